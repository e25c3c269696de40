#include "runtime/node/node_actor.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "runtime/node/caf_types.hpp"
#include "runtime/node/membership.hpp"
#include "runtime/node/spawn.hpp"
#include "runtime/node/supervisor.hpp"

namespace tandem::runtime {

using messages::ActorName;

std::string format_age(std::chrono::milliseconds age) {
  int64_t ms = age.count();
  char buf[32];
  if (ms < 1000) {
    std::snprintf(buf, sizeof(buf), "%lldms", static_cast<long long>(ms));
  } else if (ms < 60'000) {
    std::snprintf(buf, sizeof(buf), "%.1fs", ms / 1000.0);
  } else if (ms < 3'600'000) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(ms / 60'000),
                  static_cast<long long>(ms / 1000 % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(ms / 3'600'000),
                  static_cast<long long>(ms / 60'000 % 60));
  }
  return buf;
}

void answer_ping(Bridge* bridge, const ActorName& self_name, wire::Envelope::Reader envelope) {
  auto ping = envelope.getBody().getPing();
  (void)bridge->send(self_name, messages::get_name(envelope.getSource()),
                     envelope.getCorrelationId(), [&](wire::Envelope::Builder b) {
                       auto pong = b.getBody().initPong();
                       pong.setNonce(ping.getNonce());
                       pong.setSentMonoNs(ping.getSentMonoNs());
                     });
}

namespace {

std::vector<std::string> peer_names(const config::Manifest& manifest, const std::string& self) {
  std::vector<std::string> out;
  for (const auto& node : manifest.nodes) {
    if (node.name != self) out.push_back(node.name);
  }
  return out;
}

struct NodeState {
  NodeActorDeps deps;
  std::unique_ptr<Membership> membership;
  std::unique_ptr<Diagnostics> diagnostics;
  std::set<caf::actor> subscribers;
  std::map<std::string, InstanceLoadReport> local_loads;  // <= instances on this node
  // Local prefill/decode instances ("node/role/instance") being drained: every report of
  // theirs this node passes on says so. A subset of the manifest's instances of this node.
  std::set<std::string> draining;
  Clock::time_point started;
  uint64_t heartbeat_sequence = 0;
  size_t forwards_pending = 0;  // forwarded admin commands not yet answered
  static constexpr size_t subscribers_max = 4096;
  static constexpr size_t forwards_max = 64;
  static inline const char* name = "tandem.node";
};

using NodeActor = caf::stateful_actor<NodeState>;

ActorName self_name(const NodeState& st) { return {st.deps.bridge->node(), "node", ""}; }

std::chrono::milliseconds uptime(const NodeState& st) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - st.started);
}

void publish(NodeActor* self, const std::vector<MembershipEvent>& events) {
  auto& st = self->state;
  for (const auto& event : events) {
    const char* what = event.kind == MembershipEvent::Kind::down ? "down"
                       : event.kind == MembershipEvent::Kind::up ? "up"
                                                                 : "restarted";
    st.deps.log->info("peer {} is {}", event.node, what);
    // A peer that went down or restarted gets a fresh connection next time.
    if (event.kind != MembershipEvent::Kind::up) st.deps.bridge->reset_peer(event.node);
    for (const auto& sub : st.subscribers) self->send(sub, event);
  }
  if (!events.empty() && st.deps.on_peers_changed) {
    st.deps.on_peers_changed(static_cast<int64_t>(st.membership->up_count()),
                             static_cast<int64_t>(st.membership->peers().size()));
  }
}

void send_hello(NodeActor* self, const std::string& peer) {
  auto& st = self->state;
  (void)st.deps.bridge->send(self_name(st), {peer, "node", ""}, 0, [&](wire::Envelope::Builder b) {
    auto hello = b.getBody().initHello();
    hello.setProtocolVersion(st.deps.manifest->cluster.protocol_version);
    hello.setNodeName(st.deps.bridge->node());
    hello.setClusterName(st.deps.manifest->cluster.name);
    hello.setFabricAddress(st.deps.bridge->address());
    hello.setIncarnation(st.deps.bridge->incarnation());
    hello.setIsClient(false);
  });
}

void heartbeat_tick(NodeActor* self) {
  auto& st = self->state;
  ++st.heartbeat_sequence;
  for (const auto& [peer, view] : st.membership->peers()) {
    // Peers never heard from get hellos; known ones get heartbeats.
    if (view.state == PeerState::unknown) {
      send_hello(self, peer);
      continue;
    }
    (void)st.deps.bridge->send(self_name(st), {peer, "node", ""}, 0,
                               [&](wire::Envelope::Builder b) {
                                 auto hb = b.getBody().initHeartbeat();
                                 hb.setIncarnation(st.deps.bridge->incarnation());
                                 hb.setSequence(st.heartbeat_sequence);
                                 hb.setUptimeMs(uptime(st).count());
                                 auto loads = hb.initLoad(
                                     static_cast<unsigned>(st.local_loads.size()));
                                 unsigned i = 0;
                                 for (const auto& [name, r] : st.local_loads) {
                                   auto l = loads[i++];
                                   l.setInstance(name);
                                   l.setRequestsWaiting(r.waiting);
                                   l.setRequestsRunning(r.running);
                                   l.setKvBlocksUsed(static_cast<uint32_t>(r.kv_blocks_used));
                                   l.setKvBlocksTotal(static_cast<uint32_t>(r.kv_blocks_total));
                                   l.setReady(r.ready);
                                   l.setNotReadyReason(r.not_ready_reason);
                                   l.setDraining(st.draining.count(name) > 0);
                                   l.setTier2LocalReads(r.tier2_local_reads);
                                   l.setTier2RemoteReads(r.tier2_remote_reads);
                                   if (r.pending_tokens) {
                                     l.setPendingTokens(*r.pending_tokens);
                                     l.setPendingTokensKnown(true);
                                   }
                                   if (r.kv_blocks_free) {
                                     l.setKvBlocksFree(static_cast<uint32_t>(*r.kv_blocks_free));
                                     l.setKvBlocksFreeKnown(true);
                                   }
                                 }
                               });
  }
  publish(self, st.membership->tick(Clock::now()));
}

// A local report as this node passes it on: with its drain state.
InstanceLoadReport stamped(const NodeState& st, InstanceLoadReport report) {
  report.draining = st.draining.count(report.instance) > 0;
  return report;
}

// This node's prefill and decode instances ("node/role/instance"), in manifest order.
std::vector<std::string> serving_instances(const NodeState& st) {
  std::vector<std::string> out;
  const config::Node* node = st.deps.manifest->find_node(st.deps.bridge->node());
  RT_ASSERT(node != nullptr, st.deps.bridge->node());
  for (const auto& inst : node->instances) {
    if (inst.role != config::Role::prefill && inst.role != config::Role::decode) continue;
    out.push_back(
        ActorName{node->name, std::string(config::to_string(inst.role)), inst.name}.to_string());
  }
  return out;
}

// Requests the instance holds by its last report (waiting + running); 0 before any report.
uint64_t held_count(const NodeState& st, const std::string& instance) {
  auto it = st.local_loads.find(instance);
  return it == st.local_loads.end() ? 0 : uint64_t{it->second.waiting} + it->second.running;
}

// Drains (or undrains) `instances`; subscribers (the local routers) hear it at once, peers
// with the heartbeat sent right away.
void set_draining(NodeActor* self, const std::vector<std::string>& instances, bool on) {
  auto& st = self->state;
  bool changed = false;
  for (const auto& name : instances) {
    bool was = st.draining.count(name) > 0;
    if (was == on) continue;
    changed = true;
    if (on) {
      st.draining.insert(name);
    } else {
      st.draining.erase(name);
    }
    st.deps.log->info("{} {}", on ? "draining" : "undrained", name);
    auto it = st.local_loads.find(name);
    if (it == st.local_loads.end()) continue;
    for (const auto& sub : st.subscribers) self->send(sub, stamped(st, it->second));
  }
  RT_ASSERT(st.draining.size() <= serving_instances(st).size(), st.draining.size());
  if (changed) heartbeat_tick(self);
}

// `instances`: what this node serves (prefill and decode), with drain state and load.
std::vector<std::vector<std::string>> instances_rows(const NodeState& st) {
  std::vector<std::vector<std::string>> rows = {
      {"instance", "state", "waiting", "running", "kv blocks used", "kv blocks total"}};
  for (const auto& name : serving_instances(st)) {
    auto it = st.local_loads.find(name);
    std::string state = st.draining.count(name) ? "draining" : "serving";
    if (it == st.local_loads.end()) {
      rows.push_back({name, state == "draining" ? state : "starting", "-", "-", "-", "-"});
      continue;
    }
    const InstanceLoadReport& r = it->second;
    if (!r.ready) state = "not ready: " + r.not_ready_reason;
    if (!r.ready && st.draining.count(name)) state = "draining, " + state;
    rows.push_back({name, state, std::to_string(r.waiting), std::to_string(r.running),
                    std::to_string(r.kv_blocks_used), std::to_string(r.kv_blocks_total)});
  }
  return rows;
}

// `drain [INSTANCE]` / `undrain [INSTANCE]`: every local prefill/decode instance, or the one
// named (its instance name or full "node/role/instance"); answers `instances`.
AdminResult drain_command(NodeActor* self, bool on, const std::vector<std::string>& args) {
  auto& st = self->state;
  std::vector<std::string> all = serving_instances(st);
  std::vector<std::string> chosen;
  if (args.size() > 1) return AdminResult{false, "usage: drain|undrain [INSTANCE]\n", {}};
  if (args.empty()) {
    chosen = all;
  } else {
    for (const auto& name : all) {
      auto parsed = ActorName::parse(name);
      if (name == args[0] || (parsed.ok() && parsed->instance == args[0])) chosen.push_back(name);
    }
  }
  if (chosen.empty()) {
    std::string known;
    for (const auto& name : all) known += (known.empty() ? "" : ", ") + name;
    return AdminResult{
        false,
        args.empty() ? "node " + st.deps.bridge->node() + " runs no prefill or decode instance\n"
                     : "node " + st.deps.bridge->node() + " has no prefill or decode instance '" +
                           args[0] + "' (it has: " + (known.empty() ? "none" : known) + ")\n",
        {}};
  }
  set_draining(self, chosen, on);
  AdminResult result;
  result.rows = instances_rows(st);
  return result;
}

std::vector<std::vector<std::string>> nodes_rows(const NodeState& st) {
  std::vector<std::vector<std::string>> rows = {
      {"node", "address", "state", "uptime", "last heartbeat"}};
  auto now = Clock::now();
  for (const auto& node : st.deps.manifest->nodes) {
    std::string address = node.host + ":" + std::to_string(node.fabric_port);
    if (node.name == st.deps.bridge->node()) {
      rows.push_back({node.name, address, "up (this node)", format_age(uptime(st)), "-"});
      continue;
    }
    const PeerView& view = st.membership->peers().at(node.name);
    std::string up = "-", age = "never";
    if (view.last_heard) {
      auto since = std::chrono::duration_cast<std::chrono::milliseconds>(now - *view.last_heard);
      age = format_age(since) + " ago";
      if (view.state == PeerState::up) up = format_age(view.uptime_at_last_heard + since);
    }
    rows.push_back({node.name, address, std::string(to_string(view.state)), up, age});
  }
  return rows;
}

std::string render_rows(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()));
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) {
      out += row[i];
      if (i + 1 < row.size()) out += std::string(width[i] - row[i].size() + 2, ' ');
    }
    out += "\n";
  }
  return out;
}

