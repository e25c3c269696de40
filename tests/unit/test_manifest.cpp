// The cluster manifest: parsing, every validation class, count expansion, path resolution,
// the example manifests, and the `tandem check` program.
#include <doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <variant>

#include "config/manifest.hpp"

namespace fs = std::filesystem;
using namespace tandem::config;

namespace {

// A small valid cluster. Tests replace or append lines to break one thing at a time.
const std::string base_manifest = R"([cluster]
name = "test"

[model]
name = "tiny"
path = "models/tiny"

[[node]]
name = "a"
host = "127.0.0.1"
fabric_port = 17100
admin_port = 17200
http_port = 8000

  [[node.instance]]
  role = "gateway"
  name = "gw"

  [[node.instance]]
  role = "router"
  name = "rt"

  [[node.instance]]
  role = "decode"
  name = "dec"
  executor = "ex"

  [[node.instance]]
  role = "executor"
  name = "ex"
  device = "cpu"
  devices = [0]
)";

// 1-based line of the first line containing `needle`; 0 if none.
uint32_t line_of(const std::string& text, const std::string& needle) {
  std::istringstream in(text);
  std::string line;
  for (uint32_t n = 1; std::getline(in, line); ++n) {
    if (line.find(needle) != std::string::npos) return n;
  }
  return 0;
}

std::string replace(std::string text, const std::string& from, const std::string& to) {
  auto at = text.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, "test text lacks: ", from);
  return text.replace(at, from.size(), to);
}

Manifest parse_ok(const std::string& text, const std::string& file = "/etc/tandem/m.toml") {
  auto result = parse_manifest(text, file);
  if (auto* errors = std::get_if<ManifestErrors>(&result)) {
    FAIL_CHECK("unexpected issues:\n" << errors->describe());
    return {};
  }
  return std::get<Manifest>(std::move(result));
}

std::vector<ManifestIssue> parse_bad(const std::string& text) {
  auto result = parse_manifest(text, "m.toml");
  if (std::holds_alternative<Manifest>(result)) {
    FAIL_CHECK("manifest unexpectedly valid");
    return {};
  }
  auto issues = std::get<ManifestErrors>(result).issues;
  REQUIRE_FALSE(issues.empty());
  return issues;
}

// The issue with this key whose message contains `fragment`; fails the test if none.
ManifestIssue find_issue(const std::vector<ManifestIssue>& issues, const std::string& key,
                         const std::string& fragment) {
  for (const auto& issue : issues) {
    if (issue.key == key && issue.message.find(fragment) != std::string::npos) return issue;
  }
  std::string all;
  for (const auto& issue : issues) all += issue.describe() + "\n";
  FAIL_CHECK("no issue " << key << " ~ '" << fragment << "' in:\n" << all);
  return {};
}

// Exactly one issue is expected; returns it.
ManifestIssue only_issue(const std::string& text) {
  auto issues = parse_bad(text);
  std::string all;
  for (const auto& issue : issues) all += issue.describe() + "\n";
  CHECK_MESSAGE(issues.size() == 1, all);
  return issues.front();
}

}  // namespace

TEST_CASE("a valid manifest loads with its values and defaults") {
  Manifest m = parse_ok(base_manifest);
  CHECK(m.cluster.name == "test");
  CHECK(m.cluster.protocol_version == protocol_version_current);
  CHECK(m.fabric.provider == "tcp;ofi_rxm");
  CHECK(m.fabric.frame_bytes_max == 4u << 20);
  CHECK(m.membership.heartbeat_interval_ms == 200);
  CHECK(m.logging.level == "info");
  CHECK(m.model.block_tokens == 16);
  CHECK(m.model.chat_format == ChatFormat::auto_detect);
  CHECK(m.router.policy == RouterPolicy::prefix_aware);
  CHECK(m.speculative.method == SpeculativeMethod::none);
  REQUIRE(m.nodes.size() == 1);
  const Node* a = m.find_node("a");
  REQUIRE(a != nullptr);
  CHECK(m.find_node("b") == nullptr);
  CHECK(a->host == "127.0.0.1");
  CHECK(a->fabric_port == 17100);
  CHECK(a->admin_port == std::optional<uint16_t>(17200));
  CHECK(a->http_port == std::optional<uint16_t>(8000));
  CHECK(a->line == line_of(base_manifest, "[[node]]"));
  REQUIRE(a->instances.size() == 4);
  CHECK(a->instances[2].role == Role::decode);
  CHECK(a->instances[2].executor == "ex");
  CHECK(a->instances[2].line == line_of(base_manifest, "role = \"decode\"") - 1);
  auto executors = m.instances_of(Role::executor);
  REQUIRE(executors.size() == 1);
  CHECK(executors[0].first == a);
  CHECK(executors[0].second->device == DeviceKind::cpu);
  CHECK(executors[0].second->device_ids == std::vector<uint32_t>{0});
}

