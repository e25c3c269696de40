#include "actors/decode/decode_scheduler.hpp"

#include <algorithm>
#include <string>
#include <unordered_set>

#include "runtime/base/assert.hpp"

namespace tandem::decode {
namespace {

Error invalid_key(const char* key, const std::string& why) {
  return make_error(ErrorKind::invalid, std::string("decode.") + key + ": " + why);
}

}  // namespace

std::string_view to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::eos:
      return "eos";
    case FinishReason::stop_token:
      return "stop_token";
    case FinishReason::max_tokens:
      return "max_tokens";
    case FinishReason::context_length:
      return "context_length";
    case FinishReason::failed:
      return "failed";
    case FinishReason::cancelled:
      return "cancelled";
  }
  return "?";
}

Status DecodeConfig::validate(uint32_t pool_blocks_count) const {
  if (block_tokens == 0) return invalid_key("block_tokens", "must be at least 1");
  if (waiting_max == 0) return invalid_key("waiting_max", "must be at least 1");
  if (seqs_max == 0) return invalid_key("seqs_max", "must be at least 1");
  if (step_tokens_max == 0) return invalid_key("step_tokens_max", "must be at least 1");
  if (max_model_tokens < 2) return invalid_key("max_model_tokens", "must be at least 2");
  uint32_t per_seq = (max_model_tokens + block_tokens - 1) / block_tokens;
  if (per_seq > pool_blocks_count) {
    return invalid_key("max_model_tokens",
                       "one sequence at full context needs " + std::to_string(per_seq) +
                           " KV blocks, the pool has " + std::to_string(pool_blocks_count));
  }
  return spec.validate();
}

DecodeScheduler::DecodeScheduler(const DecodeConfig& config, kv::PrefixCache& cache)
    : config_(config), cache_(cache) {
  auto valid = config_.validate(cache_.blocks_count());
  RT_ASSERT(valid.ok(), valid.ok() ? "" : valid.error().describe());
  RT_ASSERT(cache_.block_tokens() == config_.block_tokens, cache_.block_tokens());
  seqs_.reserve(size_t{config_.waiting_max} + config_.seqs_max);
  if (config_.spec.method != SpecMethod::none) {
    spec_shared_ = std::make_unique<SpecShared>(config_.spec);
  }
}

uint32_t DecodeScheduler::blocks_for(uint32_t tokens_count) const {
  return (tokens_count + config_.block_tokens - 1) / config_.block_tokens;
}

Status DecodeScheduler::submit(DecodeRequest request) {
  const std::string where = "decode sequence " + std::to_string(request.id) + ": ";
  auto fail = [&where](const std::string& why) {
    return make_error(ErrorKind::invalid, where + why);
  };
  if (seqs_.contains(request.id)) return fail("id already in use");
  if (request.prompt.empty()) return fail("empty prompt");
  if (request.prompt.size() >= config_.max_model_tokens) {
    return fail("prompt of " + std::to_string(request.prompt.size()) +
                " tokens leaves no room in the context of " +
                std::to_string(config_.max_model_tokens));
  }
  if (request.max_tokens == 0) return fail("max_tokens must be at least 1");
  size_t full_sub_blocks = request.prompt.size() / cache_.sub_block_tokens();
  if (request.prefix_hashes.size() != full_sub_blocks) {
    return fail(std::to_string(request.prefix_hashes.size()) + " prefix hashes for " +
                std::to_string(request.prompt.size()) + " tokens (" +
                std::to_string(full_sub_blocks) + " full " +
                std::to_string(cache_.sub_block_tokens()) + "-token sub-blocks expected)");
  }
  if (waiting_new_count_ >= config_.waiting_max) {
    return make_error(ErrorKind::overloaded,
                      where + "waiting queue full (" + std::to_string(config_.waiting_max) + ")");
  }
  SeqId id = request.id;
  Seq s;
  s.source = request.source;
  s.prompt_tokens_count = static_cast<uint32_t>(request.prompt.size());
  // The prompt becomes the token history without a copy; room for every token it may
  // generate, so appending never copies the (long) prompt either.
  s.tokens = std::move(request.prompt);
  s.tokens.reserve(
      std::min<size_t>(s.tokens.size() + request.max_tokens, config_.max_model_tokens));
  s.input = std::move(request);
  s.arrival = ++arrivals_;
  seqs_.emplace(id, std::move(s));
  waiting_.push_back(id);
  ++waiting_new_count_;
  ++counters_.submitted_count;
  RT_ASSERT(waiting_new_count_ <= config_.waiting_max, waiting_new_count_);
  return {};
}