void reply_admin(NodeState& st, const AdminCaller& caller, const AdminResult& result) {
  (void)st.deps.bridge->send(self_name(st), caller.who, caller.correlation,
                             [&](wire::Envelope::Builder b) {
                               auto reply = b.getBody().initAdminReply();
                               reply.setOk(result.ok);
                               reply.setText(result.text);
                               auto list = reply.initRows(result.rows.size());
                               for (size_t r = 0; r < result.rows.size(); ++r) {
                                 auto cells = list.init(r, result.rows[r].size());
                                 for (size_t c = 0; c < result.rows[r].size(); ++c)
                                   cells.set(c, result.rows[r][c]);
                               }
                             });
}

// TEST HOOK `debug-crash ACTOR`: only when the node runs with test hooks (NodeOptions).
void debug_crash(NodeActor* self, const AdminCaller& caller, const std::vector<std::string>& args) {
  auto& st = self->state;
  if (!st.deps.test_hooks_supervisor || args.size() != 1) {
    std::string why = !st.deps.test_hooks_supervisor
                          ? "debug-crash is a test hook; this node runs without --test-hooks\n"
                          : "usage: debug-crash ACTOR (e.g. node/router/router)\n";
    return reply_admin(st, caller, AdminResult{false, why, {}});
  }
  self->request(st.deps.test_hooks_supervisor, std::chrono::seconds(2), DebugCrash{args[0]})
      .then([self, caller](const std::string& text) {
        bool ok = text.rfind("crashed ", 0) == 0;
        reply_admin(self->state, caller, AdminResult{ok, text, {}});
      });
}