TEST_CASE("every section's keys are read") {
  std::string text = base_manifest + R"(
[fabric]
provider = "shm"
send_queue_max = 64
frame_bytes_max = 65536
recv_buffers = 8
rma_chunk_bytes = 1048576
rma_inflight_max = 4
connect_timeout_ms = 500
spin_us = 0

[membership]
heartbeat_interval_ms = 50
heartbeat_miss_max = 3

[logging]
level = "debug"

[router]
policy = "round-robin"
weight_prefix = 2
weight_queue = 0.5
weight_kv_usage = 0.0
prefix_index_blocks_max = 500
disaggregate_tokens_min = 0

[kv_offload]
enabled = true
path = "kv"
capacity_bytes = 1000000
host_cache_bytes = 1000

[speculative]
method = "ngram"
draft_tokens_max = 16
)";
  Manifest m = parse_ok(text);
  CHECK(m.fabric.provider == "shm");
  CHECK(m.fabric.send_queue_max == 64);
  CHECK(m.fabric.frame_bytes_max == 65536);
  CHECK(m.fabric.recv_buffers == 8);
  CHECK(m.fabric.rma_chunk_bytes == 1048576);
  CHECK(m.fabric.rma_inflight_max == 4);
  CHECK(m.fabric.connect_timeout_ms == 500);
  CHECK(m.fabric.spin_us == 0);
  CHECK(m.membership.heartbeat_interval_ms == 50);
  CHECK(m.membership.heartbeat_miss_max == 3);
  CHECK(m.logging.level == "debug");
  CHECK(m.router.policy == RouterPolicy::round_robin);
  CHECK(m.router.weight_prefix == 2.0);
  CHECK(m.router.weight_queue == 0.5);
  CHECK(m.router.weight_kv_usage == 0.0);
  CHECK(m.router.prefix_index_blocks_max == 500);
  CHECK(m.router.disaggregate_tokens_min == 0);
  CHECK(m.kv_offload.enabled);
  CHECK(m.kv_offload.path == "/etc/tandem/kv");
  CHECK(m.kv_offload.capacity_bytes == 1000000);
  CHECK(m.kv_offload.host_cache_bytes == 1000);
  CHECK(m.speculative.method == SpeculativeMethod::ngram);
  CHECK(m.speculative.draft_tokens_max == 16);
}

TEST_CASE("a TOML syntax error carries toml++'s message and position") {
  std::string text = replace(base_manifest, "fabric_port = 17100", "fabric_port = ");
  ManifestIssue issue = only_issue(text);
  CHECK(issue.key == "syntax");
  CHECK(issue.file == "m.toml");
  CHECK(issue.line == line_of(text, "fabric_port ="));
  CHECK(issue.column > 0);
  CHECK(issue.message.find("expected") != std::string::npos);
  std::string dup = replace(base_manifest, "name = \"test\"", "name = \"test\"\nname = \"x\"");
  ManifestIssue redefined = only_issue(dup);
  CHECK(redefined.key == "syntax");
  CHECK(redefined.line == 3);
}

TEST_CASE("unknown keys are errors in every table, with their position") {
  std::string text = replace(base_manifest, "[model]", "colour = 1\n[model]");
  text = replace(text, "fabric_port = 17100", "fabric_port = 17100\nfabrik_port = 1");
  text = replace(text, "name = \"rt\"", "name = \"rt\"\n  weight = 3");
  text += "\n[fabricc]\nprovider = \"shm\"\n";
  auto issues = parse_bad(text);
  CHECK(issues.size() == 4);
  auto colour = find_issue(issues, "cluster.colour", "unknown key");
  CHECK(colour.line == line_of(text, "colour = 1"));
  CHECK(colour.column == 1);
  auto port = find_issue(issues, "node[0].fabrik_port", "accepted: name, host, fabric_port");
  CHECK(port.line == line_of(text, "fabrik_port"));
  auto weight = find_issue(issues, "node[0].instance[1].weight", "unknown key");
  CHECK(weight.line == line_of(text, "weight = 3"));
  CHECK(weight.column == 3);
  auto section = find_issue(issues, "fabricc", "unknown key at the top level");
  CHECK(section.line == line_of(text, "[fabricc]"));
}

