#include "actors/router/router_core.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>

namespace tandem::router {
namespace {

constexpr double tie_epsilon = 1e-12;

bool any_bit(const uint64_t* bits, uint32_t words) {
  for (uint32_t w = 0; w < words; ++w) {
    if (bits[w] != 0) return true;
  }
  return false;
}

bool same_bits(const uint64_t* a, const uint64_t* b, uint32_t words) {
  uint64_t differ = 0;
  for (uint32_t w = 0; w < words; ++w) differ |= a[w] ^ b[w];
  return differ == 0;
}

bool weight_ok(double weight) {
  return std::isfinite(weight) && weight >= 0.0;
}

}  // namespace

std::string_view to_string(Policy policy) {
  switch (policy) {
    case Policy::prefix_aware:
      return "prefix-aware";
    case Policy::round_robin:
      return "round-robin";
    case Policy::random:
      return "random";
  }
  return "?";
}

Status validate(const RouterConfig& config) {
  auto bad = [](std::string what) { return make_error(ErrorKind::invalid, "router: " + what); };
  if (!weight_ok(config.weight_prefix)) return bad("weight_prefix must be finite and >= 0");
  if (!weight_ok(config.weight_queue)) return bad("weight_queue must be finite and >= 0");
  if (!weight_ok(config.weight_kv_usage)) return bad("weight_kv_usage must be finite and >= 0");
  if (config.weight_prefix + config.weight_queue + config.weight_kv_usage <= 0.0) {
    return bad("weight_prefix, weight_queue and weight_kv_usage are all zero");
  }
  if (std::isnan(config.load_imbalance_max) || config.load_imbalance_max < 0.0) {
    return bad("load_imbalance_max must be >= 0 (infinity: no bound)");
  }
  if (std::isnan(config.prefill_load_imbalance_max) || config.prefill_load_imbalance_max < 0.0) {
    return bad("prefill_load_imbalance_max must be >= 0 (infinity: no bound)");
  }
  if (config.prefix_index_blocks_max < 1) return bad("prefix_index_blocks_max must be >= 1");
  if (config.block_tokens < 1) return bad("block_tokens must be >= 1");
  if (config.sub_blocks_per_block < 1) return bad("sub_blocks_per_block must be >= 1");
  if (!std::isfinite(config.tier2_weight) || config.tier2_weight < 0.0 ||
      config.tier2_weight > 1.0) {
    return bad("tier2_weight must be in [0, 1]");
  }
  if (!std::isfinite(config.tier2_remote_weight) || config.tier2_remote_weight < 0.0 ||
      config.tier2_remote_weight > config.tier2_weight) {
    return bad("tier2_remote_weight must be in [0, tier2_weight]");
  }
  if (config.tier2_index_blocks_max < 1) return bad("tier2_index_blocks_max must be >= 1");
  if (config.instances_max < 1 || config.instances_max > 65536) {
    return bad("instances_max must be in 1..65536, got " + std::to_string(config.instances_max));
  }
  return {};
}

namespace {
const RouterConfig& validated(const RouterConfig& config) {
  Status valid = validate(config);
  if (!valid) throw std::invalid_argument(valid.error().describe());
  return config;
}
}  // namespace

RouterCore::RouterCore(const RouterConfig& config)
    : config_(validated(config)), tier2_(config.tier2_index_blocks_max) {
  words_ = (config.instances_max + 63) / 64;
  random_state_ = config.seed;
  RT_ASSERT(words_ >= 1 && words_ <= 1024, words_);
  RT_ASSERT(table_.empty());
}

Status RouterCore::set_config(const RouterConfig& config) {
  if (Status valid = validate(config); !valid.ok()) return valid;
  auto fixed = [](const RouterConfig& c) {
    return std::tuple(c.prefix_index_blocks_max, c.block_tokens, c.sub_blocks_per_block,
                      c.instances_max, c.tier2_index_blocks_max, c.seed);
  };
  if (fixed(config) != fixed(config_)) {
    return make_error(ErrorKind::invalid,
                      "router: only the policy, weights, P/D threshold, load bounds and tier-2 "
                      "weights change live; capacities and block sizes are fixed at start");
  }
  config_ = config;
  RT_ASSERT(validate(config_).ok());
  return {};
}

RouterCore::Slot* RouterCore::find(InstanceId id) {
  auto it = slot_of_.find(id.value);
  if (it == slot_of_.end()) return nullptr;
  RT_ASSERT(slots_[it->second].used && slots_[it->second].id == id, id.value);
  return &slots_[it->second];
}

Status RouterCore::add_instance(InstanceId id, InstanceRole role, uint32_t site) {
  if (slot_of_.count(id.value) != 0) {
    return make_error(ErrorKind::invalid,
                      "router: instance " + std::to_string(id.value) + " is already known");
  }
  if (slot_of_.size() >= config_.instances_max) {
    return make_error(ErrorKind::overloaded, "router: instances_max (" +
                                                 std::to_string(config_.instances_max) +
                                                 ") instances already known");
  }
  uint32_t slot = 0;
  while (slot < slots_.size() && slots_[slot].used) ++slot;
  if (slot == slots_.size()) slots_.emplace_back();
  RT_ASSERT(slot < config_.instances_max, slot);
  Slot& s = slots_[slot];
  RT_ASSERT(s.held.empty() && s.oldest == none_, slot);
  s.used = true;
  s.up = true;
  s.draining = false;
  s.id = id;
  s.role = role;
  s.site = site;
  s.load = {};
  s.inflight_count = 0;
  s.inflight_tokens = 0;
  slot_of_[id.value] = slot;
  return {};
}

Status RouterCore::remove_instance(InstanceId id) {
  Slot* s = find(id);
  if (s == nullptr) {
    return make_error(ErrorKind::not_found, "router: unknown instance " + std::to_string(id.value));
  }
  uint32_t slot = slot_of_[id.value];
  clear_slot_index(slot);
  RT_ASSERT(s->held.empty() && s->oldest == none_, slot);
  s->used = false;
  slot_of_.erase(id.value);
  return {};
}

Status RouterCore::set_up(InstanceId id, bool up) {
  Slot* s = find(id);
  if (s == nullptr) {
    return make_error(ErrorKind::not_found, "router: unknown instance " + std::to_string(id.value));
  }
  if (!up) {
    clear_slot_index(slot_of_[id.value]);
    if (s->up) s->load = {};
    s->inflight_count = 0;
    s->inflight_tokens = 0;
  }
  s->up = up;
  RT_ASSERT(up || s->held.empty(), id.value);
  return {};
}

Status RouterCore::set_draining(InstanceId id, bool draining) {
  Slot* s = find(id);
  if (s == nullptr) {
    return make_error(ErrorKind::not_found, "router: unknown instance " + std::to_string(id.value));
  }
  s->draining = draining;
  RT_ASSERT(s->draining == draining);
  return {};
}

bool RouterCore::draining(InstanceId id) const {
  auto it = slot_of_.find(id.value);
  return it != slot_of_.end() && slots_[it->second].draining;
}

Status RouterCore::update_load(InstanceId id, const InstanceLoad& load) {
  Slot* s = find(id);
  if (s == nullptr) {
    return make_error(ErrorKind::not_found, "router: unknown instance " + std::to_string(id.value));
  }
  s->load = load;
  s->inflight_count = 0;  // the heartbeat now counts what was picked before it
  s->inflight_tokens = 0;
  RT_ASSERT(s->used, id.value);
  return {};
}

Status RouterCore::check_request(const PickRequest& request) const {
  uint64_t block_tokens_sum = uint64_t{request.block_hashes.size()} * config_.block_tokens;
  if (request.prompt_tokens < block_tokens_sum) {
    return make_error(ErrorKind::invalid,
                      "router: prompt_tokens " + std::to_string(request.prompt_tokens) +
                          " is below its " + std::to_string(request.block_hashes.size()) +
                          " full blocks of " + std::to_string(config_.block_tokens) + " tokens");
  }
  if (request.block_hashes.size() >= UINT32_MAX) {
    return make_error(ErrorKind::invalid, "router: too many block hashes");
  }
  return {};
}

// ---- prefix matching: parallel bisection over the prompt's chain ----
//
// Invariant kept by every update: an instance that holds a block holds its parent (each
// instance's blocks form prefix-closed trees). So the set of instances holding block i of
// the prompt shrinks as i grows, and an instance's match length is found by bisection.

bool RouterCore::bit(uint32_t node, uint32_t slot) const {
  return (node_bits_[size_t{node} * words_ + slot / 64] >> (slot % 64)) & 1u;
}

uint32_t RouterCore::node_of(const kv::BlockHash& hash) const {
  const BlockTable::Entry* entry = table_.find(hash);
  return entry == nullptr ? none_ : entry->node;
}

// Looks up the holders of every position in probe_positions_ into fresh arena bitsets
// (probe_bits_), in three passes so the cache misses of all lookups overlap.
void RouterCore::probe(std::span<const kv::BlockHash> hashes) const {
  size_t count = probe_positions_.size();
  for (uint32_t position : probe_positions_) table_.prefetch(hashes[position]);
  probe_nodes_.resize(count);
  for (size_t i = 0; i < count; ++i) {
    uint32_t position = probe_positions_[i];
    RT_ASSERT(position < hashes.size(), position, hashes.size());
    const BlockTable::Entry* entry = table_.find(hashes[position]);
    // A hash at another chain position than ours is another prefix: not a hit.
    probe_nodes_[i] = entry == nullptr || entry->depth != position ? none_ : entry->node;
    if (probe_nodes_[i] != none_) __builtin_prefetch(&node_bits_[size_t{entry->node} * words_]);
  }
  probe_bits_.resize(count);
  auto base = static_cast<uint32_t>(bits_arena_.size());
  bits_arena_.resize(bits_arena_.size() + count * words_);
  RT_ASSERT(bits_arena_.size() < UINT32_MAX, bits_arena_.size());
  for (size_t i = 0; i < count; ++i) {
    probe_bits_[i] = base + static_cast<uint32_t>(i) * words_;
    uint64_t* out = &bits_arena_[probe_bits_[i]];
    if (probe_nodes_[i] == none_) {
      for (uint32_t w = 0; w < words_; ++w) out[w] = 0;
      continue;
    }
    const uint64_t* bits = &node_bits_[size_t{probe_nodes_[i]} * words_];
    for (uint32_t w = 0; w < words_; ++w) out[w] = bits[w];
  }
}

// Invariant kept by every update: an instance that holds a block holds its parent (each
// instance's blocks form prefix-closed trees). So the set of instances holding block i of
// the prompt shrinks as i grows, and every instance's match length is found by one
// bisection over the chain, run level by level so each level's lookups overlap.
void RouterCore::role_mask(InstanceRole role, std::vector<uint64_t>& mask) const {
  mask.assign(words_, 0);
  for (uint32_t slot = 0; slot < slots_.size(); ++slot) {
    const Slot& s = slots_[slot];
    if (pickable(s, role)) mask[slot / 64] |= uint64_t{1} << (slot % 64);
  }
  RT_ASSERT(mask.size() == words_);
}

void RouterCore::match_lengths(std::span<const kv::BlockHash> hashes,
                               const std::vector<uint64_t>& mask,
                               std::vector<uint32_t>& out) const {
  RT_ASSERT(mask.size() == words_, mask.size());
  out.assign(slots_.size(), 0);
  if (hashes.empty() || table_.empty()) return;
  auto blocks = static_cast<uint32_t>(hashes.size());
  bits_arena_.clear();
  probe_positions_.assign({0, blocks - 1});
  probe(hashes);
  uint32_t first = probe_bits_[0], last = probe_bits_[1];
  for (uint32_t w = 0; w < words_; ++w) {
    bits_arena_[first + w] &= mask[w];  // only the slots asked about
    uint64_t& all = bits_arena_[last + w];
    all &= bits_arena_[first + w];
    for (uint64_t rest = all; rest != 0; rest &= rest - 1) {
      out[w * 64 + static_cast<uint32_t>(__builtin_ctzll(rest))] = blocks;
    }
  }
  level_.clear();
  if (blocks > 1) level_.push_back({0, blocks - 1, first, last});
  for (uint32_t depth = 0; !level_.empty(); ++depth) {
    RT_ASSERT(depth <= 40, "bisection depth is log2(blocks)", depth);
    next_level_.clear();
    probe_positions_.clear();
    for (const Interval& interval : level_) {
      const uint64_t* lo_bits = &bits_arena_[interval.lo_bits];
      const uint64_t* hi_bits = &bits_arena_[interval.hi_bits];
      if (same_bits(lo_bits, hi_bits, words_)) continue;  // nobody's match ends in (lo, hi]
      if (interval.hi == interval.lo + 1) {
        for (uint32_t w = 0; w < words_; ++w) {
          for (uint64_t ends = lo_bits[w] & ~hi_bits[w]; ends != 0; ends &= ends - 1) {
            out[w * 64 + static_cast<uint32_t>(__builtin_ctzll(ends))] = interval.hi;
          }
        }
        continue;
      }
      next_level_.push_back(interval);
      probe_positions_.push_back(interval.lo + (interval.hi - interval.lo) / 2);
    }
    probe(hashes);
    level_.clear();
    for (size_t i = 0; i < next_level_.size(); ++i) {
      const Interval& interval = next_level_[i];
      uint32_t mid = probe_bits_[i];
      for (uint32_t w = 0; w < words_; ++w) {  // keep hi ⊆ mid ⊆ lo even on odd input
        bits_arena_[mid + w] = (bits_arena_[mid + w] & bits_arena_[interval.lo_bits + w]) |
                               bits_arena_[interval.hi_bits + w];
      }
      level_.push_back({interval.lo, probe_positions_[i], interval.lo_bits, mid});
      level_.push_back({probe_positions_[i], interval.hi, mid, interval.hi_bits});
    }
  }
  RT_ASSERT(out.size() == slots_.size());
}

uint32_t RouterCore::cached_blocks(InstanceId id, std::span<const kv::BlockHash> hashes) const {
  auto it = slot_of_.find(id.value);
  if (it == slot_of_.end()) return 0;
  std::vector<uint64_t> mask(words_, 0);
  mask[it->second / 64] |= uint64_t{1} << (it->second % 64);
  std::vector<uint32_t> lengths;
  match_lengths(hashes, mask, lengths);
  RT_ASSERT(lengths[it->second] <= hashes.size());
  return lengths[it->second];
}

bool RouterCore::holds(InstanceId id, const kv::BlockHash& hash) const {
  auto it = slot_of_.find(id.value);
  if (it == slot_of_.end()) return false;
  uint32_t node = node_of(hash);
  RT_ASSERT(node == none_ || node < nodes_.size(), node);
  return node != none_ && bit(node, it->second);
}

size_t RouterCore::index_blocks_count(InstanceId id) const {
  auto it = slot_of_.find(id.value);
  return it == slot_of_.end() ? 0 : slots_[it->second].held.size();
}

// ---- scoring and choosing ----

uint64_t RouterCore::load_count(const Slot& s) {
  return uint64_t{s.load.waiting_count} + s.load.running_count + s.inflight_count;
}

RouterCore::RoleLoad RouterCore::role_load(InstanceRole role) const {
  RoleLoad out;
  for (const Slot& s : slots_) {
    if (!pickable(s, role)) continue;
    ++out.candidates_count;
    out.load_sum += load_count(s);
  }
  RT_ASSERT(out.candidates_count <= slots_.size(), out.candidates_count);
  return out;
}

InstanceScore RouterCore::score_slot(uint32_t slot, uint32_t cached, size_t blocks,
                                     const RoleLoad& role_load, const Tier2Run& tier2) const {
  uint32_t tier2_blocks = tier2.blocks;
  const Slot& s = slots_[slot];
  RT_ASSERT(s.used, slot);
  RT_ASSERT(cached + tier2_blocks <= blocks, cached, tier2_blocks, blocks);
  RT_ASSERT(role_load.candidates_count >= 1, slot);
  InstanceScore score;
  score.id = s.id;
  score.cached_blocks = cached;
  score.tier2_blocks = tier2_blocks;
  score.tier2_remote = tier2.remote;
  double credited = static_cast<double>(cached) + tier2.credit();
  score.prefix = blocks == 0 ? 0.0 : credited / static_cast<double>(blocks);
  score.load_count = load_count(s);
  auto candidates = static_cast<double>(role_load.candidates_count);
  double mean = static_cast<double>(role_load.load_sum) / candidates;
  auto load = static_cast<double>(score.load_count);
  score.queue = (mean + 1.0) / (mean + 1.0 + load);
  // Bounded load: eligible while load < (1 + e) * (sum + 1) / n (the new request counted).
  // Some instance always is (the least loaded one is at or below the mean).
  double imbalance_max = s.role == InstanceRole::prefill ? config_.prefill_load_imbalance_max
                                                         : config_.load_imbalance_max;
  double bound = (1.0 + imbalance_max) *
                 (static_cast<double>(role_load.load_sum) + 1.0) / candidates;
  score.over_bound = !(load < bound);
  const InstanceLoad& l = s.load;
  if (l.kv_blocks_total == 0) {
    score.kv_usage = 1.0;
  } else {
    uint64_t used = std::min(l.kv_blocks_used, l.kv_blocks_total);
    score.kv_usage = 1.0 - static_cast<double>(used) / static_cast<double>(l.kv_blocks_total);
  }
  score.total = config_.weight_prefix * score.prefix + config_.weight_queue * score.queue +
                config_.weight_kv_usage * score.kv_usage;
  return score;
}

std::optional<uint32_t> RouterCore::choose_best(InstanceRole role,
                                                const std::vector<uint32_t>& lengths, size_t blocks,
                                                uint32_t& cursor, double* score,
                                                const std::vector<Tier2Run>* tier2) const {
  RoleLoad loads = role_load(role);
  std::optional<uint32_t> best;
  double best_total = 0.0;
  auto count = static_cast<uint32_t>(slots_.size());
  // Pass 0 honours the load bound; pass 1 (never needed in exact arithmetic) ignores it.
  for (int pass = 0; pass < 2 && !best; ++pass) {
    for (uint32_t k = 0; k < count; ++k) {
      uint32_t slot = (cursor + k) % count;  // ties go to the first after the last pick
      const Slot& s = slots_[slot];
      if (!pickable(s, role)) continue;
      InstanceScore candidate =
          score_slot(slot, lengths[slot], blocks, loads, tier2 ? (*tier2)[slot] : Tier2Run{});
      if (pass == 0 && candidate.over_bound) continue;
      if (!best || candidate.total > best_total + tie_epsilon) {
        best = slot;
        best_total = candidate.total;
      }
    }
  }
  if (best) *score = best_total;
  RT_ASSERT(!best || *best < count, *best);
  RT_ASSERT(best || loads.candidates_count == 0, loads.candidates_count);
  return best;
}

std::optional<uint32_t> RouterCore::choose(InstanceRole role, const std::vector<uint32_t>& lengths,
                                           size_t blocks, uint32_t& cursor, double* score,
                                           const std::vector<Tier2Run>* tier2) {
  auto count = static_cast<uint32_t>(slots_.size());
  RT_ASSERT(lengths.size() == count, lengths.size(), count);
  *score = 0.0;
  std::optional<uint32_t> chosen;
  if (config_.policy == Policy::prefix_aware) {
    chosen = choose_best(role, lengths, blocks, cursor, score, tier2);
  } else {
    uint32_t eligible_count = 0;
    for (const Slot& s : slots_) eligible_count += pickable(s, role) ? 1 : 0;
    if (eligible_count > 0) {
      uint32_t index = 0;
      if (config_.policy == Policy::random) {
        // Lemire's multiply-shift: uniform enough for 2^64 >> eligible_count.
        index = static_cast<uint32_t>(
            (static_cast<unsigned __int128>(next_random()) * eligible_count) >> 64);
      }
      for (uint32_t k = 0; k < count && !chosen; ++k) {
        uint32_t slot = (cursor + k) % count;
        const Slot& s = slots_[slot];
        if (!pickable(s, role)) continue;
        if (index-- == 0) chosen = slot;
      }
    }
  }
  if (chosen) cursor = (*chosen + 1) % count;
  RT_ASSERT(!chosen || slots_[*chosen].role == role, *chosen);
  return chosen;
}

// The prefill instance with the least estimated work ahead of this prompt's first token:
// load x mean uncached tokens per P/D request + this prompt's uncached tokens there. Within
// the prefill load bound (if any); ties (1e-9 relative): more free KV, then rotation.
std::optional<uint32_t> RouterCore::choose_by_work(const std::vector<uint32_t>& lengths,
                                                   const std::vector<Tier2Run>& tier2,
                                                   const PickRequest& request) const {
  RoleLoad loads = role_load(InstanceRole::prefill);
  double per_request = prefill_tokens_mean_ < 0.0 ? static_cast<double>(request.prompt_tokens)
                                                  : prefill_tokens_mean_;
  size_t blocks = request.block_hashes.size();
  auto count = static_cast<uint32_t>(slots_.size());
  std::optional<uint32_t> best;
  double best_work = 0.0, best_kv = 0.0;
  for (int pass = 0; pass < 2 && !best; ++pass) {
    for (uint32_t k = 0; k < count; ++k) {
      uint32_t slot = (prefill_cursor_ + k) % count;
      const Slot& s = slots_[slot];
      if (!pickable(s, InstanceRole::prefill)) continue;
      InstanceScore score = score_slot(slot, lengths[slot], blocks, loads, tier2[slot]);
      if (pass == 0 && score.over_bound) continue;
      // Tier-2 blocks count as their weight of a device hit: (1 - weight) of their tokens
      // is the modelled cost of reading them back (more from another node).
      double uncached = static_cast<double>(request.prompt_tokens) -
                        (static_cast<double>(lengths[slot]) + tier2[slot].credit()) *
                            config_.block_tokens;
      // The work in front of this prompt: what the instance reported it has to compute plus
      // what was picked for it since; without a report, its load x the recent mean.
      double queued = s.load.pending_tokens
                          ? static_cast<double>(*s.load.pending_tokens + s.inflight_tokens)
                          : static_cast<double>(score.load_count) * per_request;
      double evicting = 0.0;
      if (s.load.kv_blocks_free) {
        double room = static_cast<double>(*s.load.kv_blocks_free) * config_.block_tokens *
                      config_.sub_blocks_per_block;
        evicting = std::max(0.0, uncached - room);
      }
      double work = queued + uncached + evicting;
      bool tie = best && std::abs(work - best_work) <= 1e-9 * std::max(1.0, best_work);
      if (!best || (!tie && work < best_work) || (tie && score.kv_usage > best_kv + tie_epsilon)) {
        best = slot;
        best_work = work;
        best_kv = score.kv_usage;
      }
    }
  }
  RT_ASSERT(!best || slots_[*best].role == InstanceRole::prefill, *best);
  RT_ASSERT(best || loads.candidates_count == 0, loads.candidates_count);
  return best;
}

uint64_t RouterCore::next_random() {  // splitmix64
  random_state_ += 0x9e3779b97f4a7c15ull;
  uint64_t z = random_state_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Result<std::vector<InstanceScore>> RouterCore::scores(const PickRequest& request,
                                                      InstanceRole role) const {
  Status valid = check_request(request);
  if (!valid) return valid.error();
  std::vector<uint64_t> mask;
  role_mask(role, mask);
  std::vector<uint32_t> lengths;
  match_lengths(request.block_hashes, mask, lengths);
  std::vector<Tier2Run> tier2;
  tier2_runs(request.block_hashes, lengths, tier2);
  RoleLoad loads = role_load(role);
  std::vector<InstanceScore> out;
  for (uint32_t slot = 0; slot < slots_.size(); ++slot) {
    const Slot& s = slots_[slot];
    if (!pickable(s, role)) continue;
    out.push_back(score_slot(slot, lengths[slot], request.block_hashes.size(), loads, tier2[slot]));
  }
  std::sort(out.begin(), out.end(),
            [](const InstanceScore& a, const InstanceScore& b) { return a.id < b.id; });
  RT_ASSERT(out.size() <= slot_of_.size(), out.size());
  return out;
}

void RouterCore::tier2_runs(std::span<const kv::BlockHash> hashes,
                            const std::vector<uint32_t>& lengths,
                            std::vector<Tier2Run>& out) const {
  out.assign(slots_.size(), Tier2Run{});
  if (config_.tier2_weight <= 0.0) return;
  std::vector<uint32_t> sites;
  if (config_.tier2_remote_weight > 0.0) sites = tier2_.sites_holding();
  // A run starts at the block holding the first sub-block the device lacks (tier 2 holds whole
  // blocks and partial ones: Tier2Index::reach) and is counted in sub-blocks past the device's.
  const uint32_t k = config_.sub_blocks_per_block;
  for (uint32_t slot = 0; slot < slots_.size(); ++slot) {
    const Slot& s = slots_[slot];
    if (!pickable(s, InstanceRole::prefill)) continue;
    const uint32_t from = lengths[slot] / k;
    auto past_device = [&](uint32_t site) {
      const uint32_t reached = size_t{from} * k + tier2_.reach(site, hashes, k, from);
      return reached > lengths[slot] ? reached - lengths[slot] : 0u;
    };
    Tier2Run best{s.load.tier2_local_reads ? past_device(s.site) : 0, s.site, false,
                  config_.tier2_weight};
    // Another node's copy when it is worth more (ties: this node's, read without the network).
    for (uint32_t site : sites) {
      if (site == s.site || !s.load.tier2_remote_reads) continue;
      Tier2Run remote{past_device(site), site, true, config_.tier2_remote_weight};
      if (remote.credit() > best.credit() + tie_epsilon) best = remote;
    }
    if (best.blocks == 0) best = Tier2Run{};
    RT_ASSERT(lengths[slot] + best.blocks <= hashes.size(), slot);
    out[slot] = best;
  }
}

size_t RouterCore::tier2_stored(uint32_t site, std::span<const kv::BlockHash> hashes) {
  return tier2_.stored(site, hashes);
}

void RouterCore::tier2_removed(uint32_t site, std::span<const kv::BlockHash> hashes) {
  tier2_.removed(site, hashes);
}

void RouterCore::tier2_clear(uint32_t site) { tier2_.clear(site); }

// P/D: picks the prefill instance (when one is up) into `pick`.
void RouterCore::decide_prefill(const PickRequest& request, Pick& pick) {
  size_t blocks = request.block_hashes.size();
  role_mask(InstanceRole::prefill, pick_mask_);
  match_lengths(request.block_hashes, pick_mask_, pick_prefill_lengths_);
  tier2_runs(request.block_hashes, pick_prefill_lengths_, pick_tier2_);
  std::optional<uint32_t> prefill;
  if (config_.prefill_by_work && config_.policy == Policy::prefix_aware) {
    prefill = choose_by_work(pick_prefill_lengths_, pick_tier2_, request);
    if (prefill) prefill_cursor_ = (*prefill + 1) % static_cast<uint32_t>(slots_.size());
  } else {
    double prefill_score = 0.0;
    prefill = choose(InstanceRole::prefill, pick_prefill_lengths_, blocks, prefill_cursor_,
                     &prefill_score, &pick_tier2_);
  }
  if (!prefill) return;
  pick.prefill = slots_[*prefill].id;
  pick.prefill_cached_blocks = pick_prefill_lengths_[*prefill];
  pick.prefill_tier2_blocks = pick_tier2_[*prefill].blocks;
  if (pick_tier2_[*prefill].remote) pick.prefill_tier2_site = pick_tier2_[*prefill].site;
  slots_[*prefill].inflight_count += 1;
  // The work it left there, in tokens, as choose_by_work counts it.
  uint64_t hit_blocks = uint64_t{pick.prefill_cached_blocks} + pick.prefill_tier2_blocks;
  RT_ASSERT(hit_blocks * config_.block_tokens <= request.prompt_tokens, hit_blocks);
  double uncached = static_cast<double>(request.prompt_tokens) -
                    (static_cast<double>(pick.prefill_cached_blocks) +
                     pick_tier2_[*prefill].credit()) *
                        config_.block_tokens;
  slots_[*prefill].inflight_tokens += static_cast<uint64_t>(std::max(0.0, uncached));
  prefill_tokens_mean_ = prefill_tokens_mean_ < 0.0
                             ? uncached
                             : prefill_tokens_mean_ + (uncached - prefill_tokens_mean_) / 32.0;
}

Result<Pick> RouterCore::decide(const PickRequest& request) {
  Status valid = check_request(request);
  if (!valid) return valid.error();
  bool any_decode = std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) {
    return s.used && s.role == InstanceRole::decode;
  });
  if (!any_decode) return make_error(ErrorKind::not_found, "router: no decode instance known");
  // Decode lengths first; prefill lengths only when P/D is used (half the bisection work).
  std::vector<uint32_t>& lengths = pick_lengths_;
  role_mask(InstanceRole::decode, pick_mask_);
  match_lengths(request.block_hashes, pick_mask_, lengths);
  size_t blocks = request.block_hashes.size();
  Pick pick;
  std::optional<uint32_t> decode =
      choose(InstanceRole::decode, lengths, blocks, decode_cursor_, &pick.decode_score);
  if (!decode) {
    bool draining = std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) {
      return s.used && s.up && s.draining && s.role == InstanceRole::decode;
    });
    return make_error(ErrorKind::overloaded, draining ? "router: every decode instance is down or "
                                                        "draining"
                                                      : "router: every decode instance is down");
  }
  pick.decode = slots_[*decode].id;
  pick.decode_cached_blocks = lengths[*decode];
  pick.uncached_tokens =
      request.prompt_tokens - uint64_t{pick.decode_cached_blocks} * config_.block_tokens;
  slots_[*decode].inflight_count += 1;
  if (pick.uncached_tokens >= config_.disaggregate_tokens_min) decide_prefill(request, pick);
  RT_ASSERT(pick.decode_cached_blocks <= blocks, pick.decode_cached_blocks, blocks);
  RT_ASSERT(slots_[*decode].up && slots_[*decode].role == InstanceRole::decode);
  return pick;
}

