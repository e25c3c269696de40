// The node actor's subscriptions: a subscriber that arrives after a peer came up is told
// that the peer is up (the router once kept a decode node excluded for good because its
// `subscribe` reached the node actor after the peer's first heartbeat).
#include <doctest.h>

#include <caf/all.hpp>

#include <chrono>
#include <string>
#include <variant>
#include <vector>

#include "runtime/node/node_actor.hpp"
#include "runtime/node/node_metrics.hpp"
#include "tests/support/local_bridge.hpp"
#include "tests/support/process.hpp"

using namespace tandem;
using namespace std::chrono_literals;

namespace {

const std::string two_nodes = R"([cluster]
name = "subs"
[membership]
heartbeat_interval_ms = 60000
[model]
name = "tiny"
path = "models/tiny"
[[node]]
name = "a"
host = "127.0.0.1"
fabric_port = FABRIC_PORT
admin_port = 17200
http_port = 8000
  [[node.instance]]
  role = "gateway"
  name = "gw"
  [[node.instance]]
  role = "router"
  name = "rt"
[[node]]
name = "b"
host = "127.0.0.1"
fabric_port = 17101
admin_port = 17201
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

// Node b's heartbeat, delivered to node a's node actor through a's bridge (local delivery:
// the bridge has no fabric; the envelope names b as its source).
void heartbeat_from_b(runtime::Bridge& bridge, uint64_t sequence) {
  Status sent = bridge.send({"b", "node", ""}, {"a", "node", ""}, 0,
                            [&](wire::Envelope::Builder b) {
                              auto hb = b.getBody().initHeartbeat();
                              hb.setIncarnation(42);
                              hb.setSequence(sequence);
                              hb.setUptimeMs(1000);
                            });
  REQUIRE_MESSAGE(sent.ok(), sent.error().describe());
}

}  // namespace

TEST_CASE("node actor: a late subscriber learns the peers that are already up") {
  std::string text = two_nodes;
  text.replace(text.find("FABRIC_PORT"), 11, std::to_string(testing::free_port()));
  config::Manifest manifest = testing::parse_manifest_or_fail(text);
  caf::actor_system_config cfg;
  caf::actor_system system{testing::tandem_actor_config(cfg)};
  testing::LocalBridge local(manifest, "a");  // node b never answers: its hellos go nowhere
  runtime::Bridge& bridge = *local.bridge;
  runtime::NodeActorDeps deps{&manifest, &bridge, local.log, [] { return std::string(); },
                              nullptr};
  caf::actor node = runtime::spawn_node_actor(system, std::move(deps));
  // However the test ends, the node actor exits (or ~actor_system waits for it forever).
  struct Stop {
    caf::actor node;
    ~Stop() { caf::anon_send_exit(node, caf::exit_reason::user_shutdown); }
  } stop{node};
  bridge.set_ready();

  // An early subscriber sees b come up as it happens.
  caf::scoped_actor early{system};
  early->send(node, runtime::atoms::subscribe::value, caf::actor_cast<caf::actor>(early));
  heartbeat_from_b(bridge, 1);
  bool early_saw_up = false;
  early->receive([&](const runtime::MembershipEvent& e) {
    early_saw_up = e.kind == runtime::MembershipEvent::Kind::up && e.node == "b";
  }, caf::after(5s) >> [] {});
  CHECK(early_saw_up);

  // A subscriber that arrives after b is up is told at once, not at b's next change.
  caf::scoped_actor late{system};
  late->send(node, runtime::atoms::subscribe::value, caf::actor_cast<caf::actor>(late));
  bool late_saw_up = false;
  late->receive([&](const runtime::MembershipEvent& e) {
    late_saw_up = e.kind == runtime::MembershipEvent::Kind::up && e.node == "b";
  }, caf::after(5s) >> [] {});
  CHECK(late_saw_up);

  // Subscribing twice is harmless: no second replay, and b's heartbeats cause no events.
  late->send(node, runtime::atoms::subscribe::value, caf::actor_cast<caf::actor>(late));
  heartbeat_from_b(bridge, 2);
  bool extra = false;
  late->receive([&](const runtime::MembershipEvent&) { extra = true; },
                caf::after(300ms) >> [] {});
  CHECK_FALSE(extra);
}

TEST_CASE("read_process_memory: VmRSS and VmHWM in bytes; the peak follows touched memory") {
  auto before = runtime::read_process_memory();
  REQUIRE(before.has_value());
  CHECK(before->rss_bytes > 0);
  CHECK(before->rss_bytes <= before->peak_rss_bytes);
  // Touch 64 MiB more than the peak so far: the peak must grow by most of it.
  size_t bytes = (64u << 20) + before->peak_rss_bytes;
  std::vector<char> block(bytes, 1);
  auto after = runtime::read_process_memory();
  REQUIRE(after.has_value());
  CHECK(after->peak_rss_bytes >= before->peak_rss_bytes + (56u << 20));
  CHECK(block[bytes / 2] == 1);
}
