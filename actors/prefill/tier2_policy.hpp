// Prefill's tier-2 cost rule (issue 13): ask tier 2 for the blocks a prompt lacks only when
// reading them is modelled to be faster than computing them, so a tier-2 hit never loses
// (SGLang's public report: an 8K-token file-tier hit slower than recomputing). Pure: the
// shell measures the rates and passes them in.
#pragma once

#include <algorithm>
#include <cstdint>

#include "runtime/base/assert.hpp"

namespace tandem::prefill {

struct Tier2Rates {
  double read_bytes_per_s = 0.0;      // measured: staged bytes / (lookup sent .. RMA reads done)
  double prefill_tokens_per_s = 0.0;  // measured: tokens computed / device compute time
  double lookup_overhead_s = 0.0;     // measured: a lookup's round trip with nothing to read
  uint64_t eligible_count = 0;        // prompts that lacked blocks (for exploration)
};

// Every explore_every-th eligible prompt asks anyway, so the rates keep being measured when
// the rule says no (a disk that got faster is noticed).
inline constexpr uint64_t explore_every = 32;

// A probe asks for at most this many blocks (below).
inline constexpr uint32_t probe_blocks = 1;

// How many of `blocks` missing blocks (of `block_bytes` and `block_tokens` each) to ask tier 2
// for: all of them when reading is modelled faster than computing them, else 0 (compute).
// `waiting`: this instance's lookups to this kind of source not ended yet. Unmeasured rates
// (0), and every explore_every-th eligible prompt while the rule says no, ask a probe
// instead: probe_blocks blocks, one probe at a time. A probe that read all it asked for asks
// again for the rest, now by the measured rates (prefill's shell), so on a fast disk the
// prompt still comes from tier 2 (one extra round trip), and a disk slower than computing
// costs one block of one prompt, not whole prompts of every prompt that arrived before the
// first answer. `tandem sim`, a disk 100x slower than computing: TTFT p99 52 s when every
// prompt reads, 12.9 s when an unmeasured lookup reads its whole prompt, 1.45 s with probes
// (1.49 s without tier 2); docs/benchmarks.md.
inline uint32_t tier2_blocks_to_ask(uint32_t blocks, uint64_t block_bytes, uint32_t block_tokens,
                                    const Tier2Rates& r, uint32_t waiting) {
  RT_ASSERT(block_tokens > 0 && block_bytes > 0, block_tokens, block_bytes);
  if (blocks == 0) return 0;
  const uint32_t probe = waiting == 0 ? std::min(blocks, probe_blocks) : 0;
  if (r.read_bytes_per_s <= 0.0 || r.prefill_tokens_per_s <= 0.0) return probe;
  double read_s = r.lookup_overhead_s + static_cast<double>(blocks) *
                                            static_cast<double>(block_bytes) / r.read_bytes_per_s;
  double compute_s =
      static_cast<double>(blocks) * static_cast<double>(block_tokens) / r.prefill_tokens_per_s;
  RT_ASSERT(read_s >= 0.0 && compute_s >= 0.0, read_s, compute_s);
  if (read_s < compute_s) return blocks;
  return r.eligible_count % explore_every == 0 ? probe : 0;
}

// Whether this kind of source's reads beat computing, per block (the lookup's overhead left
// out: a router credit is for runs of blocks). Unmeasured: yes. What the instance reports to
// the router, which credits tier-2 copies only where they would be read.
inline bool tier2_reads_pay(uint64_t block_bytes, uint32_t block_tokens, const Tier2Rates& r) {
  if (r.read_bytes_per_s <= 0.0 || r.prefill_tokens_per_s <= 0.0) return true;
  return static_cast<double>(block_bytes) / r.read_bytes_per_s <
         static_cast<double>(block_tokens) / r.prefill_tokens_per_s;
}

// The fewest sub-blocks (of `sub_tokens` each, k per block) a partial block must add to be
// worth reading: it costs a whole block's read (its layout is a block's) but saves only the
// tokens it adds, so it pays when gain x sub_tokens / prefill rate > block_bytes / read rate.
// 1 when unmeasured (like tier2_reads_pay); k when no partial pays (at most k - 1 sub-blocks).
// Prefill offers a trailing partial block only with this many sub-blocks, and asks tier 2 for
// partials that add at least this many (OffloadLookup.partialGainMin). `tandem sim`,
// target-4p4d: without it partials made tier 2 write 2.9x the blocks of whole-only and p90
// TTFT 0.98-1.10x of it; with it 2.3x and 0.87-1.08x (docs/benchmarks.md "Sub-blocks in
// tier 2").
inline uint32_t tier2_partial_gain_min(uint64_t block_bytes, uint32_t sub_tokens, uint32_t k,
                                       const Tier2Rates& r) {
  RT_ASSERT(sub_tokens > 0 && k >= 1, sub_tokens, k);
  if (r.read_bytes_per_s <= 0.0 || r.prefill_tokens_per_s <= 0.0) return 1;
  const double read_s = static_cast<double>(block_bytes) / r.read_bytes_per_s;
  const double sub_s = static_cast<double>(sub_tokens) / r.prefill_tokens_per_s;
  const double even = read_s / sub_s;  // sub-blocks whose compute equals the read
  if (!(even < static_cast<double>(k))) return k;
  return std::min<uint32_t>(k, static_cast<uint32_t>(even) + 1);
}

// A lookup's budget: the modelled time to compute its `blocks` blocks (kv-offload stages only
// the blocks its disk can read within it, behind its queue: blocks_within_budget). 0 when the
// compute rate is unmeasured: no budget.
inline double tier2_budget_s(uint32_t blocks, uint32_t block_tokens, const Tier2Rates& r) {
  if (!(r.prefill_tokens_per_s > 0.0)) return 0.0;
  return static_cast<double>(blocks) * static_cast<double>(block_tokens) / r.prefill_tokens_per_s;
}

// An exponentially weighted mean (weight 1/8 for the new sample); the first sample is taken
// as is. Non-positive or non-finite samples are ignored.
inline double ewma(double mean, double sample) {
  if (!(sample > 0.0) || sample > 1e300) return mean;
  return mean <= 0.0 ? sample : mean + (sample - mean) / 8.0;
}

// The read rate after a lookup answer that reports the source's disk read rate: never faster
// than the disk; the disk's when nothing was measured here yet (0 or non-finite: unknown).
inline double at_most_disk(double read_bytes_per_s, double disk_bytes_per_s) {
  if (!(disk_bytes_per_s > 0.0) || disk_bytes_per_s > 1e300) return read_bytes_per_s;
  return read_bytes_per_s > 0.0 ? std::min(read_bytes_per_s, disk_bytes_per_s) : disk_bytes_per_s;
}


// The rates per kind of source: this node's kv-offload, or another node's (the router's
// remote copy: its reads cross the network, so they are measured apart and a slow remote
// read never makes a local one look slow, or the other way round). The compute rate is the
// device's: one measurement for both.
struct Tier2RateBook {
  Tier2Rates local;
  Tier2Rates remote;
  Tier2Rates& of(bool remote_source) { return remote_source ? remote : local; }
  // A prefill step computed `tokens` in `seconds` of device time.
  void computed(double tokens, double seconds) {
    if (!(seconds > 0.0)) return;
    local.prefill_tokens_per_s = ewma(local.prefill_tokens_per_s, tokens / seconds);
    remote.prefill_tokens_per_s = local.prefill_tokens_per_s;
  }
};

}  // namespace tandem::prefill