void RouterCore::record(const PickRequest& request, const Pick& pick) {
  std::span<const kv::BlockHash> hashes = request.block_hashes;
  RT_ASSERT(hashes.size() < UINT32_MAX, hashes.size());
  auto blocks = static_cast<uint32_t>(hashes.size());
  auto one = [&](InstanceId id, uint32_t cached) {
    auto it = slot_of_.find(id.value);
    if (it == slot_of_.end() || !slots_[it->second].up) return;  // gone or down meanwhile
    uint32_t slot = it->second;
    RT_ASSERT(cached <= blocks, cached, blocks);
    // Still exact? (the index may have changed since decide); else measure again.
    bool holds_prefix = cached == 0 || holds_at(slot, hashes, cached - 1);
    bool holds_next = cached < blocks && holds_at(slot, hashes, cached);
    if (!holds_prefix || holds_next) {
      std::vector<uint64_t> mask(words_, 0);
      mask[slot / 64] |= uint64_t{1} << (slot % 64);
      match_lengths(hashes, mask, pick_prefill_lengths_);
      cached = pick_prefill_lengths_[slot];
    }
    record_slot(slot, hashes, cached);
  };
  one(pick.decode, pick.decode_cached_blocks);
  if (pick.prefill) one(*pick.prefill, pick.prefill_cached_blocks);
}

