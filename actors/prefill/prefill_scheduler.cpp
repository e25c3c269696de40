#include "actors/prefill/prefill_scheduler.hpp"

#include <algorithm>
#include <string>

#include "runtime/base/assert.hpp"

namespace tandem::prefill {
namespace {

Error invalid_key(const char* key, const std::string& why) {
  return make_error(ErrorKind::invalid, std::string("prefill.") + key + ": " + why);
}

}  // namespace

Status PrefillConfig::validate() const {
  if (block_tokens == 0) return invalid_key("block_tokens", "must be at least 1");
  if (queue_max == 0) return invalid_key("queue_max", "must be at least 1");
  if (running_max == 0) return invalid_key("running_max", "must be at least 1");
  if (held_max < running_max) {
    return invalid_key("held_max",
                       "must be at least running_max (" + std::to_string(running_max) + ")");
  }
  if (step_tokens_max == 0) return invalid_key("step_tokens_max", "must be at least 1");
  if (hold_timeout_ms.count() <= 0) return invalid_key("hold_timeout_ms", "must be positive");
  return {};
}

std::vector<kv::BlockHash> block_hashes(const PrefillDone& done, uint32_t k) {
  return kv::block_hashes_of(done.prefix_hashes, k);
}

std::vector<kv::BlockHash> tier2_offer_hashes(const PrefillDone& done, uint32_t k,
                                              uint32_t partial_min) {
  std::vector<kv::BlockHash> out = kv::block_hashes_of(done.prefix_hashes, k);
  const size_t rest = done.prefix_hashes.size() % k;
  if (k > 1 && rest > 0 && rest >= partial_min) out.push_back(done.prefix_hashes.back());
  if (out.size() > done.block_table.size()) out.resize(done.block_table.size());
  return out;
}

Tier2Lack tier2_lack(std::span<const kv::BlockHash> q, uint32_t k, uint32_t matched,
                     bool partials) {
  RT_ASSERT(k >= 1 && matched <= q.size(), k, matched, q.size());
  Tier2Lack lack;
  lack.first = matched / k;
  lack.held = matched % k;
  const auto full = static_cast<uint32_t>(q.size() / k);
  lack.whole = full - std::min(full, lack.first);
  lack.partials = partials && k > 1;
  lack.trailing = lack.partials && q.size() % k != 0 && lack.whole > 0;
  return lack;
}

Tier2Ask tier2_ask(std::span<const kv::BlockHash> q, uint32_t k, const Tier2Lack& lack,
                   uint32_t ask) {
  RT_ASSERT(ask <= lack.positions(), ask, lack.positions());
  Tier2Ask out;
  kv::PrefixHashes p{q, k};
  for (uint32_t i = 0; i < std::min(ask, lack.whole); ++i) out.block_hashes.push_back(p.block(lack.first + i));
  if (lack.partials && ask > 0) {
    const size_t from = size_t{k} * lack.first;
    const size_t to = std::min(q.size(), size_t{k} * (lack.first + ask));
    out.sub_hashes.assign(q.begin() + static_cast<std::ptrdiff_t>(from),
                          q.begin() + static_cast<std::ptrdiff_t>(to));
    out.held = lack.held;
  }
  return out;
}

PrefillScheduler::PrefillScheduler(const PrefillConfig& config, kv::PrefixCache& cache)
    : config_(config), cache_(cache) {
  RT_ASSERT(config_.validate().ok(), config_.validate().error().describe());
  RT_ASSERT(cache_.block_tokens() == config_.block_tokens, cache_.block_tokens(),
            config_.block_tokens);
  requests_.reserve(size_t{config_.queue_max} + config_.held_max);
}

uint32_t PrefillScheduler::blocks_needed(const Request& r) const {
  auto tokens = static_cast<uint32_t>(r.input.tokens.size());
  return (tokens + config_.block_tokens - 1) / config_.block_tokens;
}

Status PrefillScheduler::submit(PrefillRequest request) {
  const std::string where = "prefill request " + std::to_string(request.id) + ": ";
  if (requests_.contains(request.id)) {
    return make_error(ErrorKind::invalid, where + "id already in use");
  }
  if (request.tokens.empty()) return make_error(ErrorKind::invalid, where + "empty prompt");
  const uint32_t sub_tokens = cache_.sub_block_tokens();
  size_t full_sub_blocks = request.tokens.size() / sub_tokens;
  if (request.prefix_hashes.size() != full_sub_blocks) {
    return make_error(ErrorKind::invalid,
                      where + std::to_string(request.prefix_hashes.size()) +
                          " prefix hashes for " + std::to_string(request.tokens.size()) +
                          " tokens (" + std::to_string(full_sub_blocks) + " full " +
                          std::to_string(sub_tokens) + "-token sub-blocks expected)");
  }
  size_t needed = (request.tokens.size() + config_.block_tokens - 1) / config_.block_tokens;
  if (needed > cache_.blocks_count()) {
    return make_error(ErrorKind::invalid, where + "needs " + std::to_string(needed) +
                                              " KV blocks, the pool has " +
                                              std::to_string(cache_.blocks_count()));
  }
  if (queue_.size() >= config_.queue_max) {
    return make_error(ErrorKind::overloaded,
                      where + "queue full (" + std::to_string(config_.queue_max) + ")");
  }
  RequestId id = request.id;
  Request r;
  auto tokens = static_cast<uint32_t>(request.tokens.size());
  uint32_t hit = std::min(cache_.match(request.prefix_hashes), (tokens - 1) / sub_tokens);
  r.input = std::move(request);
  set_pending(r, tokens - hit * sub_tokens);
  requests_.emplace(id, std::move(r));
  queue_.push_back(id);
  ++counters_.submitted_count;
  RT_ASSERT(queue_.size() <= config_.queue_max, queue_.size());
  return {};
}

bool PrefillScheduler::try_admit(Request& r) {
  RT_ASSERT(r.stage == PrefillStage::queued && r.blocks.empty(), r.input.id);
  const uint32_t k = cache_.sub_blocks_per_block();
  const uint32_t sub_tokens = cache_.sub_block_tokens();
  uint32_t needed = blocks_needed(r);
  std::span<const kv::BlockHash> hashes(r.input.prefix_hashes);
  // A fully cached prompt recomputes its last sub-block for the first token's logits.
  auto tokens = static_cast<uint32_t>(r.input.tokens.size());
  uint32_t matched = std::min(cache_.match(hashes), (tokens - 1) / sub_tokens);
  auto alloc = cache_.acquire(hashes.first(matched), needed - matched / k,
                              static_cast<uint32_t>(hashes.size()));
  if (!alloc) return false;  // overloaded: wait for blocks to come back
  r.blocks = std::move(alloc->cached);
  r.blocks.insert(r.blocks.end(), alloc->fresh.begin(), alloc->fresh.end());
  if (alloc->partial_source) {
    RT_ASSERT(!alloc->fresh.empty(), r.input.id);
    r.copy_source = alloc->partial_source;
  }
  r.committed_sub_blocks = matched;
  r.computed_tokens_count = matched * sub_tokens;
  r.cached_tokens_count = r.computed_tokens_count;
  r.stage = PrefillStage::running;
  set_pending(r, tokens - r.computed_tokens_count);
  counters_.cached_tokens_count += r.computed_tokens_count;
  RT_ASSERT(r.blocks.size() == needed, r.blocks.size(), needed);
  RT_ASSERT(r.computed_tokens_count < r.input.tokens.size(), r.input.id);
  return true;
}

void PrefillScheduler::add_chunk(Request& r, uint32_t tokens_count, PrefillPlan& plan) {
  RT_ASSERT(tokens_count > 0 && r.in_flight_tokens_count == 0, r.input.id);
  uint32_t start = r.computed_tokens_count;
  RT_ASSERT(start + tokens_count <= r.input.tokens.size(), start, tokens_count);
  PrefillChunk chunk;
  chunk.request = r.input.id;
  chunk.block_table = r.blocks;
  chunk.start_position = start;
  chunk.tokens.assign(r.input.tokens.begin() + start,
                      r.input.tokens.begin() + start + tokens_count);
  chunk.last = start + tokens_count == r.input.tokens.size();
  if (r.copy_source && !r.copy_in_flight) {
    // The partial hit's KV goes into the prompt's own block before anything is computed.
    chunk.copy = BlockCopy{*r.copy_source, r.blocks[start / config_.block_tokens]};
    r.copy_in_flight = true;
  }
  r.in_flight_tokens_count = tokens_count;
  plan.tokens_count += tokens_count;
  plan.chunks.push_back(std::move(chunk));
  in_flight_ids_.push_back(r.input.id);
}

std::optional<PrefillPlan> PrefillScheduler::plan_step() {
  RT_ASSERT(!in_flight_, "plan_step while step", step_id_, "is in flight");
  RT_ASSERT(in_flight_ids_.empty());
  PrefillPlan plan;
  uint32_t budget = config_.step_tokens_max;
  for (RequestId id : running_) {
    if (budget == 0) break;
    Request& r = requests_.at(id);
    auto remaining = static_cast<uint32_t>(r.input.tokens.size()) - r.computed_tokens_count;
    uint32_t take = std::min(remaining, budget);
    add_chunk(r, take, plan);
    budget -= take;
  }
  while (budget > 0 && !queue_.empty() && running_.size() < config_.running_max &&
         running_.size() + held_count_ < config_.held_max) {
    Request& r = requests_.at(queue_.front());
    if (!try_admit(r)) break;
    queue_.pop_front();
    running_.push_back(r.input.id);
    auto remaining = static_cast<uint32_t>(r.input.tokens.size()) - r.computed_tokens_count;
    uint32_t take = std::min(remaining, budget);
    add_chunk(r, take, plan);
    budget -= take;
  }
  if (plan.chunks.empty()) return std::nullopt;
  RT_ASSERT(plan.tokens_count <= config_.step_tokens_max, plan.tokens_count);
  plan.step_id = ++step_id_;
  in_flight_ = true;
  return plan;
}

void PrefillScheduler::commit_sub_blocks(Request& r) {
  r.committed_sub_blocks = cache_.commit_prefix(r.blocks, r.input.prefix_hashes,
                                                r.committed_sub_blocks, r.computed_tokens_count);
}

void PrefillScheduler::set_pending(Request& r, uint32_t tokens) {
  RT_ASSERT(pending_tokens_ >= r.pending_tokens_count, pending_tokens_, r.pending_tokens_count);
  pending_tokens_ = pending_tokens_ - r.pending_tokens_count + tokens;
  r.pending_tokens_count = tokens;
}

void PrefillScheduler::release_copy_source(Request& r) {
  if (!r.copy_source) return;
  cache_.release(std::span<const kv::BlockIndex>(&*r.copy_source, 1));
  r.copy_source.reset();
  r.copy_in_flight = false;
}

std::vector<PrefillDone> PrefillScheduler::on_step_done(uint64_t step_id, Nanos now) {
  RT_ASSERT(in_flight_, "on_step_done with no step in flight", step_id);
  RT_ASSERT(step_id == step_id_, step_id, step_id_);
  std::vector<PrefillDone> done;
  for (RequestId id : in_flight_ids_) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;  // cancelled while the step ran
    Request& r = it->second;
    RT_ASSERT(r.stage == PrefillStage::running && r.in_flight_tokens_count > 0, id);
    r.computed_tokens_count += r.in_flight_tokens_count;
    counters_.computed_tokens_count += r.in_flight_tokens_count;
    set_pending(r, static_cast<uint32_t>(r.input.tokens.size()) - r.computed_tokens_count);
    r.in_flight_tokens_count = 0;
    // The copy is done: the prompt's block holds the partial hit's KV, committed below.
    if (r.copy_in_flight) release_copy_source(r);
    commit_sub_blocks(r);
    if (r.computed_tokens_count < r.input.tokens.size()) continue;
    r.stage = PrefillStage::held;
    r.hold_deadline = now + std::chrono::duration_cast<Nanos>(config_.hold_timeout_ms);
    erase_running(id);
    ++held_count_;
    ++counters_.completed_count;
    done.push_back(PrefillDone{id, r.blocks, r.input.prefix_hashes,
                               static_cast<uint32_t>(r.input.tokens.size()),
                               r.cached_tokens_count, r.hold_deadline});
  }
  in_flight_ids_.clear();
  in_flight_ = false;
  RT_ASSERT(running_.size() + held_count_ <= config_.held_max, running_.size(), held_count_);
  return done;
}

