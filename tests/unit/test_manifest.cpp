// The cluster manifest: parsing, every validation class, count expansion, path resolution,
// the example manifests, and the `tandem check` program.
#include <doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <fstream>
#include <map>
#include <sstream>
#include <set>
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
sends_inflight_max = 3
frame_bytes_max = 65536
recv_buffers = 8
rma_chunk_bytes = 1048576
rma_inflight_max = 4
connect_timeout_ms = 500
spin_us = 0

[membership]
heartbeat_interval_ms = 50
heartbeat_miss_max = 3

[supervisor]
restarts_max = 2
restart_window_ms = 1000
restart_delay_ms = 0
executor_open_timeout_ms = 90000

[logging]
level = "debug"

[router]
policy = "round-robin"
kv_index = "precise"
weight_prefix = 2
weight_queue = 0.5
weight_kv_usage = 0.0
prefix_index_blocks_max = 500
disaggregate_tokens_min = 0
load_imbalance_max = 0.25
prefill_load_imbalance_max = 2.5
prefill_by_work = false
tier2_weight = 0.5
tier2_remote_weight = 0.25
tier2_index_blocks_max = 1000
kv_resync_interval_ms = 250

[kv_offload]
enabled = false
path = "kv"
capacity_bytes = 1000000
host_cache_bytes = 1000

[speculative]
method = "none"
draft_tokens_max = 16
)";
  Manifest m = parse_ok(text);
  CHECK(m.fabric.provider == "shm");
  CHECK(m.fabric.send_queue_max == 64);
  CHECK(m.fabric.sends_inflight_max == 3);
  CHECK(m.fabric.frame_bytes_max == 65536);
  CHECK(m.fabric.recv_buffers == 8);
  CHECK(m.fabric.rma_chunk_bytes == 1048576);
  CHECK(m.fabric.rma_inflight_max == 4);
  CHECK(m.fabric.connect_timeout_ms == 500);
  CHECK(m.fabric.spin_us == 0);
  CHECK(m.membership.heartbeat_interval_ms == 50);
  CHECK(m.membership.heartbeat_miss_max == 3);
  CHECK(m.supervisor.restarts_max == 2);
  CHECK(m.supervisor.restart_window_ms == 1000);
  CHECK(m.supervisor.restart_delay_ms == 0);
  CHECK(m.supervisor.executor_open_timeout_ms == 90000);
  CHECK(Manifest{}.supervisor.executor_open_timeout_ms == 600000);
  CHECK(m.logging.level == "debug");
  CHECK(m.router.policy == RouterPolicy::round_robin);
  CHECK(m.router.kv_index == tandem::config::KvIndexMode::precise);
  CHECK(m.router.weight_prefix == 2.0);
  CHECK(m.router.weight_queue == 0.5);
  CHECK(m.router.weight_kv_usage == 0.0);
  CHECK(m.router.prefix_index_blocks_max == 500);
  CHECK(m.router.disaggregate_tokens_min == 0);
  CHECK(m.router.load_imbalance_max == 0.25);
  CHECK(m.router.prefill_load_imbalance_max == 2.5);
  CHECK_FALSE(m.router.prefill_by_work);
  CHECK(m.router.tier2_weight == 0.5);
  CHECK(m.router.tier2_remote_weight == 0.25);
  CHECK(m.router.tier2_index_blocks_max == 1000);
  CHECK(m.router.kv_resync_interval_ms == 250);
  CHECK_FALSE(m.kv_offload.enabled);
  CHECK(m.kv_offload.path == "/etc/tandem/kv");
  CHECK(m.kv_offload.capacity_bytes == 1000000);
  CHECK(m.kv_offload.host_cache_bytes == 1000);
  CHECK(m.speculative.method == SpeculativeMethod::none);
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

TEST_CASE("the empty key (valid TOML) is an unknown key named \"\", at the top level and in a table") {
  // Found by fuzz_manifest: an issue without a key tripped an assertion (a crash of
  // `tandem node` on a two-line manifest).
  std::string text = "\"\" = \"\"\n" + base_manifest + "\n[router]\n\"\" = 1\n";
  auto issues = parse_bad(text);
  CHECK(issues.size() == 2);
  auto top = find_issue(issues, "\"\"", "unknown key at the top level");
  CHECK(top.line == 1);
  auto router = find_issue(issues, "router.\"\"", "unknown key in router");
  CHECK(router.line == line_of(text, "\"\" = 1"));
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
[supervisor]
restarts_max = 0
executor_open_timeout_ms = 50
[speculative]
draft_tokens_max = 17
[router]
weight_prefix = -0.5
tier2_weight = 1.5
kv_resync_interval_ms = 1
)";
  text = replace(text, "fabric_port = 17100", "fabric_port = 70000");
  auto issues = parse_bad(text);
  CHECK(issues.size() == 11);
  find_issue(issues, "supervisor.executor_open_timeout_ms", "out of range 100..3600000");
  auto tier2 = find_issue(issues, "router.tier2_weight", "out of range");
  CHECK(tier2.line == line_of(text, "tier2_weight"));
  find_issue(issues, "router.kv_resync_interval_ms", "out of range 10..600000");
  auto frame = find_issue(issues, "fabric.frame_bytes_max", "out of range 4096..67108864");
  CHECK(frame.line == line_of(text, "frame_bytes_max"));
  find_issue(issues, "fabric.spin_us", "value -1 is out of range");
  find_issue(issues, "membership.heartbeat_interval_ms", "out of range 10..60000");
  find_issue(issues, "membership.heartbeat_miss_max", "out of range 1..100");
  find_issue(issues, "supervisor.restarts_max", "out of range 1..1000");
  find_issue(issues, "speculative.draft_tokens_max", "out of range 1..16");
  find_issue(issues, "router.weight_prefix", "out of range");
  auto port = find_issue(issues, "node[0].fabric_port", "out of range 1..65535");
  CHECK(port.line == line_of(text, "fabric_port = 70000"));
}

TEST_CASE("router.tier2_remote_weight: at most tier2_weight; unset, it follows a lower one") {
  Manifest lower = parse_ok(base_manifest + "[router]\ntier2_weight = 0.3\n");
  CHECK(lower.router.tier2_remote_weight == 0.3);
  Manifest defaults = parse_ok(base_manifest);
  CHECK(defaults.router.tier2_weight == 0.8);
  CHECK(defaults.router.kv_index == tandem::config::KvIndexMode::approximate);
  CHECK(defaults.router.tier2_remote_weight == 0.5);
  std::string text = base_manifest + "[router]\ntier2_weight = 0.4\ntier2_remote_weight = 0.6\n";
  auto issues = parse_bad(text);
  REQUIRE(issues.size() == 1);
  auto remote = find_issue(issues, "router.tier2_remote_weight", "must not exceed tier2_weight");
  CHECK(remote.line == line_of(text, "tier2_remote_weight"));
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
                     "[router]\npolicy = \"best\"\nkv_index = \"exact\"\n"
                     "[speculative]\nmethod = \"medusa\"\n";
  auto issues = parse_bad(text);
  CHECK(issues.size() == 5);
  auto mode = find_issue(issues, "router.kv_index", "unknown value 'exact'; accepted: approximate, precise");
  CHECK(mode.line == line_of(text, "kv_index"));
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
  std::string empty = base_manifest + "[[node]]\nname = \"b\"\nhost = \"127.0.0.2\"\n"
                                      "fabric_port = 1\n";
  auto lonely = only_issue(empty);
  CHECK(lonely.key == "node[1]");
  CHECK(lonely.message == "node 'b' has no instances");
}

TEST_CASE("kv_offload.enabled needs a path; tier-2 bounds are checked by key") {
  auto issue = only_issue(base_manifest + "[kv_offload]\nenabled = true\n");
  CHECK(issue.key == "kv_offload.path");
  CHECK(issue.message.find("required when kv_offload.enabled") != std::string::npos);
  Manifest m = parse_ok(base_manifest + "[kv_offload]\nenabled = true\npath = \"kv\"\n"
                        "staging_blocks = 8\nhold_timeout_ms = 500\n");
  CHECK(m.kv_offload.enabled);
  CHECK(m.kv_offload.staging_blocks == 8);
  CHECK(m.kv_offload.hold_timeout_ms == 500);
  CHECK(m.kv_offload.lookup_timeout_ms == 2000);
  CHECK(m.kv_offload.partial_blocks);
  CHECK_FALSE(parse_ok(base_manifest + "[kv_offload]\npartial_blocks = false\n")
                  .kv_offload.partial_blocks);
  std::string word = base_manifest + "[kv_offload]\npartial_blocks = \"no\"\n";
  auto not_bool = only_issue(word);
  CHECK(not_bool.key == "kv_offload.partial_blocks");
  CHECK(not_bool.line == line_of(word, "partial_blocks = "));
  std::string bad = base_manifest + "[kv_offload]\nstaging_blocks = 0\n";
  auto zero = only_issue(bad);
  CHECK(zero.key == "kv_offload.staging_blocks");
  CHECK(zero.line == line_of(bad, "staging_blocks = 0"));
}