Result<Pick> RouterCore::pick(const PickRequest& request) {
  Result<Pick> decided = decide(request);
  if (decided.ok()) record(request, *decided);
  return decided;
}

bool RouterCore::holds_at(uint32_t slot, std::span<const kv::BlockHash> hashes,
                          uint32_t position) const {
  RT_ASSERT(position < hashes.size(), position, hashes.size());
  const BlockTable::Entry* entry = table_.find(hashes[position]);
  return entry != nullptr && entry->depth == position && bit(entry->node, slot);
}

// ---- the index: nodes, per-instance trees, LRU list ----

uint32_t RouterCore::node_for(const kv::BlockHash& hash, uint32_t parent, uint32_t depth) {
  if (uint32_t found = node_of(hash); found != none_) {
    const Node& node = nodes_[found];
    // A hash seen at another chain position: inconsistent input, not our invariant.
    if (node.parent != parent || node.depth != depth) return none_;
    return found;
  }
  uint32_t id = 0;
  if (!free_nodes_.empty()) {
    id = free_nodes_.back();
    free_nodes_.pop_back();
  } else {
    RT_ASSERT(nodes_.size() < none_, nodes_.size());
    id = static_cast<uint32_t>(nodes_.size());
    nodes_.emplace_back();
    node_bits_.resize(node_bits_.size() + words_, 0);
  }
  Node& node = nodes_[id];
  node.hash = hash;
  node.parent = parent;
  node.depth = depth;
  RT_ASSERT(node.first_child == none_, id);
  RT_ASSERT(!any_bit(&node_bits_[size_t{id} * words_], words_), id);
  node.previous_sibling = none_;
  node.next_sibling = none_;
  if (parent != none_) {
    uint32_t next = nodes_[parent].first_child;
    node.next_sibling = next;
    if (next != none_) nodes_[next].previous_sibling = id;
    nodes_[parent].first_child = id;
  }
  table_.insert(hash, id, depth);
  return id;
}

