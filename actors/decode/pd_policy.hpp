// Decode's failure policy for disaggregated requests (issue 12), pure: shared by the decode
// shell (decode_actor.cpp) and the cluster simulator (tools/sim), so the simulator runs the
// decisions the nodes make. No CAF, no clocks (time is passed in), no I/O.
//
//   prefill_timed_out   a remote prefill that has not answered by its deadline
//                       (decode.prefill_timeout_ms after submission) -> prefill locally;
//   pull_start          when a pull may start, must fail at once (prefill failed, request
//                       cancelled, descriptors that do not match) -> local prefill, or waits;
//   PullReads           a pull's block reads: it fails if any read failed, and ends when the
//                       last read ends (a failed pull -> local prefill, the hold released);
//   on_duplicate        a generate request whose id this instance still holds: from the same
//                       gateway it is that gateway's retry of a request it gave up on here
//                       (no progress, a membership blip; the gateway reuses its id), so the
//                       new attempt replaces the old one; from anyone else it is refused;
//   LostStreams         streams cancelled because their tokens could not reach the gateway:
//                       the error is re-sent every tick until it goes out or attempts_max
//                       ticks passed; at most capacity are kept (the oldest is dropped).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>

#include "runtime/base/assert.hpp"

namespace tandem::decode {

// `waiting`: the request has a remote prefill that neither answered nor failed yet.
inline bool prefill_timed_out(bool waiting, std::chrono::nanoseconds now,
                              std::chrono::nanoseconds deadline) {
  return waiting && now > deadline;
}

enum class PullStart : uint8_t { wait, fail, start };

// `order_known`: the scheduler asked for the pull (PullOrder); `answered`: prefill described
// its blocks; `descriptors_match`: as many descriptors as the order's block table (and a
// fabric), meaningful only when answered.
inline PullStart pull_start(bool order_known, bool started, bool prefill_failed, bool cancelled,
                            bool answered, bool descriptors_match) {
  if (!order_known || started) return PullStart::wait;
  if (prefill_failed || cancelled) return PullStart::fail;
  if (!answered) return PullStart::wait;
  return descriptors_match ? PullStart::start : PullStart::fail;
}

enum class Duplicate : uint8_t { refuse, replace };

// `same_sender`: the request's reply_to is the held sequence's. replace: cancel the held
// sequence and take the new one (if the held one cannot go yet, its KV pull still in flight,
// answer a retryable error); refuse: invalid ("duplicate request id").
inline Duplicate on_duplicate(bool same_sender) {
  return same_sender ? Duplicate::replace : Duplicate::refuse;
}

// The reads of one pull. start(n) (n = 0: the pull is done and ok at once); read_done(ok)
// returns the pull's outcome when it was the last read, nullopt before.
class PullReads {
 public:
  std::optional<bool> start(uint32_t reads) {
    left_ = reads;
    failed_ = false;
    if (reads == 0) return true;
    return std::nullopt;
  }
  // Returns true when this read is the first that failed (the caller logs it once).
  bool note(bool ok) {
    bool first = !ok && !failed_;
    failed_ = failed_ || !ok;
    return first;
  }
  std::optional<bool> read_done(bool ok) {
    RT_ASSERT(left_ > 0);
    note(ok);
    if (--left_ > 0) return std::nullopt;
    return !failed_;
  }
  uint32_t left() const { return left_; }
  bool failed() const { return failed_; }

 private:
  uint32_t left_ = 0;
  bool failed_ = false;
};

// Errors owed to gateways. T: the error's content (its destination, request id, tokens sent).
template <class T>
class LostStreams {
 public:
  LostStreams(size_t capacity, uint32_t attempts_max)
      : capacity_(capacity), attempts_max_(attempts_max) {
    RT_ASSERT(capacity >= 1 && attempts_max >= 1);
  }
  // A first send failed: keep it for the next tick (the oldest goes when full).
  void push(T item) {
    if (entries_.size() == capacity_) {
      entries_.pop_front();
      ++dropped_count_;
    }
    entries_.push_back({std::move(item), 0});
  }
  // One tick: send(item) -> bool sent; keeps those not sent, gives up after attempts_max
  // ticks (give_up(item) is told). Order kept.
  template <class Send, class GiveUp>
  void retry(Send&& send, GiveUp&& give_up) {
    std::deque<Entry> keep;
    for (Entry& e : entries_) {
      if (send(e.item)) continue;
      if (++e.attempts < attempts_max_) {
        keep.push_back(std::move(e));
      } else {
        give_up(e.item);
      }
    }
    entries_ = std::move(keep);
  }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  size_t capacity() const { return capacity_; }
  uint64_t dropped_count() const { return dropped_count_; }

 private:
  struct Entry {
    T item;
    uint32_t attempts = 0;
  };
  size_t capacity_;
  uint32_t attempts_max_;
  std::deque<Entry> entries_;
  uint64_t dropped_count_ = 0;
};

}  // namespace tandem::decode
