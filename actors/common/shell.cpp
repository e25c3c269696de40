#include "actors/common/shell.hpp"

#include <algorithm>

#include "messages/convert.hpp"
#include "runtime/node/caf_types.hpp"

namespace tandem::actors {

HandlerGuard::HandlerGuard(const ShellContext& ctx, std::string role)
    : ctx_(ctx), role_(std::move(role)) {
  RT_ASSERT(ctx_.metrics != nullptr && ctx_.log != nullptr, role_);
  failures_ = make_counter(*ctx_.metrics, "tandem:handler_failures_total",
                           "messages whose handler failed unexpectedly (answered with an "
                           "internal error; the actor lives on)",
                           {{"role", role_}});
}

Status HandlerGuard::run(std::string_view what, const std::function<void()>& body) const {
  std::string why;
  try {
    body();
    return {};
  } catch (const kj::Exception& e) {
    why = e.getDescription().cStr();
  } catch (const std::exception& e) {
    why = e.what();
  } catch (...) {
    why = "an exception of unknown type";
  }
  RT_ASSERT(!why.empty(), role_);
  failures_->inc();
  ctx_.log->error("{}: {} failed: {}", role_, what, why);
  return make_error(ErrorKind::failed, "internal error while " + std::string(what) + ": " + why);
}

void HandlerGuard::run_frame(const messages::ActorName& self_name,
                             const runtime::InboundFrame& in,
                             const std::function<void()>& body) const {
  Status done = run("handling a message", body);
  if (done.ok()) return;
  try {  // the envelope was validated by the bridge; reading it again is expected to work
    auto envelope = in.frame->envelope();
    uint64_t correlation = envelope.getCorrelationId();
    messages::ActorName source = messages::get_name(envelope.getSource());
    if (correlation == 0 || source.role == "node" || source.role.empty()) return;
    if (envelope.getBody().which() == wire::Envelope::Body::ERROR) return;  // no error loops
    send_error(ctx_, self_name, source, correlation, done.error());
  } catch (const kj::Exception& e) {
    ctx_.log->warn("{}: could not answer a failed message: {}", role_,
                   e.getDescription().cStr());
  }
}

void lose_device(const ShellContext& ctx, ExecWatch& watch, const messages::ActorName& self,
                 std::string_view role, const std::string& reason, std::string_view ending,
                 const std::function<void()>& end_requests) {
  if (!watch.lose(reason)) return;
  ctx.log->error(
      "{} {}: {}; {} end with this error and no step runs until the node restarts "
      "([supervisor] device_lost)",
      role, self.instance, watch.stall_reason(), ending);
  end_requests();
  if (ctx.device_lost) ctx.device_lost(self.to_string(), watch.stall_reason());
}

void send_error(const ShellContext& ctx, const messages::ActorName& from,
                const messages::ActorName& to, uint64_t request_id, const Error& error,
                uint32_t tokens_sent) {
  Status sent = ctx.bridge->send(from, to, request_id, [&](wire::Envelope::Builder b) {
    auto e = b.getBody().initError();
    e.setRequestId(request_id);
    e.setKind(messages::to_wire(error.kind));
    e.setMessage(error.message);
    e.setTokensSent(tokens_sent);
  });
  if (!sent.ok()) {
    ctx.log->warn("could not send an error for request {} to {}: {}", request_id,
                  to.to_string(), sent.error().describe());
  }
}

obs::Counter* make_counter(obs::Registry& registry, const std::string& name,
                           const std::string& help, obs::Labels labels) {
  auto made = registry.counter(name, help, std::move(labels));
  RT_ASSERT(made.ok(), name, made.ok() ? "" : made.error().describe());
  return *made;
}

obs::Gauge* make_gauge(obs::Registry& registry, const std::string& name, const std::string& help,
                       obs::Labels labels) {
  auto made = registry.gauge(name, help, std::move(labels));
  RT_ASSERT(made.ok(), name, made.ok() ? "" : made.error().describe());
  return *made;
}

obs::Histogram* make_histogram(obs::Registry& registry, const std::string& name,
                               const std::string& help, std::vector<double> bounds,
                               obs::Labels labels) {
  auto made = registry.histogram(name, help, std::move(bounds), std::move(labels));
  RT_ASSERT(made.ok(), name, made.ok() ? "" : made.error().describe());
  return *made;
}

}  // namespace tandem::actors

