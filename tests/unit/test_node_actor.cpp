// The node actor's subscriptions: a subscriber that arrives after a peer came up is told
// that the peer is up (the router once kept a decode node excluded for good because its
// `subscribe` reached the node actor after the peer's first heartbeat). And the admin
// commands it hands to its local kv-offload actors (LocalAdmin): the answers merged.
#include <doctest.h>

#include <caf/all.hpp>

#include <chrono>
#include <string>
#include <variant>
#include <vector>

#include "runtime/node/node_actor.hpp"
#include "runtime/node/node_metrics.hpp"
#include "runtime/node/spawn.hpp"
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

// Node a of two_nodes in this process: its actor system, bridge and node actor (node b never
// answers: its hellos go nowhere). Every actor in `actors` (the node actor first) is stopped
// at the end, or ~actor_system waits for it forever.
struct NodeA {
  NodeA()
      : manifest(manifest_on_free_port()),
        system(testing::tandem_actor_config(cfg)),
        local(manifest, "a"),
        bridge(*local.bridge) {
    runtime::NodeActorDeps deps{&manifest, &bridge, local.log, [] { return std::string(); },
                                nullptr};
    actors.push_back(runtime::spawn_node_actor(system, std::move(deps)));
  }
  ~NodeA() {
    for (auto& a : actors) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }
  static config::Manifest manifest_on_free_port() {
    std::string text = two_nodes;
    text.replace(text.find("FABRIC_PORT"), 11, std::to_string(testing::free_port()));
    return testing::parse_manifest_or_fail(text);
  }
  caf::actor node() const { return actors.front(); }

  config::Manifest manifest;
  caf::actor_system_config cfg;
  caf::actor_system system;
  testing::LocalBridge local;  // after the system: destroyed (its fabric stopped) first
  runtime::Bridge& bridge;
  std::vector<caf::actor> actors;
};

struct AdminReply {
  bool ok = false;
  std::string text;
  std::vector<std::vector<std::string>> rows;
};

// Sends `command` to node a's node actor as the admin client `asker` (registered on the
// bridge as a/shell/test) and waits for its AdminReply.
AdminReply admin(runtime::Bridge& bridge, caf::scoped_actor& asker, const std::string& command) {
  Status sent = bridge.send(
      {"a", "shell", "test"}, {"a", "node", ""}, 7,
      [&](wire::Envelope::Builder b) { b.getBody().initAdminRequest().setCommand(command); });
  REQUIRE_MESSAGE(sent.ok(), sent.error().describe());
  AdminReply out;
  bool got = false;
  asker->receive(
      [&](const runtime::InboundFrame& in) {
        auto body = in.frame->envelope().getBody();
        REQUIRE(body.which() == wire::Envelope::Body::ADMIN_REPLY);
        auto reply = body.getAdminReply();
        out.ok = reply.getOk();
        out.text = reply.getText();
        for (auto row : reply.getRows()) {
          out.rows.emplace_back();
          for (auto cell : row) out.rows.back().emplace_back(cell);
        }
        got = true;
      },
      caf::after(10s) >> [] {});
  REQUIRE(got);
  return out;
}

// A stand-in kv-offload instance: answers LocalAdmin with a header and one row naming it.
caf::behavior fake_kv_offload(caf::event_based_actor*, std::string name, bool ok) {
  return {[name, ok](const runtime::LocalAdmin& cmd) {
    return runtime::AdminResult{
        ok, name + " did " + cmd.command + "\n", {{"instance", "command"}, {name, cmd.command}}};
  }};
}

}  // namespace