TEST_CASE("speculative: ngram, suffix and eagle3 with their keys; other methods' keys "
          "refused") {
  std::string ngram = base_manifest +
                      "[speculative]\nmethod = \"ngram\"\ndraft_tokens_max = 6\nbatch_max = 8\nrow_cost = 0.1\n"
                      "ngram_match_min = 3\nngram_match_max = 5\nngram_candidates_max = 2\n";
  Manifest m = parse_ok(ngram);
  CHECK(m.speculative.method == SpeculativeMethod::ngram);
  CHECK(m.speculative.draft_tokens_max == 6);
  CHECK(m.speculative.batch_max == 8);
  CHECK(m.speculative.row_cost == doctest::Approx(0.1));
  CHECK(m.speculative.ngram_match_min == 3);
  CHECK(m.speculative.ngram_match_max == 5);
  CHECK(m.speculative.ngram_candidates_max == 2);
  std::string suffix = base_manifest +
                       "[speculative]\nmethod = \"suffix\"\nsuffix_depth_max = 32\n"
                       "suffix_probability_min = 0.2\nsuffix_match_factor = 2.0\n"
                       "suffix_cache_tokens_max = 100000\n";
  Manifest ms = parse_ok(suffix);
  CHECK(ms.speculative.method == SpeculativeMethod::suffix);
  CHECK(ms.speculative.suffix_depth_max == 32);
  CHECK(ms.speculative.suffix_probability_min == doctest::Approx(0.2));
  CHECK(ms.speculative.suffix_match_factor == doctest::Approx(2.0));
  CHECK(ms.speculative.suffix_cache_tokens_max == 100000);

  std::string eagle = base_manifest + "[speculative]\nmethod = \"eagle3\"\n";
  auto refused = only_issue(eagle);
  CHECK(refused.key == "speculative.method");
  CHECK(refused.line == line_of(eagle, "method = "));
  CHECK(refused.message.find("needs draft_model") != std::string::npos);
  Manifest me = parse_ok(base_manifest +
                         "[speculative]\nmethod = \"eagle3\"\ndraft_model = \"heads/e3\"\n");
  CHECK(me.speculative.method == SpeculativeMethod::eagle3);
  CHECK(me.speculative.draft_model.size() > std::string("heads/e3").size());  // made absolute
  CHECK(me.speculative.draft_model.substr(me.speculative.draft_model.size() - 8) == "heads/e3");
  std::string stray = base_manifest + "[speculative]\nmethod = \"suffix\"\ndraft_model = \"x\"\n";
  auto unused = only_issue(stray);
  CHECK(unused.key == "speculative.draft_model");
  CHECK(unused.line == line_of(stray, "draft_model"));
  CHECK(unused.message.find("applies to method \"eagle3\"") != std::string::npos);
  // The draft head runs beside decode's executor, on the cpu device only.
  std::string on_sim = replace(base_manifest, "device = \"cpu\"", "device = \"sim\"") +
                       "[speculative]\nmethod = \"eagle3\"\ndraft_model = \"h\"\n";
  auto sim = only_issue(on_sim);
  CHECK(sim.key == "node[0].instance[2].executor");
  CHECK(sim.line == line_of(on_sim, "executor = \"ex\""));
  CHECK(sim.message.find("executor 'ex' has device \"sim\"") != std::string::npos);
  // A method's keys do nothing under another method: refused, naming both.
  std::string mixed = base_manifest + "[speculative]\nmethod = \"ngram\"\nsuffix_depth_max = 8\n";
  auto other = only_issue(mixed);
  CHECK(other.key == "speculative.suffix_depth_max");
  CHECK(other.line == line_of(mixed, "suffix_depth_max"));
  CHECK(other.message.find("applies to method \"suffix\"") != std::string::npos);
  CHECK(other.message.find("\"ngram\"") != std::string::npos);
  auto none_key = only_issue(base_manifest + "[speculative]\nngram_match_min = 2\n");
  CHECK(none_key.key == "speculative.ngram_match_min");
  std::string inverted = base_manifest +
                         "[speculative]\nmethod = \"ngram\"\nngram_match_min = 6\n"
                         "ngram_match_max = 4\n";
  auto order = only_issue(inverted);
  CHECK(order.key == "speculative.ngram_match_max");
  CHECK(order.message.find("must not be below ngram_match_min") != std::string::npos);
  auto zero = only_issue(base_manifest +
                         "[speculative]\nmethod = \"suffix\"\nsuffix_probability_min = 0.0\n");
  CHECK(zero.key == "speculative.suffix_probability_min");
  CHECK(parse_ok(base_manifest + "[speculative]\nmethod = \"none\"\n").speculative.method ==
        SpeculativeMethod::none);
}

TEST_CASE("new sections and executor keys default when absent") {
  Manifest m = parse_ok(base_manifest);
  CHECK(m.gateway.api_keys.empty());
  CHECK(m.gateway.body_bytes_max == 16u << 20);
  CHECK(m.gateway.connections_max == 4096);
  CHECK(m.gateway.requests_max == 1024);
  CHECK(m.gateway.queue_max == 4096);
  CHECK(m.gateway.request_timeout_ms == 600000);
  CHECK(m.gateway.queue_timeout_ms == 30000);
  CHECK(m.gateway.cache_secret.empty());
  CHECK(m.prefill.queue_max == 256);
  CHECK(m.prefill.running_max == 16);
  CHECK(m.prefill.held_max == 256);
  CHECK(m.prefill.step_tokens_max == 512);
  CHECK(m.prefill.hold_timeout_ms == 30000);
  CHECK(m.decode.waiting_max == 256);
  CHECK(m.decode.seqs_max == 64);
  CHECK(m.decode.step_tokens_max == 512);
  CHECK(m.decode.prefill_timeout_ms == 30000);
  CHECK(m.sim.params.empty());
  const Instance& ex = m.nodes.at(0).instances.at(3);
  CHECK(ex.kv_blocks == 512);
  CHECK(ex.threads == 0);
}

TEST_CASE("[gateway], [prefill], [decode], [sim] and executor keys are read") {
  std::string text =
      replace(base_manifest, "devices = [0]", "devices = [0]\n  kv_blocks = 64\n  threads = 3");
  text += R"(
[gateway]
api_keys = ["sk-one", "sk-two"]
body_bytes_max = 1024
connections_max = 100000
requests_max = 1
queue_max = 0
request_timeout_ms = 86400000
cache_secret = ""

[prefill]
queue_max = 1
running_max = 2
held_max = 2
step_tokens_max = 16
hold_timeout_ms = 100

[decode]
waiting_max = 1
seqs_max = 1
step_tokens_max = 1
prefill_timeout_ms = 3600000

[sim]
npu_count = 8
peak_flops = 2e15
kv_scale = 0.125
)";
  Manifest m = parse_ok(text);
  CHECK(m.gateway.api_keys == std::vector<std::string>{"sk-one", "sk-two"});
  CHECK(m.gateway.body_bytes_max == 1024);
  CHECK(m.gateway.connections_max == 100000);
  CHECK(m.gateway.requests_max == 1);
  CHECK(m.gateway.queue_max == 0);
  CHECK(m.gateway.request_timeout_ms == 86400000);
  CHECK(m.gateway.cache_secret.empty());
  CHECK(m.prefill.queue_max == 1);
  CHECK(m.prefill.running_max == 2);
  CHECK(m.prefill.held_max == 2);
  CHECK(m.prefill.step_tokens_max == 16);
  CHECK(m.prefill.hold_timeout_ms == 100);
  CHECK(m.decode.waiting_max == 1);
  CHECK(m.decode.seqs_max == 1);
  CHECK(m.decode.step_tokens_max == 1);
  CHECK(m.decode.prefill_timeout_ms == 3600000);
  REQUIRE(m.sim.params.size() == 3);
  auto param = [&m](const std::string& name) {
    for (const auto& [key, value] : m.sim.params) {
      if (key == name) return std::optional<double>(value);
    }
    return std::optional<double>();
  };
  CHECK(param("npu_count") == std::optional<double>(8.0));
  CHECK(param("peak_flops") == std::optional<double>(2e15));
  CHECK(param("kv_scale") == std::optional<double>(0.125));
  const Instance& ex = m.nodes.at(0).instances.at(3);
  CHECK(ex.kv_blocks == 64);
  CHECK(ex.threads == 3);

  std::string upper = base_manifest + R"(
[gateway]
api_keys = []
body_bytes_max = 1073741824
cache_secret = "s3cret"
request_timeout_ms = 1000
[prefill]
running_max = 100000
held_max = 1000000
queue_max = 1000000
step_tokens_max = 16777216
hold_timeout_ms = 3600000
[decode]
waiting_max = 1000000
seqs_max = 100000
step_tokens_max = 16777216
prefill_timeout_ms = 100
[sim]
)";
  upper =
      replace(upper, "devices = [0]", "devices = [0]\n  kv_blocks = 16777216\n  threads = 1024");
  Manifest u = parse_ok(upper);
  CHECK(u.gateway.api_keys.empty());
  CHECK(u.gateway.body_bytes_max == 1u << 30);
  CHECK(u.gateway.cache_secret == "s3cret");
  CHECK(u.prefill.held_max == 1000000);
  CHECK(u.decode.seqs_max == 100000);
  CHECK(u.sim.params.empty());
  CHECK(u.nodes.at(0).instances.at(3).kv_blocks == 16777216);
  CHECK(u.nodes.at(0).instances.at(3).threads == 1024);
}

