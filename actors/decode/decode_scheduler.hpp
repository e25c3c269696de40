// The decode scheduler: continuous batching over the decode instance's KV pool.
// A pure core: no threads, clocks or I/O.
//
// A sequence moves through:
//   waiting     submitted (or preempted), FIFO, no blocks; at most waiting_max new ones;
//   pulling     (source pull) blocks allocated for the prompt; the leading blocks already in
//               the local prefix cache are reused, the others are read from the prefill
//               instance by the shell (RMA). on_pull_done(ok) -> running with the first token
//               prefill sampled; on_pull_done(!ok) -> prefilling (local fallback);
//   prefilling  (source local, a failed pull, or a preempted sequence being recomputed) the
//               prompt (plus tokens generated before a preemption) is computed in chunks under
//               the step token budget; the final chunk samples the next token -> running;
//   running     one token per step, plus up to k draft tokens when speculating (below); a
//               new block is allocated when the sequence crosses a block boundary;
//   finished    EOS, a stop token id, max_tokens, the context length, a malformed step
//               result, or cancel: its blocks are released and it is forgotten.
// Stop STRINGS are the gateway's business (detokenized text): it cancels the sequence.
//
// Speculation (config.spec, drafter.hpp): after every running sequence has its one token, the
// budget left goes to drafts, oldest sequence first, when at most spec.batch_max sequences
// run and the request allows it. A sequence's draft (its Drafter's proposal, at most k, never
// past max_tokens or the context) rides its entry: tokens = {last, d_1..d_d},
// draft_tokens_count = d, and blocks are grown to hold them from the pool's free or evictable
// blocks only (drafts never preempt; a draft is cut to the blocks it got). The result holds
// the accepted drafts (they must equal the planned ones) and one more token; the KV of the
// rejected positions is stale and the blocks holding only them go back to the pool at once.
// A sequence's drafter is created when it first runs and dropped when it is preempted or
// finishes, so drafters never outnumber seqs_max.
//
// Every step: running sequences first, oldest first (1 token each, then drafts); then
// prefilling chunks, oldest first; then admission from the waiting queue while sequences
// holding blocks < seqs_max and the budget lasts. Admission never preempts and is FIFO.
// When a running sequence needs a block and the pool (free + evictable) is empty, the NEWEST
// sequence holding blocks (running or prefilling; never one being pulled into) is preempted:
// its blocks are released and it goes to the front of the waiting queue, to be recomputed
// locally later (its generated tokens are kept and not streamed again).
//
// Protocol with the shell (the decode actor):
//   plan = plan_step();  start plan.pulls (RMA); run plan.entries on the Device if any;
//   updates = on_step_result(plan.step_id, sampled)  (only when plan.entries is non-empty);
//   on_pull_done(seq, ok, first_token) when a pull ends.
// A pulling sequence that is cancelled keeps its blocks until on_pull_done (the RMA may still
// be writing them); every other cancel releases at once.
//
// Not thread-safe: one owning actor. The PrefixCache outlives the scheduler and is used by it
// alone.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "actors/decode/drafter.hpp"
#include "kvstore/block_hash.hpp"
#include "kvstore/prefix_cache.hpp"
#include "runtime/base/result.hpp"