void RouterCore::free_node(uint32_t node) {
  Node& n = nodes_[node];
  RT_ASSERT(n.first_child == none_, "closure: a node nobody holds has no children", node);
  RT_ASSERT(!any_bit(&node_bits_[size_t{node} * words_], words_), node);
  if (n.previous_sibling != none_) {
    nodes_[n.previous_sibling].next_sibling = n.next_sibling;
  } else if (n.parent != none_) {
    RT_ASSERT(nodes_[n.parent].first_child == node, node, n.parent);
    nodes_[n.parent].first_child = n.next_sibling;
  }
  if (n.next_sibling != none_) nodes_[n.next_sibling].previous_sibling = n.previous_sibling;
  bool erased = table_.erase(n.hash);
  RT_ASSERT(erased, node);
  n.parent = none_;
  n.depth = 0;
  free_nodes_.push_back(node);
}

void RouterCore::link_newest(Slot& s, uint32_t entry) {
  Held& h = s.entries[entry];
  RT_ASSERT(!h.listed, entry);
  RT_ASSERT(s.newest == none_ || s.entries[s.newest].stamp <= h.stamp, "LRU list order", entry);
  h.older = s.newest;
  h.newer = none_;
  if (s.newest != none_) {
    s.entries[s.newest].newer = entry;
  } else {
    s.oldest = entry;
  }
  s.newest = entry;
  h.listed = true;
}