TEST_CASE("[gateway]: ranges, types and API keys") {
  std::string text = base_manifest + R"(
[gateway]
body_bytes_max = 1023
connections_max = 0
requests_max = 100001
queue_max = -1
request_timeout_ms = 999
queue_timeout_ms = 99
cache_secret = 42
api_keys = ["ok", "", 7]
colour = "red"
)";
  auto issues = parse_bad(text);
  CHECK(issues.size() == 10);
  auto body = find_issue(issues, "gateway.body_bytes_max",
                         "value 1023 is out of range "
                         "1024..1073741824");
  CHECK(body.line == line_of(text, "body_bytes_max"));
  CHECK(body.column == 18);
  auto conn = find_issue(issues, "gateway.connections_max", "out of range 1..100000");
  CHECK(conn.line == line_of(text, "connections_max"));
  auto req = find_issue(issues, "gateway.requests_max", "value 100001 is out of range 1..100000");
  CHECK(req.line == line_of(text, "requests_max"));
  auto queue = find_issue(issues, "gateway.queue_max", "value -1 is out of range 0..1000000");
  CHECK(queue.line == line_of(text, "queue_max"));
  auto timeout = find_issue(issues, "gateway.request_timeout_ms", "out of range 1000..86400000");
  CHECK(timeout.line == line_of(text, "request_timeout_ms"));
  auto wait =
      find_issue(issues, "gateway.queue_timeout_ms", "value 99 is out of range 100..86400000");
  CHECK(wait.line == line_of(text, "queue_timeout_ms"));
  auto secret = find_issue(issues, "gateway.cache_secret", "expected a string, got an integer");
  CHECK(secret.line == line_of(text, "cache_secret"));
  auto empty = find_issue(issues, "gateway.api_keys[1]", "must not be empty");
  CHECK(empty.line == line_of(text, "api_keys"));
  CHECK(empty.column == 19);
  auto seven = find_issue(issues, "gateway.api_keys[2]", "expected a string, got an integer");
  CHECK(seven.column == 23);
  find_issue(issues, "gateway.colour", "unknown key in gateway; accepted: api_keys");

  std::string types = base_manifest +
                      "[gateway]\napi_keys = \"sk\"\nbody_bytes_max = 2.5e6\n"
                      "request_timeout_ms = \"10s\"\n";
  auto type_issues = parse_bad(types);
  CHECK(type_issues.size() == 3);
  auto keys =
      find_issue(type_issues, "gateway.api_keys", "expected an array of strings, got a string");
  CHECK(keys.line == line_of(types, "api_keys"));
  auto bytes =
      find_issue(type_issues, "gateway.body_bytes_max", "expected an integer, got a number");
  CHECK(bytes.line == line_of(types, "body_bytes_max"));
  find_issue(type_issues, "gateway.request_timeout_ms", "expected an integer, got a string");
  auto table = only_issue("gateway = 3\n" + base_manifest);
  CHECK(table.key == "gateway");
  CHECK(table.message.find("expected a table [gateway], got an integer") != std::string::npos);
}

TEST_CASE("[prefill]: limits at least 1, running_max <= held_max, a step holds a block") {
  std::string text = base_manifest + R"(
[prefill]
queue_max = 0
running_max = 0
held_max = 1000001
step_tokens_max = "512"
hold_timeout_ms = 99
)";
  auto issues = parse_bad(text);
  CHECK(issues.size() == 5);
  auto queue = find_issue(issues, "prefill.queue_max", "value 0 is out of range 1..1000000");
  CHECK(queue.line == line_of(text, "queue_max = 0"));
  find_issue(issues, "prefill.running_max", "value 0 is out of range 1..100000");
  find_issue(issues, "prefill.held_max", "out of range 1..1000000");
  auto step = find_issue(issues, "prefill.step_tokens_max", "expected an integer, got a string");
  CHECK(step.line == line_of(text, "step_tokens_max"));
  auto hold = find_issue(issues, "prefill.hold_timeout_ms", "out of range 100..3600000");
  CHECK(hold.line == line_of(text, "hold_timeout_ms"));

  std::string order = base_manifest + "[prefill]\nrunning_max = 32\nheld_max = 31\n";
  auto held = only_issue(order);
  CHECK(held.key == "prefill.held_max");
  CHECK(held.line == line_of(order, "held_max"));
  CHECK(held.message.find("running_max (32) must not exceed held_max (31)") != std::string::npos);
  // Against the default held_max (256): reported on running_max, the key that is written.
  std::string over = base_manifest + "[prefill]\nrunning_max = 257\n";
  auto running = only_issue(over);
  CHECK(running.key == "prefill.running_max");
  CHECK(running.line == line_of(over, "running_max"));

  std::string block =
      replace(base_manifest, "path = \"models/tiny\"", "path = \"models/tiny\"\nblock_tokens = 64");
  block += "[prefill]\nstep_tokens_max = 63\n";
  auto small = only_issue(block);
  CHECK(small.key == "prefill.step_tokens_max");
  CHECK(small.line == line_of(block, "step_tokens_max"));
  CHECK(small.message.find("step_tokens_max (63) must be at least model.block_tokens (64)") !=
        std::string::npos);
  Manifest exact = parse_ok(replace(block, "step_tokens_max = 63", "step_tokens_max = 64"));
  CHECK(exact.prefill.step_tokens_max == 64);
  // A default step (512) below a large block is reported too, at the [prefill] table.
  std::string big = replace(base_manifest, "path = \"models/tiny\"",
                            "path = \"models/tiny\"\nblock_tokens = 1024\nmax_model_tokens = 1024");
  big += "[prefill]\nqueue_max = 8\n";
  auto default_step = only_issue(big);
  CHECK(default_step.key == "prefill.step_tokens_max");
  CHECK(default_step.line == line_of(big, "[prefill]"));
  CHECK(default_step.message.find("(512) must be at least model.block_tokens (1024); the "
                                  "default is too small") != std::string::npos);
  // Without a [prefill] section the default still counts; the issue has no place.
  auto absent = only_issue(big.substr(0, big.find("[prefill]")));
  CHECK(absent.key == "prefill.step_tokens_max");
  CHECK(absent.line == 0);
  auto not_table = only_issue("prefill = 1\n" + big.substr(0, big.find("[prefill]")));
  CHECK(not_table.key == "prefill");
}

TEST_CASE("[decode]: limits at least 1 and the prefill timeout range") {
  std::string text = base_manifest + R"(
[decode]
waiting_max = 0
seqs_max = 100001
step_tokens_max = 0
prefill_timeout_ms = 3600001
budget = 1
)";
  auto issues = parse_bad(text);
  CHECK(issues.size() == 5);
  auto waiting = find_issue(issues, "decode.waiting_max", "value 0 is out of range 1..1000000");
  CHECK(waiting.line == line_of(text, "waiting_max"));
  auto seqs = find_issue(issues, "decode.seqs_max", "value 100001 is out of range 1..100000");
  CHECK(seqs.line == line_of(text, "seqs_max"));
  auto step = find_issue(issues, "decode.step_tokens_max", "value 0 is out of range 1..16777216");
  CHECK(step.line == line_of(text, "step_tokens_max"));
  auto timeout = find_issue(issues, "decode.prefill_timeout_ms", "out of range 100..3600000");
  CHECK(timeout.line == line_of(text, "prefill_timeout_ms"));
  find_issue(issues, "decode.budget", "unknown key in decode");
  auto type = only_issue(base_manifest + "[decode]\nseqs_max = true\n");
  CHECK(type.key == "decode.seqs_max");
  CHECK(type.message == "expected an integer, got a boolean");
}

TEST_CASE("[sim]: every value is a finite number; names are free-form") {
  std::string text = base_manifest + R"(
[sim]
npu_count = 4
time_factor = "fast"
dp_ep = true
kv_scale = nan
peak_flops = inf
any_new_name = -1.5
[sim.nested]
x = 1
)";
  auto issues = parse_bad(text);
  CHECK(issues.size() == 5);
  auto factor = find_issue(issues, "sim.time_factor",
                           "expected a number (integer or float), "
                           "got a string");
  CHECK(factor.line == line_of(text, "time_factor"));
  CHECK(factor.column == 15);
  auto dp = find_issue(issues, "sim.dp_ep", "got a boolean");
  CHECK(dp.line == line_of(text, "dp_ep"));
  auto scale = find_issue(issues, "sim.kv_scale", "must be a finite number");
  CHECK(scale.line == line_of(text, "kv_scale"));
  find_issue(issues, "sim.peak_flops", "must be a finite number");
  find_issue(issues, "sim.nested", "got a table");

  Manifest m = parse_ok(base_manifest + "[sim]\nany_new_name = -1.5\nnpu_count = 4\n");
  REQUIRE(m.sim.params.size() == 2);
  for (const auto& [name, value] : m.sim.params) {
    CHECK((name == "any_new_name" ? value == -1.5 : (name == "npu_count" && value == 4.0)));
  }
}

TEST_CASE("executor sim = { ... }: its own values of [sim] keys, for sim executors only") {
  std::string sim_executor = replace(base_manifest, "device = \"cpu\"", "device = \"sim\"\n  "
                                     "sim = { dp_ep = 1, step_overhead_us = 250 }");
  Manifest m = parse_ok(sim_executor + "[sim]\nnpu_count = 4\ndp_ep = 0\n");
  const Instance* ex = m.find_executor("ex");
  REQUIRE(ex != nullptr);
  CHECK(ex->sim.size() == 2);
  auto merged = m.sim_params(*ex);
  CHECK(merged.size() == 3);
  CHECK(merged["npu_count"] == 4.0);   // from [sim]
  CHECK(merged["dp_ep"] == 1.0);       // the executor's own value wins
  CHECK(merged["step_overhead_us"] == 250.0);
  CHECK(m.find_executor("dec") == nullptr);  // not an executor

  // Not a table; a non-number inside; on a cpu executor; on a decode instance.
  std::string text = replace(base_manifest, "device = \"cpu\"",
                             "device = \"sim\"\n  sim = { dp_ep = \"yes\" }");
  auto value = only_issue(text);
  CHECK(value.key == "node[0].instance[3].sim.dp_ep");
  CHECK(value.line == line_of(text, "sim = {"));
  CHECK(value.message.find("expected a number") != std::string::npos);
  text = replace(base_manifest, "device = \"cpu\"", "device = \"sim\"\n  sim = 3");
  auto not_table = only_issue(text);
  CHECK(not_table.key == "node[0].instance[3].sim");
  CHECK(not_table.line == line_of(text, "sim = 3"));
  CHECK(not_table.message.find("expected a table") != std::string::npos);
  text = replace(base_manifest, "devices = [0]", "devices = [0]\n  sim = { dp_ep = 1 }");
  auto cpu = only_issue(text);
  CHECK(cpu.key == "node[0].instance[3].sim");
  CHECK(cpu.message.find("device = \"sim\" only (this executor's device is cpu)") !=
        std::string::npos);
  text = replace(base_manifest, "executor = \"ex\"", "executor = \"ex\"\n  sim = { dp_ep = 1 }");
  auto decode = only_issue(text);
  CHECK(decode.key == "node[0].instance[2].sim");
  CHECK(decode.message.find("only executor instances take 'sim'") != std::string::npos);
}