TEST_CASE("wrong types name what was expected and what was found") {
  std::string text = replace(base_manifest, "fabric_port = 17100", "fabric_port = \"17100\"");
  text = replace(text, "name = \"tiny\"", "name = 7");
  text += "\n[kv_offload]\nenabled = \"yes\"\n[router]\nweight_queue = \"high\"\n";
  auto issues = parse_bad(text);
  CHECK(issues.size() == 4);
  auto port = find_issue(issues, "node[0].fabric_port", "expected an integer, got a string");
  CHECK(port.line == line_of(text, "fabric_port ="));
  auto name = find_issue(issues, "model.name", "expected a string, got an integer");
  CHECK(name.line == line_of(text, "name = 7"));
  find_issue(issues, "kv_offload.enabled", "expected a boolean, got a string");
  find_issue(issues, "router.weight_queue", "expected a number, got a string");

  std::string not_tables = "node = 3\n" + base_manifest.substr(0, base_manifest.find("[[node]]"));
  auto node_issues = parse_bad(not_tables);
  auto node =
      find_issue(node_issues, "node", "expected an array of tables [[node]], got an integer");
  CHECK(node.line == 1);
}

TEST_CASE("out-of-range values report the accepted range") {
  std::string text = base_manifest + R"(
[fabric]
frame_bytes_max = 1024
spin_us = -1
[membership]
heartbeat_interval_ms = 5
heartbeat_miss_max = 101
[speculative]
draft_tokens_max = 17
[router]
weight_prefix = -0.5
)";
  text = replace(text, "fabric_port = 17100", "fabric_port = 70000");
  auto issues = parse_bad(text);
  CHECK(issues.size() == 7);
  auto frame = find_issue(issues, "fabric.frame_bytes_max", "out of range 4096..67108864");
  CHECK(frame.line == line_of(text, "frame_bytes_max"));
  find_issue(issues, "fabric.spin_us", "value -1 is out of range");
  find_issue(issues, "membership.heartbeat_interval_ms", "out of range 10..60000");
  find_issue(issues, "membership.heartbeat_miss_max", "out of range 1..100");
  find_issue(issues, "speculative.draft_tokens_max", "out of range 1..16");
  find_issue(issues, "router.weight_prefix", "out of range");
  auto port = find_issue(issues, "node[0].fabric_port", "out of range 1..65535");
  CHECK(port.line == line_of(text, "fabric_port = 70000"));
}

TEST_CASE("model keys: power-of-two blocks, context at least one block, known formats") {
  std::string text = replace(base_manifest, "path = \"models/tiny\"",
                             "path = \"models/tiny\"\nblock_tokens = 24\nchat_format = \"x\"");
  auto issues = parse_bad(text);
  CHECK(issues.size() == 2);
  auto block = find_issue(issues, "model.block_tokens", "not a power of two");
  CHECK(block.line == line_of(text, "block_tokens"));
  find_issue(issues, "model.chat_format", "accepted: auto, plain, chatml, minimax-m2");
  std::string small = replace(base_manifest, "path = \"models/tiny\"",
                              "path = \"models/tiny\"\nblock_tokens = 64\nmax_model_tokens = 32");
  auto context = only_issue(small);
  CHECK(context.key == "model.max_model_tokens");
  CHECK(context.message.find("at least block_tokens (64)") != std::string::npos);
}

TEST_CASE("enumerated strings list what is accepted") {
  std::string text = base_manifest +
                     "[fabric]\nprovider = \"udp\"\n[logging]\nlevel = \"loud\"\n"
                     "[router]\npolicy = \"best\"\n[speculative]\nmethod = \"medusa\"\n";
  auto issues = parse_bad(text);
  CHECK(issues.size() == 4);
  auto provider =
      find_issue(issues, "fabric.provider", "unknown value 'udp'; accepted: tcp;ofi_rxm, shm");
  CHECK(provider.line == line_of(text, "provider"));
  find_issue(issues, "logging.level", "trace, debug, info, warn, error");
  find_issue(issues, "router.policy", "prefix-aware, round-robin, random");
  find_issue(issues, "speculative.method", "none, ngram, suffix, eagle3");
}

TEST_CASE("cluster: protocol version and names") {
  std::string text = replace(base_manifest, "name = \"test\"",
                             "name = \"my cluster\"\nprotocol_version = 2");
  auto issues = parse_bad(text);
  CHECK(issues.size() == 2);
  find_issue(issues, "cluster.protocol_version", "unsupported protocol_version 2");
  auto name = find_issue(issues, "cluster.name", "may use only letters");
  CHECK(name.line == 2);
}

