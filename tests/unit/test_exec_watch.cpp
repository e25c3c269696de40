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

TEST_CASE("exec watch: a lost device stalls the shell for good, with the first reason") {
  using namespace std::chrono_literals;
  tandem::actors::ExecWatch w(100ms);
  auto t0 = tandem::actors::ExecWatch::Clock::now();
  CHECK_FALSE(w.lose(""));  // no reason: not lost
  CHECK_FALSE(w.stalled());
  uint64_t g = w.start(t0);
  CHECK(w.lose("rbln decoder_batch_1 run 3 did not complete"));
  CHECK_FALSE(w.lose("another"));   // the first reason stays; logged once
  CHECK(w.answered(g, t0 + 10ms));  // the step in flight still ends (with its error)
  CHECK(w.lost());
  CHECK(w.stalled());
  CHECK(w.stall_reason() == "executor device lost: rbln decoder_batch_1 run 3 did not complete");
  CHECK_FALSE(w.expired(t0 + 10s));
  CHECK(w.stalled());  // no late answer ends it
}