DecodePlan DecodeScheduler::plan_step() {
  DecodePlan plan;
  plan_step(plan);
  return plan;
}

void DecodeScheduler::plan_step(DecodePlan& plan) {
  RT_ASSERT(!in_flight_, "plan_step while step", step_id_, "is in flight");
  RT_ASSERT(in_flight_ids_.empty());
  for (DecodeEntry& e : plan.entries) spare_entries_.push_back(std::move(e));
  RT_ASSERT(spare_entries_.size() <= size_t{config_.seqs_max} + config_.step_tokens_max,
            spare_entries_.size());
  plan.entries.clear();
  plan.pulls.clear();
  plan.preempted.clear();
  plan.tokens_count = 0;
  plan.step_id = 0;
  uint32_t budget = config_.step_tokens_max;
  plan_running(plan, budget);
  plan_prefilling(plan, budget);
  admit(plan, budget);
  RT_ASSERT(plan.tokens_count + budget == config_.step_tokens_max, plan.tokens_count);
  if (!plan.entries.empty()) {
    plan.step_id = ++step_id_;
    in_flight_ = true;
  }
}

void DecodeScheduler::active_insert(const Seq& s) {
  std::pair<uint64_t, SeqId> key{s.arrival, s.input.id};
  auto at = std::lower_bound(active_.begin(), active_.end(), key);
  RT_ASSERT(at == active_.end() || *at != key, s.input.id);
  active_.insert(at, key);
  RT_ASSERT(active_.size() <= config_.seqs_max, active_.size());
}

void DecodeScheduler::active_erase(const Seq& s) {
  std::pair<uint64_t, SeqId> key{s.arrival, s.input.id};
  auto at = std::lower_bound(active_.begin(), active_.end(), key);
  RT_ASSERT(at != active_.end() && *at == key, s.input.id);
  active_.erase(at);
}

void DecodeScheduler::plan_running(DecodePlan& plan, uint32_t& budget) {
  // A snapshot: preemptions below take sequences out of active_.
  order_scratch_.clear();
  for (const auto& [arrival, id] : active_) order_scratch_.push_back(id);
  size_t first_entry = plan.entries.size();
  for (SeqId id : order_scratch_) {
    if (budget == 0) break;
    auto it = seqs_.find(id);
    if (it == seqs_.end() || it->second.stage != SeqStage::running) continue;  // preempted
    Seq& s = it->second;
    if (!grow_or_preempt(s, plan)) continue;  // s itself was preempted
    add_entry(s, 1, true, plan);
    budget -= 1;
  }
  if (spec_shared_) plan_drafts(plan, first_entry, budget);
}

void DecodeScheduler::plan_drafts(DecodePlan& plan, size_t first_entry, uint32_t& budget) {
  size_t running = plan.entries.size() - first_entry;
  if (running == 0 || budget == 0) return;
  if (running > config_.spec.batch_max) {
    ++counters_.spec_batch_off_steps;
    return;
  }
  for (size_t i = first_entry; i < plan.entries.size() && budget > 0; ++i) {
    DecodeEntry& e = plan.entries[i];
    Seq& s = seqs_.at(e.seq);
    if (!s.input.speculate) continue;
    if (!s.drafter) s.drafter = std::make_unique<Drafter>(config_.spec, *spec_shared_);
    if (s.drafter->context_size() < s.tokens.size()) {
      s.drafter->append(std::span<const TokenId>(s.tokens).subspan(s.drafter->context_size()));
    }
    // Never past max_tokens or the context: the step emits accepted + 1 tokens.
    auto tokens = static_cast<uint32_t>(s.tokens.size());
    uint32_t room = std::min(config_.max_model_tokens - tokens,
                             s.input.max_tokens - s.generated_count);
    if (room <= 1) continue;
    std::vector<TokenId> drafts =
        s.drafter->propose(std::min(budget, room - 1), static_cast<uint32_t>(running));
    if (!drafts.empty()) add_drafts(s, e, std::move(drafts), plan);
    budget -= e.draft_tokens_count;
  }
}

