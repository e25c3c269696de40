// gather_status (tools/cluster_status.hpp): the admin round trips behind `status`.
#include "config/manifest.hpp"
#include "runtime/client/client.hpp"
#include "tools/cluster_status.hpp"

namespace tandem::tools {

ClusterStatus gather_status(runtime::ClusterClient& client, const config::Manifest& manifest,
                            std::chrono::milliseconds timeout, bool* nodes_answered) {
  auto nodes = client.admin_any("nodes", timeout);
  if (nodes_answered) *nodes_answered = nodes.ok();
  std::vector<std::vector<std::string>> nodes_rows;
  if (nodes.ok()) nodes_rows = nodes->rows;
  std::vector<NodeAnswers> answers;
  for (const auto& node : manifest.nodes) {
    NodeAnswers a{node.name, {}, ""};
    auto instances = client.admin(node.name, "instances", {}, timeout);
    if (instances.ok() && instances->ok) {
      a.instances = instances->rows;
      auto stats = client.admin(node.name, "stats", {}, timeout);
      if (stats.ok() && stats->ok) a.metrics = stats->text;
    } else {
      a.instances.push_back({"instance", "state", "waiting", "running", "kv", "total"});
      for (const auto& inst : node.instances) {
        if (inst.role != config::Role::prefill && inst.role != config::Role::decode) continue;
        std::string name =
            node.name + "/" + std::string(config::to_string(inst.role)) + "/" + inst.name;
        a.instances.push_back({name, "unreachable", "-", "-", "-", "-"});
      }
    }
    answers.push_back(std::move(a));
  }
  return build_status(manifest.cluster.name, nodes_rows, answers);
}

}  // namespace tandem::tools
