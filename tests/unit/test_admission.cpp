// Admission: the gateway's running limit from the decode instances, FIFO waiting, refusals
// with Retry-After, queue timeouts with time passed in.
#include <doctest.h>

#include "actors/gateway/admission.hpp"

using tandem::gateway::Admission;
using tandem::gateway::AdmissionLimits;
using Verdict = Admission::Verdict;
using std::chrono::milliseconds;

namespace {
AdmissionLimits limits(uint32_t requests_max, uint32_t queue_max, uint32_t per_instance) {
  AdmissionLimits l;
  l.requests_max = requests_max;
  l.queue_max = queue_max;
  l.queue_timeout = milliseconds(1000);
  l.decode_seqs_per_instance = per_instance;
  return l;
}
const Admission::Time t0{};
}  // namespace

TEST_CASE("admission: the running limit is what the ready decode instances hold") {
  Admission a(limits(1024, 4096, 64 + 256));
  CHECK(a.running_max() == 0);
  a.set_decode_ready(1);
  CHECK(a.running_max() == 320);
  a.set_decode_ready(2);
  CHECK(a.running_max() == 640);
  a.set_decode_ready(4);
  CHECK(a.running_max() == 1024);  // gateway.requests_max is the ceiling
}

TEST_CASE("admission: no decode instance ready is a 503 with Retry-After") {
  Admission a(limits(8, 8, 2));
  auto o = a.offer(1, t0);
  CHECK(o.verdict == Verdict::refused);
  CHECK(o.refusal.http_status == 503);
  CHECK(o.refusal.type == "overloaded_error");
  CHECK(o.refusal.code == "no_capacity");
  CHECK(o.refusal.retry_after_s >= 1);
  CHECK(a.running_count() == 0);
  CHECK(a.waiting_count() == 0);
}

TEST_CASE("admission: admit up to decode capacity, wait up to queue_max, then 429") {
  Admission a(limits(1024, 2, 1 + 1));  // one instance: seqs_max 1 + waiting_max 1
  a.set_decode_ready(1);
  CHECK(a.offer(1, t0).verdict == Verdict::admitted);
  CHECK(a.offer(2, t0).verdict == Verdict::admitted);
  CHECK(a.offer(3, t0).verdict == Verdict::waiting);
  CHECK(a.offer(4, t0).verdict == Verdict::waiting);
  auto o = a.offer(5, t0);
  CHECK(o.verdict == Verdict::refused);
  CHECK(o.refusal.http_status == 429);
  CHECK(o.refusal.type == "rate_limit_error");
  CHECK(o.refusal.code == "rate_limit_exceeded");
  CHECK(o.refusal.retry_after_s == 1);
  CHECK(o.refusal.message.find("2 in flight") != std::string::npos);
  CHECK(a.running_count() == 2);
  CHECK(a.waiting_count() == 2);
}

TEST_CASE("admission: a finish admits the oldest waiting request, FIFO") {
  Admission a(limits(1, 3, 10));
  a.set_decode_ready(1);
  CHECK(a.offer(1, t0).verdict == Verdict::admitted);
  CHECK(a.offer(2, t0).verdict == Verdict::waiting);
  CHECK(a.offer(3, t0).verdict == Verdict::waiting);
  CHECK(a.admit_waiting().empty());  // still full
  CHECK(a.finished(1));
  CHECK_FALSE(a.finished(1));        // twice: ignored
  CHECK(a.admit_waiting() == std::vector<uint64_t>{2});
  // A new request does not overtake the waiting one even when a slot is free.
  CHECK(a.finished(2));
  CHECK(a.offer(4, t0).verdict == Verdict::waiting);
  CHECK(a.admit_waiting() == std::vector<uint64_t>{3});
}

TEST_CASE("admission: a waiting client that leaves frees its place") {
  Admission a(limits(1, 1, 10));
  a.set_decode_ready(1);
  CHECK(a.offer(1, t0).verdict == Verdict::admitted);
  CHECK(a.offer(2, t0).verdict == Verdict::waiting);
  CHECK(a.offer(3, t0).verdict == Verdict::refused);
  CHECK(a.cancel_waiting(2));
  CHECK_FALSE(a.cancel_waiting(2));
  CHECK(a.offer(3, t0).verdict == Verdict::waiting);
}

TEST_CASE("admission: waiting longer than queue_timeout is a 503 queue_timeout") {
  Admission a(limits(1, 4, 10));
  a.set_decode_ready(1);
  CHECK(a.offer(1, t0).verdict == Verdict::admitted);
  CHECK(a.offer(2, t0).verdict == Verdict::waiting);
  CHECK(a.offer(3, t0 + milliseconds(600)).verdict == Verdict::waiting);
  CHECK(a.expire(t0 + milliseconds(1000)).empty());  // not longer than the timeout yet
  auto late = a.expire(t0 + milliseconds(1001));
  REQUIRE(late.size() == 1);
  CHECK(late[0].id == 2);
  CHECK(late[0].refusal.http_status == 503);
  CHECK(late[0].refusal.code == "queue_timeout");
  CHECK(late[0].refusal.retry_after_s == 1);
  CHECK(a.waiting_count() == 1);
  CHECK(a.expire(t0 + milliseconds(1601)).size() == 1);
  CHECK(a.waiting_count() == 0);
}

TEST_CASE("admission: losing a decode instance stops admissions until running drops") {
  Admission a(limits(100, 4, 2));
  a.set_decode_ready(2);
  for (uint64_t id = 1; id <= 4; ++id) CHECK(a.offer(id, t0).verdict == Verdict::admitted);
  a.set_decode_ready(1);
  CHECK(a.offer(5, t0).verdict == Verdict::waiting);
  CHECK(a.finished(1));
  CHECK(a.admit_waiting().empty());  // 3 running > 2 now
  CHECK(a.finished(2));
  CHECK(a.finished(3));
  CHECK(a.admit_waiting() == std::vector<uint64_t>{5});
  a.set_decode_ready(0);
  CHECK(a.offer(6, t0).refusal.http_status == 503);
}

TEST_CASE("admission: queue_max 0 refuses at once when running is full") {
  Admission a(limits(1, 0, 10));
  a.set_decode_ready(1);
  CHECK(a.offer(1, t0).verdict == Verdict::admitted);
  CHECK(a.offer(2, t0).refusal.http_status == 429);
}
