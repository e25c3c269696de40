// Names of the manifest's enums, issue formatting, lookups and the human summary.
// The parser and validator live in manifest.cpp.
#include "config/manifest.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <thread>

namespace tandem::config {

std::string_view to_string(Role role) {
  switch (role) {
    case Role::gateway: return "gateway";
    case Role::router: return "router";
    case Role::prefill: return "prefill";
    case Role::decode: return "decode";
    case Role::kv_offload: return "kv-offload";
    case Role::executor: return "executor";
  }
  RT_ASSERT(false, "unknown Role", static_cast<int>(role));
  return {};
}

std::optional<Role> role_from_string(std::string_view text) {
  for (Role role : roles_all) {
    if (to_string(role) == text) return role;
  }
  return std::nullopt;
}

std::string_view to_string(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::cpu: return "cpu";
    case DeviceKind::sim: return "sim";
    case DeviceKind::rbln: return "rbln";
  }
  RT_ASSERT(false, "unknown DeviceKind", static_cast<int>(kind));
  return {};
}

std::optional<DeviceKind> device_kind_from_string(std::string_view text) {
  for (DeviceKind kind : {DeviceKind::cpu, DeviceKind::sim, DeviceKind::rbln}) {
    if (to_string(kind) == text) return kind;
  }
  return std::nullopt;
}

std::string_view to_string(ChatFormat format) {
  switch (format) {
    case ChatFormat::auto_detect: return "auto";
    case ChatFormat::plain: return "plain";
    case ChatFormat::chatml: return "chatml";
    case ChatFormat::minimax_m2: return "minimax-m2";
  }
  RT_ASSERT(false, "unknown ChatFormat", static_cast<int>(format));
  return {};
}

std::string_view to_string(KvIndexMode mode) {
  switch (mode) {
    case KvIndexMode::approximate: return "approximate";
    case KvIndexMode::precise: return "precise";
  }
  RT_ASSERT(false, "unknown KvIndexMode", static_cast<int>(mode));
  return {};
}

std::string_view to_string(RouterPolicy policy) {
  switch (policy) {
    case RouterPolicy::prefix_aware: return "prefix-aware";
    case RouterPolicy::round_robin: return "round-robin";
    case RouterPolicy::random: return "random";
  }
  RT_ASSERT(false, "unknown RouterPolicy", static_cast<int>(policy));
  return {};
}

std::string_view to_string(DeviceLostAction action) {
  switch (action) {
    case DeviceLostAction::restart_node:
      return "restart-node";
    case DeviceLostAction::stay:
      return "stay";
  }
  RT_ASSERT(false, "unknown DeviceLostAction", static_cast<int>(action));
  return {};
}

std::string_view to_string(SpeculativeMethod method) {
  switch (method) {
    case SpeculativeMethod::none: return "none";
    case SpeculativeMethod::ngram: return "ngram";
    case SpeculativeMethod::suffix: return "suffix";
    case SpeculativeMethod::eagle3: return "eagle3";
  }
  RT_ASSERT(false, "unknown SpeculativeMethod", static_cast<int>(method));
  return {};
}

std::string ManifestIssue::describe() const {
  std::string out = file;
  if (line > 0) {
    out += ":" + std::to_string(line);
    if (column > 0) out += ":" + std::to_string(column);
  }
  out += ": " + key + ": " + message;
  return out;
}

std::string ManifestErrors::describe() const {
  RT_ASSERT(!issues.empty(), "ManifestErrors without issues");
  std::string out;
  for (const auto& issue : issues) out += issue.describe() + "\n";
  return out;
}

uint32_t default_workers() {
  return std::clamp(std::thread::hardware_concurrency() / 2, 2u, 16u);
}

uint32_t Node::workers_count() const { return workers.value_or(default_workers()); }

uint32_t gateway_preparers(const GatewaySection& gateway, const Node& node) {
  if (gateway.preparers > 0) return gateway.preparers;
  return std::clamp(node.workers_count(), 2u, 16u);
}

bool is_loopback_host(std::string_view host) {
  return host == "localhost" || host == "::1" || host == "[::1]" ||
         (host.rfind("127.", 0) == 0 && valid_host(host));
}

bool is_wildcard_host(std::string_view host) {
  return host == "0.0.0.0" || host == "::" || host == "[::]";
}