void RouterCore::unlink(Slot& s, uint32_t entry) {
  Held& h = s.entries[entry];
  RT_ASSERT(h.listed, entry);
  if (h.older != none_) {
    s.entries[h.older].newer = h.newer;
  } else {
    RT_ASSERT(s.oldest == entry, entry);
    s.oldest = h.newer;
  }
  if (h.newer != none_) {
    s.entries[h.newer].older = h.older;
  } else {
    RT_ASSERT(s.newest == entry, entry);
    s.newest = h.older;
  }
  h.older = h.newer = none_;
  h.listed = false;
}

// `new_entry` takes `old_entry`'s place in the list (and its stamp order); `old_entry` leaves.
void RouterCore::replace_in_list(Slot& s, uint32_t old_entry, uint32_t new_entry) {
  RT_ASSERT(old_entry != new_entry, old_entry);
  if (s.entries[new_entry].listed) unlink(s, new_entry);
  Held& o = s.entries[old_entry];
  Held& n = s.entries[new_entry];
  RT_ASSERT(o.listed, old_entry);
  n.older = o.older;
  n.newer = o.newer;
  n.listed = true;
  if (o.older != none_) {
    s.entries[o.older].newer = new_entry;
  } else {
    s.oldest = new_entry;
  }
  if (o.newer != none_) {
    s.entries[o.newer].older = new_entry;
  } else {
    s.newest = new_entry;
  }
  o.older = o.newer = none_;
  o.listed = false;
}