void DecodeScheduler::model_draft_wants(std::vector<DraftWant>& out) {
  out.clear();
  if (config_.spec.method != SpecMethod::eagle3) return;
  uint32_t running = 0;
  for (const auto& [arrival, id] : active_) running += seqs_.at(id).stage == SeqStage::running;
  if (running == 0 || running > config_.spec.batch_max) return;
  for (const auto& [arrival, id] : active_) {
    Seq& s = seqs_.at(id);
    if (s.stage != SeqStage::running || !s.input.speculate) continue;
    if (!s.drafter) s.drafter = std::make_unique<Drafter>(config_.spec, *spec_shared_);
    auto tokens = static_cast<uint32_t>(s.tokens.size());
    uint32_t room = std::min(config_.max_model_tokens - tokens,
                             s.input.max_tokens - s.generated_count);
    if (room <= 1) continue;
    uint32_t want = s.drafter->model_tokens_wanted(room - 1, running);
    if (want > 0) out.push_back({id, want});
  }
  RT_ASSERT(out.size() <= active_.size(), "one want per running sequence");
}

void DecodeScheduler::set_model_drafts(SeqId seq, std::vector<TokenId> drafts) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second.stage != SeqStage::running || !it->second.drafter) return;
  Seq& s = it->second;
  if (s.drafter->context_size() < s.tokens.size()) {
    s.drafter->append(std::span<const TokenId>(s.tokens).subspan(s.drafter->context_size()));
  }
  s.drafter->set_model_drafts(std::move(drafts));
}

void DecodeScheduler::add_drafts(Seq& s, DecodeEntry& e, std::vector<TokenId> drafts,
                                 DecodePlan& plan) {
  RT_ASSERT(s.in_flight_tokens_count == 1 && e.tokens.size() == 1, s.input.id);
  // Blocks for positions [computed, computed + 1 + d): free or evictable ones only.
  auto d = static_cast<uint32_t>(drafts.size());
  uint32_t needed = blocks_for(s.computed_tokens_count + 1 + d);
  while (s.blocks.size() < needed) {
    auto alloc = cache_.acquire({}, 1);
    if (!alloc) break;
    s.blocks.push_back(alloc->fresh[0]);
    e.block_table.push_back(alloc->fresh[0]);
  }
  uint32_t fits = static_cast<uint32_t>(s.blocks.size()) * config_.block_tokens -
                  (s.computed_tokens_count + 1);
  drafts.resize(std::min(d, fits));
  d = static_cast<uint32_t>(drafts.size());
  if (d == 0) return;
  e.tokens.insert(e.tokens.end(), drafts.begin(), drafts.end());
  e.draft_tokens_count = d;
  s.in_flight_tokens_count += d;
  s.in_flight_drafts_count = d;
  s.in_flight_drafts = std::move(drafts);
  plan.tokens_count += d;
}

bool DecodeScheduler::on_verified(Seq& s, uint32_t d, std::span<const TokenId> found) {
  RT_ASSERT(d > 0 && !found.empty() && found.size() <= size_t{d} + 1, s.input.id);
  auto accepted = static_cast<uint32_t>(found.size()) - 1;
  if (!std::equal(found.begin(), found.begin() + accepted, s.in_flight_drafts.begin())) {
    return false;
  }
  ++counters_.spec_drafts_count;
  counters_.spec_draft_tokens_count += d;
  counters_.spec_accepted_tokens_count += accepted;
  for (uint32_t i = 0; i < accepted && i < counters_.spec_accepted_at.size(); ++i) {
    ++counters_.spec_accepted_at[i];
  }
  if (s.drafter) s.drafter->on_verified(d, accepted);
  return true;
}

bool DecodeScheduler::grow_or_preempt(Seq& s, DecodePlan& plan) {
  RT_ASSERT(s.stage == SeqStage::running, s.input.id);
  RT_ASSERT(s.computed_tokens_count + 1 == s.tokens.size(), s.input.id);
  uint32_t needed = blocks_for(s.computed_tokens_count + 1);
  while (s.blocks.size() < needed) {
    auto alloc = cache_.acquire({}, 1);
    if (alloc) {
      s.blocks.push_back(alloc->fresh[0]);
      continue;
    }
    // The newest sequence holding blocks that is not being pulled into gives them up.
    Seq* victim = nullptr;
    for (auto it = active_.rbegin(); it != active_.rend() && victim == nullptr; ++it) {
      Seq& candidate = seqs_.at(it->second);
      if (candidate.stage != SeqStage::pulling) victim = &candidate;
    }
    RT_ASSERT(victim != nullptr, "no preemptible sequence although", s.input.id, "runs");
    bool self = victim == &s;
    preempt(*victim, plan);
    if (self) return false;
  }
  RT_ASSERT(s.blocks.size() == needed, s.blocks.size(), needed);
  return true;
}