namespace {

bool ipv4_literal(std::string_view text) {
  int parts = 0;
  size_t at = 0;
  while (at <= text.size()) {
    size_t end = std::min(text.find('.', at), text.size());
    std::string_view part = text.substr(at, end - at);
    if (part.empty() || part.size() > 3 || (part.size() > 1 && part[0] == '0')) return false;
    int value = 0;
    for (char c : part) {
      if (c < '0' || c > '9') return false;
      value = value * 10 + (c - '0');
    }
    if (value > 255) return false;
    ++parts;
    at = end + 1;
  }
  return parts == 4;
}

bool ipv6_literal(std::string_view text) {
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
    text = text.substr(1, text.size() - 2);
  }
  if (text.size() < 2 || text.size() > 45 || text.find(':') == std::string_view::npos) return false;
  return std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') ||
           c == ':' || c == '.';
  });
}

}  // namespace

bool valid_host(std::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  if (ipv6_literal(host)) return true;
  bool numeric = std::all_of(host.begin(), host.end(),
                             [](char c) { return (c >= '0' && c <= '9') || c == '.'; });
  if (numeric) return ipv4_literal(host);
  size_t at = 0;
  while (at <= host.size()) {  // RFC 1123 labels
    size_t end = std::min(host.find('.', at), host.size());
    std::string_view label = host.substr(at, end - at);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
      return false;
    }
    for (char c : label) {
      bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '-';
      if (!ok) return false;
    }
    at = end + 1;
  }
  return true;
}

bool Manifest::single_host() const {
  bool all_loopback = std::all_of(nodes.begin(), nodes.end(),
                                  [](const Node& n) { return is_loopback_host(n.host); });
  if (all_loopback) return true;
  return std::all_of(nodes.begin(), nodes.end(),
                     [this](const Node& n) { return n.host == nodes.front().host; });
}

const Node* Manifest::find_node(std::string_view name) const {
  for (const auto& node : nodes) {
    if (node.name == name) return &node;
  }
  return nullptr;
}

std::vector<std::pair<const Node*, const Instance*>> Manifest::instances_of(Role role) const {
  std::vector<std::pair<const Node*, const Instance*>> out;
  for (const auto& node : nodes) {
    for (const auto& instance : node.instances) {
      if (instance.role == role) out.emplace_back(&node, &instance);
    }
  }
  return out;
}

std::vector<std::string> ModelSection::names() const {
  std::vector<std::string> out{name};
  out.insert(out.end(), served_names.begin(), served_names.end());
  RT_ASSERT(out.size() == served_names.size() + 1, "names");
  return out;
}

bool ModelSection::serves(std::string_view id) const {
  return id == name ||
         std::find(served_names.begin(), served_names.end(), id) != served_names.end();
}

const Instance* Manifest::find_executor(std::string_view name) const {
  for (const Node& node : nodes) {
    for (const Instance& instance : node.instances) {
      if (instance.role == Role::executor && instance.name == name) return &instance;
    }
  }
  return nullptr;
}

std::map<std::string, double> Manifest::sim_params(const Instance& executor) const {
  RT_ASSERT(executor.role == Role::executor, executor.name);
  std::map<std::string, double> merged(sim.params.begin(), sim.params.end());
  for (const auto& [key, value] : executor.sim) merged[key] = value;
  return merged;
}

