#include "runtime/node/node_metrics.hpp"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace tandem::runtime {

namespace {

obs::Counter* counter(obs::Registry& registry, const char* name, const char* help,
                      obs::Labels labels) {
  auto made = registry.counter(name, help, std::move(labels));
  RT_ASSERT(made.ok(), name, made.ok() ? "" : made.error().describe());
  return *made;
}

obs::Gauge* gauge(obs::Registry& registry, const char* name, const char* help,
                  obs::Labels labels) {
  auto made = registry.gauge(name, help, std::move(labels));
  RT_ASSERT(made.ok(), name, made.ok() ? "" : made.error().describe());
  return *made;
}

}  // namespace

NodeMetrics::NodeMetrics(obs::Registry& registry, const std::string& node) {
  obs::Labels n = {{"node", node}};
  auto with = [&](const char* reason) {
    obs::Labels l = n;
    l.emplace_back("reason", reason);
    return l;
  };
  const char* dropped_help = "frames received and dropped, by reason";
  frames_sent_.metric = counter(registry, "tandem_fabric_frames_sent_total", "frames sent", n);
  bytes_sent_.metric = counter(registry, "tandem_fabric_bytes_sent_total", "bytes sent", n);
  frames_received_.metric =
      counter(registry, "tandem_fabric_frames_received_total", "frames received", n);
  bytes_received_.metric =
      counter(registry, "tandem_fabric_bytes_received_total", "bytes received", n);
  frames_local_.metric = counter(registry, "tandem_fabric_frames_local_total",
                                 "frames delivered to a local actor without the fabric", n);
  dropped_oversized_.metric =
      counter(registry, "tandem_fabric_frames_dropped_total", dropped_help, with("oversized"));
  dropped_malformed_.metric =
      counter(registry, "tandem_fabric_frames_dropped_total", dropped_help, with("malformed"));
  dropped_version_.metric =
      counter(registry, "tandem_fabric_frames_dropped_total", dropped_help, with("version"));
  dropped_unroutable_.metric =
      counter(registry, "tandem_fabric_frames_dropped_total", dropped_help, with("unroutable"));
  send_errors_.metric =
      counter(registry, "tandem_fabric_send_errors_total", "sends that completed in error", n);
  sends_refused_.metric = counter(registry, "tandem_fabric_sends_refused_total",
                                  "sends refused by backpressure (peer queue full)", n);
  rma_reads_.metric = counter(registry, "tandem_rma_reads_total", "RMA reads completed", n);
  rma_bytes_.metric = counter(registry, "tandem_rma_bytes_total", "bytes moved by RMA reads", n);
  rma_errors_.metric = counter(registry, "tandem_rma_errors_total", "RMA read chunks failed", n);
  const char* auth_help = "frames refused by the authenticated channel or the protocol table";
  for (size_t i = 0; i < static_cast<size_t>(ChannelDrop::kinds_count); ++i) {
    auto reason = std::string(to_string(static_cast<ChannelDrop>(i)));
    auth_failures_.push_back(
        {counter(registry, "tandem:fabric_auth_failures_total", auth_help, with(reason.c_str()))});
  }
  auth_failures_.push_back(
      {counter(registry, "tandem:fabric_auth_failures_total", auth_help, with("identity"))});
  auth_failures_.push_back(
      {counter(registry, "tandem:fabric_auth_failures_total", auth_help, with("protocol"))});
  handshakes_.metric = counter(registry, "tandem:fabric_handshakes_total",
                               "authenticated sessions established, either side", n);
  handshake_timeouts_.metric = counter(registry, "tandem:fabric_handshake_timeouts_total",
                                       "handshakes this node started that got no answer", n);
  peers_up_ = gauge(registry, "tandem_peers_up", "peer nodes currently up", n);
  peers_total_ = gauge(registry, "tandem_peers", "peer nodes in the manifest", n);
  workers_ = gauge(registry, "tandem_node_workers", "actor worker threads of the node", n);
  rss_ = gauge(registry, "process_resident_memory_bytes", "resident memory of the node process",
               n);
  rss_peak_ = gauge(registry, "tandem_process_peak_resident_memory_bytes",
                    "peak resident memory of the node process since it started (VmHWM)", n);
}

std::optional<ProcessMemory> read_process_memory() {
  std::ifstream in("/proc/self/status");
  if (!in) return std::nullopt;
  ProcessMemory m;
  bool rss = false, hwm = false;
  for (std::string line; std::getline(in, line);) {
    // "VmRSS:\t  123456 kB"
    auto field = [&](const char* name, uint64_t& out) {
      if (line.rfind(name, 0) != 0) return false;
      out = std::strtoull(line.c_str() + std::strlen(name), nullptr, 10) * 1024;
      return true;
    };
    rss = field("VmRSS:", m.rss_bytes) || rss;
    hwm = field("VmHWM:", m.peak_rss_bytes) || hwm;
  }
  if (!rss || !hwm) return std::nullopt;
  return m;
}

void NodeMetrics::advance(Pair& pair, uint64_t now_value) {
  RT_ASSERT(now_value >= pair.last, now_value, pair.last);  // counters only grow
  pair.metric->inc(now_value - pair.last);
  pair.last = now_value;
}

void NodeMetrics::sync(const FabricCounters& f, const BridgeCounters& b) {
  std::lock_guard lock(mu_);
  advance(frames_sent_, f.frames_sent.load());
  advance(bytes_sent_, f.bytes_sent.load());
  advance(frames_received_, f.frames_received.load());
  advance(bytes_received_, f.bytes_received.load());
  advance(frames_local_, b.frames_local.load());
  advance(dropped_oversized_, f.frames_dropped.load());
  advance(dropped_malformed_, b.frames_malformed.load());
  advance(dropped_version_, b.frames_version_refused.load());
  advance(dropped_unroutable_, b.frames_unroutable.load());
  advance(send_errors_, f.send_errors.load());
  advance(sends_refused_, f.sends_refused.load());
  advance(rma_reads_, f.rma_reads.load());
  advance(rma_bytes_, f.rma_bytes.load());
  advance(rma_errors_, f.rma_errors.load());
  constexpr size_t drops = static_cast<size_t>(ChannelDrop::kinds_count);
  RT_ASSERT(auth_failures_.size() == drops + 2, auth_failures_.size());
  for (size_t i = 0; i < drops; ++i) advance(auth_failures_[i], b.auth_failures[i].load());
  advance(auth_failures_[drops], b.identity_mismatch.load());
  advance(auth_failures_[drops + 1], b.protocol_refused.load());
  advance(handshakes_, f.handshakes.load());
  advance(handshake_timeouts_, f.handshake_timeouts.load());
  if (auto memory = read_process_memory()) {
    rss_->set(static_cast<double>(memory->rss_bytes));
    rss_peak_->set(static_cast<double>(memory->peak_rss_bytes));
  }
}

void NodeMetrics::set_peers(int64_t up, int64_t total) {
  peers_up_->set(static_cast<double>(up));
  peers_total_->set(static_cast<double>(total));
}

void NodeMetrics::set_workers(int64_t workers) {
  workers_->set(static_cast<double>(workers));
}

}  // namespace tandem::runtime
