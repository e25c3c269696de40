#include "actors/router/router_core.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

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
  if (config.prefix_index_blocks_max < 1) return bad("prefix_index_blocks_max must be >= 1");
  if (config.block_tokens < 1) return bad("block_tokens must be >= 1");
  if (config.instances_max < 1 || config.instances_max > 65536) {
    return bad("instances_max must be in 1..65536, got " + std::to_string(config.instances_max));
  }
  return {};
}

RouterCore::RouterCore(const RouterConfig& config) : config_(config) {
  Status valid = validate(config);
  if (!valid) throw std::invalid_argument(valid.error().describe());
  words_ = (config.instances_max + 63) / 64;
  random_state_ = config.seed;
  RT_ASSERT(words_ >= 1 && words_ <= 1024, words_);
  RT_ASSERT(table_.empty());
}

RouterCore::Slot* RouterCore::find(InstanceId id) {
  auto it = slot_of_.find(id.value);
  if (it == slot_of_.end()) return nullptr;
  RT_ASSERT(slots_[it->second].used && slots_[it->second].id == id, id.value);
  return &slots_[it->second];
}

Status RouterCore::add_instance(InstanceId id, InstanceRole role) {
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
  RT_ASSERT(s.held.empty() && s.leaves.empty(), slot);
  s.used = true;
  s.up = true;
  s.id = id;
  s.role = role;
  s.load = {};
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
  RT_ASSERT(s->held.empty() && s->leaves.empty(), slot);
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
  }
  s->up = up;
  RT_ASSERT(up || s->held.empty(), id.value);
  return {};
}