TEST_CASE("missing required keys and sections") {
  std::string text = replace(base_manifest, "name = \"test\"\n", "");
  text = replace(text, "path = \"models/tiny\"\n", "");
  text = replace(text, "host = \"127.0.0.1\"\n", "");
  text = replace(text, "  role = \"router\"\n", "");
  text = replace(text, "  name = \"gw\"\n", "");
  auto issues = parse_bad(text);
  CHECK(issues.size() == 5);
  auto cluster = find_issue(issues, "cluster.name", "required key is missing");
  CHECK(cluster.line == line_of(text, "[cluster]"));
  auto path = find_issue(issues, "model.path", "required key is missing");
  CHECK(path.line == line_of(text, "[model]"));
  auto host = find_issue(issues, "node[0].host", "required key is missing");
  CHECK(host.line == line_of(text, "[[node]]"));
  find_issue(issues, "node[0].instance[1].role", "required key is missing");
  find_issue(issues, "node[0].instance[0].name", "required key is missing");

  std::string no_cluster = replace(base_manifest, "[cluster]\nname = \"test\"\n", "");
  auto section = only_issue(no_cluster);
  CHECK(section.key == "cluster");
  CHECK(section.line == 0);
  CHECK(section.message == "missing required section [cluster]");
  auto no_port = only_issue(replace(base_manifest, "fabric_port = 17100\n", ""));
  CHECK(no_port.key == "node[0].fabric_port");
  auto empty = only_issue(replace(base_manifest, "\"models/tiny\"", "\"\""));
  CHECK(empty.key == "model.path");
  CHECK(empty.message == "must not be empty");
}

TEST_CASE("duplicate node names") {
  std::string text = base_manifest + R"(
[[node]]
name = "a"
host = "127.0.0.2"
fabric_port = 17100
  [[node.instance]]
  role = "router"
  name = "rt2"
)";
  ManifestIssue issue = only_issue(text);
  CHECK(issue.key == "node[1].name");
  CHECK(issue.line == line_of(text, "host = \"127.0.0.2\"") - 1);
  CHECK(issue.message.find("duplicate node name 'a'") != std::string::npos);
  CHECK(issue.message.find("node[0] at line 8") != std::string::npos);
}

TEST_CASE("duplicate instance names, also after count expansion") {
  std::string text = base_manifest + R"(
[[node]]
name = "b"
host = "127.0.0.2"
fabric_port = 17100
  [[node.instance]]
  role = "router"
  name = "rt"
  [[node.instance]]
  role = "router"
  name = "r"
  count = 2
  [[node.instance]]
  role = "router"
  name = "r-1"
)";
  auto issues = parse_bad(text);
  CHECK(issues.size() == 2);
  auto plain = find_issue(issues, "node[1].instance[0].name", "duplicate instance name 'rt'");
  uint32_t node_b_line = line_of(text, "name = \"b\"");
  CHECK(plain.line ==
        node_b_line - 1 + line_of(text.substr(text.find("name = \"b\"")), "name = \"rt\""));
  auto expanded = find_issue(issues, "node[1].instance[2].name", "duplicate instance name 'r-1'");
  CHECK(expanded.line == line_of(text, "name = \"r-1\""));
  CHECK(expanded.message.find("node[1].instance[1]") != std::string::npos);
}

TEST_CASE("a role without a node") {
  std::string text = base_manifest + R"(
[[instance]]
role = "router"
name = "lost"

[[instance]]
node = "nowhere"
role = "router"
name = "lost2"
)";
  auto issues = parse_bad(text);
  CHECK(issues.size() == 2);
  auto missing = find_issue(issues, "instance[0].node", "role without a node");
  CHECK(missing.line == line_of(text, "[[instance]]"));
  auto unknown = find_issue(issues, "instance[1].node", "no node named 'nowhere'");
  CHECK(unknown.line == line_of(text, "node = \"nowhere\""));
  CHECK(unknown.message.find("role without a node") != std::string::npos);
}

TEST_CASE("top-level [[instance]] tables join the node they name") {
  std::string text = replace(base_manifest, "  [[node.instance]]\n  role = \"router\"\n"
                                            "  name = \"rt\"\n", "");
  text += "\n[[instance]]\nnode = \"a\"\nrole = \"router\"\nname = \"rt\"\n";
  Manifest m = parse_ok(text);
  auto routers = m.instances_of(Role::router);
  REQUIRE(routers.size() == 1);
  CHECK(routers[0].first->name == "a");
  CHECK(routers[0].second->line == line_of(text, "[[instance]]"));
  CHECK(m.nodes[0].instances.back().name == "rt");
  // "node" is not a key of [[node.instance]].
  auto issue = only_issue(replace(base_manifest, "name = \"gw\"", "name = \"gw\"\n  node = \"a\""));
  CHECK(issue.key == "node[0].instance[0].node");
}

