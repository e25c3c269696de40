// The prefill scheduler: a pure core (no threads, clocks or I/O; time comes in as `now`).
//
// It decides, step by step, which prompt tokens the device computes next:
//   queued   submitted, waiting in FIFO order (at most queue_max), no blocks yet;
//   running  admitted: every block of the prompt is allocated up front (the leading blocks
//            already in the prefix cache are reused and never computed; when the cached
//            prefix ends inside a block, at sub-block granularity, the first chunk copies
//            that block's holder into the prompt's own block first); the rest is computed
//            in chunks, at most step_tokens_max tokens per step across all requests
//            (chunked prefill: a long prompt spans several steps); oldest admitted first;
//   held     the whole prompt is computed (the final chunk sampled the first token); its
//            blocks stay pinned until pull_done() (decode has read them) or until
//            now > deadline (hold_timeout_ms after completion), then they are released.
// cancel() at any stage releases whatever the request holds.
//
// Admission is FIFO: when the head of the queue does not fit in the pool (free + evictable
// blocks), nothing behind it is admitted either, so a long prompt is never starved.
// A prompt whose every sub-block is cached still recomputes its last sub-block (the device
// must produce logits for the first token).
//
// Protocol with the shell (the prefill actor), one step at a time:
//   plan = plan_step();  -> the Device runs it (chunks with block tables and positions)
//   done = on_step_done(plan.step_id, now);  -> answer decode for each finished request
// Calls that free blocks (cancel, pull_done, expire_holds) may come at any time; a block
// freed while a step is in flight is only handed out again by a later plan_step(), i.e. after
// the device finished writing it.
//
// Not thread-safe: one owning actor. The PrefixCache passed in outlives the scheduler and is
// used by it alone.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kvstore/block_hash.hpp"
#include "kvstore/prefix_cache.hpp"
#include "runtime/base/result.hpp"

namespace tandem::prefill {

using RequestId = uint64_t;
using TokenId = int32_t;
using Nanos = std::chrono::nanoseconds;  // time since an arbitrary epoch, from the shell

struct PrefillConfig {
  uint32_t block_tokens = 16;      // KV block size, tokens (must equal the cache's)
  uint32_t queue_max = 256;        // queued requests
  uint32_t running_max = 16;       // admitted requests being computed
  uint32_t held_max = 256;         // running + held requests (finished, awaiting pull)
  uint32_t step_tokens_max = 512;  // tokens computed per step, all requests together
  std::chrono::milliseconds hold_timeout_ms{30000};  // hold after completion
  // Errors: invalid, naming the key, when a limit is 0 or running_max > held_max.
  Status validate() const;
};

struct PrefillRequest {
  RequestId id = 0;
  std::vector<TokenId> tokens;  // the prompt, >= 1 token
  // One per FULL sub-block of tokens (the cache's sub_block_tokens; one per block when it
  // matches whole blocks), in order: kvstore/prefix_cache.hpp.
  std::vector<kv::BlockHash> prefix_hashes;
};

// Copy block `src` into `dst` (whole blocks, on the device) before computing the chunk.
struct BlockCopy {
  kv::BlockIndex src = 0;
  kv::BlockIndex dst = 0;
  friend bool operator==(const BlockCopy&, const BlockCopy&) = default;
};

struct PrefillChunk {
  RequestId request = 0;
  std::vector<kv::BlockIndex> block_table;  // every block of the prompt, in order
  uint32_t start_position = 0;              // position of tokens[0] in the prompt
  std::vector<TokenId> tokens;              // prompt[start_position, +size)
  bool last = false;                        // the prompt's final chunk: sample a token
  std::optional<BlockCopy> copy;            // the request's first chunk after a partial hit
};

struct PrefillPlan {
  uint64_t step_id = 0;
  std::vector<PrefillChunk> chunks;  // non-empty
  uint32_t tokens_count = 0;         // <= step_tokens_max
};

// A request whose prompt is complete; its blocks are held for decode to pull.
struct PrefillDone {
  RequestId request = 0;
  std::vector<kv::BlockIndex> block_table;
  std::vector<kv::BlockHash> prefix_hashes;  // as submitted
  uint32_t prompt_tokens_count = 0;
  uint32_t cached_tokens_count = 0;  // reused from the prefix cache, not computed
  Nanos hold_deadline{0};
};

// A prompt of `tokens` waiting for tier 2 with `blocks` whole blocks in hand (the pool's and
// those asked for): the tokens it will compute, at least its last one.
inline uint64_t tokens_after_tier2(uint64_t tokens, uint64_t blocks, uint32_t block_tokens) {
  uint64_t held = blocks * block_tokens;
  return held < tokens ? tokens - held : 1;
}

// Every k-th prefix hash of a done request: its full blocks' hashes (tier 2's keys).
std::vector<kv::BlockHash> block_hashes(const PrefillDone& done, uint32_t k);
// What a done request offers tier 2 (write-behind): its full blocks' hashes, then (k > 1)
// its trailing partial block's, the prefix hash of the block's last full sub-block (a prompt
// ending inside a block past at least one sub-block). At most block_table.size() of them;
// hash i names block_table[i]. A partial block of fewer than `partial_min` sub-blocks is not
// offered (tier2_partial_gain_min: its read would not pay).
std::vector<kv::BlockHash> tier2_offer_hashes(const PrefillDone& done, uint32_t k,
                                              uint32_t partial_min = 1);

// The block positions a prompt could read from tier 2, given its prefix hashes (k per block)
// and the `matched` sub-blocks its pool holds: from `first` (the first block the pool does
// not wholly hold; `held` of its sub-blocks it does), `whole` full blocks, then its trailing
// partial block when the prompt ends inside a block (`trailing`; k > 1 only) and whole blocks
// are lacked too: the partial rides on a lookup made for them. A prompt that lacks only its
// trailing partial block asks nothing: that block is almost always the turn's new tokens,
// which no tier 2 holds, and a lookup for it would put a round trip before every warm turn
// (`tandem sim`, target-4p4d: p50 TTFT 170 -> 265 ms; docs/benchmarks.md "Sub-blocks in
// tier 2").
// `partials` false ([kv_offload] partial_blocks = false): whole blocks only.
struct Tier2Lack {
  uint32_t first = 0;
  uint32_t held = 0;
  uint32_t whole = 0;
  bool trailing = false;
  bool partials = true;
  uint32_t positions() const { return whole + (trailing ? 1 : 0); }
};
Tier2Lack tier2_lack(std::span<const kv::BlockHash> q, uint32_t k, uint32_t matched,
                     bool partials = true);
// A lookup of `ask` (<= positions()) of those positions: their whole blocks' hashes, and
// (k > 1, with partials) their prefix hashes, k per position (the trailing one's fewer), so kv-offload can
// stage a partial block where the whole ones stop (OffloadLookup.subBlockHashes), longer than
// the `held` sub-blocks of the first position the pool has (OffloadLookup.subBlocksHeld).
struct Tier2Ask {
  std::vector<kv::BlockHash> block_hashes;
  std::vector<kv::BlockHash> sub_hashes;  // empty when k == 1
  uint32_t held = 0;
};
Tier2Ask tier2_ask(std::span<const kv::BlockHash> q, uint32_t k, const Tier2Lack& lack,
                   uint32_t ask);

enum class PrefillStage { queued, running, held };

struct PrefillCounters {
  uint64_t submitted_count = 0;
  uint64_t completed_count = 0;
  uint64_t pulled_count = 0;
  uint64_t expired_count = 0;
  uint64_t cancelled_count = 0;
  uint64_t computed_tokens_count = 0;
  uint64_t cached_tokens_count = 0;
};

class PrefillScheduler {
 public:
  // Preconditions (asserted): config.validate() ok; cache.block_tokens() == block_tokens.
  PrefillScheduler(const PrefillConfig& config, kv::PrefixCache& cache);