// TEST HOOK `debug-stall-executor EXECUTOR MS`: the local executor's next pass answers MS
// later (up to 10 minutes), as a hung device step would.
AdminResult debug_stall_executor(NodeActor* self, const std::vector<std::string>& args) {
  auto& st = self->state;
  if (!st.deps.test_hooks_supervisor) {
    return {
        false, "debug-stall-executor is a test hook; this node runs without --test-hooks\n", {}};
  }
  bool number = args.size() == 2 && !args[1].empty() && args[1].size() <= 6 &&
                args[1].find_first_not_of("0123456789") == std::string::npos;
  if (!number) return {false, "usage: debug-stall-executor EXECUTOR MS (0 .. 600000)\n", {}};
  auto ms = static_cast<uint32_t>(std::stoul(args[1]));
  if (ms > 600000) return {false, "usage: debug-stall-executor EXECUTOR MS (0 .. 600000)\n", {}};
  for (const auto& [name, actor] : st.deps.bridge->local_actors_with_role("executor")) {
    if (name.instance != args[0]) continue;
    self->send(actor, atoms::stall::value, ms);
    st.deps.log->warn("TEST HOOK debug-stall-executor: {}'s next pass answers {} ms late",
                      name.to_string(), ms);
    return {true, name.to_string() + ": the next pass answers " + args[1] + " ms late\n", {}};
  }
  return {false, "node " + st.deps.bridge->node() + " has no executor '" + args[0] + "'\n", {}};
}