namespace tandem::decode {

using SeqId = uint64_t;
using TokenId = int32_t;

struct DecodeConfig {
  uint32_t block_tokens = 16;       // KV block size, tokens (must equal the cache's)
  uint32_t waiting_max = 256;       // newly submitted sequences waiting for admission
  uint32_t seqs_max = 64;           // sequences holding blocks (pulling + prefilling + running)
  uint32_t step_tokens_max = 512;   // tokens per step: decode tokens + local prefill chunks
  uint32_t max_model_tokens = 256;  // context length, tokens (prompt + generated)
  SpecConfig spec;                  // method none: no speculation
  // Errors: invalid, naming the key, when a limit is 0, one sequence at full context would
  // not fit in a pool of pool_blocks_count blocks, or spec is invalid.
  Status validate(uint32_t pool_blocks_count) const;
};

enum class KvSource { pull, local };
enum class SeqStage { waiting, pulling, prefilling, running };
enum class FinishReason { eos, stop_token, max_tokens, context_length, failed, cancelled };
std::string_view to_string(FinishReason reason);

struct DecodeRequest {
  SeqId id = 0;
  std::vector<TokenId> prompt;              // >= 1 token, < max_model_tokens
  // One per FULL sub-block of the prompt (the cache's sub_block_tokens; one per block when
  // it matches whole blocks): kvstore/prefix_cache.hpp. Decode reuses whole cached blocks
  // (a pull reads whole blocks) and caches every full sub-block of the prompt.
  std::vector<kv::BlockHash> prefix_hashes;
  uint32_t max_tokens = 16;                 // tokens to generate, >= 1
  std::optional<TokenId> eos_token;
  std::vector<TokenId> stop_token_ids;
  KvSource source = KvSource::local;
  bool speculate = true;  // false: never drafts (the request turned speculation off)
};

// Read these prompt blocks from the prefill instance into the given local blocks.
struct PullOrder {
  SeqId seq = 0;
  std::vector<kv::BlockIndex> block_table;   // every prompt block, in order
  std::vector<uint32_t> pull_block_indexes;  // positions in block_table to fill by RMA
};

struct DecodeEntry {
  SeqId seq = 0;
  std::vector<kv::BlockIndex> block_table;
  uint32_t start_position = 0;      // position of tokens[0]
  std::vector<TokenId> tokens;      // decode: the last sampled token; prefill: a chunk
  uint32_t draft_tokens_count = 0;  // trailing draft tokens in `tokens` (0: none this step)
  bool sample = false;              // sample after the last token (decode, or final chunk)
};

struct DecodePlan {
  uint64_t step_id = 0;  // 0 when entries is empty (no device step)
  std::vector<DecodeEntry> entries;
  uint32_t tokens_count = 0;     // <= step_tokens_max
  std::vector<PullOrder> pulls;  // start these now
  std::vector<SeqId> preempted;  // for logs and metrics
};

struct SampledTokens {
  SeqId seq = 0;
  std::vector<TokenId> tokens;  // 1 + accepted drafts, <= entry tokens count
};

// What to stream for one sequence.
struct SeqUpdate {
  SeqId seq = 0;
  std::vector<TokenId> tokens;  // new tokens, in order (may be empty when finishing)
  std::optional<FinishReason> finished;
};

struct DecodeCounters {
  uint64_t submitted_count = 0;
  uint64_t finished_count = 0;
  uint64_t preemptions_count = 0;
  uint64_t pull_failures_count = 0;  // pulls that fell back to local prefill
  uint64_t bad_results_count = 0;    // malformed or missing sampled tokens
  uint64_t generated_tokens_count = 0;
  uint64_t prefill_tokens_count = 0;  // computed locally, incl. recompute
  // Speculation: entries that carried drafts and were verified, their draft tokens, the
  // accepted ones, and per draft position i the entries whose draft i was accepted.
  static constexpr size_t spec_positions_max = 16;
  uint64_t spec_drafts_count = 0;
  uint64_t spec_draft_tokens_count = 0;
  uint64_t spec_accepted_tokens_count = 0;
  std::array<uint64_t, spec_positions_max> spec_accepted_at{};
  uint64_t spec_batch_off_steps = 0;  // steps with more than spec.batch_max running
};

class DecodeScheduler {
 public:
  // Preconditions (asserted): config.validate(cache.blocks_count()) ok; block sizes agree.
  DecodeScheduler(const DecodeConfig& config, kv::PrefixCache& cache);

  // Errors: invalid (duplicate id, empty prompt, no room in the context, max_tokens 0,
  // wrong number of hashes); overloaded (waiting_max new sequences already wait).
  Status submit(DecodeRequest request);
  // Precondition (asserted): no step in flight.
  DecodePlan plan_step();
  // The same, into `plan` (overwritten). Pass the previous plan back: its entries' vectors
  // are reused, so a warm step allocates nothing (the simulator's hot path).
  void plan_step(DecodePlan& plan);
  // Precondition (asserted): step_id is the step in flight. Malformed or missing results
  // finish their sequence with FinishReason::failed; results for unknown ids are ignored.
  std::vector<SeqUpdate> on_step_result(uint64_t step_id, std::span<const SampledTokens> sampled);
  // The same, into `updates` (overwritten; its elements' storage is reused).
  void on_step_result(uint64_t step_id, std::span<const SampledTokens> sampled,
                      std::vector<SeqUpdate>& updates);
  // The pull of `seq` ended. ok: running, first_token is streamed; !ok: local prefill.
  // Errors: not_found when `seq` is not pulling.
  Result<SeqUpdate> on_pull_done(SeqId seq, bool ok, TokenId first_token);
  // Errors: not_found when unknown.
  Status cancel(SeqId seq);

  // spec.method eagle3 (drafts from a draft model beside the device). After on_step_result:
  // the running sequences that speculate, each with how many draft tokens to ask of the
  // model for its next step (Drafter::model_tokens_wanted, within max_tokens and the
  // context). Empty for other methods, and when more than spec.batch_max sequences run.
  struct DraftWant {
    SeqId seq = 0;
    uint32_t tokens = 0;  // >= 1
  };
  void model_draft_wants(std::vector<DraftWant>& out);
  // The draft model's tokens for `seq`, proposed for its next step (stale once it gets
  // another token). Ignored unless seq is running with a drafter.
  void set_model_drafts(SeqId seq, std::vector<TokenId> drafts);

