#include "tools/up_plan.hpp"

#include <algorithm>

namespace tandem::tools {

std::vector<std::string> split_node_list(const std::vector<std::string>& values) {
  std::vector<std::string> names;
  for (const auto& value : values) {
    size_t start = 0;
    while (start <= value.size()) {
      size_t comma = value.find(',', start);
      if (comma == std::string::npos) comma = value.size();
      if (comma > start) names.push_back(value.substr(start, comma - start));
      start = comma + 1;
    }
  }
  return names;
}

namespace {

const config::Node* node_named(const config::Manifest& manifest, const std::string& name) {
  for (const auto& node : manifest.nodes) {
    if (node.name == name) return &node;
  }
  return nullptr;
}

std::string known_nodes(const config::Manifest& manifest) {
  std::string out;
  for (const auto& node : manifest.nodes) {
    out += (out.empty() ? "" : ", ") + node.name + " (" + node.host + ")";
  }
  return out.empty() ? "none" : out;
}

}  // namespace

Result<std::vector<ChildSpec>> plan_local_nodes(const config::Manifest& manifest,
                                                const UpRequest& request,
                                                const HostIdentity& self) {
  RT_ASSERT(!request.manifest_path.empty(), "plan_local_nodes without a manifest path");
  RT_ASSERT(!request.tandem_bin.empty(), "plan_local_nodes without a tandem binary");
  for (const auto& name : request.only) {
    const config::Node* node = node_named(manifest, name);
    if (node == nullptr) {
      return make_error(ErrorKind::invalid, "--only: no node '" + name + "' in " +
                                                request.manifest_path +
                                                " (nodes: " + known_nodes(manifest) + ")");
    }
    if (!is_local_host(node->host, self)) {
      return make_error(ErrorKind::invalid, "--only: node '" + name + "' is on host '" +
                                                node->host + "', not this machine (" +
                                                self.hostname + ")");
    }
  }
  std::vector<ChildSpec> children;
  for (const auto& node : manifest.nodes) {
    bool wanted = request.only.empty() || std::find(request.only.begin(), request.only.end(),
                                                    node.name) != request.only.end();
    if (!wanted || !is_local_host(node.host, self)) continue;
    children.push_back(ChildSpec{
        node.name,
        {request.tandem_bin, "node", "--manifest", request.manifest_path, "--node", node.name}});
  }
  if (children.empty()) {
    return make_error(ErrorKind::invalid, "no node of " + request.manifest_path +
                                              " is on this host (" + self.hostname +
                                              "); nodes: " + known_nodes(manifest));
  }
  RT_ASSERT(children.size() <= manifest.nodes.size(), children.size());
  return children;
}

}  // namespace tandem::tools