TEST_CASE("two listeners on one host:port collide; other hosts do not") {
  std::string text = base_manifest + R"(
[[node]]
name = "b"
host = "127.0.0.1"
fabric_port = 17200
admin_port = 17300
http_port = 17300
  [[node.instance]]
  role = "router"
  name = "rt2"

[[node]]
name = "c"
host = "127.0.0.3"
fabric_port = 17100
admin_port = 17200
  [[node.instance]]
  role = "router"
  name = "rt3"
)";
  auto issues = parse_bad(text);
  CHECK(issues.size() == 2);
  auto fabric = find_issue(issues, "node[1].fabric_port",
                           "127.0.0.1:17200 is already used by node 'a' (node[0].admin_port)");
  CHECK(fabric.line == line_of(text, "fabric_port = 17200"));
  auto http = find_issue(issues, "node[1].http_port", "already used by this node's admin_port");
  CHECK(http.line == line_of(text, "http_port = 17300"));
}

TEST_CASE("executor references: missing, not an executor, on another node, shared") {
  std::string text = base_manifest + R"(
  [[node.instance]]
  role = "prefill"
  name = "pre"
  executor = "ex"

  [[node.instance]]
  role = "decode"
  name = "dec2"
  executor = "gw"

  [[node.instance]]
  role = "prefill"
  name = "pre2"
  executor = "nope"

  [[node.instance]]
  role = "prefill"
  name = "pre3"

[[node]]
name = "b"
host = "127.0.0.2"
fabric_port = 17100
  [[node.instance]]
  role = "decode"
  name = "dec3"
  executor = "ex"
)";
  auto issues = parse_bad(text);
  CHECK(issues.size() == 5);
  auto shared = find_issue(issues, "node[0].instance[4].executor", "already serves 'dec'");
  CHECK(shared.line == line_of(text, "name = \"pre\"") + 1);
  find_issue(issues, "node[0].instance[5].executor", "'gw' is a gateway instance, not an executor");
  auto missing = find_issue(issues, "node[0].instance[6].executor",
                            "executor reference missing: no instance named 'nope'");
  CHECK(missing.line == line_of(text, "executor = \"nope\""));
  auto absent = find_issue(issues, "node[0].instance[7].executor", "executor reference missing");
  CHECK(absent.line == line_of(text, "name = \"pre3\"") - 2);
  auto remote = find_issue(issues, "node[1].instance[0].executor",
                           "executor 'ex' is on node 'a', not on this instance's node 'b'");
  CHECK(remote.line == line_of(text, "name = \"dec3\"") + 1);
}

TEST_CASE("executor-only and prefill/decode-only keys are rejected on other roles") {
  std::string text = replace(base_manifest, "name = \"gw\"",
                             "name = \"gw\"\n  device = \"cpu\"\n  executor = \"ex\"");
  auto issues = parse_bad(text);
  CHECK(issues.size() == 2);
  find_issue(issues, "node[0].instance[0].device", "only executor instances take 'device'");
  find_issue(issues, "node[0].instance[0].executor", "only prefill and decode instances");
  auto kind = only_issue(replace(base_manifest, "device = \"cpu\"", "device = \"gpu\""));
  CHECK(kind.key == "node[0].instance[3].device");
  CHECK(kind.message.find("accepted: cpu, sim, rbln") != std::string::npos);
}

TEST_CASE("count expansion names instances and slices devices") {
  std::string text = replace(base_manifest, R"(  name = "dec"
  executor = "ex")", R"(  name = "dec"
  count = 2
  executor = "ex")");
  text = replace(text, R"(  name = "ex"
  device = "cpu"
  devices = [0])", R"(  name = "ex"
  count = 2
  device = "sim"
  devices = [4, 5, 6, 7])");
  text += R"(
  [[node.instance]]
  role = "executor"
  name = "spare"
  count = 3
)";
  Manifest m = parse_ok(text);
  auto decodes = m.instances_of(Role::decode);
  REQUIRE(decodes.size() == 2);
  CHECK(decodes[0].second->name == "dec-0");
  CHECK(decodes[0].second->executor == "ex-0");
  CHECK(decodes[1].second->name == "dec-1");
  CHECK(decodes[1].second->executor == "ex-1");
  auto executors = m.instances_of(Role::executor);
  REQUIRE(executors.size() == 5);
  CHECK(executors[0].second->name == "ex-0");
  CHECK(executors[0].second->device == DeviceKind::sim);
  CHECK(executors[0].second->device_ids == std::vector<uint32_t>{4, 5});
  CHECK(executors[1].second->name == "ex-1");
  CHECK(executors[1].second->device_ids == std::vector<uint32_t>{6, 7});
  // No devices listed: one device per instance, 0..count-1.
  CHECK(executors[2].second->name == "spare-0");
  CHECK(executors[2].second->device_ids == std::vector<uint32_t>{0});
  CHECK(executors[4].second->device_ids == std::vector<uint32_t>{2});
  CHECK(executors[4].second->device == DeviceKind::cpu);
}