void DecodeScheduler::preempt(Seq& victim, DecodePlan& plan) {
  RT_ASSERT(victim.stage == SeqStage::running || victim.stage == SeqStage::prefilling,
            victim.input.id);
  RT_ASSERT(victim.in_flight_tokens_count == 0, "preempting a planned sequence", victim.input.id);
  cache_.release(victim.blocks);
  victim.blocks.clear();
  victim.drafter.reset();  // rebuilt when it runs again (drafters stay <= seqs_max)
  active_erase(victim);
  victim.stage = SeqStage::waiting;
  victim.source = KvSource::local;  // recompute locally: the prefill hold is gone
  victim.computed_tokens_count = 0;
  victim.cached_blocks_count = 0;
  victim.committed_sub_blocks = 0;
  waiting_.push_front(victim.input.id);
  --active_count_;
  ++counters_.preemptions_count;
  plan.preempted.push_back(victim.input.id);
}

void DecodeScheduler::plan_prefilling(DecodePlan& plan, uint32_t& budget) {
  for (const auto& [arrival, id] : active_) {  // add_entry leaves active_ unchanged
    if (budget == 0) break;
    Seq& s = seqs_.at(id);
    if (s.stage != SeqStage::prefilling) continue;
    auto remaining = static_cast<uint32_t>(s.tokens.size()) - s.computed_tokens_count;
    uint32_t take = std::min(remaining, budget);
    add_entry(s, take, take == remaining, plan);
    budget -= take;
  }
}

void DecodeScheduler::admit(DecodePlan& plan, uint32_t& budget) {
  while (!waiting_.empty() && active_count_ < config_.seqs_max) {
    Seq& s = seqs_.at(waiting_.front());
    // A local prefill needs budget this step; a pull does not.
    if (s.source == KvSource::local && budget == 0) break;
    if (!try_admit(s, plan)) break;  // the pool is full: FIFO, wait
    waiting_.pop_front();
    if (!s.admitted_once) --waiting_new_count_;
    s.admitted_once = true;
    ++active_count_;
    if (s.stage != SeqStage::prefilling) continue;
    auto remaining = static_cast<uint32_t>(s.tokens.size()) - s.computed_tokens_count;
    uint32_t take = std::min(remaining, budget);
    add_entry(s, take, take == remaining, plan);
    budget -= take;
  }
  RT_ASSERT(active_count_ <= config_.seqs_max, active_count_);
}

bool DecodeScheduler::try_admit(Seq& s, DecodePlan& plan) {
  RT_ASSERT(s.stage == SeqStage::waiting && s.blocks.empty(), s.input.id);
  auto tokens = static_cast<uint32_t>(s.tokens.size());
  uint32_t needed = blocks_for(tokens);
  const uint32_t k = cache_.sub_blocks_per_block();
  std::span<const kv::BlockHash> hashes(s.input.prefix_hashes);
  // Whole blocks only: a pull reads whole blocks (a partial block would be read anyway).
  uint32_t matched = cache_.match(hashes) / k;
  // A local prefill must compute at least the last block to sample from it.
  if (s.source == KvSource::local && matched == needed) --matched;
  auto alloc = cache_.acquire(hashes.first(size_t{matched} * k), needed - matched,
                              static_cast<uint32_t>(hashes.size()));
  if (!alloc) return false;
  RT_ASSERT(!alloc->partial_source, s.input.id);
  s.blocks = std::move(alloc->cached);
  s.blocks.insert(s.blocks.end(), alloc->fresh.begin(), alloc->fresh.end());
  s.cached_blocks_count = matched;
  s.committed_sub_blocks = matched * k;
  active_insert(s);
  if (s.source == KvSource::pull) {
    s.stage = SeqStage::pulling;
    PullOrder order{s.input.id, s.blocks, {}};
    for (uint32_t i = matched; i < needed; ++i) order.pull_block_indexes.push_back(i);
    plan.pulls.push_back(std::move(order));
  } else {
    s.stage = SeqStage::prefilling;
    s.computed_tokens_count = matched * config_.block_tokens;
  }
  RT_ASSERT(s.blocks.size() == needed, s.blocks.size(), needed);
  return true;
}