void PrefillScheduler::release(Request& r) {
  // A copy in flight is still reading its source: only a cancel while the step runs can get
  // here with one, and the device finished the step before any later plan reuses a block
  // (the header's rule), so releasing now is safe.
  release_copy_source(r);
  cache_.release(r.blocks);
  r.blocks.clear();
}

void PrefillScheduler::erase_running(RequestId id) {
  auto it = std::find(running_.begin(), running_.end(), id);
  RT_ASSERT(it != running_.end(), id);
  running_.erase(it);
}

Status PrefillScheduler::pull_done(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.stage != PrefillStage::held) {
    return make_error(ErrorKind::not_found,
                      "prefill request " + std::to_string(id) + ": not holding blocks");
  }
  release(it->second);
  requests_.erase(it);
  RT_ASSERT(held_count_ > 0);
  --held_count_;
  ++counters_.pulled_count;
  return {};
}

std::vector<RequestId> PrefillScheduler::expire_holds(Nanos now) {
  std::vector<RequestId> expired;
  for (auto& [id, r] : requests_) {
    if (r.stage == PrefillStage::held && now > r.hold_deadline) expired.push_back(id);
  }
  std::sort(expired.begin(), expired.end());  // deterministic order for the shell's logs
  for (RequestId id : expired) {
    release(requests_.at(id));
    requests_.erase(id);
    --held_count_;
    ++counters_.expired_count;
  }
  RT_ASSERT(held_count_ <= config_.held_max, held_count_);
  return expired;
}