  // Errors: invalid (duplicate id, empty prompt, wrong number of hashes, prompt larger than
  // the whole pool); overloaded (queue_max requests already queued).
  Status submit(PrefillRequest request);

  // The next step, or nullopt when nothing can run. Precondition (asserted): no step is in
  // flight (every plan was answered by on_step_done).
  std::optional<PrefillPlan> plan_step();
  // The device finished step `step_id` (asserted: the one in flight). Returns the requests
  // that completed, now held until pull_done or now > hold_deadline.
  std::vector<PrefillDone> on_step_done(uint64_t step_id, Nanos now);

  // Decode read the blocks: release them. Errors: not_found when `id` is not held.
  Status pull_done(RequestId id);
  // Releases every hold whose deadline passed (now > deadline); returns their ids.
  std::vector<RequestId> expire_holds(Nanos now);
  // Releases everything `id` holds, at any stage. Errors: not_found when unknown.
  Status cancel(RequestId id);

  std::optional<PrefillStage> stage(RequestId id) const;
  uint32_t queued_count() const { return static_cast<uint32_t>(queue_.size()); }
  uint32_t running_count() const { return static_cast<uint32_t>(running_.size()); }
  uint32_t held_count() const { return held_count_; }
  // Prompt tokens still to compute for the queued and running requests (a queued one counts
  // what its cache match was when submitted): the work in front of a new prompt, which the
  // router weighs against this instance's cache hit (prefill by work).
  uint64_t pending_tokens() const { return pending_tokens_; }
  bool step_in_flight() const { return in_flight_; }
  const PrefillCounters& counters() const { return counters_; }
  // O(requests + blocks) consistency check (RT_ASSERT); for tests.
  void check_invariants() const;

 private:
  struct Request {
    PrefillRequest input;
    PrefillStage stage = PrefillStage::queued;
    std::vector<kv::BlockIndex> blocks;  // empty while queued
    uint32_t cached_tokens_count = 0;     // reused from the cache (sub-blocks x their size)
    uint32_t computed_tokens_count = 0;   // includes cached tokens
    uint32_t committed_sub_blocks = 0;    // sub-blocks [0, n) are cached or committed
    uint32_t in_flight_tokens_count = 0;
    uint32_t pending_tokens_count = 0;  // its share of pending_tokens_
    // A partial hit's holder, referenced until the step copying it is done.
    std::optional<kv::BlockIndex> copy_source;
    bool copy_in_flight = false;
    Nanos hold_deadline{0};
  };

  uint32_t blocks_needed(const Request& r) const;
  bool try_admit(Request& r);
  void add_chunk(Request& r, uint32_t tokens_count, PrefillPlan& plan);
  void commit_sub_blocks(Request& r);
  void release_copy_source(Request& r);
  void set_pending(Request& r, uint32_t tokens);
  void release(Request& r);
  void erase_running(RequestId id);

  PrefillConfig config_;
  kv::PrefixCache& cache_;
  std::unordered_map<RequestId, Request> requests_;  // <= queue_max + held_max
  std::deque<RequestId> queue_;                      // <= queue_max
  std::vector<RequestId> running_;                   // admission order, <= running_max
  uint32_t held_count_ = 0;                          // running + held <= held_max
  uint64_t pending_tokens_ = 0;                      // sum of the requests' shares
  std::vector<RequestId> in_flight_ids_;
  bool in_flight_ = false;
  uint64_t step_id_ = 0;
  PrefillCounters counters_;
};

}  // namespace tandem::prefill