void DecodeScheduler::add_entry(Seq& s, uint32_t tokens_count, bool sample, DecodePlan& plan) {
  RT_ASSERT(tokens_count > 0 && s.in_flight_tokens_count == 0, s.input.id);
  uint32_t start = s.computed_tokens_count;
  RT_ASSERT(start + tokens_count <= s.tokens.size(), start, tokens_count);
  RT_ASSERT(blocks_for(start + tokens_count) <= s.blocks.size(), s.input.id);
  DecodeEntry e;
  if (!spare_entries_.empty()) {  // reuse a previous step's vectors
    e = std::move(spare_entries_.back());
    spare_entries_.pop_back();
  }
  e.seq = s.input.id;
  e.block_table.assign(s.blocks.begin(), s.blocks.end());
  e.start_position = start;
  e.tokens.assign(s.tokens.begin() + start, s.tokens.begin() + start + tokens_count);
  e.draft_tokens_count = 0;
  e.sample = sample;
  s.in_flight_tokens_count = tokens_count;
  s.in_flight_sample = sample;
  s.in_flight_drafts_count = e.draft_tokens_count;
  plan.tokens_count += tokens_count;
  plan.entries.push_back(std::move(e));
  in_flight_ids_.push_back(s.input.id);
}

std::optional<FinishReason> DecodeScheduler::append_tokens(Seq& s, std::span<const TokenId> tokens,
                                                           SeqUpdate& update) {
  RT_ASSERT(!tokens.empty(), s.input.id);
  for (TokenId t : tokens) {
    s.tokens.push_back(t);
    ++s.generated_count;
    ++counters_.generated_tokens_count;
    update.tokens.push_back(t);
    const auto& stops = s.input.stop_token_ids;
    if (s.input.eos_token && t == *s.input.eos_token) return FinishReason::eos;
    if (std::find(stops.begin(), stops.end(), t) != stops.end()) {
      return FinishReason::stop_token;
    }
    if (s.generated_count >= s.input.max_tokens) return FinishReason::max_tokens;
    if (s.tokens.size() >= config_.max_model_tokens) return FinishReason::context_length;
  }
  RT_ASSERT(s.generated_count < s.input.max_tokens, s.input.id);
  return std::nullopt;
}

void DecodeScheduler::commit_prompt_blocks(Seq& s) {
  s.committed_sub_blocks = cache_.commit_prefix(s.blocks, s.input.prefix_hashes,
                                                s.committed_sub_blocks, s.computed_tokens_count);
}

std::vector<SeqUpdate> DecodeScheduler::on_step_result(uint64_t step_id,
                                                       std::span<const SampledTokens> sampled) {
  std::vector<SeqUpdate> updates;
  on_step_result(step_id, sampled, updates);
  return updates;
}

// The first result for `id` in `sampled` (sampled_index_ must index it), or nullptr.
const SampledTokens* DecodeScheduler::sampled_for(SeqId id,
                                                  std::span<const SampledTokens> sampled) const {
  auto at = std::lower_bound(sampled_index_.begin(), sampled_index_.end(),
                             std::pair<SeqId, size_t>{id, 0});
  if (at == sampled_index_.end() || at->first != id) return nullptr;
  RT_ASSERT(at->second < sampled.size(), at->second);
  return &sampled[at->second];
}