// TEST HOOK `debug-drop-kv-events N [tier2|device]`: the next N numbered KvEvents frames of
// that tier (default tier2) this node sends are lost (Bridge::drop_next_kv_events).
void debug_drop_kv_events(NodeActor* self, const AdminCaller& caller,
                          const std::vector<std::string>& args) {
  auto& st = self->state;
  uint32_t frames = 0;
  bool number = (args.size() == 1 || args.size() == 2) && !args[0].empty() &&
                args[0].size() <= 6 && args[0].find_first_not_of("0123456789") == std::string::npos;
  bool tier_ok = args.size() < 2 || args[1] == "tier2" || args[1] == "device";
  bool device = args.size() == 2 && args[1] == "device";
  if (number) frames = static_cast<uint32_t>(std::stoul(args[0]));
  if (!st.deps.test_hooks_supervisor || !number || !tier_ok) {
    std::string why = !st.deps.test_hooks_supervisor
                          ? "debug-drop-kv-events is a test hook; this node runs without "
                            "--test-hooks\n"
                          : "usage: debug-drop-kv-events N [tier2|device] (0 .. 999999 frames)\n";
    return reply_admin(st, caller, AdminResult{false, why, {}});
  }
  const char* tier = device ? "device-cache" : "tier-2";
  st.deps.bridge->drop_next_kv_events(frames, device ? 1 : 2);
  st.deps.log->warn("TEST HOOK debug-drop-kv-events: the next {} {} KV event frames are lost",
                    frames, tier);
  reply_admin(st, caller,
              AdminResult{true, "the next " + std::to_string(frames) + " numbered " + tier +
                                    " KV event frames this node sends are lost\n", {}});
}