TEST_CASE("node actor: a late subscriber learns the peers that are already up") {
  NodeA a;
  caf::actor node = a.node();
  caf::actor_system& system = a.system;
  runtime::Bridge& bridge = a.bridge;
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

TEST_CASE("node actor: a heartbeat speaks for its own node's instances only, its text is "
          "made safe, and one from a node not in the manifest is ignored") {
  NodeA a;
  a.bridge.set_ready();
  caf::scoped_actor sub{a.system};
  sub->send(a.node(), runtime::atoms::subscribe::value, caf::actor_cast<caf::actor>(sub));
  // `from` sends a heartbeat carrying loads for b's decode, a's gateway (not b's to report),
  // b's decode again with a not-ready reason that would forge a log line, and FROM/decode/dec.
  auto heartbeat = [&](const std::string& from, uint64_t incarnation) {
    Status sent = a.bridge.send({from, "node", ""}, {"a", "node", ""}, 0,
                                [&](wire::Envelope::Builder b) {
      auto hb = b.getBody().initHeartbeat();
      hb.setIncarnation(incarnation);
      hb.setSequence(1);
      hb.setUptimeMs(1000);
      auto loads = hb.initLoad(4);
      loads[0].setInstance("b/decode/dec");
      loads[0].setRequestsRunning(3);
      loads[1].setInstance("a/gateway/gw");
      loads[1].setRequestsRunning(7);
      loads[2].setInstance("b/decode/dec");
      loads[2].setReady(false);
      loads[2].setNotReadyReason("stalled\n[error] node a: forged line\r\x1b[2Kgone");
      loads[3].setInstance(from + "/decode/dec");  // its own name: b's decode, or x's
    });
    REQUIRE_MESSAGE(sent.ok(), sent.error().describe());
  };
  struct Seen {
    std::vector<runtime::InstanceLoadReport> loads;
    std::vector<runtime::MembershipEvent> events;
  };
  auto collect = [&](std::chrono::milliseconds quiet) {
    Seen seen;
    bool more = true;
    while (more) {
      sub->receive([&](const runtime::InstanceLoadReport& r) { seen.loads.push_back(r); },
                   [&](const runtime::MembershipEvent& e) { seen.events.push_back(e); },
                   caf::after(quiet) >> [&] { more = false; });
    }
    return seen;
  };

  // A node the manifest does not name: nothing of it reaches a subscriber.
  heartbeat("x", 5);
  Seen stranger = collect(300ms);
  CHECK(stranger.loads.empty());
  CHECK(stranger.events.empty());

  heartbeat("b", 42);
  Seen seen = collect(500ms);
  REQUIRE(seen.loads.size() == 3);  // a/gateway/gw is not b's: dropped
  for (const auto& r : seen.loads) CHECK(r.instance == "b/decode/dec");
  CHECK(seen.loads[0].running == 3);
  CHECK_FALSE(seen.loads[1].ready);
  const std::string& why = seen.loads[1].not_ready_reason;
  CHECK(why.find("stalled") == 0);
  CHECK(why.find("forged line") != std::string::npos);  // kept, but on the same line
  for (char c : why) {
    auto u = static_cast<unsigned char>(c);
    CHECK_MESSAGE((u >= 0x20 && u < 0x7f), why);
  }
  REQUIRE(seen.events.size() == 1);
  CHECK(seen.events[0].kind == runtime::MembershipEvent::Kind::up);
  CHECK(seen.events[0].node == "b");
}

TEST_CASE("node actor: a hello changes membership only when it names its own sender, a node") {
  NodeA a;
  a.bridge.set_ready();
  caf::scoped_actor sub{a.system};
  sub->send(a.node(), runtime::atoms::subscribe::value, caf::actor_cast<caf::actor>(sub));
  auto hello = [&](const std::string& named, bool client) {
    Status sent = a.bridge.send({"b", "node", ""}, {"a", "node", ""}, 0,
                                [&](wire::Envelope::Builder b) {
      auto h = b.getBody().initHello();
      h.setNodeName(named);
      h.setClusterName("subs");
      h.setProtocolVersion(1);
      h.setIncarnation(7);
      h.setIsClient(client);
    });
    REQUIRE_MESSAGE(sent.ok(), sent.error().describe());
  };
  auto events = [&](std::chrono::milliseconds quiet) {
    std::vector<runtime::MembershipEvent> out;
    bool more = true;
    while (more) {
      sub->receive([&](const runtime::MembershipEvent& e) { out.push_back(e); },
                   [](const runtime::InstanceLoadReport&) {},
                   caf::after(quiet) >> [&] { more = false; });
    }
    return out;
  };
  hello("a", false);  // b's session speaking for another node
  hello("b", true);   // b calling itself a client
  CHECK(events(300ms).empty());
  hello("b", false);
  auto seen = events(500ms);
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].kind == runtime::MembershipEvent::Kind::up);
  CHECK(seen[0].node == "b");
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

TEST_CASE("node actor: tier2 commands go to every local kv-offload; the answers are merged") {
  NodeA a;
  caf::actor_system& system = a.system;
  runtime::Bridge& bridge = a.bridge;
  std::vector<caf::actor>& fakes = a.actors;  // [0] is the node actor
  caf::scoped_actor asker{system};
  bridge.register_actor({"a", "shell", "test"}, caf::actor_cast<caf::actor>(asker));
  bridge.set_ready();

  AdminReply none = admin(bridge, asker, "tier2");  // no kv-offload registered yet
  CHECK_FALSE(none.ok);
  CHECK(none.text == "node a runs no kv-offload instance\n");

  fakes.push_back(system.spawn(fake_kv_offload, "k2", true));
  fakes.push_back(system.spawn(fake_kv_offload, "k1", true));
  bridge.register_actor({"a", "kv-offload", "k2"}, fakes[1]);
  bridge.register_actor({"a", "kv-offload", "k1"}, fakes[2]);
  AdminReply both = admin(bridge, asker, "tier2-verify");
  CHECK(both.ok);
  CHECK(both.text == "k1 did tier2-verify\nk2 did tier2-verify\n");  // in name order
  REQUIRE(both.rows.size() == 3);                                    // one header, a row each
  CHECK(both.rows[0] == std::vector<std::string>{"instance", "command"});
  CHECK(both.rows[1] == std::vector<std::string>{"k1", "tier2-verify"});
  CHECK(both.rows[2] == std::vector<std::string>{"k2", "tier2-verify"});

  // One refuses, one does not understand: the merged answer is an error naming both.
  bridge.unregister_actor({"a", "kv-offload", "k1"});
  fakes.push_back(system.spawn(fake_kv_offload, "k1", false));
  bridge.register_actor({"a", "kv-offload", "k1"}, fakes.back());
  fakes.push_back(runtime::spawn_fn(
      system, [](caf::event_based_actor*) -> caf::behavior { return {[](int) {}}; }));
  bridge.register_actor({"a", "kv-offload", "k3"}, fakes.back());
  AdminReply mixed = admin(bridge, asker, "tier2");
  CHECK_FALSE(mixed.ok);
  CHECK(mixed.text.find("k1 did tier2\nk2 did tier2\na/kv-offload/k3: no answer: ") == 0);
  CHECK(mixed.rows.size() == 3);
}
