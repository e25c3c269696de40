// tandem/gateway: the load of the gateway's preparers, for picking one per request.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/base/assert.hpp"

namespace tandem::gateway {

// The work each of the gateway's preparers has been given and not finished (request body
// bytes: tokenizing and hashing cost about that). The HTTP thread picks the least loaded
// preparer for each request, so a long prompt being prepared holds up only the requests
// that arrive while every preparer is busy. Loads are added by the HTTP thread and taken
// off by the preparers (atomics); each is at most the bytes of the requests it holds.
// Holds no actor handle (the preparers hold it: no reference cycle).
class PreparerPool {
 public:
  explicit PreparerPool(size_t count) : loads_(count) { RT_ASSERT(count > 0, "no preparer"); }
  size_t size() const { return loads_.size(); }
  // The least loaded slot, the first such from a start that rotates per call (equal loads
  // take turns); adds `cost` to it. One thread at a time (the HTTP thread).
  size_t pick(uint64_t cost) {
    size_t start = next_++ % loads_.size(), best = start;
    uint64_t best_load = loads_[start].load(std::memory_order_relaxed);
    for (size_t i = 1; i < loads_.size() && best_load > 0; ++i) {
      size_t slot = (start + i) % loads_.size();
      uint64_t load = loads_[slot].load(std::memory_order_relaxed);
      if (load < best_load) best = slot, best_load = load;
    }
    loads_[best].fetch_add(cost, std::memory_order_relaxed);
    return best;
  }
  // Adds `cost` to a slot chosen by the caller (the picked one's preparer was down). HTTP
  // thread.
  void add(size_t slot, uint64_t cost) {
    loads_.at(slot).fetch_add(cost, std::memory_order_relaxed);
  }
  // Takes a picked request's cost off its slot. Any thread. Never below zero: after reset()
  // (a restarted preparer) costs added before the reset may still be taken off.
  void done(size_t slot, uint64_t cost) {
    RT_ASSERT(cost > 0, slot);
    std::atomic<uint64_t>& load = loads_.at(slot);
    uint64_t before = load.load(std::memory_order_relaxed);
    while (!load.compare_exchange_weak(before, before >= cost ? before - cost : 0,
                                       std::memory_order_relaxed)) {
    }
  }
  // Forgets a slot's load: its preparer died with requests in its mailbox, which no one will
  // take off. The supervisor's thread, before the replacement starts.
  void reset(size_t slot) { loads_.at(slot).store(0, std::memory_order_relaxed); }
  uint64_t load(size_t slot) const { return loads_.at(slot).load(std::memory_order_relaxed); }

 private:
  std::vector<std::atomic<uint64_t>> loads_;
  size_t next_ = 0;  // HTTP thread only
};

}  // namespace tandem::gateway
