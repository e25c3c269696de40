// What an operator sees of one kv-offload instance's tier 2 (`tandem shell`: `tier2 [NODE]`,
// `tier2 verify NODE`, `tier2 drop NODE`): the answers' rows and text, and the per-second
// rates over the last full interval. Pure (std only): the shell fills in the values from
// its tandem:tier2_* counters and the store's answers, and passes `now`.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tandem::kv_offload {

// Counters of one instance, monotonic (its tandem:tier2_*_total series).
struct Tier2Counts {
  uint64_t lookups = 0;
  uint64_t hit_blocks = 0;
  uint64_t miss_blocks = 0;
  uint64_t stored_blocks = 0;
  uint64_t store_dropped_blocks = 0;
  uint64_t corrupt_dropped_blocks = 0;
  uint64_t read_bytes = 0;
  uint64_t written_bytes = 0;
};

struct Tier2Rates {
  std::chrono::nanoseconds over{0};  // the interval they are averaged over (> 0)
  double lookups_per_s = 0;
  double hit_blocks_per_s = 0;
  double miss_blocks_per_s = 0;
  double stored_blocks_per_s = 0;
  double read_bytes_per_s = 0;
  double written_bytes_per_s = 0;
};

// Per-second rates over the last full interval of `interval`: sample() is fed the counts
// often (every tick); each time an interval has passed since the last boundary, the rates
// over it replace the previous ones. Memory: two samples.
class RateWindow {
 public:
  explicit RateWindow(std::chrono::nanoseconds interval);  // > 0 (asserted)
  // Preconditions (asserted): `now` never goes back; no count decreases.
  void sample(std::chrono::nanoseconds now, const Tier2Counts& counts);
  // nullopt until an interval has passed since the first sample.
  const std::optional<Tier2Rates>& rates() const { return rates_; }

 private:
  std::chrono::nanoseconds interval_;
  std::optional<std::pair<std::chrono::nanoseconds, Tier2Counts>> start_;  // of this interval
  std::chrono::nanoseconds last_{0};
  std::optional<Tier2Rates> rates_;
};

enum class Tier2State { off, opening, open, failed };
const char* to_string(Tier2State state);

struct Tier2Status {
  std::string node;
  std::string instance;  // the kv-offload instance's name
  Tier2State state = Tier2State::off;
  std::string why;      // off / failed: the reason; open: what runs now ("verify"), or ""
  std::string io_mode;  // "direct" or "buffered" once open, else ""
  uint64_t blocks_used = 0;
  uint64_t blocks_capacity = 0;
  uint64_t block_bytes = 0;  // bytes of one block (used bytes = blocks_used x this)
  Tier2Counts counts;
  std::optional<Tier2Rates> rates;
};

// `tier2`: a header row, then one row per instance (same width); the text of one instance.
std::vector<std::string> tier2_status_header();
std::vector<std::string> tier2_status_row(const Tier2Status& status);
std::string tier2_status_text(const Tier2Status& status);

struct Tier2VerifyOutcome {
  std::string node;
  std::string instance;
  uint64_t checked_count = 0;
  uint64_t ok_count = 0;
  // Blocks dropped, by reason ("checksum", "short_read", ...), every reason listed.
  std::vector<std::pair<std::string, uint64_t>> dropped_by_reason;
  std::chrono::nanoseconds took{0};
  uint64_t dropped_count() const;
};

// `tier2 verify`: rows (header + one) and text. Preconditions (asserted): checked = ok +
// dropped.
std::vector<std::vector<std::string>> tier2_verify_rows(const Tier2VerifyOutcome& outcome);
std::string tier2_verify_text(const Tier2VerifyOutcome& outcome);

struct Tier2DropOutcome {
  std::string node;
  std::string instance;
  uint64_t dropped_count = 0;
  uint64_t pinned_count = 0;  // of those, pinned: freed at their unpin
  std::chrono::nanoseconds took{0};
};

// `tier2 drop`: rows (header + one) and text. Preconditions (asserted): pinned <= dropped.
std::vector<std::vector<std::string>> tier2_drop_rows(const Tier2DropOutcome& outcome);
std::string tier2_drop_text(const Tier2DropOutcome& outcome);

}  // namespace tandem::kv_offload