// Holds `node` for `slot` as a new leaf (the newest entry of the list) under the held
// `parent_entry` (none_: a first block). O(1); allocates only while the pool grows.
uint32_t RouterCore::hold(uint32_t slot, uint32_t node, uint64_t stamp, uint32_t parent_entry) {
  Slot& s = slots_[slot];
  RT_ASSERT(!bit(node, slot), node, slot);
  uint32_t parent = nodes_[node].parent;
  RT_ASSERT(parent == none_ || bit(parent, slot), "closure: parent held first", node);
  RT_ASSERT((parent == none_) == (parent_entry == none_), node);
  uint32_t entry = 0;
  if (!s.free_entries.empty()) {
    entry = s.free_entries.back();
    s.free_entries.pop_back();
  } else {
    RT_ASSERT(s.entries.size() < none_, s.entries.size());
    entry = static_cast<uint32_t>(s.entries.size());
    s.entries.emplace_back();
  }
  s.entries[entry] = Held{node, 0, stamp, none_, none_, false};
  s.held.insert(node, entry);
  node_bits_[size_t{node} * words_ + slot / 64] |= uint64_t{1} << (slot % 64);
  link_newest(s, entry);
  if (parent_entry != none_) {
    RT_ASSERT(s.entries[parent_entry].node == parent, parent_entry, parent);
    s.entries[parent_entry].child_count += 1;
  }
  return entry;
}