TEST_CASE("[[node]] workers: 1..256, default half the hardware threads, clamped to 2..16") {
  std::string text = replace(base_manifest, "http_port = 8000", "http_port = 8000\nworkers = 6");
  Manifest m = parse_ok(text);
  CHECK(m.nodes.at(0).workers == std::optional<uint32_t>(6));
  CHECK(m.nodes.at(0).workers_count() == 6);
  Manifest d = parse_ok(base_manifest);
  CHECK(!d.nodes.at(0).workers.has_value());
  CHECK(d.nodes.at(0).workers_count() == default_workers());
  CHECK(default_workers() >= 2);
  CHECK(default_workers() ==
        std::clamp(std::thread::hardware_concurrency() / 2, 2u, 16u));
  std::string zero = replace(base_manifest, "http_port = 8000", "http_port = 8000\nworkers = 0");
  auto issue = only_issue(zero);
  CHECK(issue.key == "node[0].workers");
  CHECK(issue.line == line_of(zero, "workers = 0"));
  CHECK(issue.message == "value 0 is out of range 1..256");
  auto many = only_issue(replace(base_manifest, "http_port = 8000", "http_port = 8000\nworkers = 257"));
  CHECK(many.message == "value 257 is out of range 1..256");
  auto text_value =
      only_issue(replace(base_manifest, "http_port = 8000", "http_port = 8000\nworkers = \"4\""));
  CHECK(text_value.key == "node[0].workers");
  CHECK(text_value.message.find("expected an integer") != std::string::npos);
}

TEST_CASE("[gateway] preparers, long_prompt_preparers, long_prompt_bytes: ranges, defaults") {
  Manifest d = parse_ok(base_manifest);
  CHECK(d.gateway.preparers == 0);
  Node node = d.nodes.at(0);
  node.workers = 1;
  CHECK(gateway_preparers(d.gateway, node) == 2);
  node.workers = 6;
  CHECK(gateway_preparers(d.gateway, node) == 6);
  node.workers = 64;
  CHECK(gateway_preparers(d.gateway, node) == 16);
  std::string text = base_manifest + "\n[gateway]\npreparers = 3\n";
  Manifest m = parse_ok(text);
  CHECK(m.gateway.preparers == 3);
  CHECK(gateway_preparers(m.gateway, node) == 3);
  std::string bad = base_manifest + "\n[gateway]\npreparers = 65\n";
  auto issue = only_issue(bad);
  CHECK(issue.key == "gateway.preparers");
  CHECK(issue.line == line_of(bad, "preparers = 65"));
  CHECK(issue.message == "value 65 is out of range 1..64");
  CHECK(only_issue(base_manifest + "\n[gateway]\npreparers = 0\n").message ==
        "value 0 is out of range 1..64");
  CHECK(d.gateway.long_prompt_preparers == 2);
  CHECK(d.gateway.long_prompt_bytes == 65536);
  Manifest l = parse_ok(base_manifest +
                        "\n[gateway]\nlong_prompt_preparers = 5\nlong_prompt_bytes = 4096\n");
  CHECK(l.gateway.long_prompt_preparers == 5);
  CHECK(l.gateway.long_prompt_bytes == 4096);
  std::string small = base_manifest + "\n[gateway]\nlong_prompt_bytes = 1000\n";
  auto too_small = only_issue(small);
  CHECK(too_small.key == "gateway.long_prompt_bytes");
  CHECK(too_small.line == line_of(small, "long_prompt_bytes = 1000"));
  CHECK(too_small.message == "value 1000 is out of range 1024..1073741824");
  CHECK(only_issue(base_manifest + "\n[gateway]\nlong_prompt_preparers = 0\n").key ==
        "gateway.long_prompt_preparers");
}

TEST_CASE("kv_blocks and threads: ranges, executors only, a pool holds one full context") {
  std::string text =
      replace(base_manifest, "devices = [0]", "devices = [0]\n  kv_blocks = 0\n  threads = 1025");
  text = replace(text, "name = \"gw\"", "name = \"gw\"\n  kv_blocks = 8\n  threads = 2");
  text = replace(text, "name = \"dec\"", "name = \"dec\"\n  threads = 1");
  auto issues = parse_bad(text);
  CHECK(issues.size() == 5);
  auto zero =
      find_issue(issues, "node[0].instance[3].kv_blocks", "value 0 is out of range 1..16777216");
  CHECK(zero.line == line_of(text, "kv_blocks = 0"));
  CHECK(zero.column == 15);
  auto threads =
      find_issue(issues, "node[0].instance[3].threads", "value 1025 is out of range 0..1024");
  CHECK(threads.line == line_of(text, "threads = 1025"));
  auto gw = find_issue(issues, "node[0].instance[0].kv_blocks",
                       "only executor instances take 'kv_blocks' (this is a gateway)");
  CHECK(gw.line == line_of(text, "kv_blocks = 8"));
  find_issue(issues, "node[0].instance[0].threads", "only executor instances take 'threads'");
  auto dec = find_issue(issues, "node[0].instance[2].threads", "(this is a decode)");
  CHECK(dec.line == line_of(text, "threads = 1"));
  auto type = only_issue(replace(base_manifest, "devices = [0]", "devices = [0]\n  threads = 1.5"));
  CHECK(type.key == "node[0].instance[3].threads");
  CHECK(type.message == "expected an integer, got a number");

  // 15 blocks of 16 tokens = 240 < 256: one block short.
  std::string tight = replace(base_manifest, "devices = [0]", "devices = [0]\n  kv_blocks = 15");
  auto pool = only_issue(tight);
  CHECK(pool.key == "node[0].instance[3].kv_blocks");
  CHECK(pool.line == line_of(tight, "kv_blocks = 15"));
  CHECK(pool.message.find("kv_blocks 15 x model.block_tokens 16 = 240 tokens") !=
        std::string::npos);
  CHECK(pool.message.find("model.max_model_tokens 256; needs at least 16 blocks") !=
        std::string::npos);
  Manifest exact = parse_ok(replace(tight, "kv_blocks = 15", "kv_blocks = 16"));
  CHECK(exact.nodes.at(0).instances.at(3).kv_blocks == 16);
  // The default (512 blocks) is checked too, and a count > 1 table is reported once.
  std::string long_context = replace(base_manifest, "path = \"models/tiny\"",
                                     "path = \"models/tiny\"\nmax_model_tokens = 10000");
  long_context = replace(long_context, "  name = \"dec\"", "  name = \"dec\"\n  count = 2");
  long_context = replace(long_context, "  name = \"ex\"", "  name = \"ex\"\n  count = 2");
  long_context = replace(long_context, "devices = [0]", "devices = [0, 1]");
  auto by_default = only_issue(long_context);
  CHECK(by_default.key == "node[0].instance[3].kv_blocks");
  CHECK(by_default.line == line_of(long_context, "role = \"executor\"") - 1);
  CHECK(by_default.message.find("kv_blocks 512 (the default) x model.block_tokens 16 = 8192") !=
        std::string::npos);
  CHECK(by_default.message.find("needs at least 625 blocks") != std::string::npos);
}

TEST_CASE("summarize shows the gateway's keys and limits, never the keys themselves") {
  Manifest m = parse_ok(base_manifest);
  std::string text = summarize(m);
  CHECK(text.find("gateway   api keys no; body max 16777216 bytes, 4096 connections, 1024 "
                  "requests, queue 4096 (wait max 30000 ms), timeout 600000 ms\n") !=
        std::string::npos);
  Manifest keyed = parse_ok(base_manifest +
                            "[gateway]\napi_keys = [\"sk-a\", \"sk-b\"]\ncache_secret = \"pst\"\n"
                            "requests_max = 8\nqueue_max = 0\nqueue_timeout_ms = 500\n");
  std::string keyed_text = summarize(keyed);
  CHECK(keyed_text.find("gateway   api keys yes (2); body max 16777216 bytes, 4096 connections, "
                        "8 requests, queue 0 (wait max 500 ms), timeout 600000 ms\n") !=
        std::string::npos);
  CHECK(keyed_text.find("sk-a") == std::string::npos);
  CHECK(keyed_text.find("pst") == std::string::npos);
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
  text += "[kv_offload]\npath = \"./kv/\"\n";
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
  // [gateway] is present with every key commented out: the defaults.
  CHECK(m.gateway.api_keys.empty());
  CHECK(m.gateway.body_bytes_max == 16u << 20);
  CHECK(m.gateway.request_timeout_ms == 600000);
  CHECK(executors[0].second->kv_blocks == 512);
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
    // Prefill PP4 ([sim] dp_ep = 0); decode DP4 + expert parallel (its own dp_ep = 1).
    CHECK(m.sim_params(*executor).at("dp_ep") == (prefill ? 0.0 : 1.0));
  }
  CHECK(m.model.name == "MiniMax-M2.7");
  CHECK(m.model.block_tokens == 4096);
  CHECK(m.model.max_model_tokens == 204800);
  CHECK(m.model.chat_format == ChatFormat::minimax_m2);
  CHECK(m.router.policy == RouterPolicy::prefix_aware);
  CHECK(m.prefill.step_tokens_max == 4096);
  for (const auto& [node, executor] : executors) CHECK(executor->kv_blocks == 600);
  // Every sim device key of docs/sim-device.md, at its default.
  CHECK(m.sim.params.size() == 28);
  auto param = [&m](const std::string& name) {
    for (const auto& [key, value] : m.sim.params) {
      if (key == name) return value;
    }
    FAIL_CHECK("no sim parameter " << name);
    return 0.0;
  };
  CHECK(param("npu_count") == 4.0);
  CHECK(param("hbm_bytes") == 144e9);
  CHECK(param("total_params") == 229e9);
  CHECK(param("kv_bytes_per_token") == 126976.0);
  CHECK(param("kv_memory_fraction") == 0.9);
  CHECK(param("max_position") == 204800.0);
  // 600 blocks fit the sim device's KV memory; 601 would not.
  double capacity_tokens = (param("hbm_bytes") * param("npu_count") - param("total_params")) *
                           param("kv_memory_fraction") / param("kv_bytes_per_token");
  CHECK(600.0 * m.model.block_tokens <= capacity_tokens);
  CHECK(601.0 * m.model.block_tokens > capacity_tokens);
}