TEST_CASE("device lists must split evenly, be indices, and not overlap on a node") {
  std::string text = replace(base_manifest, "devices = [0]", "count = 2\n  devices = [0, 1, 2]");
  text = replace(text, "executor = \"ex\"", "executor = \"ex-0\"");
  auto uneven = only_issue(text);
  CHECK(uneven.key == "node[0].instance[3].devices");
  CHECK(uneven.line == line_of(text, "devices = [0, 1, 2]"));
  CHECK(uneven.message.find("3 device indices do not split into 2 equal slices") !=
        std::string::npos);
  auto negative = only_issue(replace(base_manifest, "devices = [0]", "devices = [0, -1]"));
  CHECK(negative.key == "node[0].instance[3].devices[1]");
  auto twice = only_issue(replace(base_manifest, "devices = [0]", "devices = [3, 3]"));
  CHECK(twice.message.find("listed twice") != std::string::npos);
  std::string overlap = base_manifest +
                        "  [[node.instance]]\n  role = \"executor\"\n  name = \"ex2\"\n"
                        "  devices = [0]\n";
  auto clash = only_issue(overlap);
  CHECK(clash.key == "node[0].instance[4].devices");
  CHECK(clash.message.find("already used by executor 'ex'") != std::string::npos);
  // The same index on another device kind is another device.
  parse_ok(replace(overlap, "name = \"ex2\"", "name = \"ex2\"\n  device = \"sim\""));
}

TEST_CASE("count mismatch between a prefill/decode and its executor is reported") {
  std::string text = replace(base_manifest, "  executor = \"ex\"",
                             "  count = 2\n  executor = \"ex\"");
  auto issues = parse_bad(text);
  auto first = find_issue(issues, "node[0].instance[2].executor",
                          "instance 'dec-0': executor reference missing: no instance named 'ex-0'");
  CHECK(first.message.find("needs the same count") != std::string::npos);
  find_issue(issues, "node[0].instance[2].executor", "no instance named 'ex-1'");
}

TEST_CASE("the cluster needs a gateway, a router, prefill capacity and a decoder") {
  std::string text = R"([cluster]
name = "x"
[model]
name = "m"
path = "/m"
[[node]]
name = "a"
host = "h"
fabric_port = 1
  [[node.instance]]
  role = "kv-offload"
  name = "kv"
)";
  auto issues = parse_bad(text);
  CHECK(issues.size() == 4);
  for (const auto& issue : issues) {
    CHECK(issue.line == 0);
    CHECK(issue.key == "node");
  }
  find_issue(issues, "node", "no gateway instance");
  find_issue(issues, "node", "no router instance");
  find_issue(issues, "node", "no prefill-capable instance");
  find_issue(issues, "node", "no decode instance");
  // A prefill but no decode: only the decoder is missing.
  std::string prefill_only = replace(base_manifest, "role = \"decode\"", "role = \"prefill\"");
  auto issue = only_issue(prefill_only);
  CHECK(issue.message.find("no decode instance") != std::string::npos);
  auto no_nodes = only_issue("[cluster]\nname = \"x\"\n[model]\nname = \"m\"\npath = \"/m\"\n");
  CHECK(no_nodes.message.find("declares no nodes") != std::string::npos);
}

TEST_CASE("a gateway needs its node to have an http_port; nodes need instances") {
  std::string text = replace(base_manifest, "http_port = 8000\n", "");
  auto issue = only_issue(text);
  CHECK(issue.key == "node[0].instance[0].role");
  CHECK(issue.line == line_of(text, "role = \"gateway\"") - 1);
  CHECK(issue.message.find("must set http_port") != std::string::npos);
  std::string empty = base_manifest + "[[node]]\nname = \"b\"\nhost = \"h\"\nfabric_port = 1\n";
  auto lonely = only_issue(empty);
  CHECK(lonely.key == "node[1]");
  CHECK(lonely.message == "node 'b' has no instances");
}

TEST_CASE("kv_offload.enabled needs a path") {
  auto issue = only_issue(base_manifest + "[kv_offload]\nenabled = true\n");
  CHECK(issue.key == "kv_offload.path");
  CHECK(issue.message.find("required when kv_offload.enabled") != std::string::npos);
}