// Admin commands answered by this node's actors of one role (LocalAdmin).
struct Forwarded {
  std::string_view command;
  std::string_view role;
  std::chrono::milliseconds timeout;
  // The actors answer rows only (one header, their rows): the node renders them as one table,
  // after the texts of those that failed.
  bool table = false;
};
constexpr Forwarded forwarded_commands[] = {
    {"tier2", "kv-offload", admin_forward_timeout},
    {"tier2-verify", "kv-offload", admin_disk_timeout},
    {"tier2-drop", "kv-offload", admin_disk_timeout},
    {"router-show", "router", admin_forward_timeout},
    {"router-set", "router", admin_forward_timeout},
    {"requests", "gateway", admin_forward_timeout},
    {"cancel", "gateway", admin_forward_timeout},
    {"executors", "executor", admin_forward_timeout, true},
};

// The answers to one forwarded command, merged into one reply when the last one is in: ok
// when every one is; the texts in name order; one header row, then every actor's rows.
struct Gathered {
  AdminCaller caller;
  bool table = false;  // Forwarded::table
  size_t pending = 0;
  std::vector<AdminResult> results;  // by target
};

void gathered_one(NodeActor* self, const std::shared_ptr<Gathered>& g) {
  auto& st = self->state;
  RT_ASSERT(g->pending > 0 && st.forwards_pending > 0, g->pending, st.forwards_pending);
  if (--g->pending > 0) return;
  --st.forwards_pending;
  AdminResult merged;
  for (const auto& r : g->results) {
    merged.ok = merged.ok && r.ok;
    merged.text += r.text;
    if (r.rows.empty()) continue;
    if (merged.rows.empty()) merged.rows.push_back(r.rows[0]);
    merged.rows.insert(merged.rows.end(), r.rows.begin() + 1, r.rows.end());
  }
  if (g->table) merged.text += render_rows(merged.rows);
  reply_admin(st, g->caller, merged);
}

void forward_admin(NodeActor* self, const AdminCaller& caller, const Forwarded& f,
                   const std::string& command, const std::vector<std::string>& args) {
  auto& st = self->state;
  std::string role(f.role);
  auto targets = st.deps.bridge->local_actors_with_role(role);
  if (targets.empty()) {
    std::string why = "node " + st.deps.bridge->node() + " runs no " + role + " instance\n";
    return reply_admin(st, caller, AdminResult{false, why, {}});
  }
  if (st.forwards_pending >= NodeState::forwards_max) {
    std::string why = "node " + st.deps.bridge->node() + " is answering " +
                      std::to_string(NodeState::forwards_max) +
                      " such commands already; try again\n";
    return reply_admin(st, caller, AdminResult{false, why, {}});
  }
  ++st.forwards_pending;
  auto g = std::make_shared<Gathered>(Gathered{caller, f.table, targets.size(), {}});
  g->results.resize(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    std::string name = targets[i].first.to_string();
    self->request(targets[i].second, f.timeout, LocalAdmin{command, args, f.timeout})
        .then(
            [self, g, i](AdminResult& r) {
              g->results[i] = std::move(r);
              gathered_one(self, g);
            },
            [self, g, i, name](caf::error& e) {
              g->results[i] = AdminResult{false, name + ": no answer: " + to_string(e) + "\n", {}};
              gathered_one(self, g);
            });
  }
}

// Commands that change the cluster (or read its memory): each one leaves an audit line.
bool changes_something(std::string_view command) {
  static constexpr std::string_view changing[] = {
      "drain", "undrain", "router-set", "cancel", "tier2-drop", "tier2-verify", "rma-expose",
      "rma-read", "rma-release"};
  return command.rfind("debug-", 0) == 0 ||
         std::find(std::begin(changing), std::end(changing), command) != std::end(changing);
}