TEST_CASE("summarize shows the cluster, model and a row per node") {
  Manifest m = load_example("loopback-3.toml");
  std::string text = summarize(m);
  CHECK(text.find("loopback-3") != std::string::npos);
  CHECK(text.find("tcp;ofi_rxm") != std::string::npos);
  CHECK(text.find("stories15M") != std::string::npos);
  CHECK(text.find("3 node(s), 6 instance(s)") != std::string::npos);
  CHECK(text.find("front    127.0.0.1:17110  17210  8000   auto     gateway, router") !=
        std::string::npos);
  CHECK(text.find("decode   127.0.0.1:17112  17212  -      auto     decode, executor") !=
        std::string::npos);
  m.nodes[1].workers = 8;
  CHECK(summarize(m).find("prefill  127.0.0.1:17111  17211  -      8        prefill, executor") !=
        std::string::npos);
  CHECK(text.find("gateway   api keys no;") != std::string::npos);
  CHECK(text.find("          preparers auto on the workers; bodies over 65536 bytes on 2 threads\n") !=
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
  CHECK(good.output.find("tier 2    off") != std::string::npos);
  CHECK(good.output.find("block 16 tokens, context 256 tokens") != std::string::npos);
  RunResult target = run_tandem("check " + source_root() + "/config/examples/target-4p4d.toml");
  CHECK_MESSAGE(target.output.find("block 4096 tokens, prefix matched per 512-token sub-block, "
                                   "context 204800 tokens") != std::string::npos,
                target.output);
  fs::path tiered = dir / "tier2.toml";
  std::ofstream(tiered) << base_manifest + "[kv_offload]\nenabled = true\npath = \"/srv/kv\"\n"
                                           "capacity_bytes = 8192\nstaging_blocks = 3\n";
  RunResult on = run_tandem("check " + tiered.string());
  CHECK(on.exit_code == 0);
  CHECK_MESSAGE(on.output.find("tier 2    on: /srv/kv/NODE, capacity 8192 bytes per node, "
                               "host cache 0 bytes, staging 3 blocks") != std::string::npos,
                on.output);
  CHECK_MESSAGE(on.output.find("lookup wait 2000 ms, partial blocks on\n") != std::string::npos,
                on.output);
  RunResult help = run_tandem("check --help");
  CHECK(help.exit_code == 0);
  CHECK(help.output.find("usage: tandem check MANIFEST") != std::string::npos);
  RunResult usage = run_tandem("check");
  CHECK(usage.exit_code == 2);
  fs::remove_all(dir);
}

// target-4p4d-local.toml is target-4p4d.toml on one machine (issue 5: `tandem sim` on the
// target vs `tandem bench serve` on the local cluster). Only the listed deployment keys may
// differ; the topology, the schedulers' and router's settings and the timing model may not.
TEST_CASE("example target-4p4d-local.toml keeps target-4p4d's topology and timing model") {
  Manifest target = load_example("target-4p4d.toml");
  Manifest local = load_example("target-4p4d-local.toml");
  REQUIRE(local.nodes.size() == target.nodes.size());
  std::set<uint16_t> ports;
  for (size_t n = 0; n < target.nodes.size(); ++n) {
    const Node& t = target.nodes[n];
    const Node& l = local.nodes[n];
    CHECK(l.name == t.name);
    CHECK(l.host == "127.0.0.1");
    CHECK(l.http_port.has_value() == t.http_port.has_value());
    CHECK(ports.insert(l.fabric_port).second);
    REQUIRE(l.admin_port.has_value());
    CHECK(ports.insert(*l.admin_port).second);
    REQUIRE(l.instances.size() == t.instances.size());
    for (size_t i = 0; i < t.instances.size(); ++i) {
      const Instance& ti = t.instances[i];
      const Instance& li = l.instances[i];
      INFO(t.name << " instance " << ti.name);
      CHECK(li.role == ti.role);
      CHECK(li.name == ti.name);
      CHECK(li.executor == ti.executor);
      CHECK(li.device == ti.device);
      CHECK(li.device_ids == ti.device_ids);
      CHECK(li.kv_blocks == ti.kv_blocks);
      CHECK(li.sim == ti.sim);
    }
  }
  CHECK(local.fabric.provider == "tcp;ofi_rxm");
  CHECK(local.membership.heartbeat_interval_ms == target.membership.heartbeat_interval_ms);
  CHECK(local.membership.heartbeat_miss_max == target.membership.heartbeat_miss_max);
  CHECK(local.model.name == target.model.name);
  CHECK(local.model.block_tokens == target.model.block_tokens);
  CHECK(local.model.max_model_tokens == target.model.max_model_tokens);
  CHECK(fs::exists(local.model.path + "/tokenizer.bin"));  // the gateway loads it
  CHECK(local.router.policy == target.router.policy);
  CHECK(local.router.weight_prefix == target.router.weight_prefix);
  CHECK(local.router.weight_queue == target.router.weight_queue);
  CHECK(local.router.weight_kv_usage == target.router.weight_kv_usage);
  CHECK(local.router.prefix_index_blocks_max == target.router.prefix_index_blocks_max);
  CHECK(local.router.disaggregate_tokens_min == target.router.disaggregate_tokens_min);
  CHECK(local.prefill.queue_max == target.prefill.queue_max);
  CHECK(local.prefill.running_max == target.prefill.running_max);
  CHECK(local.prefill.held_max == target.prefill.held_max);
  CHECK(local.prefill.step_tokens_max == target.prefill.step_tokens_max);
  CHECK(local.prefill.hold_timeout_ms == target.prefill.hold_timeout_ms);
  CHECK(local.decode.waiting_max == target.decode.waiting_max);
  CHECK(local.decode.seqs_max == target.decode.seqs_max);
  CHECK(local.decode.step_tokens_max == target.decode.step_tokens_max);
  CHECK(local.decode.prefill_timeout_ms == target.decode.prefill_timeout_ms);
  CHECK(local.kv_offload.enabled == target.kv_offload.enabled);
  // [sim]: same keys; equal values except the deployment keys named in the file's header.
  const std::map<std::string, double> local_only = {
      {"time_factor", 1.0},          {"kv_scale", 1.0 / 128},       {"vocab", 32000.0},
      {"bos_id", 1.0},               {"eos_id", 2.0},               {"output_tokens_mean", 16384.0},
      {"output_tokens_sigma", 0.0},  {"output_tokens_max", 16384.0}};
  std::map<std::string, double> t_sim(target.sim.params.begin(), target.sim.params.end());
  std::map<std::string, double> l_sim(local.sim.params.begin(), local.sim.params.end());
  CHECK(l_sim.size() == local.sim.params.size());  // no key given twice
  REQUIRE(l_sim.size() == t_sim.size());
  for (const auto& entry : t_sim) {
    // Not a structured binding: clang 14 cannot capture one in doctest's INFO lambda.
    const std::string& key = entry.first;
    const double value = entry.second;
    INFO("[sim] " << key);
    REQUIRE(l_sim.count(key) == 1);
    auto it = local_only.find(key);
    CHECK(l_sim.at(key) == (it == local_only.end() ? value : it->second));
  }
}

TEST_CASE("[model] served_names: aliases of the model, validated with file:line:key") {
  Manifest plain = parse_ok(base_manifest);
  CHECK(plain.model.served_names.empty());
  CHECK(plain.model.names() == std::vector<std::string>{"tiny"});
  CHECK(plain.model.serves("tiny"));
  CHECK_FALSE(plain.model.serves("small"));

  std::string text = replace(base_manifest, "path = \"models/tiny\"",
                             "path = \"models/tiny\"\nserved_names = [\"big\", \"small\"]");
  Manifest m = parse_ok(text);
  CHECK(m.model.served_names == std::vector<std::string>{"big", "small"});
  CHECK(m.model.names() == std::vector<std::string>{"tiny", "big", "small"});
  CHECK(m.model.serves("small"));
  CHECK_FALSE(m.model.serves("Small"));
  CHECK(summarize(m).find("also served as big, small") != std::string::npos);

  auto with = [](const std::string& value) {
    return replace(base_manifest, "path = \"models/tiny\"",
                   "path = \"models/tiny\"\nserved_names = " + value);
  };
  auto not_array = only_issue(with("\"big\""));
  CHECK(not_array.key == "model.served_names");
  CHECK(not_array.line == line_of(with("\"big\""), "served_names"));
  CHECK(not_array.message.find("array of strings") != std::string::npos);
  auto number = only_issue(with("[\"big\", 7]"));
  CHECK(number.key == "model.served_names[1]");
  CHECK(number.line == line_of(with("[\"big\", 7]"), "served_names"));
  CHECK(number.message.find("expected a string") != std::string::npos);
  auto empty = only_issue(with("[\"\"]"));
  CHECK(empty.key == "model.served_names[0]");
  CHECK(empty.message.find("must not be empty") != std::string::npos);
  auto twice = only_issue(with("[\"big\", \"small\", \"big\"]"));
  CHECK(twice.key == "model.served_names[2]");
  CHECK(twice.message.find("'big' is listed twice") != std::string::npos);
  auto primary = only_issue(with("[\"tiny\"]"));
  CHECK(primary.key == "model.served_names[0]");
  CHECK(primary.message.find("already the model's name") != std::string::npos);
  CHECK(only_issue(with("[\"big\"]\nserved_name = 1")).key == "model.served_name");
}

TEST_CASE("[sim] reasoning_share is refused with the plain chat format (it would do nothing)") {
  std::string sim = base_manifest + "[sim]\nreasoning_share = 0.3\n";
  // chat_format auto: the executor decides once it knows the format (actors/executor).
  CHECK(parse_ok(sim).sim.params.size() == 1);
  std::string plain = replace(sim, "path = \"models/tiny\"",
                              "path = \"models/tiny\"\nchat_format = \"plain\"");
  auto issue = only_issue(plain);
  CHECK(issue.key == "sim.reasoning_share");
  CHECK(issue.line == line_of(plain, "reasoning_share"));
  CHECK(issue.message.find("model.chat_format is plain") != std::string::npos);
  std::string chatml = replace(sim, "path = \"models/tiny\"",
                               "path = \"models/tiny\"\nchat_format = \"chatml\"");
  CHECK(parse_ok(chatml).sim.params.at(0).second == 0.3);
}

TEST_CASE("example agents.toml: one machine, every role, MiniMax-M2 on the sim device") {
  Manifest m = load_example("agents.toml");
  REQUIRE(m.nodes.size() == 1);
  CHECK(m.nodes[0].host == "127.0.0.1");
  CHECK(m.nodes[0].http_port == std::optional<uint16_t>(8000));
  for (Role role : roles_all) CHECK_MESSAGE(!m.instances_of(role).empty(), to_string(role));
  CHECK(m.model.chat_format == ChatFormat::minimax_m2);
  CHECK(m.model.max_model_tokens == 204800);
  CHECK(m.model.serves("MiniMax-M2.7"));
  CHECK(m.model.served_names.size() >= 2);  // the agent's model and a side-task model
  CHECK(m.model.path ==
        fs::weakly_canonical(source_root()).string() + "/models/minimax-m2-synth");
  std::map<std::string, double> sim(m.sim.params.begin(), m.sim.params.end());
  CHECK(sim.at("time_factor") == 0);
  CHECK(sim.at("reasoning_share") > 0);
  CHECK(sim.at("reasoning_share") < 1);
  CHECK(sim.at("max_position") == 204800);
  // The synthesized tokenizer's ids (tools/setup.d/40-agents-model.sh: --vocab 512): bos is
  // its first added token ]~!b[, eos its third, [e~[.
  CHECK(sim.at("vocab") == 512);
  CHECK(sim.at("bos_id") == 505);
  CHECK(sim.at("eos_id") == 507);
  // 16 sessions of 100K tokens fit every pool, in a few GiB: rows of 62 layers x 8 KV heads x
  // max(1, 128 x kv_scale) x 2 (K, V) bytes.
  auto executors = m.instances_of(Role::executor);
  REQUIRE(executors.size() == 2);
  double row_bytes = 62.0 * 8 * std::max(1.0, 128 * sim.at("kv_scale")) * 2;
  double pools_bytes = 0;
  for (const auto& [node, executor] : executors) {
    CHECK(executor->device == DeviceKind::sim);
    uint64_t tokens = uint64_t{executor->kv_blocks} * m.model.block_tokens;
    CHECK(tokens >= 16u * 100000u);
    pools_bytes += static_cast<double>(tokens) * row_bytes;
  }
  CHECK(pools_bytes < 4.0 * (1u << 30));
}

TEST_CASE("KV pools that do not fit this host's memory: tandem check, node and up refuse") {
  fs::path dir = fs::temp_directory_path() / ("tandem-kvmem-" + std::to_string(getpid()));
  fs::create_directories(dir);
  // Two full-size sim pools (kv_scale 1: 126976 bytes a token) of 2M tokens: ~240 GiB each.
  std::string text = replace(base_manifest, "path = \"models/tiny\"",
                             "path = \"models/tiny\"\nblock_tokens = 4096\n"
                             "max_model_tokens = 8192");
  text = replace(text, "  device = \"cpu\"\n  devices = [0]\n",
                 "  device = \"sim\"\n  devices = [0]\n  kv_blocks = 500\n");
  text += "  [[node.instance]]\n  role = \"prefill\"\n  name = \"pre\"\n  executor = \"ex2\"\n"
          "  [[node.instance]]\n  role = \"executor\"\n  name = \"ex2\"\n  device = \"sim\"\n"
          "  devices = [1]\n  kv_blocks = 500\n[prefill]\nstep_tokens_max = 4096\n";
  fs::path big = dir / "big.toml";
  std::ofstream(big) << text;
  RunResult check = run_tandem("check " + big.string());
  INFO(check.output);
  CHECK(check.exit_code == 1);
  for (const char* fragment : {"kv pools  node a:", "node 'a': its KV pools and buffers need",
                               "executor 'ex': kv_blocks 500 x model.block_tokens 4096 = ",
                               "executor 'ex2'", "physical", "kv_scale", "kv_blocks"}) {
    CHECK_MESSAGE(check.output.find(fragment) != std::string::npos, fragment);
  }
  RunResult node = run_tandem("node --manifest " + big.string() + " --node a");
  INFO(node.output);
  CHECK(node.exit_code == 1);
  CHECK(node.output.find("its KV pools and buffers need") != std::string::npos);
  // tandem up checks the nodes it starts on this host together, before starting any.
  RunResult up = run_tandem("up " + big.string());
  INFO(up.output);
  CHECK(up.exit_code == 1);
  CHECK(up.output.find("this host's nodes a: its KV pools and buffers need") != std::string::npos);
  CHECK(up.output.find("executor 'a/ex2'") != std::string::npos);
  // Two nodes of this host that fit alone (60% of the budget each) but not together:
  // tandem check says so (tandem up would refuse them).
  uint64_t memory = uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGE_SIZE));
  uint64_t budget = memory - std::max<uint64_t>(memory / 10, uint64_t{1} << 30);
  uint64_t blocks = budget * 6 / 10 / (uint64_t{4096} * 126976);
  std::string two = replace(base_manifest, "path = \"models/tiny\"",
                            "path = \"models/tiny\"\nblock_tokens = 4096\n"
                            "max_model_tokens = 8192");
  two = replace(two, "  device = \"cpu\"\n  devices = [0]\n",
                "  device = \"sim\"\n  devices = [0]\n  kv_blocks = " + std::to_string(blocks) +
                    "\n");
  two += "[[node]]\nname = \"b\"\nhost = \"127.0.0.1\"\nfabric_port = 17101\n"
         "  [[node.instance]]\n  role = \"decode\"\n  name = \"dec2\"\n  executor = \"ex2\"\n"
         "  [[node.instance]]\n  role = \"executor\"\n  name = \"ex2\"\n  device = \"sim\"\n"
         "  devices = [0]\n  kv_blocks = " + std::to_string(blocks) +
         "\n[prefill]\nstep_tokens_max = 4096\n";
  fs::path together = dir / "together.toml";
  std::ofstream(together) << two;
  RunResult both = run_tandem("check " + together.string());
  INFO(both.output);
  CHECK(both.exit_code == 1);
  CHECK(both.output.find("node 'a': its KV pools") == std::string::npos);
  CHECK(both.output.find("this host's nodes a, b: its KV pools and buffers need") != std::string::npos);
  CHECK(both.output.find("executor 'b/ex2'") != std::string::npos);
  // Scaled down (1/128) the same pools fit: check passes and prints their size.
  fs::path small = dir / "small.toml";
  std::ofstream(small) << text + "[sim]\nkv_scale = 0.0078125\n";
  RunResult fits = run_tandem("check " + small.string());
  CHECK_MESSAGE(fits.exit_code == 0, fits.output);
  CHECK(fits.output.find("kv pools  node a: 3.8 GiB") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("fabric receive buffers count: 4096 x 64 MiB is refused by check and by the node") {
  fs::path dir = fs::temp_directory_path() / ("tandem-recvmem-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string text = replace(base_manifest, "[model]",
                             "[fabric]\nrecv_buffers = 4096\nframe_bytes_max = 67108864\n[model]");
  fs::path path = dir / "recv.toml";
  std::ofstream(path) << text;
  RunResult check = run_tandem("check " + path.string());
  INFO(check.output);
  CHECK(check.exit_code == 1);
  CHECK(check.output.find("fabric receive buffers: [fabric] recv_buffers 4096 x frame_bytes_max "
                          "67108864 = 256.") != std::string::npos);
  RunResult node = run_tandem("node --manifest " + path.string() + " --node a");
  INFO(node.output);
  CHECK(node.exit_code == 1);
  CHECK(node.output.find("fabric receive buffers") != std::string::npos);
  // The defaults (32 x 4 MiB) pass.
  std::ofstream(dir / "ok.toml") << base_manifest;
  RunResult fine = run_tandem("check " + (dir / "ok.toml").string());
  CHECK_MESSAGE(fine.exit_code == 0, fine.output);
  fs::remove_all(dir);
}

TEST_CASE("[gateway] slow-client keys: defaults, values and ranges") {
  Manifest defaults = parse_ok(base_manifest);
  CHECK(defaults.gateway.header_timeout_ms == 15000);
  CHECK(defaults.gateway.body_timeout_ms == 60000);
  CHECK(defaults.gateway.connections_per_client_max == 256);
  Manifest set = parse_ok(base_manifest +
                          "[gateway]\nheader_timeout_ms = 100\nbody_timeout_ms = 86400000\n"
                          "connections_per_client_max = 1\n");
  CHECK(set.gateway.header_timeout_ms == 100);
  CHECK(set.gateway.body_timeout_ms == 86400000);
  CHECK(set.gateway.connections_per_client_max == 1);
  std::string text = base_manifest + R"(
[gateway]
header_timeout_ms = 99
body_timeout_ms = 86400001
connections_per_client_max = 0
)";
  auto issues = parse_bad(text);
  CHECK(issues.size() == 3);
  auto header = find_issue(issues, "gateway.header_timeout_ms",
                           "value 99 is out of range 100..3600000");
  CHECK(header.line == line_of(text, "header_timeout_ms"));
  auto body = find_issue(issues, "gateway.body_timeout_ms",
                         "value 86400001 is out of range 100..86400000");
  CHECK(body.line == line_of(text, "body_timeout_ms"));
  auto per_client = find_issue(issues, "gateway.connections_per_client_max",
                               "value 0 is out of range 1..100000");
  CHECK(per_client.line == line_of(text, "connections_per_client_max"));
  auto typed = only_issue(base_manifest + "[gateway]\nbody_timeout_ms = \"60s\"\n");
  CHECK(typed.key == "gateway.body_timeout_ms");
  CHECK(typed.message.find("expected an integer") != std::string::npos);
}

