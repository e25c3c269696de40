// Prefill's tier-2 cost rule (actors/prefill/tier2_policy.hpp): ask tier 2 only when the
// modelled read beats the modelled compute, so a tier-2 hit never loses.
#include <doctest.h>

#include <limits>

#include "actors/prefill/tier2_policy.hpp"

using tandem::prefill::ewma;
using tandem::prefill::explore_every;
using tandem::prefill::Tier2Rates;
using tandem::prefill::tier2_blocks_to_ask;

namespace {
// Whether tier 2 is asked at all.
bool tier2_lookup_pays(uint32_t blocks, uint64_t block_bytes, uint32_t block_tokens,
                       const Tier2Rates& r, uint32_t waiting) {
  return tier2_blocks_to_ask(blocks, block_bytes, block_tokens, r, waiting) > 0;
}
}  // namespace

TEST_CASE("tier-2 cost rule: a read slower than computing is not asked; a faster one is") {
  // A block: 4096 tokens, 16 MiB. Compute at 4,096 tokens/s: 1 s per block.
  constexpr uint64_t bytes = 16u << 20;
  constexpr uint32_t tokens = 4096;
  Tier2Rates r{.read_bytes_per_s = 0.0, .prefill_tokens_per_s = 4096.0,
               .lookup_overhead_s = 0.002, .eligible_count = 1};
  // Unmeasured read rate: yes (the first lookups measure it); unmeasured compute too.
  CHECK(tier2_lookup_pays(4, bytes, tokens, r, 0));
  // Disk at 1 GiB/s: 16 ms per block against 1 s: yes.
  r.read_bytes_per_s = double(1u << 30);
  CHECK(tier2_lookup_pays(4, bytes, tokens, r, 0));
  // Disk at 8 MiB/s: 2 s per block against 1 s: no — recompute.
  r.read_bytes_per_s = double(8u << 20);
  CHECK_FALSE(tier2_lookup_pays(4, bytes, tokens, r, 0));
  // The lookup's own round trip counts: one tiny block whose compute (1 ms) is below the
  // 2 ms overhead is not worth asking for, even from a fast disk.
  r.read_bytes_per_s = double(1u << 30);
  CHECK_FALSE(tier2_lookup_pays(1, 4096, 4, r, 0));
  CHECK(tier2_lookup_pays(1, 4096, 64, r, 0));  // 16 ms of compute: yes
  // Break-even: read == compute is not a win.
  Tier2Rates even{.read_bytes_per_s = double(bytes), .prefill_tokens_per_s = double(tokens),
                  .lookup_overhead_s = 0.0, .eligible_count = 1};
  CHECK_FALSE(tier2_lookup_pays(3, bytes, tokens, even, 0));
  // Nothing missing: never asked.
  CHECK_FALSE(tier2_lookup_pays(0, bytes, tokens, r, 0));
}

TEST_CASE("tier-2 cost rule: every explore_every-th eligible prompt asks anyway") {
  Tier2Rates slow{.read_bytes_per_s = 1.0, .prefill_tokens_per_s = 1e9,
                  .lookup_overhead_s = 0.0, .eligible_count = 0};
  int asked = 0;
  for (uint64_t n = 1; n <= 4 * explore_every; ++n) {
    slow.eligible_count = n;
    asked += tier2_lookup_pays(8, 1u << 20, 16, slow, 0) ? 1 : 0;
  }
  CHECK(asked == 4);  // the rates keep being measured while the rule says no
}

TEST_CASE("tier-2 cost rule: unmeasured or exploring, a one-block probe at a time") {
  using tandem::prefill::probe_blocks;
  constexpr uint64_t bytes = 16u << 20;
  Tier2Rates unmeasured{.read_bytes_per_s = 0.0, .prefill_tokens_per_s = 4096.0,
                        .lookup_overhead_s = 0.0, .eligible_count = 1};
  CHECK(tier2_blocks_to_ask(4, bytes, 4096, unmeasured, 0) == probe_blocks);
  CHECK(tier2_blocks_to_ask(4, bytes, 4096, unmeasured, 1) == 0);  // one is out: compute
  // A slow disk (1 B/s): the rule says no; the explore_every-th prompt reads one block.
  Tier2Rates slow{.read_bytes_per_s = 1.0, .prefill_tokens_per_s = 1e9,
                  .lookup_overhead_s = 0.0, .eligible_count = explore_every};
  CHECK(tier2_blocks_to_ask(8, bytes, 16, slow, 0) == probe_blocks);
  CHECK(probe_blocks == 1);
  CHECK(tier2_blocks_to_ask(8, bytes, 16, slow, 2) == 0);  // a probe is out already
  slow.eligible_count = explore_every + 1;
  CHECK(tier2_blocks_to_ask(8, bytes, 16, slow, 0) == 0);
  // A fast disk: every block, however many lookups are out, exploring or not.
  Tier2Rates fast{.read_bytes_per_s = double(1u << 30), .prefill_tokens_per_s = 4096.0,
                  .lookup_overhead_s = 0.0, .eligible_count = explore_every};
  CHECK(tier2_blocks_to_ask(4, bytes, 4096, fast, 7) == 4);
  fast.eligible_count = 5;
  CHECK(tier2_blocks_to_ask(4, bytes, 4096, fast, 7) == 4);
  // What the instance tells the router: reads pay per block, unmeasured counts as yes.
  CHECK(tandem::prefill::tier2_reads_pay(bytes, 4096, fast));
  CHECK_FALSE(tandem::prefill::tier2_reads_pay(bytes, 16, slow));
  CHECK(tandem::prefill::tier2_reads_pay(bytes, 16, unmeasured));
}

