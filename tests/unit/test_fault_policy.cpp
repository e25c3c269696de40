// The failure policies the shells and the cluster simulator share (issue 12):
// actors/gateway/retry_policy.hpp and actors/decode/pd_policy.hpp.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "actors/decode/pd_policy.hpp"
#include "actors/gateway/retry_policy.hpp"

using namespace tandem;
using std::chrono::nanoseconds;

TEST_CASE("retry: only before the first token, within the budget, for retryable kinds") {
  for (ErrorKind k : {ErrorKind::disconnected, ErrorKind::failed, ErrorKind::timed_out,
                      ErrorKind::unimplemented}) {
    CAPTURE(to_string(k));
    CHECK(gateway::decide_retry(k, 0, gateway::retries_max).retry);
    CHECK(gateway::decide_retry(k, 0, 1).retry);
    CHECK_FALSE(gateway::decide_retry(k, 0, 0).retry);   // budget spent
    CHECK_FALSE(gateway::decide_retry(k, 1, 2).retry);   // a token reached the client
    // An instance that cannot serve (no device, device lost) is unavailability: 503.
    CHECK(gateway::decide_retry(k, 1, 2).http_status ==
          (k == ErrorKind::unimplemented ? 503 : 500));
    CHECK(gateway::decide_retry(k, 0, 0).http_status ==
          (k == ErrorKind::unimplemented ? 503 : 500));
  }
  auto invalid = gateway::decide_retry(ErrorKind::invalid, 0, 2);
  CHECK_FALSE(invalid.retry);
  CHECK(invalid.http_status == 400);
  CHECK(invalid.type == "invalid_request_error");
  auto overloaded = gateway::decide_retry(ErrorKind::overloaded, 0, 2);
  CHECK_FALSE(overloaded.retry);
  CHECK(overloaded.http_status == 503);
  CHECK(overloaded.type == "overloaded_error");
  CHECK_FALSE(gateway::decide_retry(ErrorKind::not_found, 0, 2).retry);
}

TEST_CASE("prefill timeout: only a waiting request, strictly after the deadline") {
  CHECK_FALSE(decode::prefill_timed_out(true, nanoseconds(10), nanoseconds(10)));
  CHECK(decode::prefill_timed_out(true, nanoseconds(11), nanoseconds(10)));
  CHECK_FALSE(decode::prefill_timed_out(false, nanoseconds(11), nanoseconds(10)));
}

TEST_CASE("pull start: waits for the order and the answer, fails on a failed prefill") {
  using decode::PullStart;
  CHECK(decode::pull_start(false, false, false, false, true, true) == PullStart::wait);
  CHECK(decode::pull_start(true, true, false, false, true, true) == PullStart::wait);
  CHECK(decode::pull_start(true, false, true, false, false, false) == PullStart::fail);
  CHECK(decode::pull_start(true, false, false, true, false, false) == PullStart::fail);
  CHECK(decode::pull_start(true, false, false, false, false, false) == PullStart::wait);
  CHECK(decode::pull_start(true, false, false, false, true, false) == PullStart::fail);
  CHECK(decode::pull_start(true, false, false, false, true, true) == PullStart::start);
}

TEST_CASE("pull reads: one failed read fails the pull, which ends with the last read") {
  decode::PullReads r;
  CHECK(r.start(0) == std::optional<bool>(true));
  CHECK_FALSE(r.start(3).has_value());
  CHECK_FALSE(r.read_done(true).has_value());
  CHECK_FALSE(r.failed());
  CHECK_FALSE(r.read_done(false).has_value());
  CHECK(r.failed());
  CHECK(r.read_done(true) == std::optional<bool>(false));
  CHECK(r.left() == 0);
  CHECK_FALSE(r.start(1).has_value());  // a new pull starts clean
  CHECK(r.read_done(true) == std::optional<bool>(true));
}

TEST_CASE("lost streams: bounded, retried each tick, given up after attempts_max") {
  decode::LostStreams<int> lost(2, 3);
  lost.push(1);
  lost.push(2);
  lost.push(3);  // drops 1
  CHECK(lost.size() == 2);
  CHECK(lost.dropped_count() == 1);
  std::vector<int> sent, given_up;
  auto fail_all = [](int) { return false; };
  auto note = [&](int v) { given_up.push_back(v); };
  lost.retry(fail_all, note);
  lost.retry(fail_all, note);
  CHECK(lost.size() == 2);
  lost.retry([&](int v) { if (v == 3) { sent.push_back(v); return true; } return false; }, note);
  CHECK(sent == std::vector<int>{3});
  CHECK(given_up == std::vector<int>{2});  // third failed tick
  CHECK(lost.empty());
}

TEST_CASE("a held request id sent again: replaced when its gateway retries, else refused") {
  CHECK(decode::on_duplicate(true) == decode::Duplicate::replace);
  CHECK(decode::on_duplicate(false) == decode::Duplicate::refuse);
}