TEST_CASE("model.sub_block_tokens: 512 under larger blocks, whole blocks otherwise, checked") {
  Manifest small = parse_ok(base_manifest);
  CHECK(small.model.sub_block_tokens == small.model.block_tokens);
  std::string big = replace(base_manifest, "path = \"models/tiny\"",
                            "path = \"models/tiny\"\nblock_tokens = 4096\nmax_model_tokens = 8192");
  big += "[prefill]\nstep_tokens_max = 4096\n";
  Manifest m = parse_ok(big);
  CHECK(m.model.block_tokens == 4096);
  CHECK(m.model.sub_block_tokens == 512);
  std::string set = replace(big, "block_tokens = 4096\n", "block_tokens = 4096\nsub_block_tokens = 1024\n");
  CHECK(parse_ok(set).model.sub_block_tokens == 1024);
  std::string whole = replace(big, "block_tokens = 4096\n", "block_tokens = 4096\nsub_block_tokens = 4096\n");
  CHECK(parse_ok(whole).model.sub_block_tokens == 4096);
  for (const char* bad : {"sub_block_tokens = 384", "sub_block_tokens = 8192"}) {
    CAPTURE(bad);
    std::string text = replace(big, "block_tokens = 4096\n", std::string("block_tokens = 4096\n") + bad + "\n");
    auto issue = only_issue(text);
    CHECK(issue.key == "model.sub_block_tokens");
    CHECK(issue.line == line_of(text, "sub_block_tokens"));
    CHECK(issue.message.find("must be a power of two at most block_tokens (4096)") !=
          std::string::npos);
  }
  auto zero = only_issue(replace(big, "block_tokens = 4096\n", "block_tokens = 4096\nsub_block_tokens = 0\n"));
  CHECK(zero.key == "model.sub_block_tokens");
}

