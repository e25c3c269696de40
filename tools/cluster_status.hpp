// `tandem shell` status: the cluster at a glance, from what the nodes answer (the `nodes` and
// `instances` admin commands and each node's metrics text). Pure: parsing and rendering only,
// no I/O (the shell gathers; tests feed text).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tandem::tools {

// One sample of the Prometheus text exposition format: name{labels} value.
struct MetricSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};
// Lines that are not samples (comments, blank, malformed) are skipped.
std::vector<MetricSample> parse_metrics(const std::string& text);

// What one node answered (empty rows / text: it did not answer).
struct NodeAnswers {
  std::string node;
  std::vector<std::vector<std::string>> instances;  // `instances` rows, header first
  std::string metrics;                              // its Prometheus text
};

struct ClusterStatus {
  struct Node {
    std::string name, address, state, uptime;
  };
  struct Instance {
    std::string name;   // node/role/instance
    std::string state;  // serving, draining, starting, not ready: ..., unreachable
    std::string waiting, running, kv_used, kv_total;
    std::optional<double> prefix_hit_rate;  // hits / queries (token-weighted), when looked up
  };
  struct Gateway {
    std::string node, instance;
    double running = 0, waiting = 0;
    std::optional<double> ttft_p50_s, ttft_p90_s, itl_p50_s, itl_p90_s;  // the last minute
    double first_tokens_1m = 0;
    double generation_tokens_total = 0;  // since start (a rate is its difference over time)
  };
  struct Tier2 {
    std::string node, instance;
    double blocks_used = 0, blocks_capacity = 0;
  };
  std::string cluster;
  std::vector<Node> nodes;
  std::vector<Instance> instances;
  std::vector<Gateway> gateways;
  std::vector<Tier2> tier2;
  std::map<std::string, double> errors_by_type;  // summed over gateways (since start)
  uint32_t nodes_up = 0;
};

// nodes_rows: the `nodes` answer (header first); answers: one per node asked.
ClusterStatus build_status(const std::string& cluster,
                           const std::vector<std::vector<std::string>>& nodes_rows,
                           const std::vector<NodeAnswers>& answers);
std::string render_status(const ClusterStatus& status);  // one screen of text
// The same as one JSON object; bytes that are not UTF-8 (a node's text is outside input) are
// replaced, never thrown on.
std::string status_json(const ClusterStatus& status);

}  // namespace tandem::tools

namespace tandem::runtime {
class ClusterClient;
}
namespace tandem::config {
struct Manifest;
}

namespace tandem::tools {

// Asks every node of `manifest` (nodes, instances, metrics) through `client` and builds the
// status; a node that does not answer has its prefill/decode instances listed "unreachable".
// Blocks up to about 3 x nodes x timeout. `nodes_answered`: whether any node answered `nodes`.
ClusterStatus gather_status(runtime::ClusterClient& client, const config::Manifest& manifest,
                            std::chrono::milliseconds timeout, bool* nodes_answered = nullptr);

}  // namespace tandem::tools
