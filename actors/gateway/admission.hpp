// Admission: whether the gateway starts a request now, keeps it waiting, or refuses it, from
// limits that agree end to end. Pure (no clocks, threads, I/O or CAF): the gateway actor
// passes `now` in and owns the requests; this core holds only their ids.
//
// A request is *running* from admission until it ends. At most running_max() run:
// min(gateway.requests_max, ready decode instances x (decode.seqs_max + decode.waiting_max)),
// so every request the gateway admits fits in what the decode instances can hold (sequences
// holding blocks plus their waiting queues) and is not refused by decode for a full queue.
// Beyond that up to gateway.queue_max wait, FIFO, for at most queue_timeout. Refusals come
// before any byte of the answer: 429 (running and waiting full) or 503 (no decode instance
// can serve; waited too long), each with a Retry-After.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <set>
#include <string>
#include <vector>

namespace tandem::gateway {

struct AdmissionLimits {
  uint32_t requests_max = 1024;  // gateway.requests_max; >= 1
  uint32_t queue_max = 4096;     // gateway.queue_max; may be 0 (no waiting)
  std::chrono::milliseconds queue_timeout{30000};  // gateway.queue_timeout_ms; > 0
  // What one decode instance holds: decode.seqs_max + decode.waiting_max; >= 1.
  uint32_t decode_seqs_per_instance = 320;
};

// A refusal, for the shell to render in the request's API shape.
struct AdmissionRefusal {
  int http_status = 429;        // 429 or 503
  std::string type;             // "rate_limit_error" / "overloaded_error"
  std::string code;             // "rate_limit_exceeded" / "queue_timeout" / "no_capacity"
  std::string message;
  uint32_t retry_after_s = 1;   // the Retry-After header; >= 1
};

class Admission {
 public:
  using Time = std::chrono::steady_clock::time_point;  // passed in, never read here
  enum class Verdict { admitted, waiting, refused };
  struct Offer {
    Verdict verdict = Verdict::refused;
    AdmissionRefusal refusal;  // when refused
  };
  struct Expired {
    uint64_t id = 0;
    AdmissionRefusal refusal;  // 503 queue_timeout
  };

  // Preconditions (asserted): requests_max >= 1, queue_timeout > 0, per instance >= 1.
  explicit Admission(AdmissionLimits limits);

  // How many decode instances can serve now (DecodeHealth); 0 refuses every new request.
  void set_decode_ready(uint32_t instance_count);
  // min(requests_max, ready instances x decode_seqs_per_instance).
  uint32_t running_max() const;

  // A new request `id` (unique; asserted not known). Admitted: it counts as running until
  // finished(id). Waiting: call admit_waiting() after each finish. Refused: it is forgotten.
  Offer offer(uint64_t id, Time now);
  // A running request ended (any way). False if `id` was not running (ignored).
  bool finished(uint64_t id);
  // A waiting request's client left. False if `id` was not waiting.
  bool cancel_waiting(uint64_t id);
  // The waiting requests that may start now, oldest first; each now counts as running.
  std::vector<uint64_t> admit_waiting();
  // The waiting requests older than queue_timeout at `now`, oldest first; forgotten.
  std::vector<Expired> expire(Time now);

  size_t running_count() const { return running_.size(); }
  size_t waiting_count() const { return waiting_.size(); }
  const AdmissionLimits& limits() const { return limits_; }

  static constexpr uint32_t retry_after_s = 1;

 private:
  struct Waiting {
    uint64_t id;
    Time since;
  };
  AdmissionLimits limits_;
  uint32_t decode_ready_count_ = 0;
  std::set<uint64_t> running_;   // <= max(running_max() at admission)
  std::deque<Waiting> waiting_;  // <= queue_max
};

}  // namespace tandem::gateway
