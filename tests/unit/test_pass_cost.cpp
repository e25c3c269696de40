// devices/pass_cost: the row cost a decode executor measures when it opens (issue 39). A fake
// device whose decode pass of r rows advances a fake clock by 1 + c (r - 1) units measures as
// exactly c; the fit and its clamps; what it refuses.
#include <doctest.h>

#include <cmath>
#include <vector>

#include "devices/device.hpp"
#include "devices/pass_cost.hpp"

using namespace tandem;

namespace {

// A device that computes nothing: each decode pass of r rows costs `base` (1 + cost (r - 1))
// seconds of the fake clock (and, every 7th pass, ten times that: an interruption the median
// must ignore). It records what it was asked.
class TimedDevice : public devices::Device {
 public:
  TimedDevice(double cost, uint32_t blocks) : cost_(cost) {
    model_.vocab_size = 100;
    layout_.block_tokens = 16;
    layout_.blocks_total = blocks;
  }
  const devices::ModelConfig& model_config() const override { return model_; }
  const devices::KvLayout& kv_layout() const override { return layout_; }
  devices::MemoryRegion kv_region() override { return {}; }
  Result<devices::StepOutput> prefill(std::span<const devices::PrefillSeq> batch) override {
    prefilled.insert(prefilled.end(), batch.begin(), batch.end());
    return devices::StepOutput{};
  }
  Result<devices::StepOutput> decode(std::span<const devices::DecodeSeq> batch) override {
    double rows = 0;
    for (const auto& s : batch) {
      CHECK(s.seq_id <= 77);
      CHECK(s.seq_id > 77 - 32);
      CHECK(s.start_pos == 64);
      rows += double(s.tokens.size());
      for (int32_t t : s.tokens) CHECK((t >= 0 && t < 100));
    }
    // A pass of R rows in all costs 1 + c (R - 1) one-row passes, whatever the sequences.
    clock += base * (1 + cost_ * (rows - 1)) * (++passes % 7 == 0 ? 10 : 1);
    if (fail_decode) return make_error(ErrorKind::failed, "no");
    return devices::StepOutput{};
  }
  Status copy_blocks_out(std::span<const uint32_t>, std::span<std::byte>) override { return {}; }
  Status copy_blocks_in(std::span<const uint32_t>, std::span<const std::byte>) override {
    return {};
  }

  double clock = 0, base = 0.002;
  uint64_t passes = 0;
  bool fail_decode = false;
  std::vector<devices::PrefillSeq> prefilled;

 private:
  double cost_;
  devices::ModelConfig model_;
  devices::KvLayout layout_;
};

double decode_batch_row_cost(double c, uint32_t b) { return b * c / (1 + c * (b - 1)); }

}  // namespace

TEST_CASE("pass_cost: a device whose extra rows cost c each measures as c") {
  for (double c : {0.07, 0.35, 1.0}) {
    TimedDevice d(c, 64);
    auto m = devices::measure_pass_costs(d, 5, 9, 77, 8, [&d] { return d.clock; });
    REQUIRE_MESSAGE(m.ok(), m.error().describe());
    REQUIRE(m->by_rows.size() == 5);
    for (size_t r = 0; r < 5; ++r) CHECK(m->by_rows[r] == doctest::Approx(1 + c * double(r)));
    CHECK(m->row_cost == doctest::Approx(c));
    // By batch: in a pass of b sequences one more row costs b c / (1 + c (b - 1)) of the
    // pass's cost per sequence (the drafter's batch_row_cost for this linear device).
    REQUIRE(m->by_batch.size() == 4);
    uint32_t b = 1;
    for (const auto& [size, cost] : m->by_batch) {
      CHECK(size == b);
      CHECK(cost == doctest::Approx(decode_batch_row_cost(c, b)));
      b *= 2;
    }
    // The contexts were written first, into the pool's first blocks, under the ids given.
    REQUIRE(d.prefilled.size() == 8);
    CHECK(d.prefilled[0].seq_id == 77);
    CHECK(d.prefilled[0].tokens.size() == 64);
    CHECK(d.prefilled[0].block_table == std::vector<uint32_t>{0, 1, 2, 3, 4});
    CHECK(d.prefilled[7].seq_id == 70);
    CHECK(d.prefilled[7].block_table == std::vector<uint32_t>{35, 36, 37, 38, 39});
    // 3 warm; 9 rounds of 5 row counts, 9 of 3 batches x 2 shapes; each after a warm one.
    CHECK(d.passes == 2 * (3 + 9 * 5 + 9 * 3 * 2));
  }
}

TEST_CASE("pass_cost: the fit is the least-squares slope, clamped to [0.01, 4]") {
  std::vector<double> linear = {1.0, 1.2, 1.4, 1.6};
  CHECK(devices::fit_row_cost(linear) == doctest::Approx(0.2));
  // The cpu device's measured shape here (1..5 rows): cheap second row, dearer third.
  std::vector<double> bumpy = {1.0, 1.24, 2.62, 2.79, 3.37};
  double want = (1 * 0.24 + 2 * 1.62 + 3 * 1.79 + 4 * 2.37) / (1 + 4 + 9 + 16);
  CHECK(devices::fit_row_cost(bumpy) == doctest::Approx(want));
  std::vector<double> free_rows = {1.0, 0.9, 0.95};  // extra rows "cheaper" than none
  CHECK(devices::fit_row_cost(free_rows) == devices::row_cost_min);
  std::vector<double> dear = {1.0, 9.0, 17.0};
  CHECK(devices::fit_row_cost(dear) == devices::row_cost_max);
}

TEST_CASE("pass_cost: batches the pool cannot hold, or past batch_max, are not timed") {
  TimedDevice d(0.2, 12);  // 5 blocks per sequence: 2 sequences fit
  auto m = devices::measure_pass_costs(d, 5, 3, 77, 8, [&d] { return d.clock; });
  REQUIRE(m.ok());
  REQUIRE(m->by_batch.size() == 2);
  CHECK(m->by_batch[1].first == 2);
  TimedDevice one(0.2, 64);
  auto single = devices::measure_pass_costs(one, 5, 3, 77, 1, [&one] { return one.clock; });
  REQUIRE(single.ok());
  REQUIRE(single->by_batch.size() == 1);
  CHECK(single->by_batch[0].second == doctest::Approx(0.2));
}

TEST_CASE("pass_cost: a pool too small, a failing pass and an unmeasurable pass are errors") {
  TimedDevice small(0.3, 4);  // 64 context tokens + 5 rows need 5 blocks of 16
  auto m = devices::measure_pass_costs(small, 5, 3, 77, 1, [&small] { return small.clock; });
  REQUIRE_FALSE(m.ok());
  CHECK(m.error().describe().find("too small") != std::string::npos);
  TimedDevice failing(0.3, 64);
  failing.fail_decode = true;
  CHECK_FALSE(devices::measure_pass_costs(failing, 5, 3, 77, 1, [&] { return failing.clock; }).ok());
  TimedDevice instant(0.3, 64);
  instant.base = 0;
  auto zero = devices::measure_pass_costs(instant, 5, 3, 77, 1, [&] { return instant.clock; });
  REQUIRE_FALSE(zero.ok());
  CHECK(zero.error().describe().find("no measurable time") != std::string::npos);
}