void RouterCore::touch(uint32_t slot, uint32_t node) {
  Slot& s = slots_[slot];
  uint32_t entry = s.held.at(node);
  Held& h = s.entries[entry];
  uint64_t stamp = ++stamp_;
  RT_ASSERT(stamp > h.stamp, stamp, h.stamp);
  h.stamp = stamp;
  if (h.listed) unlink(s, entry);
  link_newest(s, entry);
}

// Drops a leaf of `slot`'s tree. Its parent inherits the stamp and list position if newer
// (a block counts as used whenever a deeper block of its chain was), so a parent that
// becomes a leaf is always listed. O(1).
void RouterCore::drop(uint32_t slot, uint32_t node) {
  Slot& s = slots_[slot];
  uint32_t entry = s.held.at(node);
  RT_ASSERT(s.entries[entry].child_count == 0, node, slot);
  RT_ASSERT(s.entries[entry].listed, "a leaf is always listed", node);
  uint32_t parent = nodes_[node].parent;
  if (parent != none_) {
    uint32_t parent_entry = s.held.at(parent);
    Held& p = s.entries[parent_entry];
    RT_ASSERT(p.child_count > 0, parent);
    p.child_count -= 1;
    uint64_t stamp = s.entries[entry].stamp;
    if (!p.listed || stamp > p.stamp) {
      p.stamp = std::max(p.stamp, stamp);
      replace_in_list(s, entry, parent_entry);
    } else {
      unlink(s, entry);
    }
  } else {
    unlink(s, entry);
  }
  s.entries[entry].node = none_;
  s.free_entries.push_back(entry);
  s.held.erase(node);
  node_bits_[size_t{node} * words_ + slot / 64] &= ~(uint64_t{1} << (slot % 64));
  if (!any_bit(&node_bits_[size_t{node} * words_], words_)) free_node(node);
}

void RouterCore::drop_subtree(uint32_t slot, uint32_t node) {
  RT_ASSERT(bit(node, slot), node, slot);
  std::vector<uint32_t> order{node};  // preorder; dropped in reverse (leaves first)
  for (size_t i = 0; i < order.size(); ++i) {
    for (uint32_t child = nodes_[order[i]].first_child; child != none_;
         child = nodes_[child].next_sibling) {
      if (bit(child, slot)) order.push_back(child);
    }
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) drop(slot, *it);
  RT_ASSERT(order.size() >= 1);
}

// Evicts least recently used leaves until at most `keep` blocks are held. An internal entry
// at the list's head is parked (unlisted): its stamp is the oldest, and it comes back with a
// child's stamp when that child is dropped. Amortized O(1) per evicted block.
void RouterCore::evict_to(uint32_t slot, size_t keep) {
  Slot& s = slots_[slot];
  while (s.held.size() > keep) {
    uint32_t entry = s.oldest;
    RT_ASSERT(entry != none_, "a non-empty tree has a listed leaf", slot);
    if (s.entries[entry].child_count > 0) {
      unlink(s, entry);
      continue;
    }
    drop(slot, s.entries[entry].node);
  }
  RT_ASSERT(s.held.size() <= keep, s.held.size());
}

void RouterCore::evict_to_capacity(uint32_t slot) {
  evict_to(slot, config_.prefix_index_blocks_max);
}