// The audit line: who (the authenticated peer, its class and key), what, and (the line's
// time) when. Reads go at debug level.
void audit(NodeState& st, const PeerIdentity* who, const std::string& command,
           const std::vector<std::string>& args) {
  std::string what = command;
  for (const auto& a : args) what += " " + a;
  std::string by = who == nullptr
                       ? std::string("this node")
                       : who->name + " (" + std::string(to_string(who->peer_class)) + " at " +
                             who->address + ", " + std::string(to_string(who->key_role)) +
                             " key " + [&] {
                               char hex[9];
                               std::snprintf(hex, sizeof hex, "%08x", who->key_id);
                               return std::string(hex);
                             }() + ")";
  auto level = changes_something(command) ? spdlog::level::info : spdlog::level::debug;
  st.deps.log->log(level, "audit: {} ran: {}", sanitize_peer_text(by, 256),
                   sanitize_peer_text(what, 512));
}

void answer_admin(NodeActor* self, wire::Envelope::Reader envelope, const PeerIdentity* who) {
  auto& st = self->state;
  auto request = envelope.getBody().getAdminRequest();
  std::string command = request.getCommand();
  std::vector<std::string> args;
  for (auto arg : request.getArgs()) args.emplace_back(arg);
  audit(st, who, command, args);
  AdminCaller caller{messages::get_name(envelope.getSource()), envelope.getCorrelationId()};
  AdminResult result;
  if (command == "nodes") {
    result.rows = nodes_rows(st);
    result.text = render_rows(result.rows);
  } else if (command == "actors") {
    result.rows.push_back({"actor"});
    for (const auto& name : st.deps.bridge->local_actors()) result.rows.push_back({name.to_string()});
    result.text = render_rows(result.rows);
  } else if (command == "stats") {
    result.text = st.deps.render_metrics ? st.deps.render_metrics() : "";
  } else if (command == "instances") {
    result.rows = instances_rows(st);
    result.text = render_rows(result.rows);
  } else if (command == "drain" || command == "undrain") {
    result = drain_command(self, command == "drain", args);
    if (result.ok) result.text = render_rows(result.rows);
  } else if (command == "ping") {
    return st.diagnostics->ping(caller, args);
  } else if (command == "rma-expose") {
    return st.diagnostics->rma_expose(caller, args);
  } else if (command == "rma-read") {
    return st.diagnostics->rma_read(caller, args);
  } else if (command == "rma-release") {
    return st.diagnostics->rma_release(caller, args);
  } else if (command == "debug-crash") {
    return debug_crash(self, caller, args);
  } else if (command == "debug-stall-executor") {
    result = debug_stall_executor(self, args);
  } else if (command == "debug-drop-kv-events") {
    return debug_drop_kv_events(self, caller, args);
  } else if (auto f = std::find_if(std::begin(forwarded_commands), std::end(forwarded_commands),
                                   [&command](const Forwarded& c) { return c.command == command; });
             f != std::end(forwarded_commands)) {
    return forward_admin(self, caller, *f, command, args);
  } else {
    result = AdminResult{false, "unknown admin command '" + command + "'\n", {}};
  }
  reply_admin(st, caller, result);
}

void on_hello(NodeActor* self, wire::Envelope::Reader envelope) {
  auto& st = self->state;
  auto hello = envelope.getBody().getHello();
  ActorName source = messages::get_name(envelope.getSource());
  // The peer is who its session authenticated (the bridge checked the source is that name);
  // a hello naming anyone else, or a client calling itself a node, changes no membership.
  std::string peer = source.node;
  bool member = st.deps.manifest->find_node(peer) != nullptr;
  if (!hello.getIsClient() && member && std::string_view(hello.getNodeName().cStr()) == peer) {
    if (auto event = st.membership->heard(peer, hello.getIncarnation(), std::chrono::milliseconds(0),
                                          Clock::now())) {
      publish(self, {*event});
    }
  }
  (void)st.deps.bridge->send(self_name(st), source, envelope.getCorrelationId(),
                             [&](wire::Envelope::Builder b) {
                               auto ack = b.getBody().initHelloAck();
                               ack.setAccepted(true);
                               ack.setProtocolVersion(st.deps.manifest->cluster.protocol_version);
                               ack.setNodeName(st.deps.bridge->node());
                               ack.setIncarnation(st.deps.bridge->incarnation());
                             });
}