TEST_CASE("all problems are reported at once, in file order") {
  std::string text = replace(base_manifest, "name = \"test\"", "name = \"test\"\nzzz = 1");
  text = replace(text, "fabric_port = 17100", "fabric_port = 0");
  text = replace(text, "role = \"router\"", "role = \"ruter\"");
  text = replace(text, "executor = \"ex\"", "executor = \"ex9\"");
  text += "[speculative]\ndraft_tokens_max = 99\n";
  auto issues = parse_bad(text);
  REQUIRE(issues.size() == 5);
  CHECK(issues[0].key == "cluster.zzz");
  CHECK(issues[1].key == "node[0].fabric_port");
  CHECK(issues[2].key == "node[0].instance[1].role");
  CHECK(issues[3].key == "node[0].instance[2].executor");
  CHECK(issues[4].key == "speculative.draft_tokens_max");
  for (size_t i = 1; i < issues.size(); ++i) CHECK(issues[i - 1].line < issues[i].line);
  ManifestErrors errors{issues};
  std::string described = errors.describe();
  CHECK(std::count(described.begin(), described.end(), '\n') == 5);
  CHECK(issues[0].describe() == "m.toml:3:1: cluster.zzz: " + issues[0].message);
  ManifestIssue placeless{"f.toml", 0, 0, "node", "no gateway"};
  CHECK(placeless.describe() == "f.toml: node: no gateway");
}

TEST_CASE("relative paths resolve against the manifest's directory") {
  std::string text = replace(base_manifest, "path = \"models/tiny\"", "path = \"../models/tiny\"");
  text += "[kv_offload]\nenabled = true\npath = \"./kv/\"\n";
  Manifest m = parse_ok(text, "/srv/cluster/conf/m.toml");
  CHECK(m.dir == "/srv/cluster/conf");
  CHECK(m.file == "/srv/cluster/conf/m.toml");
  CHECK(m.model.path == "/srv/cluster/models/tiny");
  CHECK(m.kv_offload.path == "/srv/cluster/conf/kv/");
  Manifest absolute = parse_ok(replace(base_manifest, "\"models/tiny\"", "\"/opt/m\""));
  CHECK(absolute.model.path == "/opt/m");
  // A relative manifest path: its directory is made absolute.
  Manifest relative = parse_ok(base_manifest, "conf/m.toml");
  CHECK(fs::path(relative.dir).is_absolute());
  CHECK(relative.model.path == (fs::current_path() / "conf/models/tiny").string());
}

TEST_CASE("load_manifest reports an unreadable file") {
  auto result = load_manifest("/nonexistent/tandem.toml");
  REQUIRE(std::holds_alternative<ManifestErrors>(result));
  auto issue = std::get<ManifestErrors>(result).issues.at(0);
  CHECK(issue.file == "/nonexistent/tandem.toml");
  CHECK(issue.message.find("cannot open") != std::string::npos);
}

namespace {

std::string source_root() {
  const char* root = std::getenv("TANDEM_SOURCE_ROOT");
  REQUIRE_MESSAGE(root != nullptr, "TANDEM_SOURCE_ROOT is not set");
  return root;
}

Manifest load_example(const std::string& name) {
  std::string path = source_root() + "/config/examples/" + name;
  auto result = load_manifest(path);
  if (auto* errors = std::get_if<ManifestErrors>(&result)) {
    FAIL_CHECK(path << " is invalid:\n" << errors->describe());
    return {};
  }
  return std::get<Manifest>(std::move(result));
}

}  // namespace

TEST_CASE("example local.toml: one node with every role") {
  Manifest m = load_example("local.toml");
  REQUIRE(m.nodes.size() == 1);
  const Node& local = m.nodes[0];
  CHECK(local.name == "local");
  CHECK(local.host == "127.0.0.1");
  CHECK(local.fabric_port == 17100);
  CHECK(local.admin_port == std::optional<uint16_t>(17200));
  CHECK(local.http_port == std::optional<uint16_t>(8000));
  for (Role role : roles_all) CHECK_MESSAGE(!m.instances_of(role).empty(), to_string(role));
  CHECK(m.model.name == "stories15M");
  CHECK(m.model.path == fs::weakly_canonical(source_root()).string() + "/models/stories15M");
  CHECK(m.model.block_tokens == 16);
  CHECK(m.model.max_model_tokens == 256);
  CHECK(m.model.chat_format == ChatFormat::plain);
  auto prefill = m.instances_of(Role::prefill).at(0).second;
  auto decode = m.instances_of(Role::decode).at(0).second;
  CHECK(prefill->executor == "exec-prefill");
  CHECK(decode->executor == "exec-decode");
  auto executors = m.instances_of(Role::executor);
  REQUIRE(executors.size() == 2);
  CHECK(executors[0].second->device_ids == std::vector<uint32_t>{0});
  CHECK(executors[1].second->device_ids == std::vector<uint32_t>{1});
}