void RouterCore::clear_slot_index(uint32_t slot) {
  evict_to(slot, 0);
  Slot& s = slots_[slot];
  RT_ASSERT(s.held.empty() && s.oldest == none_, "every held block was dropped", slot);
  RT_ASSERT(s.free_entries.size() == s.entries.size(), slot);
}

void RouterCore::record_slot(uint32_t slot, std::span<const kv::BlockHash> hashes,
                             uint32_t cached) {
  RT_ASSERT(cached <= hashes.size(), cached, hashes.size());
  RT_ASSERT(slots_[slot].used, slot);
  if (hashes.empty()) return;
  auto blocks = static_cast<uint32_t>(hashes.size());
  if (cached == blocks) {
    touch(slot, node_of(hashes[blocks - 1]));
    return;
  }
  uint32_t parent = cached == 0 ? none_ : node_of(hashes[cached - 1]);
  Slot& s = slots_[slot];
  uint32_t parent_entry = none_;
  if (parent != none_) {
    touch(slot, parent);
    parent_entry = s.held.at(parent);
  }
  uint64_t stamp = ++stamp_;  // one stamp for the new chain; only its deepest is a leaf
  s.held.reserve(s.held.size() + (blocks - cached));
  for (uint32_t i = cached; i < blocks; ++i) {
    uint32_t node = node_for(hashes[i], parent, i);
    if (node == none_ || bit(node, slot)) break;  // inconsistent chain: stop recording
    parent_entry = hold(slot, node, stamp, parent_entry);
    parent = node;
  }
  evict_to_capacity(slot);
}

Status RouterCore::kv_stored(InstanceId id, std::optional<kv::BlockHash> parent_hash,
                             std::span<const kv::BlockHash> hashes) {
  if (find(id) == nullptr) {
    return make_error(ErrorKind::not_found, "router: unknown instance " + std::to_string(id.value));
  }
  uint32_t slot = slot_of_.at(id.value);
  if (!slots_[slot].up) return {};  // a down instance's index stays empty until it returns
  uint32_t parent = none_;
  uint32_t depth = 0;
  if (parent_hash) {
    parent = node_of(*parent_hash);
    if (parent == none_ || !bit(parent, slot)) return {};  // cannot be a leading hit
    depth = nodes_[parent].depth + 1;
  }
  Slot& s = slots_[slot];
  uint32_t parent_entry = parent == none_ ? none_ : s.held.at(parent);
  for (const kv::BlockHash& hash : hashes) {
    uint32_t node = node_for(hash, parent, depth);
    if (node == none_) break;
    if (bit(node, slot)) {
      touch(slot, node);
      parent_entry = s.held.at(node);
    } else {
      parent_entry = hold(slot, node, ++stamp_, parent_entry);
    }
    parent = node;
    ++depth;
  }
  evict_to_capacity(slot);
  RT_ASSERT(slots_[slot].held.size() <= config_.prefix_index_blocks_max);
  return {};
}

Status RouterCore::kv_removed(InstanceId id, std::span<const kv::BlockHash> hashes) {
  if (find(id) == nullptr) {
    return make_error(ErrorKind::not_found, "router: unknown instance " + std::to_string(id.value));
  }
  uint32_t slot = slot_of_.at(id.value);
  for (const kv::BlockHash& hash : hashes) {
    uint32_t node = node_of(hash);
    if (node == none_ || !bit(node, slot)) continue;
    drop_subtree(slot, node);
  }
  RT_ASSERT(slots_[slot].held.size() <= config_.prefix_index_blocks_max);
  return {};
}

Status RouterCore::kv_clear(InstanceId id) {
  if (find(id) == nullptr) {
    return make_error(ErrorKind::not_found, "router: unknown instance " + std::to_string(id.value));
  }
  clear_slot_index(slot_of_.at(id.value));
  return {};
}

void RouterCore::check_invariants() const {
  for (uint32_t slot = 0; slot < slots_.size(); ++slot) {
    const Slot& s = slots_[slot];
    if (!s.used) continue;
    size_t listed_count = 0;
    uint64_t previous_stamp = 0;
    uint32_t previous = none_;
    for (uint32_t e = s.oldest; e != none_; e = s.entries[e].newer) {
      const Held& h = s.entries[e];
      RT_ASSERT(h.listed && h.node != none_, slot, e);
      RT_ASSERT(h.older == previous, "LRU list links", slot, e);
      RT_ASSERT(h.stamp >= previous_stamp, "LRU list in stamp order", slot, e);
      previous_stamp = h.stamp;
      previous = e;
      ++listed_count;
    }
    RT_ASSERT(s.newest == previous, slot);
    uint64_t oldest_stamp = s.oldest == none_ ? UINT64_MAX : s.entries[s.oldest].stamp;
    std::vector<uint32_t> children(s.entries.size(), 0);
    size_t used_count = 0;
    for (const Held& h : s.entries) {
      if (h.node == none_) continue;
      ++used_count;
      RT_ASSERT(bit(h.node, slot), slot, h.node);
      uint32_t parent = nodes_[h.node].parent;
      if (parent != none_) children[s.held.at(parent)] += 1;  // closure: parent held
    }
    RT_ASSERT(used_count == s.held.size(), slot, used_count, s.held.size());
    RT_ASSERT(used_count + s.free_entries.size() == s.entries.size(), slot);
    for (uint32_t e = 0; e < s.entries.size(); ++e) {
      const Held& h = s.entries[e];
      if (h.node == none_) continue;
      RT_ASSERT(s.held.at(h.node) == e, slot, e);
      RT_ASSERT(h.child_count == children[e], "child count", slot, e);
      RT_ASSERT(h.listed || h.child_count > 0, "every leaf is listed", slot, e);
      RT_ASSERT(h.listed || h.stamp <= oldest_stamp, "parked entries are the oldest", slot, e);
    }
    RT_ASSERT(listed_count <= used_count, slot);
  }
}

}  // namespace tandem::router