namespace {

std::string port_text(const std::optional<uint16_t>& port) {
  return port ? std::to_string(*port) : std::string("-");
}

// "gateway, router, prefill, decode, executor x2" in roles_all order.
std::string roles_text(const Node& node) {
  std::string out;
  for (Role role : roles_all) {
    size_t count = std::count_if(node.instances.begin(), node.instances.end(),
                                 [role](const Instance& i) { return i.role == role; });
    if (count == 0) continue;
    if (!out.empty()) out += ", ";
    out += to_string(role);
    if (count > 1) out += " x" + std::to_string(count);
  }
  return out.empty() ? std::string("(none)") : out;
}

std::string pad(std::string text, size_t width) {
  if (text.size() < width) text.append(width - text.size(), ' ');
  return text + "  ";
}

// One line: whether API keys are required (never the keys or the cache secret), and limits.
// "tier 2    off" or what each node's tier 2 is: directory, capacity, cache, staging, bounds.
std::string tier2_text(const KvOffloadSection& kv) {
  if (!kv.enabled) return "tier 2    off\n";
  return "tier 2    on: " + kv.path + "/NODE, capacity " + std::to_string(kv.capacity_bytes) +
         " bytes per node, host cache " + std::to_string(kv.host_cache_bytes) +
         " bytes, staging " + std::to_string(kv.staging_blocks) + " blocks, " +
         std::to_string(kv.stores_max) + " stores / " + std::to_string(kv.lookups_max) +
         " lookups in flight, hold " + std::to_string(kv.hold_timeout_ms) + " ms, lookup wait " +
         std::to_string(kv.lookup_timeout_ms) + " ms, partial blocks " +
         (kv.partial_blocks ? "on" : "off") + "\n";
}

std::string gateway_text(const GatewaySection& g) {
  std::string keys =
      g.api_keys.empty() ? std::string("no") : "yes (" + std::to_string(g.api_keys.size()) + ")";
  return "gateway   api keys " + keys + "; body max " + std::to_string(g.body_bytes_max) +
         " bytes, " + std::to_string(g.connections_max) + " connections, " +
         std::to_string(g.requests_max) + " requests, queue " + std::to_string(g.queue_max) +
         " (wait max " + std::to_string(g.queue_timeout_ms) + " ms), timeout " +
         std::to_string(g.request_timeout_ms) + " ms\n" + "          preparers " +
         (g.preparers > 0 ? std::to_string(g.preparers) : std::string("auto")) +
         " on the workers; bodies over " + std::to_string(g.long_prompt_bytes) + " bytes on " +
         std::to_string(g.long_prompt_preparers) + " threads\n";
}

}  // namespace

std::string summarize(const Manifest& m) {
  RT_ASSERT(!m.nodes.empty(), "summarize() of a manifest without nodes");
  RT_ASSERT(!m.cluster.name.empty(), "summarize() of a manifest without a cluster name");
  std::string out;
  out += "cluster   " + m.cluster.name + " (protocol " +
         std::to_string(m.cluster.protocol_version) + ")\n";
  out += "fabric    " + m.fabric.provider + "\n";
  out += "model     " + m.model.name + " at " + m.model.path + "\n";
  if (!m.model.served_names.empty()) {
    std::string aliases;
    for (const auto& alias : m.model.served_names) {
      aliases += (aliases.empty() ? "" : ", ") + alias;
    }
    out += "          also served as " + aliases + "\n";
  }
  out += "          block " + std::to_string(m.model.block_tokens) + " tokens";
  if (m.model.sub_block_tokens < m.model.block_tokens) {
    out += ", prefix matched per " + std::to_string(m.model.sub_block_tokens) +
           "-token sub-block";
  }
  out += ", context " +
         std::to_string(m.model.max_model_tokens) + " tokens, chat format " +
         std::string(to_string(m.model.chat_format)) + "\n";
  out += "router    " + std::string(to_string(m.router.policy)) + ", " +
         std::string(to_string(m.router.kv_index)) + " KV index; speculative " +
         std::string(to_string(m.speculative.method)) + "\n";
  out += tier2_text(m.kv_offload);
  out += gateway_text(m.gateway);
  size_t name_width = 4, fabric_width = 6;
  for (const auto& node : m.nodes) {
    name_width = std::max(name_width, node.name.size());
    fabric_width = std::max(fabric_width, node.host.size() + 6);
  }
  size_t instance_count = 0;
  for (const auto& node : m.nodes) instance_count += node.instances.size();
  out += "\n" + std::to_string(m.nodes.size()) + " node(s), " + std::to_string(instance_count) +
         " instance(s)\n";
  out += pad("NAME", name_width) + pad("FABRIC", fabric_width) + pad("ADMIN", 5) +
         pad("HTTP", 5) + pad("WORKERS", 7) + "INSTANCES\n";
  for (const auto& node : m.nodes) {
    out += pad(node.name, name_width) +
           pad(node.host + ":" + std::to_string(node.fabric_port), fabric_width) +
           pad(port_text(node.admin_port), 5) + pad(port_text(node.http_port), 5) +
           pad(node.workers ? std::to_string(*node.workers) : std::string("auto"), 7) +
           roles_text(node) + "\n";
  }
  return out;
}

}  // namespace tandem::config
