// The node's own metrics: fabric traffic, RMA, frames dropped by reason, peers up, and the
// process's resident memory now and at its peak (VmRSS, VmHWM of /proc/self/status).
// Fabric and bridge counters are plain atomics on the hot path; sync() copies them into
// the registry right before it is rendered (admin HTTP thread or the node actor), under
// this object's mutex.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "runtime/fabric/endpoint.hpp"
#include "runtime/node/bridge.hpp"
#include "runtime/obs/metrics.hpp"

namespace tandem::runtime {

class NodeMetrics {
 public:
  // `registry` outlives this object. Asserts the registry accepts the series (fixed names).
  NodeMetrics(obs::Registry& registry, const std::string& node);

  void sync(const FabricCounters& fabric, const BridgeCounters& bridge);
  void set_peers(int64_t up, int64_t total);
  void set_workers(int64_t workers);

 private:
  struct Pair {
    obs::Counter* metric;
    uint64_t last = 0;
  };
  void advance(Pair& pair, uint64_t now_value);

  std::mutex mu_;
  Pair frames_sent_, bytes_sent_, frames_received_, bytes_received_;
  Pair dropped_oversized_, dropped_malformed_, dropped_version_, dropped_unroutable_;
  Pair send_errors_, sends_refused_, rma_reads_, rma_bytes_, rma_errors_, frames_local_;
  // tandem:fabric_auth_failures_total{reason}: the channel's drops (ChannelDrop), then
  // "identity" (a source that is not the sender) and "protocol" (a kind its role never sends).
  std::vector<Pair> auth_failures_;
  Pair handshakes_, handshake_timeouts_;
  obs::Gauge* peers_up_;
  obs::Gauge* peers_total_;
  obs::Gauge* workers_;
  obs::Gauge* rss_;
  obs::Gauge* rss_peak_;
};

// VmRSS and VmHWM of /proc/self/status, bytes; nullopt where it cannot be read.
struct ProcessMemory {
  uint64_t rss_bytes = 0, peak_rss_bytes = 0;
};
std::optional<ProcessMemory> read_process_memory();

}  // namespace tandem::runtime
