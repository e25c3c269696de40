// `tandem bench transport`, the raw libfabric baseline: the provider's own ceiling on this
// machine, with none of Tandem's layers (no framing, no validation, no queues, no progress
// thread, no actors). Both sides busy-poll their completion queue with fi_cq_read, calling
// sched_yield() after an empty poll (never blocking in the kernel).
//
// Protocol (parent = measuring side, child = serve_raw in another process):
//   child opens an RDM endpoint on `port`, registers `region_bytes`, writes
//   "BASE LENGTH KEY\n" to `ready_path` (atomically: temp file + rename), then echoes every
//   message it receives back to the parent; a message starting with 'q' ends it.
//   The parent measures 64-byte send/recv round trips, a windowed message rate, and fi_read loops
//   from the child's region.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/base/result.hpp"

namespace tandem::bench {

struct RawRemote {
  std::string address;  // "host:port" of the child
  uint64_t remote_base = 0, length_bytes = 0, key = 0;
};

struct RawPlan {
  std::string provider, host;
  uint16_t port = 0;  // the parent's endpoint
  uint32_t round_trips_count = 2000;
  uint32_t rate_messages_count = 20000;
  uint32_t window_count = 64;  // messages outstanding in the rate test
  std::vector<uint64_t> read_sizes_bytes;
  uint64_t read_bytes_per_size = 256ull << 20;  // repetitions = this / size (at least 8)
};

struct RawResults {
  std::vector<double> round_trip_us;
  double rate_msg_per_s = 0;
  std::vector<double> read_mb_per_s;  // one per plan.read_sizes_bytes
};

// The child process's body. Returns a process exit code; errors go to stderr.
int serve_raw(const std::string& provider, const std::string& host, uint16_t port,
              const std::string& parent_address, const std::string& ready_path,
              uint64_t region_bytes);

// The parent side. The parent's endpoint must be open (on plan.port) before the child starts
// so the child's first echo finds it: `start_child` is called once it is.
// Errors: failed (provider calls), timed_out (no completion within 10 s).
Result<RawResults> measure_raw(const RawPlan& plan,
                               const std::function<Result<RawRemote>()>& start_child);

}  // namespace tandem::bench