TEST_CASE("example loopback-3.toml: front, prefill and decode nodes") {
  Manifest m = load_example("loopback-3.toml");
  REQUIRE(m.nodes.size() == 3);
  CHECK(m.nodes[0].name == "front");
  CHECK(m.nodes[0].fabric_port == 17110);
  CHECK(m.nodes[0].admin_port == std::optional<uint16_t>(17210));
  CHECK(m.nodes[0].http_port == std::optional<uint16_t>(8000));
  CHECK(m.nodes[1].name == "prefill");
  CHECK(m.nodes[1].fabric_port == 17111);
  CHECK(m.nodes[2].name == "decode");
  CHECK(m.nodes[2].fabric_port == 17112);
  CHECK(m.instances_of(Role::gateway).at(0).first == &m.nodes[0]);
  CHECK(m.instances_of(Role::router).at(0).first == &m.nodes[0]);
  CHECK(m.instances_of(Role::prefill).at(0).first == &m.nodes[1]);
  CHECK(m.instances_of(Role::decode).at(0).first == &m.nodes[2]);
}

TEST_CASE("example target-4p4d.toml: the reference design") {
  Manifest m = load_example("target-4p4d.toml");
  REQUIRE(m.nodes.size() == 4);
  for (size_t n = 0; n < 4; ++n) {
    CHECK(m.nodes[n].host == "10.0.0." + std::to_string(n + 1));
  }
  CHECK(m.instances_of(Role::prefill).size() == 4);
  CHECK(m.instances_of(Role::decode).size() == 4);
  CHECK(m.instances_of(Role::gateway).at(0).first == &m.nodes[0]);
  CHECK(m.instances_of(Role::router).at(0).first == &m.nodes[0]);
  auto executors = m.instances_of(Role::executor);
  REQUIRE(executors.size() == 8);
  for (const auto& [node, executor] : executors) {
    CHECK(executor->device == DeviceKind::sim);
    bool prefill = executor->name.find("prefill") != std::string::npos;
    CHECK(executor->device_ids ==
          (prefill ? std::vector<uint32_t>{0, 1, 2, 3} : std::vector<uint32_t>{4, 5, 6, 7}));
  }
  CHECK(m.model.name == "MiniMax-M2.7");
  CHECK(m.model.block_tokens == 4096);
  CHECK(m.model.max_model_tokens == 204800);
  CHECK(m.model.chat_format == ChatFormat::minimax_m2);
  CHECK(m.router.policy == RouterPolicy::prefix_aware);
}

TEST_CASE("summarize shows the cluster, model and a row per node") {
  Manifest m = load_example("loopback-3.toml");
  std::string text = summarize(m);
  CHECK(text.find("loopback-3") != std::string::npos);
  CHECK(text.find("tcp;ofi_rxm") != std::string::npos);
  CHECK(text.find("stories15M") != std::string::npos);
  CHECK(text.find("3 node(s), 6 instance(s)") != std::string::npos);
  CHECK(text.find("front    127.0.0.1:17110  17210  8000   gateway, router") != std::string::npos);
  CHECK(text.find("decode   127.0.0.1:17112  17212  -      decode, executor") !=
        std::string::npos);
  CHECK(std::count(text.begin(), text.end(), '\n') < 25);
}

namespace {

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

RunResult run_tandem(const std::string& args) {
  const char* build = std::getenv("TANDEM_BUILD_ROOT");
  REQUIRE_MESSAGE(build != nullptr, "TANDEM_BUILD_ROOT is not set");
  std::string command = std::string(build) + "/tools/tandem " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  RunResult result;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) result.output.append(buffer, n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace

TEST_CASE("tandem check: exit 1 with file:line:column issues, exit 0 with a summary") {
  fs::path dir = fs::temp_directory_path() / ("tandem-manifest-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string bad_text = replace(base_manifest, "fabric_port = 17100", "fabric_port = 0");
  bad_text += "[bogus]\n";
  fs::path bad = dir / "bad.toml";
  std::ofstream(bad) << bad_text;
  RunResult failed = run_tandem("check " + bad.string());
  CHECK(failed.exit_code == 1);
  uint32_t port_line = line_of(bad_text, "fabric_port = 0");
  CHECK_MESSAGE(failed.output.find(bad.string() + ":" + std::to_string(port_line) +
                                   ":15: node[0].fabric_port: value 0 is out of range") !=
                    std::string::npos,
                failed.output);
  CHECK(failed.output.find(bad.string() + ":" + std::to_string(line_of(bad_text, "[bogus]")) +
                           ":2: bogus: unknown key") != std::string::npos);
  RunResult good = run_tandem("check " + source_root() + "/config/examples/local.toml");
  CHECK(good.exit_code == 0);
  CHECK(good.output.find("cluster   local") != std::string::npos);
  CHECK(good.output.find("127.0.0.1:17100") != std::string::npos);
  RunResult help = run_tandem("check --help");
  CHECK(help.exit_code == 0);
  CHECK(help.output.find("usage: tandem check MANIFEST") != std::string::npos);
  RunResult usage = run_tandem("check");
  CHECK(usage.exit_code == 2);
  fs::remove_all(dir);
}