void DecodeScheduler::on_step_result(uint64_t step_id, std::span<const SampledTokens> sampled,
                                     std::vector<SeqUpdate>& updates) {
  RT_ASSERT(in_flight_, "on_step_result with no step in flight", step_id);
  RT_ASSERT(step_id == step_id_, step_id, step_id_);
  for (SeqUpdate& u : updates) spare_updates_.push_back(std::move(u));
  RT_ASSERT(spare_updates_.size() <= size_t{config_.seqs_max} + config_.step_tokens_max,
            spare_updates_.size());
  updates.clear();
  sampled_index_.clear();
  for (size_t i = 0; i < sampled.size(); ++i) sampled_index_.emplace_back(sampled[i].seq, i);
  std::sort(sampled_index_.begin(), sampled_index_.end());
  for (size_t i = 1; i < sampled_index_.size(); ++i) {  // repeated: the first one counts
    if (sampled_index_[i].first == sampled_index_[i - 1].first) ++counters_.bad_results_count;
  }
  finishing_.clear();
  for (SeqId id : in_flight_ids_) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) continue;  // cancelled while the step ran
    Seq& s = it->second;
    uint32_t fed = s.in_flight_tokens_count;
    bool sample = s.in_flight_sample;
    uint32_t drafts = s.in_flight_drafts_count;
    uint32_t sampled_max = 1 + drafts;  // the next token + accepted drafts
    s.in_flight_drafts_count = 0;
    s.in_flight_tokens_count = 0;
    s.in_flight_sample = false;
    // Drafts: the KV of the last token and of the accepted drafts is kept (below).
    s.computed_tokens_count += fed - drafts;
    if (s.stage == SeqStage::prefilling) {
      counters_.prefill_tokens_count += fed;
      commit_prompt_blocks(s);
    }
    const SampledTokens* found = sampled_for(id, sampled);
    if (!sample) {
      if (found != nullptr) ++counters_.bad_results_count;
      continue;
    }
    SeqUpdate update;
    if (!spare_updates_.empty()) {  // reuse a previous step's token vector
      update = std::move(spare_updates_.back());
      spare_updates_.pop_back();
    }
    update.seq = id;
    update.tokens.clear();
    update.finished.reset();
    bool valid = found != nullptr && !found->tokens.empty() && found->tokens.size() <= sampled_max;
    if (valid && drafts > 0) {
      valid = on_verified(s, drafts, found->tokens);
      if (valid) {
        s.computed_tokens_count += static_cast<uint32_t>(found->tokens.size()) - 1;
        // The blocks that hold only rejected positions go back to the pool.
        uint32_t keep = blocks_for(s.computed_tokens_count + 1);
        if (s.blocks.size() > keep) {
          cache_.release(std::span<const kv::BlockIndex>(s.blocks).subspan(keep));
          s.blocks.resize(keep);
        }
      }
    }
    s.in_flight_drafts.clear();
    if (valid && drafts == 0 && s.drafter && s.stage == SeqStage::running) {
      s.drafter->observe(found->tokens[0]);
    }
    if (!valid) {
      ++counters_.bad_results_count;
      update.finished = FinishReason::failed;
    } else {
      if (s.stage == SeqStage::prefilling) s.stage = SeqStage::running;
      update.finished = append_tokens(s, found->tokens, update);
    }
    if (update.finished) finishing_.emplace_back(id, *update.finished);
    updates.push_back(std::move(update));
  }
  in_flight_ids_.clear();
  in_flight_ = false;
  for (const auto& [id, reason] : finishing_) finish(id, reason);
}

Result<SeqUpdate> DecodeScheduler::on_pull_done(SeqId seq, bool ok, TokenId first_token) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second.stage != SeqStage::pulling) {
    return make_error(ErrorKind::not_found,
                      "decode sequence " + std::to_string(seq) + ": no pull in progress");
  }
  Seq& s = it->second;
  SeqUpdate update{seq, {}, std::nullopt};
  if (s.cancel_pending) {
    update.finished = FinishReason::cancelled;
    finish(seq, FinishReason::cancelled);
    return update;
  }
  if (!ok) {
    // Local fallback: keep the blocks; compute what was not cached.
    ++counters_.pull_failures_count;
    s.stage = SeqStage::prefilling;
    s.source = KvSource::local;
    s.computed_tokens_count = s.cached_blocks_count * config_.block_tokens;
    if (s.computed_tokens_count == s.tokens.size()) s.computed_tokens_count -= config_.block_tokens;
    return update;
  }
  s.computed_tokens_count = static_cast<uint32_t>(s.tokens.size());
  commit_prompt_blocks(s);
  s.stage = SeqStage::running;
  update.finished = append_tokens(s, std::span<const TokenId>(&first_token, 1), update);
  RT_ASSERT(s.computed_tokens_count + 1 == s.tokens.size(), seq);
  if (update.finished) finish(seq, *update.finished);
  return update;
}

Status DecodeScheduler::cancel(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return make_error(ErrorKind::not_found, "decode sequence " + std::to_string(seq) +
                                                ": unknown (finished or never sent)");
  }
  Seq& s = it->second;
  if (s.stage == SeqStage::pulling) {
    s.cancel_pending = true;  // the RMA may still write the blocks: free on on_pull_done
    return {};
  }
  finish(seq, FinishReason::cancelled);
  return {};
}