namespace tandem::actors {

Result<devices::SampledToken> sample_at(const devices::SamplingParams& params, uint32_t position,
                                        const devices::SeqOutput& out, uint32_t row,
                                        std::span<const int32_t> history, uint32_t vocab_size) {
  if (!out.tokens.empty()) {
    if (row >= out.tokens.size()) {
      return make_error(ErrorKind::failed, "device returned too few tokens");
    }
    devices::SampledToken t;
    t.token = out.tokens[row];
    for (int32_t stop : params.stop_token_ids) t.is_stop = t.is_stop || stop == t.token;
    // A token-producing device is deterministic: the token has probability 1.
    if (params.logprobs_top_n > 0) t.top.push_back({t.token, 0.0f});
    return t;
  }
  if (vocab_size == 0 || out.logits.size() < uint64_t(row + 1) * vocab_size) {
    return make_error(ErrorKind::failed, "device returned too few logits");
  }
  devices::Sampler sampler(devices::seeded_at(params, position));
  return sampler.sample(
      std::span<const float>(out.logits.data() + uint64_t(row) * vocab_size, vocab_size), history);
}

std::chrono::nanoseconds now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch());
}

}  // namespace tandem::actors

namespace tandem::actors {

InstanceMetrics::InstanceMetrics(obs::Registry& registry, const std::string& instance)
    : registry_(registry), labels_{{"instance", instance}} {
  waiting_ = make_gauge(registry, "tandem:num_requests_waiting",
                        "requests waiting to be scheduled", labels_);
  running_ = make_gauge(registry, "tandem:num_requests_running",
                        "requests holding KV (computing, running or held for a pull)", labels_);
  kv_usage_ = make_gauge(registry, "tandem:kv_cache_usage_perc",
                         "fraction of KV blocks in use (0..1)", labels_);
  queries_tokens_ = make_counter(registry, "tandem:prefix_cache_queries_total",
                                 "prompt tokens looked up in the prefix cache", labels_);
  hits_tokens_ = make_counter(registry, "tandem:prefix_cache_hits_total",
                              "prompt tokens found in the prefix cache", labels_);
  cached_blocks_ = make_gauge(registry, "tandem:prefix_cache_blocks",
                              "blocks the prefix cache holds (reachable by a prompt)", labels_);
  cached_entries_ = make_gauge(registry, "tandem:prefix_cache_entries",
                               "prefix hashes (sub-blocks) the prefix cache holds: what a "
                               "precise router index mirrors",
                               labels_);
}

void InstanceMetrics::refresh(const kv::PrefixCache& cache, uint32_t waiting, uint32_t running) {
  waiting_->set(waiting);
  running_->set(running);
  kv_usage_->set(double(cache.blocks_used_count()) / cache.blocks_count());
  cached_blocks_->set(cache.blocks_cached_count());
  cached_entries_->set(cache.entries_count());
  const auto& c = cache.counters();
  RT_ASSERT(c.query_tokens_count >= queries_seen_ && c.hit_tokens_count >= hits_seen_);
  queries_tokens_->inc(c.query_tokens_count - queries_seen_);
  hits_tokens_->inc(c.hit_tokens_count - hits_seen_);
  queries_seen_ = c.query_tokens_count;
  hits_seen_ = c.hit_tokens_count;
}

KvEventReporter::KvEventReporter(const ShellContext& ctx, messages::ActorName self)
    : ctx_(ctx), self_(std::move(self)) {
  for (const auto& [node, inst] : ctx_.manifest->instances_of(config::Role::router)) {
    routers_.push_back({node->name, std::string(config::to_string(config::Role::router)),
                        inst->name});
  }
  // A hash is a 32-byte Data element (8-byte pointer + 32 bytes); leave 1 KiB for the
  // envelope and the instance name.
  uint32_t frame = ctx_.manifest->fabric.frame_bytes_max;
  hashes_per_frame_ = std::max<size_t>(1, (frame > 1024 ? frame - 1024 : 0) / 40);
}

void KvEventReporter::send_frame(uint8_t tier, bool all_cleared, uint64_t sequence,
                                 std::span<const kv::BlockHash> stored,
                                 std::span<const std::optional<kv::BlockHash>> parents,
                                 std::span<const kv::BlockHash> removed) {
  RT_ASSERT(parents.empty() || parents.size() == stored.size(), parents.size(), stored.size());
  RT_ASSERT(stored.size() + parents.size() + removed.size() <= hashes_per_frame_,
            stored.size(), removed.size());
  sent_at_ = std::chrono::steady_clock::now();
  std::string instance = self_.to_string();
  std::vector<kv::BlockHash> stored_part(stored.begin(), stored.end());
  std::vector<kv::BlockHash> removed_part(removed.begin(), removed.end());
  for (const auto& router : routers_) {
    Status sent = ctx_.bridge->send(self_, router, 0, [&](wire::Envelope::Builder b) {
      auto ev = b.getBody().initKvEvents();
      ev.setInstance(instance);
      ev.setTier(tier);
      ev.setSequence(sequence);
      ev.setAllCleared(all_cleared);
      if (!stored_part.empty()) {
        messages::set_hashes(ev.initStored(static_cast<unsigned>(stored_part.size())),
                             stored_part);
      }
      if (!parents.empty()) {
        messages::set_parent_hashes(ev.initStoredParents(static_cast<unsigned>(parents.size())),
                                    parents);
      }
      if (!removed_part.empty()) {
        messages::set_hashes(ev.initRemoved(static_cast<unsigned>(removed_part.size())),
                             removed_part);
      }
    });
    if (!sent.ok()) {
      ctx_.log->debug("{}: KV events for {} not sent: {}", instance, router.to_string(),
                      sent.error().describe());
    }
  }
}

void KvEventReporter::send_device(const kv::CacheEvents& events, bool snapshot) {
  bool cleared = snapshot;
  std::span<const kv::BlockHash> removed(events.removed);
  std::span<const kv::BlockHash> stored(events.stored);
  std::span<const std::optional<kv::BlockHash>> parents(events.stored_parents);
  RT_ASSERT(stored.size() == parents.size(), stored.size(), parents.size());
  RT_ASSERT(!snapshot || removed.empty(), removed.size());
  // A snapshot of nothing is still a frame: it tells the router this source holds nothing.
  if (snapshot && stored.empty()) {
    send_frame(1, true, ++sequence_, {}, {}, {});
    return;
  }
  for (size_t at = 0; at < removed.size(); at += hashes_per_frame_) {
    size_t n = std::min(hashes_per_frame_, removed.size() - at);
    send_frame(1, false, ++sequence_, {}, {}, removed.subspan(at, n));
  }
  size_t per_frame = std::max<size_t>(1, hashes_per_frame_ / 2);  // a hash and its parent
  for (size_t at = 0; at < stored.size(); at += per_frame) {
    size_t n = std::min(per_frame, stored.size() - at);
    send_frame(1, cleared, ++sequence_, stored.subspan(at, n), parents.subspan(at, n), {});
    cleared = false;
  }
}

void KvEventReporter::flush(kv::PrefixCache& cache) {
  if (snapshot_due_ || cache.has_events()) {
    bool snapshot = snapshot_due_;
    snapshot_due_ = false;
    kv::CacheEvents events = snapshot ? cache.snapshot() : cache.drain_events();
    removed_count_ += events.removed.size();
    stored_count_ += events.stored.size();
    if (!routers_.empty()) send_device(events, snapshot);
    return;
  }
  auto idle = std::chrono::milliseconds(ctx_.manifest->router.kv_resync_interval_ms) / 2;
  if (!routers_.empty() && std::chrono::steady_clock::now() - sent_at_ >= idle) {
    send_frame(1, false, sequence_, {}, {}, {});  // keepalive
  }
}

void KvEventReporter::send_tier2_keepalive() {
  if (!routers_.empty()) send_frame(2, false, sequence_, {}, {}, {});
}

void KvEventReporter::send_tier2(std::span<const kv::BlockHash> stored,
                                 std::span<const kv::BlockHash> removed, bool snapshot) {
  if (routers_.empty()) return;
  bool cleared = snapshot;
  // A snapshot of nothing is still a frame: it tells the router this source holds nothing.
  if (snapshot && stored.empty()) {
    send_frame(2, true, ++sequence_, {}, {}, {});
    cleared = false;
  }
  for (size_t at = 0; at < stored.size(); at += hashes_per_frame_) {
    size_t n = std::min(hashes_per_frame_, stored.size() - at);
    send_frame(2, cleared, ++sequence_, stored.subspan(at, n), {}, {});
    cleared = false;
  }
  for (size_t at = 0; at < removed.size(); at += hashes_per_frame_) {
    size_t n = std::min(hashes_per_frame_, removed.size() - at);
    send_frame(2, false, ++sequence_, {}, {}, removed.subspan(at, n));
  }
  RT_ASSERT(!cleared, "a snapshot sends its allCleared frame");
}

void report_load(caf::event_based_actor* self, const ShellContext& ctx,
                 const messages::ActorName& name, const kv::PrefixCache& cache, uint32_t waiting,
                 uint32_t running, PrefillLoadExtras extras) {
  if (!ctx.node_actor) return;
  runtime::InstanceLoadReport report{name.to_string(), waiting, running,
                                     cache.blocks_used_count(), cache.blocks_count()};
  report.tier2_local_reads = extras.tier2.local;
  report.tier2_remote_reads = extras.tier2.remote;
  report.pending_tokens = extras.pending_tokens;
  report.kv_blocks_free = cache.blocks_free_count();
  self->send(ctx.node_actor, std::move(report));
}

void report_not_ready(caf::event_based_actor* self, const ShellContext& ctx,
                      const messages::ActorName& name, const std::string& reason) {
  if (!ctx.node_actor) return;
  RT_ASSERT(!reason.empty(), name.to_string());
  runtime::InstanceLoadReport report;
  report.instance = name.to_string();
  report.ready = false;
  report.not_ready_reason = reason;
  self->send(ctx.node_actor, std::move(report));
}

}  // namespace tandem::actors