TEST_CASE("tier-2 cost rule: the rates' mean ignores samples that cannot be rates") {
  CHECK(ewma(0.0, 80.0) == 80.0);  // the first sample as is
  CHECK(ewma(80.0, 160.0) == doctest::Approx(90.0));
  CHECK(ewma(80.0, 0.0) == 80.0);
  CHECK(ewma(80.0, -5.0) == 80.0);
  CHECK(ewma(80.0, std::numeric_limits<double>::quiet_NaN()) == 80.0);
  CHECK(ewma(80.0, std::numeric_limits<double>::infinity()) == 80.0);
}

TEST_CASE("tier-2 cost rule: local and remote reads are measured apart; compute is shared") {
  using tandem::prefill::Tier2RateBook;
  constexpr uint64_t bytes = 16u << 20;
  constexpr uint32_t tokens = 4096;
  Tier2RateBook book;
  book.computed(4096.0, 1.0);  // 4,096 tokens/s: 1 s per block
  CHECK(book.local.prefill_tokens_per_s == 4096.0);
  CHECK(book.remote.prefill_tokens_per_s == 4096.0);
  book.computed(4096.0, 0.0);  // no device time (the sim at time_factor 0): no sample
  CHECK(book.local.prefill_tokens_per_s == 4096.0);
  // The local disk is fast, the remote read slow (8 MiB/s: 2 s per block).
  book.of(false).read_bytes_per_s = double(1u << 30);
  book.of(true).read_bytes_per_s = double(8u << 20);
  book.local.eligible_count = book.remote.eligible_count = 1;
  CHECK(tier2_lookup_pays(4, bytes, tokens, book.of(false), 0));        // read locally
  CHECK_FALSE(tier2_lookup_pays(4, bytes, tokens, book.of(true), 0));   // recompute instead
  // A faster device makes the local read lose too: compute at 1M tokens/s (4 ms a block,
  // the 1 GiB/s read takes 16 ms).
  for (int i = 0; i < 64; ++i) book.computed(1048576.0, 1.0);
  CHECK(book.remote.prefill_tokens_per_s == book.local.prefill_tokens_per_s);
  CHECK(book.local.prefill_tokens_per_s > 1e6);
  CHECK_FALSE(tier2_lookup_pays(4, bytes, tokens, book.of(false), 0));
}

TEST_CASE("tier-2 cost rule: a partial block pays only by the sub-blocks it adds") {
  using tandem::prefill::tier2_partial_gain_min;
  // A 4096-token block of 8 sub-blocks (512 tokens), 1 GiB. Compute at 4,096 tokens/s: 125 ms
  // per sub-block.
  constexpr uint64_t bytes = 1ull << 30;
  Tier2Rates r{.read_bytes_per_s = 0.0, .prefill_tokens_per_s = 4096.0,
               .lookup_overhead_s = 0.0, .eligible_count = 1};
  CHECK(tier2_partial_gain_min(bytes, 512, 8, r) == 1);  // unmeasured: any partial
  // Read at 2 GiB/s: 500 ms, the compute of 4 sub-blocks: break-even is no win, 5 pay.
  r.read_bytes_per_s = double(2ull << 30);
  CHECK(tier2_partial_gain_min(bytes, 512, 8, r) == 5);
  // 4.5 sub-blocks' compute: 5.
  r.read_bytes_per_s = double(bytes) / 0.5625;
  CHECK(tier2_partial_gain_min(bytes, 512, 8, r) == 5);
  // A fast disk (50 ms): one sub-block pays.
  r.read_bytes_per_s = double(bytes) / 0.05;
  CHECK(tier2_partial_gain_min(bytes, 512, 8, r) == 1);
  // Reading costs more than 7 sub-blocks' compute: no partial pays (k).
  r.read_bytes_per_s = double(bytes) / 0.9;
  CHECK(tier2_partial_gain_min(bytes, 512, 8, r) == 8);
  r.read_bytes_per_s = double(bytes) / 100.0;
  CHECK(tier2_partial_gain_min(bytes, 512, 8, r) == 8);
  // Whole blocks only (k = 1): 1, never below.
  CHECK(tier2_partial_gain_min(bytes, 4096, 1, r) == 1);
}
