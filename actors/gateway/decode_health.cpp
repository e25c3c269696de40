#include "actors/gateway/decode_health.hpp"

#include "runtime/base/assert.hpp"

namespace tandem::gateway {

DecodeHealth::DecodeHealth(std::string self_node, const std::vector<Instance>& instances)
    : self_node_(std::move(self_node)) {
  RT_ASSERT(!self_node_.empty());
  for (const auto& i : instances) {
    RT_ASSERT(!i.node.empty() && !i.name.empty(), i.node, i.name);
    auto [it, added] = instances_.emplace(i.node + "/decode/" + i.name, View{i.node, i.name});
    RT_ASSERT(added, it->first);
    if (i.node != self_node_) node_up_.emplace(i.node, false);
  }
}

void DecodeHealth::node_up(const std::string& node, bool up) {
  auto it = node_up_.find(node);
  if (it != node_up_.end()) it->second = up;
}

void DecodeHealth::node_restarted(const std::string& node) {
  for (auto& [key, v] : instances_) {
    if (v.node != node) continue;
    v.reported = false;
    v.ready = false;
    v.reason.clear();
  }
}

void DecodeHealth::report(const std::string& actor_name, bool ready, const std::string& reason) {
  auto it = instances_.find(actor_name);
  if (it == instances_.end()) return;
  View& v = it->second;
  v.reported = true;
  v.ready = ready;
  v.reason = ready ? "" : reason.substr(0, reason_bytes_max);
  if (!ready && v.reason.empty()) v.reason = "not ready (no reason given)";
  RT_ASSERT(v.ready || !v.reason.empty(), actor_name);
}

bool DecodeHealth::node_is_up(const std::string& node) const {
  if (node == self_node_) return true;
  auto it = node_up_.find(node);
  RT_ASSERT(it != node_up_.end(), node);
  return it->second;
}

bool DecodeHealth::can_serve(const View& v) const { return node_is_up(v.node) && v.ready; }

bool DecodeHealth::healthy() const {
  for (const auto& [key, v] : instances_) {
    if (can_serve(v)) return true;
  }
  return false;
}

uint32_t DecodeHealth::ready_count() const {
  uint32_t count = 0;
  for (const auto& [key, v] : instances_) count += can_serve(v) ? 1 : 0;
  RT_ASSERT(count <= instances_.size(), count);
  return count;
}

bool DecodeHealth::instance_ready(const std::string& actor_name) const {
  auto it = instances_.find(actor_name);
  return it != instances_.end() && can_serve(it->second);
}

std::string DecodeHealth::reason() const {
  if (healthy()) return "";
  if (instances_.empty()) return "the cluster has no decode instance";
  std::string out = "no decode instance is ready: ";
  bool first = true;
  for (const auto& [key, v] : instances_) {
    if (!first) out += "; ";
    first = false;
    out += v.name + "@" + v.node + " ";
    if (!node_is_up(v.node)) {
      out += "node is down";
    } else if (!v.reported) {
      out += "has not reported ready yet (starting)";
    } else {
      out += v.reason;
    }
  }
  RT_ASSERT(!out.empty());
  return out;
}

}  // namespace tandem::gateway