void on_frame(NodeActor* self, const InboundFrame& in) {
  auto& st = self->state;
  auto envelope = in.frame->envelope();
  auto body = envelope.getBody();
  std::string source_node = envelope.getSource().getNode();
  switch (body.which()) {
    case wire::Envelope::Body::HELLO:
      on_hello(self, envelope);
      return;
    case wire::Envelope::Body::HELLO_ACK: {
      auto ack = body.getHelloAck();
      if (!ack.getAccepted()) {
        st.deps.log->error("peer {} refused this node: {}", source_node,
                           sanitize_peer_text(ack.getReason().cStr(), 512));
        return;
      }
      if (auto event = st.membership->heard(source_node, ack.getIncarnation(),
                                            std::chrono::milliseconds(0), Clock::now()))
        publish(self, {*event});
      return;
    }
    case wire::Envelope::Body::HEARTBEAT: {
      auto hb = body.getHeartbeat();
      if (st.deps.manifest->find_node(source_node) == nullptr) return;  // a client's
      for (auto l : hb.getLoad()) {
        // A node reports its own instances only ("node/role/instance").
        std::string instance = l.getInstance();
        if (instance.rfind(source_node + "/", 0) != 0) continue;
        InstanceLoadReport report{instance, l.getRequestsWaiting(), l.getRequestsRunning(),
                                  l.getKvBlocksUsed(), l.getKvBlocksTotal(), l.getReady(),
                                  sanitize_peer_text(l.getNotReadyReason().cStr(), 512),
                                  l.getTier2LocalReads(), l.getTier2RemoteReads()};
        if (l.getPendingTokensKnown()) report.pending_tokens = l.getPendingTokens();
        if (l.getKvBlocksFreeKnown()) report.kv_blocks_free = l.getKvBlocksFree();
        report.draining = l.getDraining();
        for (const auto& sub : st.subscribers) self->send(sub, report);
      }
      if (auto event = st.membership->heard(source_node, hb.getIncarnation(),
                                            std::chrono::milliseconds(hb.getUptimeMs()),
                                            Clock::now()))
        publish(self, {*event});
      return;
    }
    case wire::Envelope::Body::PING:
      answer_ping(st.deps.bridge, self_name(st), envelope);
      return;
    case wire::Envelope::Body::PONG:
      st.diagnostics->on_pong(envelope.getCorrelationId());
      return;
    case wire::Envelope::Body::ADMIN_REQUEST:
      answer_admin(self, envelope, in.from.get());
      return;
    default:
      st.deps.log->warn("node actor ignores message kind {} from {}",
                        static_cast<int>(body.which()), source_node);
      return;
  }
}