namespace tandem::actors {

void fill_kv_layout(wire::KvLayout::Builder l, const devices::KvLayout& layout) {
  l.setBlockTokens(layout.block_tokens);
  l.setLayers(layout.layers);
  l.setKvHeads(layout.kv_heads);
  l.setHeadDim(layout.head_dim);
  l.setElementBytes(layout.element_bytes);
  l.setBlockBytes(layout.block_bytes());
  l.setOrder(static_cast<uint32_t>(layout.order));
  l.setInner(static_cast<uint32_t>(layout.inner));
  l.setLayerFirst(layout.layer_first);
}

devices::KvLayout read_kv_layout(wire::KvLayout::Reader l) {
  devices::KvLayout out;
  out.block_tokens = l.getBlockTokens();
  out.layers = l.getLayers();
  out.kv_heads = l.getKvHeads();
  out.head_dim = l.getHeadDim();
  out.element_bytes = l.getElementBytes();
  out.layer_first = l.getLayerFirst();
  if (l.getOrder() > 1 || l.getInner() > 1) {
    out.layers = 0;  // an order this build does not know: matches no pool
    return out;
  }
  out.order = static_cast<devices::KvOrder>(l.getOrder());
  out.inner = static_cast<devices::KvInner>(l.getInner());
  return out;
}

void fill_block_descriptor(wire::BlockDescriptor::Builder d, const std::string& address,
                           const runtime::RemoteRegionRef& region, uint64_t offset_bytes,
                           const kv::BlockHash* hash, const devices::KvLayout& layout) {
  RT_ASSERT(offset_bytes + layout.block_bytes() <= region.length_bytes, offset_bytes);
  auto r = d.initRegion();
  r.setFabricAddress(address);
  r.setBaseAddress(region.remote_base);
  r.setLengthBytes(region.length_bytes);
  r.setKey(region.key);
  d.setOffsetBytes(offset_bytes);
  d.setLengthBytes(layout.block_bytes());
  if (hash != nullptr) d.setBlockHash(kj::arrayPtr(hash->bytes.data(), hash->bytes.size()));
  fill_kv_layout(d.initLayout(), layout);
  // Block-major pools (every pool of this build) are one run at offset_bytes; a layer-major one
  // lists its 2 * layers parts of block offset_bytes / block_bytes (what callers pass either way).
  if (layout.order == devices::KvOrder::block_major) {
    auto segs = d.initSegments(1);
    segs[0].setLayer(layout.layer_first);
    segs[0].setPart(0);
    segs[0].setParts(layout.layers * 2);
    segs[0].setOffsetBytes(offset_bytes);
    return;
  }
  RT_ASSERT(offset_bytes % layout.block_bytes() == 0, offset_bytes);
  auto block = static_cast<uint32_t>(offset_bytes / layout.block_bytes());
  RT_ASSERT(block < layout.blocks_total, block);
  auto parts = devices::block_segments(layout, block);
  auto segs = d.initSegments(static_cast<unsigned>(parts.size()));
  for (unsigned i = 0; i < parts.size(); ++i) {
    segs[i].setLayer(parts[i].layer);
    segs[i].setPart(static_cast<uint32_t>(parts[i].part));
    segs[i].setParts(parts[i].parts);
    segs[i].setOffsetBytes(parts[i].offset_bytes);
  }
}

RemoteBlock read_block_descriptor(wire::BlockDescriptor::Reader d) {
  auto r = d.getRegion();
  RemoteBlock out{std::string(r.getFabricAddress().cStr()),
                  {r.getBaseAddress(), r.getLengthBytes(), r.getKey()},
                  d.getOffsetBytes(),
                  d.getLengthBytes(),
                  {}};
  out.source.layout = read_kv_layout(d.getLayout());
  out.source.length_bytes = r.getLengthBytes();
  auto segs = d.getSegments();
  if (segs.size() == 0) {  // one block-major run
    out.source.segments.push_back({out.source.layout.layer_first, devices::KvPart::k,
                                   out.source.layout.layers * 2, out.offset_bytes});
    return out;
  }
  // At most one per part: more can only be refused (plan_block_copy bounds them too).
  size_t max = size_t{out.source.layout.layers} * 2;
  out.source.segments.reserve(std::min<size_t>(segs.size(), max + 1));
  for (auto seg : segs) {
    if (out.source.segments.size() > max) break;
    out.source.segments.push_back({seg.getLayer(),
                                   seg.getPart() == 0 ? devices::KvPart::k : devices::KvPart::v,
                                   seg.getPart() > 1 ? 0u : seg.getParts(), seg.getOffsetBytes()});
  }
  return out;
}

}  // namespace tandem::actors