Status RouterCore::update_load(InstanceId id, const InstanceLoad& load) {
  Slot* s = find(id);
  if (s == nullptr) {
    return make_error(ErrorKind::not_found, "router: unknown instance " + std::to_string(id.value));
  }
  s->load = load;
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
    if (s.used && s.up && s.role == role) mask[slot / 64] |= uint64_t{1} << (slot % 64);
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

InstanceScore RouterCore::score_slot(uint32_t slot, uint32_t cached, size_t blocks) const {
  const Slot& s = slots_[slot];
  RT_ASSERT(s.used, slot);
  RT_ASSERT(cached <= blocks, cached, blocks);
  InstanceScore score;
  score.id = s.id;
  score.cached_blocks = cached;
  score.prefix = blocks == 0 ? 0.0 : static_cast<double>(cached) / static_cast<double>(blocks);
  score.queue = 1.0 / (1.0 + static_cast<double>(s.load.waiting_count));
  const InstanceLoad& load = s.load;
  if (load.kv_blocks_total == 0) {
    score.kv_usage = 1.0;
  } else {
    uint64_t used = std::min(load.kv_blocks_used, load.kv_blocks_total);
    score.kv_usage = 1.0 - static_cast<double>(used) / static_cast<double>(load.kv_blocks_total);
  }
  score.total = config_.weight_prefix * score.prefix + config_.weight_queue * score.queue +
                config_.weight_kv_usage * score.kv_usage;
  return score;
}

std::optional<uint32_t> RouterCore::choose_best(InstanceRole role,
                                                const std::vector<uint32_t>& lengths, size_t blocks,
                                                uint32_t& cursor, double* score) const {
  std::optional<uint32_t> best;
  double best_total = 0.0;
  auto count = static_cast<uint32_t>(slots_.size());
  for (uint32_t k = 0; k < count; ++k) {
    uint32_t slot = (cursor + k) % count;  // ties go to the first after the last pick
    const Slot& s = slots_[slot];
    if (!s.used || !s.up || s.role != role) continue;
    double total = score_slot(slot, lengths[slot], blocks).total;
    if (!best || total > best_total + tie_epsilon) {
      best = slot;
      best_total = total;
    }
  }
  if (best) *score = best_total;
  RT_ASSERT(!best || *best < count, *best);
  return best;
}

std::optional<uint32_t> RouterCore::choose(InstanceRole role, const std::vector<uint32_t>& lengths,
                                           size_t blocks, uint32_t& cursor, double* score) {
  auto count = static_cast<uint32_t>(slots_.size());
  RT_ASSERT(lengths.size() == count, lengths.size(), count);
  *score = 0.0;
  std::optional<uint32_t> chosen;
  if (config_.policy == Policy::prefix_aware) {
    chosen = choose_best(role, lengths, blocks, cursor, score);
  } else {
    std::vector<uint32_t> eligible;
    for (uint32_t k = 0; k < count; ++k) {
      uint32_t slot = (cursor + k) % count;
      const Slot& s = slots_[slot];
      if (s.used && s.up && s.role == role) eligible.push_back(slot);
    }
    if (!eligible.empty()) {
      size_t index = 0;
      if (config_.policy == Policy::random) {
        // Lemire's multiply-shift: uniform enough for 2^64 >> eligible.size().
        index = static_cast<size_t>(
            (static_cast<unsigned __int128>(next_random()) * eligible.size()) >> 64);
      }
      chosen = eligible[index];
    }
  }
  if (chosen) cursor = (*chosen + 1) % count;
  RT_ASSERT(!chosen || slots_[*chosen].role == role, *chosen);
  return chosen;
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
  std::vector<InstanceScore> out;
  for (uint32_t slot = 0; slot < slots_.size(); ++slot) {
    const Slot& s = slots_[slot];
    if (!s.used || !s.up || s.role != role) continue;
    out.push_back(score_slot(slot, lengths[slot], request.block_hashes.size()));
  }
  std::sort(out.begin(), out.end(),
            [](const InstanceScore& a, const InstanceScore& b) { return a.id < b.id; });
  RT_ASSERT(out.size() <= slot_of_.size(), out.size());
  return out;
}

Result<Pick> RouterCore::pick(const PickRequest& request) {
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
  if (!decode) return make_error(ErrorKind::overloaded, "router: every decode instance is down");
  pick.decode = slots_[*decode].id;
  pick.decode_cached_blocks = lengths[*decode];
  pick.uncached_tokens =
      request.prompt_tokens - uint64_t{pick.decode_cached_blocks} * config_.block_tokens;
  std::optional<uint32_t> prefill;
  if (pick.uncached_tokens >= config_.disaggregate_tokens_min) {
    double prefill_score = 0.0;
    role_mask(InstanceRole::prefill, pick_mask_);
    match_lengths(request.block_hashes, pick_mask_, pick_prefill_lengths_);
    for (uint32_t slot = 0; slot < slots_.size(); ++slot) {
      if (slots_[slot].role == InstanceRole::prefill) lengths[slot] = pick_prefill_lengths_[slot];
    }
    prefill = choose(InstanceRole::prefill, lengths, blocks, prefill_cursor_, &prefill_score);
  }
  record(*decode, request.block_hashes, lengths[*decode]);
  slots_[*decode].load.waiting_count += 1;
  if (prefill) {
    pick.prefill = slots_[*prefill].id;
    record(*prefill, request.block_hashes, lengths[*prefill]);
    slots_[*prefill].load.waiting_count += 1;
  }
  RT_ASSERT(pick.decode_cached_blocks <= blocks, pick.decode_cached_blocks, blocks);
  RT_ASSERT(slots_[*decode].up && slots_[*decode].role == InstanceRole::decode);
  return pick;
}

// ---- the index: nodes, per-instance trees, LRU ----

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

// Holds `node` for `slot` as a new leaf; its parent (held, or none) loses its leaf status.
void RouterCore::hold(uint32_t slot, uint32_t node, uint64_t stamp) {
  Slot& s = slots_[slot];
  RT_ASSERT(!bit(node, slot), node, slot);
  uint32_t parent = nodes_[node].parent;
  RT_ASSERT(parent == none_ || bit(parent, slot), "closure: parent held first", node);
  node_bits_[size_t{node} * words_ + slot / 64] |= uint64_t{1} << (slot % 64);
  s.held.insert(node, Held{stamp, 0});
  s.leaves.emplace(stamp, node);
  if (parent != none_) {
    Held& p = s.held.at(parent);
    if (p.child_count++ == 0) s.leaves.erase({p.stamp, parent});
  }
}

void RouterCore::touch(uint32_t slot, uint32_t node) {
  Slot& s = slots_[slot];
  Held& h = s.held.at(node);
  uint64_t stamp = ++stamp_;
  RT_ASSERT(stamp > h.stamp, stamp, h.stamp);
  if (h.child_count == 0) {
    size_t erased = s.leaves.erase({h.stamp, node});
    RT_ASSERT(erased == 1, node);
    s.leaves.emplace(stamp, node);
  }
  h.stamp = stamp;
}

// Drops a leaf of `slot`'s tree. Its parent inherits the stamp if newer (a block counts as
// used whenever a deeper block of its chain was), and becomes a leaf when childless.
void RouterCore::drop(uint32_t slot, uint32_t node) {
  Slot& s = slots_[slot];
  Held* held = s.held.find(node);
  RT_ASSERT(held != nullptr && held->child_count == 0, node, slot);
  uint64_t stamp = held->stamp;
  size_t erased = s.leaves.erase({stamp, node});
  RT_ASSERT(erased == 1, node);
  s.held.erase(node);
  node_bits_[size_t{node} * words_ + slot / 64] &= ~(uint64_t{1} << (slot % 64));
  uint32_t parent = nodes_[node].parent;
  if (parent != none_) {
    Held& p = s.held.at(parent);
    RT_ASSERT(p.child_count > 0, parent);
    p.stamp = std::max(p.stamp, stamp);
    if (--p.child_count == 0) s.leaves.emplace(p.stamp, parent);
  }
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

void RouterCore::evict_to_capacity(uint32_t slot) {
  Slot& s = slots_[slot];
  while (s.held.size() > config_.prefix_index_blocks_max) {
    RT_ASSERT(!s.leaves.empty(), "a non-empty tree has a leaf", slot);
    drop(slot, s.leaves.begin()->second);
  }
  RT_ASSERT(s.held.size() <= config_.prefix_index_blocks_max, s.held.size());
}

void RouterCore::clear_slot_index(uint32_t slot) {
  Slot& s = slots_[slot];
  while (!s.leaves.empty()) drop(slot, s.leaves.begin()->second);
  RT_ASSERT(s.held.empty(), "every held block is reachable from a leaf", slot);
}

void RouterCore::record(uint32_t slot, std::span<const kv::BlockHash> hashes, uint32_t cached) {
  RT_ASSERT(cached <= hashes.size(), cached, hashes.size());
  RT_ASSERT(slots_[slot].used, slot);
  if (hashes.empty()) return;
  auto blocks = static_cast<uint32_t>(hashes.size());
  if (cached == blocks) {
    touch(slot, node_of(hashes[blocks - 1]));
    return;
  }
  uint32_t parent = cached == 0 ? none_ : node_of(hashes[cached - 1]);
  if (parent != none_) touch(slot, parent);
  uint64_t stamp = ++stamp_;
  // Like hold() per block, but only the new deepest block enters the leaf set.
  Slot& s = slots_[slot];
  s.held.reserve(s.held.size() + (blocks - cached));  // keeps the Held pointers below valid
  Held* previous = parent == none_ ? nullptr : &s.held.at(parent);
  uint32_t previous_node = parent;
  for (uint32_t i = cached; i < blocks; ++i) {
    uint32_t node = node_for(hashes[i], previous_node, i);
    if (node == none_ || bit(node, slot)) break;  // inconsistent chain: stop recording
    node_bits_[size_t{node} * words_ + slot / 64] |= uint64_t{1} << (slot % 64);
    Held* held = &s.held.insert(node, Held{stamp, 0});
    if (previous != nullptr && previous->child_count++ == 0 && previous_node == parent) {
      s.leaves.erase({previous->stamp, parent});  // the old deepest block is a leaf no more
    }
    previous = held;
    previous_node = node;
  }
  if (previous_node != parent) s.leaves.emplace(stamp, previous_node);
  RT_ASSERT(previous_node == parent || s.held.at(previous_node).child_count == 0);
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
  for (const kv::BlockHash& hash : hashes) {
    uint32_t node = node_for(hash, parent, depth);
    if (node == none_) break;
    if (bit(node, slot)) {
      touch(slot, node);
    } else {
      hold(slot, node, ++stamp_);
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

}  // namespace tandem::router