  std::optional<SeqStage> stage(SeqId seq) const;
  uint32_t waiting_count() const { return static_cast<uint32_t>(waiting_.size()); }
  uint32_t active_count() const { return active_count_; }  // holding blocks
  bool step_in_flight() const { return in_flight_; }
  const DecodeCounters& counters() const { return counters_; }
  void check_invariants() const;  // O(sequences + blocks), RT_ASSERT; for tests

 private:
  struct Seq {
    DecodeRequest input;  // its prompt is moved into `tokens` (empty here)
    uint32_t prompt_tokens_count = 0;
    SeqStage stage = SeqStage::waiting;
    KvSource source = KvSource::local;
    std::vector<TokenId> tokens;  // prompt + generated
    uint32_t generated_count = 0;
    std::vector<kv::BlockIndex> blocks;
    uint32_t computed_tokens_count = 0;  // KV present for tokens [0, n)
    uint32_t cached_blocks_count = 0;    // leading blocks reused from the cache
    uint32_t committed_sub_blocks = 0;   // prompt sub-blocks [0, n) cached or committed
    uint32_t in_flight_tokens_count = 0;
    bool in_flight_sample = false;
    uint32_t in_flight_drafts_count = 0;  // draft tokens fed this step
    std::vector<TokenId> in_flight_drafts;  // they (checked against the result)
    std::unique_ptr<Drafter> drafter;       // speculating and running (see above)
    bool cancel_pending = false;
    uint64_t arrival = 0;        // larger = newer
    bool admitted_once = false;  // false: counts against waiting_max
  };

  uint32_t blocks_for(uint32_t tokens_count) const;
  void plan_running(DecodePlan& plan, uint32_t& budget);
  void plan_drafts(DecodePlan& plan, size_t first_entry, uint32_t& budget);
  void add_drafts(Seq& s, DecodeEntry& entry, std::vector<TokenId> drafts, DecodePlan& plan);
  // A running sequence's verified step: fed {last, d drafts}, `found` the shell's tokens.
  // False when the result does not extend the drafts (a malformed result).
  bool on_verified(Seq& s, uint32_t d, std::span<const TokenId> found);
  void plan_prefilling(DecodePlan& plan, uint32_t& budget);
  void admit(DecodePlan& plan, uint32_t& budget);
  bool try_admit(Seq& s, DecodePlan& plan);
  bool grow_or_preempt(Seq& s, DecodePlan& plan);
  void preempt(Seq& victim, DecodePlan& plan);
  void add_entry(Seq& s, uint32_t tokens_count, bool sample, DecodePlan& plan);
  std::optional<FinishReason> append_tokens(Seq& s, std::span<const TokenId> tokens,
                                            SeqUpdate& update);
  void commit_prompt_blocks(Seq& s);
  void finish(SeqId id, FinishReason reason);
  void active_insert(const Seq& s);
  void active_erase(const Seq& s);
  const SampledTokens* sampled_for(SeqId id, std::span<const SampledTokens> sampled) const;

  DecodeConfig config_;
  kv::PrefixCache& cache_;
  std::unique_ptr<SpecShared> spec_shared_;  // null when spec.method is none
  std::unordered_map<SeqId, Seq> seqs_;  // <= waiting_max + seqs_max
  std::deque<SeqId> waiting_;            // <= waiting_max + seqs_max (preempted in front)
  uint32_t waiting_new_count_ = 0;       // never-admitted ones in waiting_, <= waiting_max
  uint32_t active_count_ = 0;            // pulling + prefilling + running, <= seqs_max
  std::vector<SeqId> in_flight_ids_;
  // Sequences holding blocks (pulling, prefilling, running) as (arrival, id), oldest first;
  // size == active_count_.
  std::vector<std::pair<uint64_t, SeqId>> active_;
  // Per-step scratch, reused so that a warm step does not allocate (each <= seqs_max, or
  // the sampled results count).
  std::vector<SeqId> order_scratch_;
  std::vector<std::pair<SeqId, size_t>> sampled_index_;  // (seq, index in sampled), sorted
  std::vector<std::pair<SeqId, FinishReason>> finishing_;
  std::vector<DecodeEntry> spare_entries_;
  std::vector<SeqUpdate> spare_updates_;
  bool in_flight_ = false;
  uint64_t step_id_ = 0;
  uint64_t arrivals_ = 0;
  DecodeCounters counters_;
};

}  // namespace tandem::decode