caf::behavior node_behavior(NodeActor* self, NodeActorDeps deps) {
  auto& st = self->state;
  st.deps = std::move(deps);
  st.started = Clock::now();
  st.membership = std::make_unique<Membership>(
      peer_names(*st.deps.manifest, st.deps.bridge->node()),
      std::chrono::milliseconds(st.deps.manifest->membership.heartbeat_interval_ms),
      st.deps.manifest->membership.heartbeat_miss_max);
  // An error coming back from a subscriber must never take the node actor down.
  self->set_error_handler([self](caf::error& err) {
    self->state.deps.log->warn("node actor: ignored error: {}", to_string(err));
  });
  caf::actor me = caf::actor_cast<caf::actor>(self);
  st.diagnostics = std::make_unique<Diagnostics>(
      st.deps.bridge,
      [self](const AdminCaller& caller, const AdminResult& result) {
        reply_admin(self->state, caller, result);
      },
      [me](RmaReadDone done) { caf::anon_send(me, std::move(done)); });
  for (const auto& [peer, view] : st.membership->peers()) send_hello(self, peer);
  auto interval = std::chrono::milliseconds(st.deps.manifest->membership.heartbeat_interval_ms);
  self->delayed_send(self, interval, atoms::tick::value);
  return {
      [self](const InboundFrame& in) {
        // The backstop (STYLE section 8): a failure costs this message, never the node actor.
        try {
          on_frame(self, in);
        } catch (const kj::Exception& e) {  // a field we could not convert: drop the message
          self->state.deps.log->warn("dropped a message: {}", e.getDescription().cStr());
        } catch (const std::exception& e) {
          self->state.deps.log->error("node actor: handling a message failed: {}", e.what());
        } catch (...) {
          self->state.deps.log->error("node actor: handling a message failed (unknown error)");
        }
      },
      [self, interval](atoms::tick) {
        heartbeat_tick(self);
        self->state.diagnostics->expire(Clock::now());
        self->delayed_send(self, interval, atoms::tick::value);
      },
      [self](const RmaReadDone& done) { self->state.diagnostics->on_read_done(done); },
      [self](const InstanceLoadReport& report) {
        auto& st = self->state;
        if (st.local_loads.size() < 4096 || st.local_loads.count(report.instance)) {
          st.local_loads[report.instance] = report;
        }
        for (const auto& sub : st.subscribers) self->send(sub, stamped(st, report));
      },
      [self](atoms::subscribe, caf::actor subscriber) {
        // Subscribing is asynchronous: peers may have come up before this message arrived.
        // Replay them, or the subscriber (the router, say) keeps them down until they
        // restart. Subscribers treat a repeated `up` as a no-op.
        auto& st = self->state;
        if (st.subscribers.size() >= NodeState::subscribers_max) {
          st.deps.log->warn("node actor: subscriber limit {} reached; ignoring a subscription",
                            NodeState::subscribers_max);
          return;
        }
        if (!st.subscribers.insert(subscriber).second) return;
        for (const auto& event : st.membership->current()) self->send(subscriber, event);
        // And the last load of every local instance: a router restarted by the supervisor
        // can route at once instead of after the next reports (it skips unreported ones).
        for (const auto& [instance, report] : st.local_loads) {
          self->send(subscriber, stamped(st, report));
        }
      },
      [self](atoms::drain, bool on) -> uint64_t {
        auto& st = self->state;
        set_draining(self, serving_instances(st), on);
        uint64_t held = 0;
        for (const auto& name : serving_instances(st)) held += held_count(st, name);
        return held;
      },
  };
}

}  // namespace

caf::actor spawn_node_actor(caf::actor_system& system, NodeActorDeps deps) {
  RT_ASSERT(deps.manifest != nullptr && deps.bridge != nullptr);
  Bridge* bridge = deps.bridge;
  caf::actor actor = system.spawn(node_behavior, std::move(deps));
  bridge->register_actor({bridge->node(), "node", ""}, actor);
  return actor;
}

caf::actor spawn_role_actor(caf::actor_system& system, Bridge* bridge,
                            const config::Instance& instance) {
  RT_ASSERT(bridge != nullptr);
  ActorName name{bridge->node(), std::string(config::to_string(instance.role)), instance.name};
  caf::actor actor = spawn_fn(system, [bridge, name](caf::event_based_actor*) -> caf::behavior {
    return {
        [bridge, name](const InboundFrame& in) {
          auto envelope = in.frame->envelope();
          auto body = envelope.getBody();
          if (body.which() == wire::Envelope::Body::PING) {
            answer_ping(bridge, name, envelope);
          } else if (body.which() == wire::Envelope::Body::ADMIN_REQUEST) {
            ActorName to = messages::get_name(envelope.getSource());
            (void)bridge->send(name, to, envelope.getCorrelationId(),
                               [&](wire::Envelope::Builder b) {
                                 auto reply = b.getBody().initAdminReply();
                                 reply.setOk(true);
                                 reply.setText(name.to_string() + "\n");
                               });
          }
        },
    };
  });
  bridge->register_actor(name, actor);
  return actor;
}

}  // namespace tandem::runtime