TEST_CASE("router set: live settings validated by the manifest's own [router] rules") {
  RouterSection current;
  auto settings = router_settings(current);
  REQUIRE(!settings.empty());
  CHECK(settings[0].first == "policy");
  CHECK(settings[0].second == "\"prefix-aware\"");
  for (const auto& [key, value] : settings) CHECK(key != "kv_index");  // fixed at start

  auto w = set_router_key(current, "weight_queue", "2.5");
  REQUIRE(w.ok());
  CHECK(w->weight_queue == 2.5);
  CHECK(w->weight_prefix == current.weight_prefix);  // the others stay
  CHECK(router_setting_text(*w, "weight_queue") == "2.5");
  auto bare = set_router_key(current, "policy", "round-robin");  // a bare word is a string
  REQUIRE(bare.ok());
  CHECK(bare->policy == RouterPolicy::round_robin);
  auto quoted = set_router_key(current, "policy", "\"random\"");
  REQUIRE(quoted.ok());
  CHECK(quoted->policy == RouterPolicy::random);
  auto flag = set_router_key(current, "prefill_by_work", "false");
  REQUIRE(flag.ok());
  CHECK_FALSE(flag->prefill_by_work);
  auto count = set_router_key(current, "disaggregate_tokens_min", "64");
  REQUIRE(count.ok());
  CHECK(count->disaggregate_tokens_min == 64);

  auto negative = set_router_key(current, "weight_queue", "-1");
  REQUIRE_FALSE(negative.ok());
  CHECK(negative.error().message.find("router.weight_queue") != std::string::npos);
  auto policy = set_router_key(current, "policy", "fastest");
  REQUIRE_FALSE(policy.ok());
  CHECK(policy.error().message.find("router.policy") != std::string::npos);
  CHECK(policy.error().message.find("round-robin") != std::string::npos);  // what is allowed
  auto unknown = set_router_key(current, "weight_magic", "1");
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().message.find("router.weight_magic is not a router setting; settable: "
                                     "policy, weight_prefix") != std::string::npos);
  auto fixed = set_router_key(current, "kv_index", "precise");
  REQUIRE_FALSE(fixed.ok());
  CHECK(fixed.error().message.find("router.kv_index is fixed when a router starts") !=
        std::string::npos);
  auto not_value = set_router_key(current, "weight_queue", "1 2");
  REQUIRE_FALSE(not_value.ok());
  CHECK(not_value.error().message.find("router.weight_queue") != std::string::npos);
  // Cross-key rules hold against the current values: all three weights zero is refused.
  RouterSection two_zero = current;
  two_zero.weight_prefix = 0;
  two_zero.weight_kv_usage = 0;
  auto all_zero = set_router_key(two_zero, "weight_queue", "0");
  REQUIRE_FALSE(all_zero.ok());
  CHECK(all_zero.error().message.find("all zero") != std::string::npos);
  auto remote = set_router_key(current, "tier2_remote_weight", "0.9");  // above tier2_weight 0.8
  REQUIRE_FALSE(remote.ok());
  CHECK(remote.error().message.find("must not exceed tier2_weight") != std::string::npos);
}

TEST_CASE("supervisor.drain_timeout_ms: read, ranged") {
  auto ok = parse_manifest(base_manifest + "[supervisor]\ndrain_timeout_ms = 1500\n", "m.toml");
  REQUIRE(std::holds_alternative<Manifest>(ok));
  CHECK(std::get<Manifest>(ok).supervisor.drain_timeout_ms == 1500);
  auto bad = parse_manifest(base_manifest + "[supervisor]\ndrain_timeout_ms = -1\n", "m.toml");
  REQUIRE(std::holds_alternative<ManifestErrors>(bad));
  CHECK(std::get<ManifestErrors>(bad).describe().find("supervisor.drain_timeout_ms") !=
        std::string::npos);
}

TEST_CASE(
    "supervisor.device_lost: restart-node by default, stay, anything else refused at its line") {
  CHECK(Manifest{}.supervisor.device_lost == DeviceLostAction::restart_node);
  auto stay = parse_manifest(base_manifest + "[supervisor]\ndevice_lost = \"stay\"\n", "m.toml");
  REQUIRE(std::holds_alternative<Manifest>(stay));
  CHECK(std::get<Manifest>(stay).supervisor.device_lost == DeviceLostAction::stay);
  std::string text = base_manifest + "[supervisor]\ndevice_lost = \"reboot\"\n";
  ManifestIssue issue = only_issue(text);
  CHECK(issue.key == "supervisor.device_lost");
  CHECK(issue.line == line_of(text, "device_lost = "));
  CHECK(issue.message.find("unknown value 'reboot'") != std::string::npos);
  CHECK(issue.message.find("restart-node") != std::string::npos);
  CHECK(issue.message.find("stay") != std::string::npos);
  // The bound on device-lost restarts: defaults, values, and refused beside "stay".
  CHECK(Manifest{}.supervisor.device_lost_restarts_max == 3);
  CHECK(Manifest{}.supervisor.device_lost_window_ms == 3'600'000);
  Manifest bounded = parse_ok(base_manifest +
                              "[supervisor]\ndevice_lost_restarts_max = 1\n"
                              "device_lost_window_ms = 600000\n");
  CHECK(bounded.supervisor.device_lost_restarts_max == 1);
  CHECK(bounded.supervisor.device_lost_window_ms == 600000);
  CHECK(only_issue(base_manifest + "[supervisor]\ndevice_lost_restarts_max = 0\n").message ==
        "value 0 is out of range 1..100");
  std::string beside = base_manifest +
                       "[supervisor]\ndevice_lost = \"stay\"\n"
                       "device_lost_window_ms = 60000\n";
  ManifestIssue unused = only_issue(beside);
  CHECK(unused.key == "supervisor.device_lost_window_ms");
  CHECK(unused.line == line_of(beside, "device_lost_window_ms"));
  CHECK(unused.message.find("with device_lost = \"stay\" a lost device never restarts") !=
        std::string::npos);
}

