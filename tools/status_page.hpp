// The status page on every node's admin port (`tandem node`): GET /status is a small web page
// (HTML, CSS and JS in the binary: no CDN, no build step) that polls GET /status.json, the
// cluster's status (tools/cluster_status.hpp) sampled every `interval` over the last minutes,
// and draws it: nodes, instances, gateways, and plots of TTFT, throughput, prefix hit rate and
// load per instance.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "config/manifest.hpp"

namespace tandem::runtime {
class ClusterClient;
}

namespace tandem::tools {

std::string status_page_html();

// Samples the cluster's status from a thread of its own, through its own ClusterClient (an
// admin client bound to `bind_host`), every `interval`, keeping at most `samples_max`. It
// starts on the first history_json() and stops after `idle_stop` without one, so a cluster
// nobody watches pays nothing. Thread-safe. `manifest` outlives the sampler.
class StatusSampler {
 public:
  StatusSampler(const config::Manifest& manifest, std::string bind_host,
                std::chrono::milliseconds interval = std::chrono::seconds(2),
                size_t samples_max = 300,
                std::chrono::milliseconds idle_stop = std::chrono::minutes(10));
  ~StatusSampler();
  StatusSampler(const StatusSampler&) = delete;
  StatusSampler& operator=(const StatusSampler&) = delete;

  // {"cluster", "interval_ms", "error" (when the client cannot connect), "samples": [{"t_ms"
  // (unix ms), "status"}...]}, oldest first.
  std::string history_json();

 private:
  void run();

  const config::Manifest& manifest_;
  std::string bind_host_;
  std::chrono::milliseconds interval_, idle_stop_;
  size_t samples_max_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool running_ = false, stopping_ = false;
  std::chrono::steady_clock::time_point last_asked_;
  std::string error_;
  std::deque<std::pair<int64_t, std::string>> samples_;  // unix ms, status JSON
  std::thread thread_;
};

}  // namespace tandem::tools
