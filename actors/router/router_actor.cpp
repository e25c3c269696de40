#include "actors/router/router_actor.hpp"

#include <algorithm>
#include <map>

#include "actors/router/kv_sequence.hpp"
#include "actors/router/router_core.hpp"
#include "messages/convert.hpp"
#include "runtime/node/caf_types.hpp"
#include "runtime/node/node_actor.hpp"
#include "runtime/node/spawn.hpp"

namespace tandem::actors {
namespace {

using messages::ActorName;

// An instance is eligible (core `set_up(true)`) while its node is up AND its last load
// report said it is ready (its executor created the device). No report yet = not ready.
struct Known {
  ActorName name;
  router::InstanceRole role;
  bool node_up = false;
  bool ready = false;
  bool reported = false;  // a load report arrived (for logging the first not-ready one)
  // tandem_router_instance_eligible{instance=<router>, target=<node/role/instance>}: 1 while
  // this router may pick it (what an operator or a test waits for), 0 otherwise.
  obs::Gauge* eligible = nullptr;
  // Precise KV index ([router] kv_index = "precise"): the instance's event stream.
  std::optional<router::KvSequence> sequence;
  obs::Counter* resyncs = nullptr;     // tandem_router_kv_resyncs_total{instance, source}
  obs::Counter* gaps = nullptr;        // tandem_router_kv_event_gaps_total{instance, source}
  obs::Gauge* index_blocks = nullptr;  // tandem_router_kv_index_blocks{instance, target}
  obs::Counter* picks = nullptr;       // tandem_router_instance_picks_total{instance, target}
  bool draining = false;  // its node drains it (load reports): eligible, but not picked
};

// A node's tier 2 as a source of precise KV events: the first kv-offload instance of the node
// (the one its prefill instances read, actors/prefill). site = the node's index.
struct Tier2Source {
  ActorName name;
  uint32_t site = 0;
  bool node_up = false;
  router::KvSequence sequence;
  obs::Gauge* blocks = nullptr;     // tandem_router_tier2_blocks{instance, node}
  obs::Counter* resyncs = nullptr;  // tandem_router_kv_resyncs_total{instance, source}
  obs::Counter* gaps = nullptr;     // tandem_router_kv_event_gaps_total{instance, source}
};

struct RouterState {
  ShellContext ctx;
  config::RouterSection settings;  // the manifest's [router], as changed live (router set)
  ActorName self_name;
  std::optional<HandlerGuard> guard;  // the backstop of each message's handler
  std::unique_ptr<router::RouterCore> core;
  std::vector<Known> instances;                 // index = InstanceId.value
  std::map<std::string, uint32_t> by_name;      // "node/role/instance" -> index
  obs::Counter* picks_disaggregated = nullptr;
  obs::Counter* picks_local = nullptr;
  obs::Counter* kv_removed = nullptr;
  obs::Counter* tier2_refused = nullptr;
  obs::Counter* tier2_credited = nullptr;  // P/D picks whose prefill has tier-2 blocks to read
  obs::Counter* tier2_remote = nullptr;    // ... of which on another node's tier 2
  std::vector<Tier2Source> tier2_sources;
  std::map<std::string, size_t> source_by_name;  // "node/kv-offload/instance" -> index
  bool precise = false;  // [router] kv_index: the device index from events only
  static inline const char* name = "tandem.router";
};

using RouterActor = caf::stateful_actor<RouterState>;

}  // namespace

router::RouterConfig router_config(const config::Manifest& m) {
  return router_config(m, m.router);
}

router::RouterConfig router_config(const config::Manifest& m, const config::RouterSection& r) {
  router::RouterConfig c;
  c.policy = r.policy == config::RouterPolicy::round_robin ? router::Policy::round_robin
             : r.policy == config::RouterPolicy::random    ? router::Policy::random
                                                           : router::Policy::prefix_aware;
  c.weight_prefix = r.weight_prefix;
  c.weight_queue = r.weight_queue;
  c.weight_kv_usage = r.weight_kv_usage;
  // The index holds sub-blocks; the key counts blocks.
  const uint32_t k = m.model.block_tokens / m.model.sub_block_tokens;
  c.prefix_index_blocks_max = static_cast<uint32_t>(
      std::min<uint64_t>(uint64_t{r.prefix_index_blocks_max} * k, uint64_t{1} << 31));
  c.disaggregate_tokens_min = r.disaggregate_tokens_min;
  c.load_imbalance_max = r.load_imbalance_max;
  c.prefill_load_imbalance_max = r.prefill_load_imbalance_max;
  c.prefill_by_work = r.prefill_by_work;
  c.tier2_weight = r.tier2_weight;
  c.tier2_remote_weight = r.tier2_remote_weight;
  c.tier2_index_blocks_max = r.tier2_index_blocks_max;
  c.block_tokens = m.model.sub_block_tokens;
  c.sub_blocks_per_block = k;
  // Only the manifest's instances are ever added; the index keeps one holder bit per
  // instance per block (instances_max / 64 words), so size it to them, not to the maximum.
  size_t instances = m.instances_of(config::Role::prefill).size() +
                     m.instances_of(config::Role::decode).size();
  c.instances_max = static_cast<uint32_t>(std::clamp<size_t>(instances, 1, 65536));
  c.seed = std::hash<std::string>{}(m.cluster.name);
  return c;
}

namespace {

uint32_t site_of(const config::Manifest& m, const std::string& node) {
  for (size_t i = 0; i < m.nodes.size(); ++i) {
    if (m.nodes[i].name == node) return static_cast<uint32_t>(i);
  }
  RT_ASSERT(false, "a node of the manifest", node);
  return 0;
}

void add_instances(RouterState& st) {
  const config::Manifest& m = *st.ctx.manifest;
  if (m.kv_offload.enabled) {
    auto interval = std::chrono::milliseconds(m.router.kv_resync_interval_ms);
    for (const auto& [node, inst] : m.instances_of(config::Role::kv_offload)) {
      bool first_of_node = std::none_of(
          st.tier2_sources.begin(), st.tier2_sources.end(),
          [&, n = node](const Tier2Source& s) { return s.name.node == n->name; });
      if (!first_of_node) continue;
      ActorName name{node->name, "kv-offload", inst->name};
      obs::Labels source = {{"instance", st.self_name.instance}, {"source", name.to_string()}};
      st.source_by_name[name.to_string()] = st.tier2_sources.size();
      st.tier2_sources.push_back(Tier2Source{
          name, site_of(m, node->name), node->name == st.ctx.bridge->node(),
          router::KvSequence(interval),
          make_gauge(*st.ctx.metrics, "tandem_router_tier2_blocks",
                     "blocks the router believes a node's tier 2 holds (precise KV events)",
                     {{"instance", st.self_name.instance}, {"node", node->name}}),
          make_counter(*st.ctx.metrics, "tandem_router_kv_resyncs_total",
                       "snapshots asked of a tier-2 source (out of sync: gap, restart, new)",
                       source),
          make_counter(*st.ctx.metrics, "tandem_router_kv_event_gaps_total",
                       "numbered KV event frames that broke a synced stream", source)});
    }
  }
  for (auto role : {config::Role::decode, config::Role::prefill}) {
    for (const auto& [node, inst] : st.ctx.manifest->instances_of(role)) {
      uint32_t index = static_cast<uint32_t>(st.instances.size());
      ActorName name{node->name, std::string(config::to_string(role)), inst->name};
      auto core_role =
          role == config::Role::decode ? router::InstanceRole::decode : router::InstanceRole::prefill;
      Status added = st.core->add_instance({index}, core_role, site_of(m, node->name));
      RT_ASSERT(added.ok(), added.ok() ? "" : added.error().describe());
      // Instances on other nodes are down until their node is heard from; every instance is
      // ineligible until it reports that it is ready.
      Status up = st.core->set_up({index}, false);
      RT_ASSERT(up.ok());
      st.by_name[name.to_string()] = index;
      obs::Gauge* eligible = make_gauge(
          *st.ctx.metrics, "tandem_router_instance_eligible",
          "1 while the router may pick the instance (its node is up, it reported ready, it is "
          "not draining)",
          {{"instance", st.self_name.instance}, {"target", name.to_string()}});
      eligible->set(0.0);
      Known known{name, core_role, node->name == st.ctx.bridge->node(), false, false, eligible};
      known.picks =
          make_counter(*st.ctx.metrics, "tandem_router_instance_picks_total",
                       "requests this router sent to the instance (decode or prefill)",
                       {{"instance", st.self_name.instance}, {"target", name.to_string()}});
      if (st.precise) {
        obs::Labels source = {{"instance", st.self_name.instance}, {"source", name.to_string()}};
        known.sequence.emplace(std::chrono::milliseconds(m.router.kv_resync_interval_ms));
        known.resyncs = make_counter(
            *st.ctx.metrics, "tandem_router_kv_resyncs_total",
            "snapshots asked of a KV event source (out of sync: gap, restart, new)", source);
        known.gaps = make_counter(*st.ctx.metrics, "tandem_router_kv_event_gaps_total",
                                  "numbered KV event frames that broke a synced stream", source);
        known.index_blocks = make_gauge(
            *st.ctx.metrics, "tandem_router_kv_index_blocks",
            "blocks the router's index holds for a device cache (precise KV events)",
            {{"instance", st.self_name.instance}, {"target", name.to_string()}});
        known.index_blocks->set(0.0);
      }
      st.instances.push_back(std::move(known));
    }
  }
}

// The tier-2 source (kv-offload) of a site (node index), or nullptr.
const Tier2Source* source_of_site(const RouterState& st, uint32_t site) {
  for (const Tier2Source& s : st.tier2_sources) {
    if (s.site == site) return &s;
  }
  return nullptr;
}

void on_route(RouterActor* self, wire::Envelope::Reader envelope) {
  auto& st = self->state;
  auto req = envelope.getBody().getRouteRequest();
  ActorName from = messages::get_name(envelope.getSource());
  uint64_t id = req.getRequestId();
  auto hashes = messages::get_hashes(req.getBlockHashes());
  if (!hashes.ok()) return send_error(st.ctx, st.self_name, from, id, hashes.error());
  router::PickRequest request{*hashes, req.getPromptTokens()};
  auto pick = st.core->decide(request);
  if (!pick.ok()) return send_error(st.ctx, st.self_name, from, id, pick.error());
  (pick->prefill ? st.picks_disaggregated : st.picks_local)->inc();
  st.instances[pick->decode.value].picks->inc();
  if (pick->prefill) st.instances[pick->prefill->value].picks->inc();
  if (pick->prefill_tier2_blocks > 0) st.tier2_credited->inc();
  (void)st.ctx.bridge->send(st.self_name, from, id, [&](wire::Envelope::Builder b) {
    auto reply = b.getBody().initRouteReply();
    reply.setDecodeInstance(st.instances[pick->decode.value].name.to_string());
    if (pick->prefill) reply.setPrefillInstance(st.instances[pick->prefill->value].name.to_string());
    reply.setCachedBlocks(pick->decode_cached_blocks);
    if (pick->prefill && pick->prefill_tier2_site) {
      if (const Tier2Source* source = source_of_site(st, *pick->prefill_tier2_site)) {
        reply.setTier2Source(source->name.to_string());
        st.tier2_remote->inc();
      }
    }
  });
  // Reply first, then record where the blocks will be (same behavior: nothing in between).
  // Precise: the instances' events say what they hold, once they hold it.
  if (!st.precise) st.core->record(request, *pick);
}

// Sends KvResync to `to` when its stream is out of sync and was not asked within the interval.
void ask_resync(RouterState& st, const ActorName& to, router::KvSequence& sequence,
                obs::Counter* resyncs, const std::string& reason) {
  auto now = router::KvSequence::Clock::now();
  if (!sequence.resync_due(now)) return;
  sequence.resync_sent(now);
  resyncs->inc();
  Status sent = st.ctx.bridge->send(st.self_name, to, 0, [&](wire::Envelope::Builder b) {
    b.getBody().initKvResync().setReason(reason);
  });
  if (!sent.ok()) {
    st.ctx.log->debug("router: KvResync to {} not sent: {}", to.to_string(),
                      sent.error().describe());
  }
}

void ask_resync(RouterState& st, Tier2Source& source, const std::string& reason) {
  ask_resync(st, source.name, source.sequence, source.resyncs, reason);
}

// A precise device source that is eligible but out of sync is asked for a snapshot.
void ask_resync(RouterState& st, uint32_t i, const std::string& reason) {
  Known& k = st.instances[i];
  if (!k.sequence || !k.node_up || !k.ready || k.sequence->synced()) return;
  ask_resync(st, k.name, *k.sequence, k.resyncs, reason);
}

void refresh_index_gauge(RouterState& st, uint32_t i) {
  Known& k = st.instances[i];
  if (k.index_blocks) k.index_blocks->set(static_cast<double>(st.core->index_blocks_count({i})));
}

// Applies a change of node state or readiness to the core; the core's view changes only
// when eligibility does (set_up(false) drops the instance's prefix index).
void set_eligibility(RouterState& st, uint32_t i, bool node_up, bool ready) {
  RT_ASSERT(i < st.instances.size(), i);
  Known& k = st.instances[i];
  bool was = k.node_up && k.ready;
  k.node_up = node_up;
  k.ready = ready;
  bool now = k.node_up && k.ready;
  if (k.eligible) k.eligible->set(now && !k.draining ? 1.0 : 0.0);
  if (was != now) {
    Status s = st.core->set_up({i}, now);
    RT_ASSERT(s.ok(), i);
    // Precise: events that came while it was not eligible were not applied (and going down
    // cleared its index): start over from a snapshot.
    if (k.sequence) {
      k.sequence->lost();
      refresh_index_gauge(st, i);
      if (now) ask_resync(st, i, k.name.to_string() + " became eligible");
    }
  }
}

void on_membership(RouterState& st, const runtime::MembershipEvent& event) {
  bool up = event.kind != runtime::MembershipEvent::Kind::down;
  for (uint32_t i = 0; i < st.instances.size(); ++i) {
    if (st.instances[i].name.node != event.node) continue;
    // A restarted node lost its KV: drop what the index believed it held, and wait for its
    // instances to report that they are ready again.
    if (event.kind == runtime::MembershipEvent::Kind::restarted) {
      set_eligibility(st, i, false, false);
      st.instances[i].reported = false;
    }
    set_eligibility(st, i, up, up && st.instances[i].ready);
  }
  for (Tier2Source& source : st.tier2_sources) {
    if (source.name.node != event.node) continue;
    // Down: what it held is unreachable. Up or restarted: out of sync until its snapshot.
    source.node_up = up;
    source.sequence.lost();
    st.core->tier2_clear(source.site);
    source.blocks->set(0.0);
    bool restarted = event.kind == runtime::MembershipEvent::Kind::restarted;
    if (up) ask_resync(st, source, event.node + (restarted ? " restarted" : " is up"));
  }
  st.ctx.log->info("router: instances on {} are {}", event.node, up ? "eligible" : "excluded");
}

void on_load(RouterState& st, const runtime::InstanceLoadReport& r) {
  auto it = st.by_name.find(r.instance);
  if (it == st.by_name.end()) return;
  Known& k = st.instances[it->second];
  if (r.ready && !k.ready) st.ctx.log->info("router: {} is ready", r.instance);
  if (!r.ready && (k.ready || !k.reported)) {
    st.ctx.log->warn("router: {} is not ready: {}", r.instance, r.not_ready_reason);
  }
  k.reported = true;
  if (r.draining != k.draining) {
    st.ctx.log->info("router: {} is {}", r.instance,
                     r.draining ? "draining: not picked" : "undrained");
    k.draining = r.draining;
    Status s = st.core->set_draining({it->second}, r.draining);
    RT_ASSERT(s.ok(), r.instance);
  }
  set_eligibility(st, it->second, k.node_up, r.ready);
  if (!r.ready) return;
  (void)st.core->update_load({it->second},
                             {r.waiting, r.running, r.kv_blocks_used, r.kv_blocks_total,
                              r.tier2_local_reads, r.tier2_remote_reads, r.pending_tokens,
                              r.kv_blocks_free});
}

// Events of an instance's prefix cache (KvEventReporter). Approximate: the index drops the
// removed blocks and every deeper block of their chains (it learns stored blocks from its own
// picks). Precise: numbered frames, applied only while they continue the stream (KvSequence):
// removed, then stored in chain order under their parents; out of sync, the router forgets
// the instance's index and asks it for a snapshot.
void on_device_events(RouterState& st, wire::Envelope::Reader envelope) {
  auto ev = envelope.getBody().getKvEvents();
  auto it = st.by_name.find(ev.getInstance());
  if (it == st.by_name.end()) {
    st.ctx.log->debug("router: KV events from unknown instance {}", std::string(ev.getInstance()));
    return;
  }
  const uint32_t i = it->second;
  Known& k = st.instances[i];
  auto removed = messages::get_hashes(ev.getRemoved());
  auto stored = removed.ok() ? messages::get_hashes(ev.getStored()) : removed;
  auto parents = messages::get_parent_hashes(ev.getStoredParents());
  Status bad;
  if (!removed.ok()) bad = removed.error();
  else if (!stored.ok()) bad = stored.error();
  else if (!parents.ok()) bad = parents.error();
  else if (k.sequence && parents->size() != stored->size()) {
    bad = make_error(ErrorKind::invalid, "storedParents has " + std::to_string(parents->size()) +
                                             " entries for " + std::to_string(stored->size()) +
                                             " stored blocks");
  }
  if (!bad.ok()) {
    st.ctx.log->warn("router: bad KV events from {}: {}", std::string(ev.getInstance()),
                     bad.error().describe());
    if (!k.sequence) return;
    // A frame it cannot read is a frame lost: the index is no longer exact.
    k.sequence->lost();
    RT_ASSERT(st.core->kv_clear({i}).ok(), i);
  } else if (!k.sequence) {
    Status applied = st.core->kv_removed({i}, *removed);
    RT_ASSERT(applied.ok(), i);
    st.kv_removed->inc(removed->size());
    return;
  } else {
    using V = router::KvSequence::Verdict;
    bool keepalive = !ev.getAllCleared() && stored->empty() && removed->empty();
    V verdict = k.sequence->on_frame(envelope.getSourceIncarnation(), ev.getSequence(),
                                     ev.getAllCleared(), keepalive);
    if (verdict == V::reset_apply || verdict == V::drop_lost) {
      RT_ASSERT(st.core->kv_clear({i}).ok(), i);
    }
    if (verdict == V::drop_lost) {
      k.gaps->inc();
      st.ctx.log->info("router: KV events from {} out of sequence (frame {}): resync",
                       k.name.to_string(), ev.getSequence());
    }
    if (verdict == V::apply || verdict == V::reset_apply) {
      RT_ASSERT(st.core->kv_removed({i}, *removed).ok(), i);
      st.kv_removed->inc(removed->size());
      for (size_t n = 0; n < stored->size(); ++n) {
        RT_ASSERT(st.core->kv_stored({i}, (*parents)[n], std::span(*stored).subspan(n, 1)).ok(),
                  i);
      }
    }
  }
  refresh_index_gauge(st, i);
  ask_resync(st, i, k.sequence->synced() ? "" : "frame " + std::to_string(ev.getSequence()) +
                                                    " out of sequence or not in sync yet");
}

// Precise tier-2 events from a node's kv-offload: numbered frames, applied only while they
// continue the stream (KvSequence); out of sync, the router forgets the node's tier 2 and asks
// for a snapshot.
void on_tier2_events(RouterState& st, wire::Envelope::Reader envelope) {
  auto ev = envelope.getBody().getKvEvents();
  auto it = st.source_by_name.find(ev.getInstance());
  if (it == st.source_by_name.end()) {
    st.ctx.log->debug("router: tier-2 events from unknown source {}",
                      std::string(ev.getInstance()));
    return;
  }
  Tier2Source& source = st.tier2_sources[it->second];
  uint64_t gaps_before = source.sequence.gaps_count();
  auto stored = messages::get_hashes(ev.getStored());
  auto removed = stored.ok() ? messages::get_hashes(ev.getRemoved()) : stored;
  if (!stored.ok() || !removed.ok()) {
    // A frame it cannot read is a frame lost: the view is no longer exact.
    st.ctx.log->warn("router: bad tier-2 events from {}: {}", source.name.to_string(),
                     (stored.ok() ? removed : stored).error().describe());
    source.sequence.lost();
    st.core->tier2_clear(source.site);
  } else {
    using V = router::KvSequence::Verdict;
    bool keepalive = !ev.getAllCleared() && stored->empty() && removed->empty();
    V verdict = source.sequence.on_frame(envelope.getSourceIncarnation(), ev.getSequence(),
                                         ev.getAllCleared(), keepalive);
    if (verdict == V::reset_apply || verdict == V::drop_lost) st.core->tier2_clear(source.site);
    if (verdict == V::drop_lost) {
      source.gaps->inc();
      st.ctx.log->info("router: tier-2 events from {} out of sequence (frame {}): resync",
                       source.name.to_string(), ev.getSequence());
    }
    if (verdict == V::apply || verdict == V::reset_apply) {
      st.tier2_refused->inc(st.core->tier2_stored(source.site, *stored));
      st.core->tier2_removed(source.site, *removed);
    }
  }
  source.blocks->set(static_cast<double>(st.core->tier2().blocks_count(source.site)));
  if (source.node_up && !source.sequence.synced()) {
    ask_resync(st, source, source.sequence.gaps_count() > gaps_before
                               ? "frame " + std::to_string(ev.getSequence()) + " out of sequence"
                               : "not in sync yet");
  }
}

void on_kv_events(RouterState& st, wire::Envelope::Reader envelope) {
  if (envelope.getBody().getKvEvents().getTier() == 2) return on_tier2_events(st, envelope);
  on_device_events(st, envelope);
}

// Every kv_resync_interval_ms: sources of up nodes still out of sync are asked again.
void on_resync_tick(RouterState& st) {
  for (Tier2Source& source : st.tier2_sources) {
    if (source.node_up) ask_resync(st, source, "no snapshot yet");
  }
  for (uint32_t i = 0; i < st.instances.size(); ++i) ask_resync(st, i, "no snapshot yet");
}

// `router-show`: the live settings; `router-set KEY VALUE`: one changed, checked by the
// manifest's rules, applied to the core; rows: router, key, old, new.
runtime::AdminResult on_admin(RouterState& st, const runtime::LocalAdmin& cmd) {
  const std::string who = st.self_name.to_string();
  if (cmd.command == "router-show") {
    runtime::AdminResult out{true, "", {{"router", "key", "value"}}};
    out.text = who + " (" + std::string(router::to_string(st.core->config().policy)) + ")\n";
    for (const auto& [key, value] : config::router_settings(st.settings)) {
      out.rows.push_back({who, key, value});
      out.text += "  " + key + " = " + value + "\n";
    }
    return out;
  }
  if (cmd.command != "router-set" || cmd.args.size() != 2) {
    return {false, who + ": usage: router-set KEY VALUE\n", {}};
  }
  const std::string& key = cmd.args[0];
  auto changed = config::set_router_key(st.settings, key, cmd.args[1]);
  if (!changed.ok()) return {false, who + ": " + changed.error().message + "\n", {}};
  Status applied = st.core->set_config(router_config(*st.ctx.manifest, *changed));
  if (!applied.ok()) return {false, who + ": " + applied.error().message + "\n", {}};
  std::string before = config::router_setting_text(st.settings, key);
  std::string after = config::router_setting_text(*changed, key);
  st.settings = *changed;
  st.ctx.log->info("router: {} set live: {} -> {}", key, before, after);
  return {true,
          who + ": " + key + " = " + after + " (was " + before + ")\n",
          {{"router", "key", "old", "new"}, {who, key, before, after}}};
}

}  // namespace

caf::actor spawn_router(caf::actor_system& system, const ShellContext& ctx,
                        const config::Instance& instance) {
  ActorName name{ctx.bridge->node(), "router", instance.name};
  auto actor = runtime::spawn_fn(system, [ctx, name](RouterActor* self) -> caf::behavior {
    auto& st = self->state;
    st.ctx = ctx;
    st.self_name = name;
    st.guard.emplace(ctx, "router");
    st.settings = ctx.manifest->router;
    st.core = std::make_unique<router::RouterCore>(router_config(*ctx.manifest));
    st.precise = ctx.manifest->router.kv_index == config::KvIndexMode::precise;
    add_instances(st);
    obs::Labels l = {{"instance", name.instance}};
    st.picks_disaggregated = make_counter(*ctx.metrics, "tandem_router_picks_total",
                                          "routing decisions, by kind",
                                          {{"instance", name.instance}, {"kind", "disaggregated"}});
    st.picks_local = make_counter(*ctx.metrics, "tandem_router_picks_total",
                                  "routing decisions, by kind",
                                  {{"instance", name.instance}, {"kind", "decode_only"}});
    st.kv_removed = make_counter(*ctx.metrics, "tandem_router_kv_blocks_removed_total",
                                 "blocks instances reported evicted from their prefix cache",
                                 {{"instance", name.instance}});
    st.tier2_refused = make_counter(*ctx.metrics, "tandem_router_tier2_refused_blocks_total",
                                    "tier-2 stored events refused (router.tier2_index_blocks_max)",
                                    {{"instance", name.instance}});
    st.tier2_credited = make_counter(*ctx.metrics, "tandem_router_tier2_credited_picks_total",
                                     "P/D picks whose prefill instance's node holds blocks of "
                                     "the prompt in tier 2 beyond its device cache",
                                     {{"instance", name.instance}});
    st.tier2_remote = make_counter(*ctx.metrics, "tandem_router_tier2_remote_picks_total",
                                   "P/D picks whose prefill instance reads the prompt's blocks "
                                   "from another node's tier 2 (RouteReply.tier2Source)",
                                   {{"instance", name.instance}});
    auto resync_interval = std::chrono::milliseconds(ctx.manifest->router.kv_resync_interval_ms);
    if (!st.tier2_sources.empty() || st.precise) {
      self->delayed_send(self, resync_interval, runtime::atoms::tick::value);
    }
    if (ctx.node_actor) {
      self->send(ctx.node_actor, runtime::atoms::subscribe::value, caf::actor_cast<caf::actor>(self));
    }
    return {
        [self](const runtime::InboundFrame& in) {
          self->state.guard->run_frame(self->state.self_name, in, [self, &in] {
            auto envelope = in.frame->envelope();
            auto which = envelope.getBody().which();
            if (which == wire::Envelope::Body::ROUTE_REQUEST) return on_route(self, envelope);
            if (which == wire::Envelope::Body::KV_EVENTS) return on_kv_events(self->state, envelope);
            if (which == wire::Envelope::Body::PING) {
              return runtime::answer_ping(self->state.ctx.bridge, self->state.self_name, envelope);
            }
          });
        },
        [self](const runtime::MembershipEvent& event) { on_membership(self->state, event); },
        [self](const runtime::InstanceLoadReport& r) { on_load(self->state, r); },
        [self](const runtime::LocalAdmin& cmd) -> runtime::AdminResult {
          runtime::AdminResult out;
          Status ran = self->state.guard->run(
              "an admin command", [self, &cmd, &out] { out = on_admin(self->state, cmd); });
          if (!ran.ok()) out = {false, ran.error().describe() + "\n", {}};
          return out;
        },
        [self, resync_interval](runtime::atoms::tick) {
          on_resync_tick(self->state);
          self->delayed_send(self, resync_interval, runtime::atoms::tick::value);
        },
    };
  });
  ctx.bridge->register_actor(name, actor);
  return actor;
}

}  // namespace tandem::actors
