// Upper bound of the token-weighted prefix hit rate a trace allows (issue 5): with infinite
// prefix caches and an ideal router, a prompt can reuse at most the leading full blocks that
// some earlier prompt already contained; everything else is computed at least once.
//
//   hit_rate_max = 1 - computed_min / prompt tokens
//
// where a request's computed_min is its prompt minus its leading full blocks seen before
// (in send order), and a prompt seen in full still recomputes its last block (the
// schedulers' rule, as in `tandem sim`'s hit rate). So hit rates are comparable.
//
// Pure: no clocks, threads or I/O. Cost: O(new tokens) per request (a turn that extends its
// session's previous turn hashes only its new segments; system + repository chains are
// memoized) and one 8-byte hash per distinct block (a set). 64-bit chained block hashes:
// a collision (~n^2 / 2^64) could only raise the bound by one block.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tools/workload/workload.hpp"

namespace tandem::sim {

struct HitBound {
  uint64_t requests_count = 0;
  uint64_t prompt_tokens_count = 0;
  uint64_t reusable_tokens_count = 0;   // leading tokens in blocks seen before, capped as above
  uint64_t first_turn_tokens_count = 0; // prompt tokens of turn-0 requests (context)
  uint64_t first_turn_reusable_count = 0;
  double hit_rate_max = 0;              // reusable / prompt tokens (0 for no tokens)
};

// `order`: indexes into `requests` in the order they were sent (each once). Requests with
// text prompts count their tokens as 0. Precondition (asserted): block_tokens >= 1, every
// index < requests.size().
HitBound prefix_hit_bound(const std::vector<workload::Request>& requests,
                          std::span<const uint32_t> order, uint32_t block_tokens);

}  // namespace tandem::sim
