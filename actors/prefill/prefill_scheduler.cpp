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
  size_t full_blocks = request.tokens.size() / config_.block_tokens;
  if (request.block_hashes.size() != full_blocks) {
    return make_error(ErrorKind::invalid,
                      where + std::to_string(request.block_hashes.size()) + " block hashes for " +
                          std::to_string(request.tokens.size()) + " tokens (" +
                          std::to_string(full_blocks) + " full blocks expected)");
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
  r.input = std::move(request);
  requests_.emplace(id, std::move(r));
  queue_.push_back(id);
  ++counters_.submitted_count;
  RT_ASSERT(queue_.size() <= config_.queue_max, queue_.size());
  return {};
}

bool PrefillScheduler::try_admit(Request& r) {
  RT_ASSERT(r.stage == PrefillStage::queued && r.blocks.empty(), r.input.id);
  uint32_t needed = blocks_needed(r);
  std::span<const kv::BlockHash> hashes(r.input.block_hashes);
  uint32_t matched = cache_.match(hashes);
  // Fully cached prompt: recompute the last block to get the first token's logits.
  if (matched == needed) --matched;
  auto alloc = cache_.acquire(hashes.first(matched), needed - matched,
                              static_cast<uint32_t>(hashes.size()));
  if (!alloc) return false;  // overloaded: wait for blocks to come back
  r.blocks = std::move(alloc->cached);
  r.blocks.insert(r.blocks.end(), alloc->fresh.begin(), alloc->fresh.end());
  r.cached_blocks_count = matched;
  r.committed_blocks_count = matched;
  r.computed_tokens_count = matched * config_.block_tokens;
  r.stage = PrefillStage::running;
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

void PrefillScheduler::commit_full_blocks(Request& r) {
  auto full = std::min<uint32_t>(r.computed_tokens_count / config_.block_tokens,
                                 static_cast<uint32_t>(r.input.block_hashes.size()));
  for (uint32_t i = r.committed_blocks_count; i < full; ++i) {
    // duplicate or orphan: stays private
    (void)cache_.commit(r.blocks[i], r.input.block_hashes[i],
                        kv::chain_parent(r.input.block_hashes, i));
  }
  r.committed_blocks_count = std::max(r.committed_blocks_count, full);
  RT_ASSERT(r.committed_blocks_count <= r.blocks.size(), r.committed_blocks_count);
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
    r.in_flight_tokens_count = 0;
    commit_full_blocks(r);
    if (r.computed_tokens_count < r.input.tokens.size()) continue;
    r.stage = PrefillStage::held;
    r.hold_deadline = now + std::chrono::duration_cast<Nanos>(config_.hold_timeout_ms);
    erase_running(id);
    ++held_count_;
    ++counters_.completed_count;
    done.push_back(PrefillDone{id, r.blocks, r.input.block_hashes,
                               static_cast<uint32_t>(r.input.tokens.size()),
                               r.cached_blocks_count * config_.block_tokens, r.hold_deadline});
  }
  in_flight_ids_.clear();
  in_flight_ = false;
  RT_ASSERT(running_.size() + held_count_ <= config_.held_max, running_.size(), held_count_);
  return done;
}

void PrefillScheduler::release(Request& r) {
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
  }
  RT_ASSERT(queued == queue_.size() && running == running_.size() && held == held_count_);
  RT_ASSERT(queue_.size() <= config_.queue_max && running_.size() <= config_.running_max);
  RT_ASSERT(running + held <= config_.held_max, running, held);
  // This scheduler is the cache's only user: its references are exactly the cache's.
  for (const auto& [block, count] : refs) {
    RT_ASSERT(cache_.ref_count(block) == count, block, count);
  }
  RT_ASSERT(refs.size() == cache_.blocks_used_count(), refs.size());
  cache_.check_invariants();
}

}  // namespace tandem::prefill