void DecodeScheduler::finish(SeqId id, FinishReason reason) {
  auto it = seqs_.find(id);
  RT_ASSERT(it != seqs_.end(), id);
  Seq& s = it->second;
  RT_ASSERT(s.in_flight_tokens_count == 0 || reason == FinishReason::cancelled, id);
  if (s.stage == SeqStage::waiting) {
    auto w = std::find(waiting_.begin(), waiting_.end(), id);
    RT_ASSERT(w != waiting_.end(), id);
    waiting_.erase(w);
    if (!s.admitted_once) --waiting_new_count_;
  } else {
    RT_ASSERT(active_count_ > 0, id);
    --active_count_;
    cache_.release(s.blocks);
    active_erase(s);
  }
  if (spec_shared_ && reason != FinishReason::failed && s.generated_count > 0) {
    spec_shared_->add_output(std::vector<TokenId>(s.tokens.begin() + s.prompt_tokens_count,
                                                  s.tokens.end()));
  }
  seqs_.erase(it);
  ++counters_.finished_count;
}

std::optional<SeqStage> DecodeScheduler::stage(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return std::nullopt;
  return it->second.stage;
}

void DecodeScheduler::check_invariants() const {
  uint32_t waiting = 0, waiting_new = 0, active = 0;
  std::unordered_map<kv::BlockIndex, uint32_t> refs;
  for (const auto& [id, s] : seqs_) {
    RT_ASSERT(s.input.id == id && s.tokens.size() == s.prompt_tokens_count + s.generated_count);
    RT_ASSERT(s.tokens.size() <= config_.max_model_tokens, id);
    RT_ASSERT(s.generated_count < s.input.max_tokens || s.input.max_tokens == 0, id);
    bool in_flight = s.in_flight_tokens_count > 0;
    switch (s.stage) {
      case SeqStage::waiting:
        ++waiting;
        waiting_new += s.admitted_once ? 0 : 1;
        RT_ASSERT(s.blocks.empty() && s.computed_tokens_count == 0 && !in_flight, id);
        continue;
      case SeqStage::pulling:
        RT_ASSERT(s.blocks.size() == blocks_for(static_cast<uint32_t>(s.tokens.size())), id);
        RT_ASSERT(!in_flight, id);
        break;
      case SeqStage::prefilling:
        RT_ASSERT(s.blocks.size() == blocks_for(static_cast<uint32_t>(s.tokens.size())), id);
        RT_ASSERT(s.computed_tokens_count < s.tokens.size(), id);
        break;
      case SeqStage::running:
        RT_ASSERT(s.computed_tokens_count + 1 == s.tokens.size(), id);
        RT_ASSERT(s.blocks.size() * config_.block_tokens >=
                      s.computed_tokens_count + s.in_flight_tokens_count,
                  id);
        RT_ASSERT(s.in_flight_drafts.size() == s.in_flight_drafts_count, id);
        // Blocks beyond the next token's are drafts' only, and only while they are in flight.
        RT_ASSERT(in_flight || s.blocks.size() <= blocks_for(s.computed_tokens_count + 1), id);
        break;
    }
    ++active;
    RT_ASSERT(!s.cancel_pending || s.stage == SeqStage::pulling, id);
    for (kv::BlockIndex b : s.blocks) ++refs[b];
  }
  RT_ASSERT(waiting == waiting_.size() && waiting_new == waiting_new_count_, waiting);
  RT_ASSERT(active == active_count_ && active_count_ <= config_.seqs_max, active);
  RT_ASSERT(active_.size() == active_count_, active_.size());
  RT_ASSERT(std::is_sorted(active_.begin(), active_.end()));
  for (const auto& [arrival, id] : active_) {
    auto it = seqs_.find(id);
    RT_ASSERT(it != seqs_.end() && it->second.arrival == arrival, id);
    RT_ASSERT(it->second.stage != SeqStage::waiting, id);
  }
  RT_ASSERT(waiting_new_count_ <= config_.waiting_max, waiting_new_count_);
  for (const auto& [block, count] : refs) {
    RT_ASSERT(cache_.ref_count(block) == count, block, count);
  }
  RT_ASSERT(refs.size() == cache_.blocks_used_count(), refs.size());
  cache_.check_invariants();
}

}  // namespace tandem::decode
