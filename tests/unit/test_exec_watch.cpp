// ExecWatch: a hung executor request times out once, its late answer is recognized and ends
// the stall; a timely answer is handled.
#include <doctest.h>

#include "actors/common/exec_watch.hpp"

using tandem::actors::ExecWatch;
using namespace std::chrono_literals;

TEST_CASE("ExecWatch: timely answers, a timeout, a late answer, and the stall in between") {
  ExecWatch watch(500ms);
  auto t = ExecWatch::Clock::time_point{} + 100s;
  uint64_t a = watch.start(t);
  CHECK(watch.in_flight());
  CHECK_FALSE(watch.expired(t + 499ms));
  CHECK(watch.answered(a, t + 499ms));  // in time: handle it
  CHECK_FALSE(watch.in_flight());
  CHECK_FALSE(watch.expired(t + 10s));  // nothing in flight: nothing expires

  uint64_t b = watch.start(t + 1s);
  CHECK(watch.expired(t + 1500ms));
  CHECK_FALSE(watch.expired(t + 1600ms));  // once
  CHECK(watch.stalled());
  CHECK(watch.timeouts_count() == 1);
  CHECK(watch.stall_reason() == "executor step timed out after 500 ms and has not answered since");
  CHECK_FALSE(watch.in_flight());
  CHECK_FALSE(watch.answered(b, t + 4s));  // late: ignore it, the stall ends
  CHECK_FALSE(watch.stalled());
  CHECK(watch.late_by() == 2500ms);
  CHECK(watch.late_text() ==
        "the executor answered 2500 ms after its step timed out; serving again");

  uint64_t c = watch.start(t + 5s);  // back to normal
  CHECK(c > b);
  CHECK(watch.answered(c, t + 5100ms));
}
