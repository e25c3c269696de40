#include "actors/gateway/admission.hpp"

#include <algorithm>

#include "runtime/base/assert.hpp"

namespace tandem::gateway {

Admission::Admission(AdmissionLimits limits) : limits_(limits) {
  RT_ASSERT(limits_.requests_max >= 1, limits_.requests_max);
  RT_ASSERT(limits_.queue_timeout.count() > 0, limits_.queue_timeout.count());
  RT_ASSERT(limits_.decode_seqs_per_instance >= 1, limits_.decode_seqs_per_instance);
}

void Admission::set_decode_ready(uint32_t instance_count) { decode_ready_count_ = instance_count; }

uint32_t Admission::running_max() const {
  uint64_t decode = uint64_t{decode_ready_count_} * limits_.decode_seqs_per_instance;
  return static_cast<uint32_t>(std::min<uint64_t>(limits_.requests_max, decode));
}

Admission::Offer Admission::offer(uint64_t id, Time now) {
  RT_ASSERT(running_.count(id) == 0, id);
  RT_ASSERT(std::none_of(waiting_.begin(), waiting_.end(),
                         [id](const Waiting& w) { return w.id == id; }), id);
  Offer o;
  if (decode_ready_count_ == 0) {
    o.refusal = {503, "overloaded_error", "no_capacity",
                 "no decode instance can serve now; retry later", retry_after_s};
    return o;
  }
  const uint32_t max = running_max();
  if (running_.size() < max && waiting_.empty()) {
    running_.insert(id);
    o.verdict = Verdict::admitted;
    return o;
  }
  if (waiting_.size() < limits_.queue_max) {
    waiting_.push_back({id, now});
    o.verdict = Verdict::waiting;
    return o;
  }
  o.refusal = {429, "rate_limit_error", "rate_limit_exceeded",
               "too many requests: " + std::to_string(max) + " in flight (what " +
                   std::to_string(decode_ready_count_) + " decode instance(s) hold, at most " +
                   "gateway.requests_max " + std::to_string(limits_.requests_max) + ") and " +
                   std::to_string(limits_.queue_max) + " waiting; retry later",
               retry_after_s};
  RT_ASSERT(waiting_.size() <= limits_.queue_max, waiting_.size());
  return o;
}

bool Admission::finished(uint64_t id) { return running_.erase(id) > 0; }

bool Admission::cancel_waiting(uint64_t id) {
  auto it = std::find_if(waiting_.begin(), waiting_.end(),
                         [id](const Waiting& w) { return w.id == id; });
  if (it == waiting_.end()) return false;
  waiting_.erase(it);
  return true;
}

std::vector<uint64_t> Admission::admit_waiting() {
  std::vector<uint64_t> started;
  const uint32_t max = running_max();
  while (!waiting_.empty() && running_.size() < max) {
    uint64_t id = waiting_.front().id;
    waiting_.pop_front();
    bool added = running_.insert(id).second;
    RT_ASSERT(added, id);
    started.push_back(id);
  }
  RT_ASSERT(waiting_.empty() || running_.size() >= max, running_.size(), max);
  return started;
}

std::vector<Admission::Expired> Admission::expire(Time now) {
  std::vector<Expired> late;
  while (!waiting_.empty() && now - waiting_.front().since > limits_.queue_timeout) {
    uint64_t id = waiting_.front().id;
    waiting_.pop_front();
    late.push_back({id, {503, "overloaded_error", "queue_timeout",
                         "waited " + std::to_string(limits_.queue_timeout.count()) +
                             " ms for admission (gateway.queue_timeout_ms); retry later",
                         retry_after_s}});
  }
  RT_ASSERT(waiting_.size() <= limits_.queue_max, waiting_.size());
  return late;
}

}  // namespace tandem::gateway