Status PrefillScheduler::cancel(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    return make_error(ErrorKind::not_found, "prefill request " + std::to_string(id) +
                                                ": unknown (finished, expired or never sent)");
  }
  Request& r = it->second;
  switch (r.stage) {
    case PrefillStage::queued: {
      auto q = std::find(queue_.begin(), queue_.end(), id);
      RT_ASSERT(q != queue_.end(), id);
      queue_.erase(q);
      RT_ASSERT(r.blocks.empty(), id);
      break;
    }
    case PrefillStage::running:
      erase_running(id);
      release(r);
      break;
    case PrefillStage::held:
      RT_ASSERT(held_count_ > 0);
      --held_count_;
      release(r);
      break;
  }
  set_pending(r, 0);
  requests_.erase(it);
  ++counters_.cancelled_count;
  return {};
}

std::optional<PrefillStage> PrefillScheduler::stage(RequestId id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) return std::nullopt;
  return it->second.stage;
}

void PrefillScheduler::check_invariants() const {
  uint32_t queued = 0, running = 0, held = 0;
  std::unordered_map<kv::BlockIndex, uint32_t> refs;
  for (const auto& [id, r] : requests_) {
    RT_ASSERT(r.input.id == id, id);
    if (r.stage == PrefillStage::queued) {
      ++queued;
      RT_ASSERT(r.blocks.empty(), id);
      continue;
    }
    r.stage == PrefillStage::running ? ++running : ++held;
    RT_ASSERT(r.blocks.size() == blocks_needed(r), id);
    RT_ASSERT(r.computed_tokens_count + r.in_flight_tokens_count <= r.input.tokens.size(), id);
    if (r.stage == PrefillStage::held) {
      RT_ASSERT(r.computed_tokens_count == r.input.tokens.size(), id);
    }
    for (kv::BlockIndex b : r.blocks) ++refs[b];
    if (r.copy_source) {
      RT_ASSERT(r.stage == PrefillStage::running, id);
      ++refs[*r.copy_source];
    }
  }
  RT_ASSERT(queued == queue_.size() && running == running_.size() && held == held_count_);
  RT_ASSERT(queue_.size() <= config_.queue_max && running_.size() <= config_.running_max);
  RT_ASSERT(running + held <= config_.held_max, running, held);
  // This scheduler is the cache's only user: its references are exactly the cache's.
  for (const auto& [block, count] : refs) {
    RT_ASSERT(cache_.ref_count(block) == count, block, count);
  }
  RT_ASSERT(refs.size() == cache_.blocks_used_count(), refs.size());
  uint64_t pending = 0;
  for (const auto& [id, r] : requests_) {
    RT_ASSERT(r.stage != PrefillStage::held || r.pending_tokens_count == 0, id);
    if (r.stage == PrefillStage::running) {
      RT_ASSERT(r.pending_tokens_count == r.input.tokens.size() - r.computed_tokens_count, id);
    }
    pending += r.pending_tokens_count;
  }
  RT_ASSERT(pending == pending_tokens_, pending, pending_tokens_);
  cache_.check_invariants();
}

}  // namespace tandem::prefill