TEST_CASE(
    "rbln: [rbln] library and artifacts; required by an rbln executor; no speculation on "
    "its decode instances") {
  std::string rbln = replace(base_manifest, "device = \"cpu\"", "device = \"rbln\"");
  auto missing = only_issue(rbln);
  CHECK(missing.key == "node[0].instance[3].device");
  CHECK(missing.line == line_of(rbln, "role = \"executor\"") - 1);
  CHECK(missing.message.find("[rbln] artifacts (the compiled model directory) or compiler (the "
                             "compile cache) must be set") != std::string::npos);

  std::string with = rbln + "[rbln]\nartifacts = \"compiled/tiny\"\n";
  Manifest m = parse_ok(with);
  CHECK(m.rbln.library == "/usr/local/lib/librbln_runtime.so");
  CHECK(m.rbln.artifacts == "/etc/tandem/compiled/tiny");  // relative to the manifest
  Manifest lib = parse_ok(rbln + "[rbln]\nartifacts = \"/c\"\nlibrary = \"/opt/rbln/lib.so\"\n");
  CHECK(lib.rbln.library == "/opt/rbln/lib.so");
  CHECK_FALSE(m.rbln.kv_on_device);  // kv_memory = "host" by default
  CHECK(parse_ok(with + "kv_memory = \"device\"\n").rbln.kv_on_device);
  CHECK_FALSE(parse_ok(with + "kv_memory = \"host\"\n").rbln.kv_on_device);
  auto memory = only_issue(with + "kv_memory = \"hbm\"\n");
  CHECK(memory.key == "rbln.kv_memory");
  CHECK(memory.message.find("unknown value 'hbm'; accepted: host, device") == 0);

  auto unknown = only_issue(with + "compile = \"rebel-compile\"\n");
  CHECK(unknown.key == "rbln.compile");
  auto both = only_issue(with + "compiler = \"rebel-compile\"\n");
  CHECK(both.key == "rbln.compiler");
  CHECK(both.message.find("not both") != std::string::npos);
  Manifest cached = parse_ok(rbln + "[rbln]\ncompiler = \"rebel-compile --opt 2\"\n");
  CHECK(cached.rbln.artifacts.empty());
  CHECK(cached.rbln.compiler == "rebel-compile --opt 2");
  CHECK(cached.rbln.cache_dir == "/etc/tandem/rbln-cache");
  CHECK(cached.rbln.prefill_chunk == 128);
  CHECK(only_issue(rbln + "[rbln]\ncompiler = \"c\"\nprefill_chunk = 100\n").message ==
        "must be a multiple of 64, got 100");

  // Speculation on an rbln decode instance: host-side drafters (n-gram, suffix) are accepted,
  // the executor checks its artifact for verify graphs (test_rbln_device); EAGLE-3's draft model
  // runs on device "cpu" only and is refused at the decode instance's executor.
  CHECK(parse_ok(with + "[speculative]\nmethod = \"suffix\"\n").speculative.method ==
        SpeculativeMethod::suffix);
  CHECK(parse_ok(with + "[speculative]\nmethod = \"ngram\"\n").speculative.method ==
        SpeculativeMethod::ngram);
  auto eagle = only_issue(with + "[speculative]\nmethod = \"eagle3\"\ndraft_model = \"d\"\n");
  CHECK(eagle.message.find("EAGLE-3 runs on \"cpu\"") != std::string::npos);
}

// A prefill instance on its own rbln executor with four devices (appended to base_manifest).
const std::string kPrefillOnFourRblnDevices = R"(
  [[node.instance]]
  role = "prefill"
  name = "pre"
  executor = "px"

  [[node.instance]]
  role = "executor"
  name = "px"
  device = "rbln"
  devices = [1, 2, 3, 4]
)";

TEST_CASE("rbln: [rbln] prefill_artifacts serves prefill executors; unused, it is refused") {
  std::string rbln = replace(base_manifest, "device = \"cpu\"", "device = \"rbln\"");
  // Only a decode instance runs on rbln: the key would do nothing, and says so where it is.
  std::string unused =
      rbln + "[rbln]\nartifacts = \"compiled/d\"\nprefill_artifacts = \"compiled/pp4\"\n";
  auto issue = only_issue(unused);
  CHECK(issue.key == "rbln.prefill_artifacts");
  CHECK(issue.line == line_of(unused, "prefill_artifacts"));
  CHECK(issue.message.find("no prefill instance runs on an executor with device \"rbln\"") == 0);

  // A prefill instance on its own rbln executor with four devices: prefill_artifacts alone
  // covers it, the decode executor still needs artifacts or compiler.
  std::string pd = rbln + kPrefillOnFourRblnDevices;
  auto decode_needs = only_issue(pd + "[rbln]\nprefill_artifacts = \"compiled/pp4\"\n");
  CHECK(decode_needs.key == "node[0].instance[3].device");
  CHECK(decode_needs.message.find("executor 'ex' has device \"rbln\"") == 0);
  Manifest m = parse_ok(pd + "[rbln]\ncompiler = \"c\"\nprefill_artifacts = \"compiled/pp4\"\n");
  CHECK(m.rbln.prefill_artifacts == "/etc/tandem/compiled/pp4");
  // The prefill executor uses the directory, not the cache (actors/executor: device_spec).
  CHECK(m.rbln.compiler == "c");
}

TEST_CASE(
    "rbln: [rbln] prefill_pipeline_stages, prefill_stage_layers and decode_data_parallel split "
    "an executor's devices for the compile cache; what does not fit is refused where it is") {
  std::string rbln = replace(base_manifest, "device = \"cpu\"", "device = \"rbln\"");
  // The prefill instance on its own rbln executor with four devices; decode on one.
  std::string pd = rbln + kPrefillOnFourRblnDevices;
  Manifest plain = parse_ok(pd + "[rbln]\ncompiler = \"c\"\n");
  CHECK(plain.rbln.prefill_pipeline_stages == 1);
  CHECK(plain.rbln.decode_data_parallel == 1);
  CHECK(plain.rbln.prefill_stage_layers.empty());
  Manifest staged = parse_ok(pd +
                             "[rbln]\ncompiler = \"c\"\nprefill_pipeline_stages = 2\n"
                             "prefill_stage_layers = [10, 22]\n");
  CHECK(staged.rbln.prefill_pipeline_stages == 2);
  CHECK(staged.rbln.prefill_stage_layers == std::vector<uint32_t>{10, 22});

  // Four devices do not split into three stages: refused at the executor's devices.
  std::string three = pd + "[rbln]\ncompiler = \"c\"\nprefill_pipeline_stages = 3\n";
  auto uneven = only_issue(three);
  CHECK(uneven.key == "node[0].instance[5].devices");
  CHECK(uneven.line == line_of(three, "devices = [1, 2, 3, 4]"));
  CHECK(uneven.message ==
        "executor 'px' has 4 devices, which do not split into [rbln] prefill_pipeline_stages = 3 "
        "pipeline stages of equal tensor-parallel width (list a multiple of 3 devices)");
  // The decode executor's one device into two ranks: the same, naming decode_data_parallel.
  auto ranks = only_issue(pd + "[rbln]\ncompiler = \"c\"\ndecode_data_parallel = 2\n");
  CHECK(ranks.key == "node[0].instance[3].devices");
  CHECK(ranks.message.find("executor 'ex' has 1 device, which do not split into [rbln] "
                           "decode_data_parallel = 2 data-parallel ranks") == 0);
  // Layers per stage: one count per stage.
  std::string counts = pd +
                       "[rbln]\ncompiler = \"c\"\nprefill_pipeline_stages = 2\n"
                       "prefill_stage_layers = [32]\n";
  auto listed = only_issue(counts);
  CHECK(listed.key == "rbln.prefill_stage_layers");
  CHECK(listed.line == line_of(counts, "prefill_stage_layers"));
  CHECK(listed.message == "lists 1 stages, prefill_pipeline_stages is 2");
  CHECK(only_issue(pd + "[rbln]\ncompiler = \"c\"\nprefill_stage_layers = [0, \"x\"]\n")
            .message.find("expected a non-empty array of layer counts") == 0);
  // They shape the compile cache: with a compiled directory they would do nothing.
  auto no_cache = only_issue(pd +
                             "[rbln]\nartifacts = \"a\"\ndecode_data_parallel = 1\n"
                             "prefill_pipeline_stages = 2\n");
  CHECK(no_cache.key == "rbln.prefill_pipeline_stages");
  CHECK(no_cache.message.find("says what the compile cache compiles, and [rbln] compiler is not "
                              "set") == 0);
  auto beside = only_issue(pd +
                           "[rbln]\ncompiler = \"c\"\nprefill_artifacts = \"pp\"\n"
                           "prefill_pipeline_stages = 2\n");
  CHECK(beside.key == "rbln.prefill_pipeline_stages");
  CHECK(beside.message.find("the prefill executors use prefill_artifacts") == 0);
  // No prefill instance on rbln: stages would be unused.
  std::string decode_only = rbln + "[rbln]\ncompiler = \"c\"\nprefill_pipeline_stages = 2\n";
  auto unused = only_issue(decode_only);
  CHECK(unused.key == "rbln.prefill_pipeline_stages");
  CHECK(unused.line == line_of(decode_only, "prefill_pipeline_stages"));
  CHECK(unused.message.find("no prefill instance runs on an executor with device \"rbln\"") == 0);
}
