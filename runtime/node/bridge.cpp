#include "runtime/node/bridge.hpp"

#include <array>
#include <optional>

#include <caf/send.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "runtime/node/caf_types.hpp"
#include "runtime/node/credentials.hpp"
#include "messages/senders.hpp"

namespace tandem::runtime {

using messages::ActorName;

Bridge::Bridge(const config::Manifest& manifest, std::string node, uint64_t incarnation,
               std::shared_ptr<spdlog::logger> log)
    : manifest_(manifest), node_(std::move(node)), incarnation_(incarnation), log_(std::move(log)) {
  RT_ASSERT(manifest_.find_node(node_) != nullptr, node_);
  RT_ASSERT(log_ != nullptr);
}

Bridge::~Bridge() { stop(); }

Status Bridge::start() {
  const config::Node* self = manifest_.find_node(node_);
  FabricOptions options;
  options.provider = manifest_.fabric.provider;
  options.host = self->host;
  options.bind_host = self->fabric_host;
  options.port = self->fabric_port;
  auto channel = node_channel(manifest_, node_);
  if (!channel.ok()) return channel.error();
  options.channel = std::move(channel).value();
  options.on_drop = [this](ChannelDrop why, const std::string& hint) { on_auth_drop(why, hint); };
  options.send_queue_max = manifest_.fabric.send_queue_max;
  options.sends_inflight_max = manifest_.fabric.sends_inflight_max;
  options.frame_bytes_max = manifest_.fabric.frame_bytes_max;
  options.recv_buffers = manifest_.fabric.recv_buffers;
  options.rma_chunk_bytes = manifest_.fabric.rma_chunk_bytes;
  options.rma_inflight_max = manifest_.fabric.rma_inflight_max;
  options.spin_us = manifest_.fabric.spin_us;
  auto opened = open_fabric(
      options, [this](std::span<const std::byte> b, const PeerRef& from) { on_frame(b, from); });
  if (!opened.ok()) return opened.error();
  fabric_ = std::move(opened).value();
  log_->info("fabric endpoint {} up (provider {}, listening on {}; authenticated with key {:08x})",
             fabric_->address(), fabric_->provider(), self->fabric_host,
             fabric_->options().channel->config().keys.front().id());
  return {};
}

void Bridge::stop() {
  std::unique_ptr<FabricEndpoint> fabric;
  {
    std::unique_lock lock(mu_);
    fabric = std::move(fabric_);
    actors_.clear();
  }
  fabric.reset();  // joins the progress thread outside the lock
}

std::string Bridge::address() const {
  std::shared_lock lock(mu_);
  return fabric_ ? fabric_->address() : std::string();
}

void Bridge::register_actor(const ActorName& name, caf::actor actor) {
  RT_ASSERT(name.node == node_, name.to_string());
  std::unique_lock lock(mu_);
  RT_ASSERT(!actors_.count(name), "actor registered twice", name.to_string());
  actors_.emplace(name, std::move(actor));
}

void Bridge::unregister_actor(const ActorName& name) {
  RT_ASSERT(name.node == node_, name.to_string());
  std::unique_lock lock(mu_);
  actors_.erase(name);
}

std::vector<ActorName> Bridge::local_actors() const {
  std::shared_lock lock(mu_);
  std::vector<ActorName> out;
  for (const auto& [name, actor] : actors_) out.push_back(name);
  return out;
}

std::vector<std::pair<ActorName, caf::actor>> Bridge::local_actors_with_role(
    const std::string& role) const {
  std::shared_lock lock(mu_);
  std::vector<std::pair<ActorName, caf::actor>> out;
  for (const auto& [name, actor] : actors_) {
    if (name.role == role) out.emplace_back(name, actor);
  }
  return out;
}

Result<std::string> Bridge::address_of(const std::string& node) const {
  std::shared_lock lock(mu_);
  return address_of_locked(node);
}

Result<std::string> Bridge::address_of_locked(const std::string& node) const {
  if (const config::Node* n = manifest_.find_node(node)) {
    return n->host + ":" + std::to_string(n->fabric_port);
  }
  auto it = client_addresses_.find(node);
  if (it != client_addresses_.end()) return it->second;
  return make_error(ErrorKind::not_found, "no node or client named '" + node + "'");
}

namespace {

// Each thread builds its envelopes in one reused first segment (capnp zeroes what it used
// when the builder goes away), so a typical message costs no 8 KiB malloc/free. A nested
// send on the same thread (none today) would fall back to a fresh segment.
struct ScratchSegment {
  alignas(capnp::word) std::array<capnp::word, 1024> words{};
  bool in_use = false;
};
thread_local ScratchSegment scratch_segment;

class ScratchBuilder {
 public:
  ScratchBuilder() : borrowed_(!scratch_segment.in_use) {
    if (borrowed_) {
      scratch_segment.in_use = true;
      builder_.emplace(kj::ArrayPtr<capnp::word>(scratch_segment.words.data(),
                                                 scratch_segment.words.size()));
    } else {
      builder_.emplace();
    }
  }
  ~ScratchBuilder() {
    builder_.reset();  // zeroes the scratch it used
    if (borrowed_) scratch_segment.in_use = false;
  }
  ScratchBuilder(const ScratchBuilder&) = delete;
  ScratchBuilder& operator=(const ScratchBuilder&) = delete;
  capnp::MallocMessageBuilder& get() { return *builder_; }

 private:
  bool borrowed_;
  std::optional<capnp::MallocMessageBuilder> builder_;
};

}  // namespace

Status Bridge::send(const ActorName& from, const ActorName& to, uint64_t correlation_id,
                    const Fill& fill) {
  ScratchBuilder scratch;
  capnp::MallocMessageBuilder& message = scratch.get();
  auto envelope = message.initRoot<wire::Envelope>();
  envelope.setProtocolVersion(manifest_.cluster.protocol_version);
  messages::set_name(envelope.initSource(), from);
  messages::set_name(envelope.initDestination(), to);
  envelope.setCorrelationId(correlation_id);
  envelope.setSourceIncarnation(incarnation_);
  std::shared_lock lock(mu_);
  if (!fabric_) return make_error(ErrorKind::disconnected, "node is stopping");
  envelope.setSourceAddress(fabric_->address());
  fill(envelope);
  if (envelope.getBody().which() == wire::Envelope::Body::KV_EVENTS &&
      drop_kv_events_.load(std::memory_order_relaxed) > 0) {
    auto ev = envelope.getBody().getKvEvents();
    bool tier2 = ev.getTier() == 2;
    bool numbered = tier2 == (drop_kv_tier_.load(std::memory_order_relaxed) == 2) &&
                    (ev.getAllCleared() || ev.getStored().size() > 0 ||
                     ev.getRemoved().size() > 0);  // not a keepalive
    uint32_t left = numbered ? drop_kv_events_.load(std::memory_order_relaxed) : 0;
    while (left > 0 && !drop_kv_events_.compare_exchange_weak(left, left - 1)) {
    }
    if (left > 0) {  // the test hook: lost on the way
      counters_.kv_events_dropped.fetch_add(1, std::memory_order_relaxed);
      return {};
    }
  }
  messages::FrameBytes words = messages::encode_frame(message);
  if (to.node == node_) {
    auto it = actors_.find(to);
    if (it == actors_.end()) {
      counters_.frames_unroutable.fetch_add(1, std::memory_order_relaxed);
      return make_error(ErrorKind::not_found, "no actor " + to.to_string());
    }
    size_t size = words.size();
    auto frame = std::make_shared<messages::Frame>(std::move(words), size);
    counters_.frames_local.fetch_add(1, std::memory_order_relaxed);
    caf::anon_send(it->second, InboundFrame{std::move(frame)});
    return {};
  }
  auto address = address_of_locked(to.node);
  if (!address.ok()) return address.error();
  auto peer = fabric_->peer(*address);
  if (!peer.ok()) return peer.error();
  auto bytes = messages::frame_span(words);
  // The node actor's frames (hellos, heartbeats, their answers) are membership traffic:
  // they must get through even when data to that peer fills its queue.
  bool control = from.role == "node" && from.node == node_;
  Status sent = fabric_->send(*peer, bytes, control);
  if (!sent.ok()) counters_.sends_failed.fetch_add(1, std::memory_order_relaxed);
  return sent;
}

void Bridge::reset_peer(const std::string& node) {
  std::shared_lock lock(mu_);
  if (!fabric_) return;
  if (auto address = address_of_locked(node); address.ok()) fabric_->reset_peer(*address);
}

void Bridge::warn_limited(const std::string& what) {
  uint64_t n = warnings_.fetch_add(1, std::memory_order_relaxed);
  if (n < 20 || n % 1000 == 0) log_->warn("{} (warning #{})", what, n + 1);
}

void Bridge::learn_client(const std::string& node, const std::string& address) {
  if (manifest_.find_node(node) != nullptr) return;
  std::unique_lock lock(mu_);
  auto it = client_addresses_.find(node);
  if (it != client_addresses_.end()) {
    it->second = address;
    return;
  }
  if (client_order_.size() >= clients_max) {
    client_addresses_.erase(client_order_.front());
    client_order_.erase(client_order_.begin());
  }
  client_addresses_.emplace(node, address);
  client_order_.push_back(node);
  RT_ASSERT(client_order_.size() <= clients_max);
}

void Bridge::set_ready() { ready_.store(true, std::memory_order_release); }

void Bridge::on_auth_drop(ChannelDrop why, const std::string& peer_hint) {
  counters_.auth_failures[static_cast<size_t>(why)].fetch_add(1, std::memory_order_relaxed);
  // A peer's own old process (unknown_session) and late handshake answers (stale) are part of
  // restarts and retries: counted, not logged.
  if (why == ChannelDrop::unknown_session || why == ChannelDrop::stale) return;
  std::string who = peer_hint.empty() ? "an unknown peer" : sanitize_peer_text(peer_hint);
  std::string key = who + "|" + std::string(to_string(why));
  auto now = std::chrono::steady_clock::now();
  uint64_t suppressed = 0;
  {
    std::lock_guard lock(auth_log_mu_);
    auto it = auth_log_.find(key);
    if (it != auth_log_.end() && now - it->second.logged < auth_log_interval) {
      ++it->second.suppressed;
      return;
    }
    if (it == auth_log_.end()) {
      if (auth_log_.size() >= auth_log_max) auth_log_.erase(auth_log_.begin());
      it = auth_log_.emplace(key, AuthLog{}).first;
    }
    suppressed = it->second.suppressed;
    it->second = AuthLog{now, 0};
    RT_ASSERT(auth_log_.size() <= auth_log_max);
  }
  log_->warn("fabric: refused a frame from {}: {}{}", who, to_string(why),
             suppressed ? " (and " + std::to_string(suppressed) + " more since the last report)"
                        : std::string());
}

void Bridge::on_frame(std::span<const std::byte> bytes, const PeerRef& from) {
  if (from == nullptr) {  // the channel hands over only authenticated frames
    counters_.auth_failures[static_cast<size_t>(ChannelDrop::not_sealed)].fetch_add(1);
    return;
  }
  if (!ready_.load(std::memory_order_acquire)) {
    counters_.frames_before_ready.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  auto decoded = messages::decode_frame(bytes, manifest_.fabric.frame_bytes_max);
  if (!decoded.ok()) {
    counters_.frames_malformed.fetch_add(1, std::memory_order_relaxed);
    warn_limited("dropped a frame of " + std::to_string(bytes.size()) +
                 " bytes: " + decoded.error().message);
    return;
  }
  auto frame = std::make_shared<messages::Frame>(std::move(decoded).value());
  auto envelope = frame->envelope();
  // The sender is the authenticated peer: a frame that names another source is refused.
  if (std::string_view(envelope.getSource().getNode().cStr()) != from->name) {
    counters_.identity_mismatch.fetch_add(1, std::memory_order_relaxed);
    warn_limited("refused a frame from " + sanitize_peer_text(from->name) + " claiming to be from " +
                 sanitize_peer_text(envelope.getSource().getNode().cStr()));
    return;
  }
  const PeerRef& sender = from;  // shared with its session: the frame keeps it alive
  if (envelope.getProtocolVersion() != manifest_.cluster.protocol_version) {
    refuse_version(*frame, *sender);
    return;
  }
  deliver(std::move(frame), sender);
}

void Bridge::refuse_version(messages::Frame& frame, const PeerIdentity& from) {
  auto envelope = frame.envelope();
  counters_.frames_version_refused.fetch_add(1, std::memory_order_relaxed);
  ActorName source = messages::get_name(envelope.getSource());
  uint32_t theirs = envelope.getProtocolVersion();
  uint32_t ours = manifest_.cluster.protocol_version;
  log_->error("refusing peer {} at {}: it speaks protocol version {}, this node speaks {}",
              sanitize_peer_text(source.node),
              sanitize_peer_text(envelope.getSourceAddress().cStr()), theirs, ours);
  if (envelope.getBody().which() != wire::Envelope::Body::HELLO) return;
  learn_client(source.node, from.address);
  ActorName self{node_, "node", ""};
  (void)send(self, source, envelope.getCorrelationId(), [&](wire::Envelope::Builder b) {
    auto ack = b.getBody().initHelloAck();
    ack.setAccepted(false);
    ack.setProtocolVersion(ours);
    ack.setNodeName(node_);
    ack.setIncarnation(incarnation_);
    ack.setReason("protocol version " + std::to_string(theirs) + " refused; this node speaks " +
                  std::to_string(ours));
  });
}

void Bridge::deliver(std::shared_ptr<messages::Frame> frame,
                     std::shared_ptr<const PeerIdentity> from) {
  auto envelope = frame->envelope();
  ActorName source = messages::get_name(envelope.getSource());
  ActorName destination = messages::get_name(envelope.getDestination());
  if (!messages::sender_allowed(envelope.getBody().which(), source.role, destination.role,
                                from->peer_class == PeerClass::client)) {
    counters_.protocol_refused.fetch_add(1, std::memory_order_relaxed);
    warn_limited("refused a message of kind " +
                 std::to_string(static_cast<int>(envelope.getBody().which())) + " from " +
                 sanitize_peer_text(source.to_string()) + " to " +
                 sanitize_peer_text(destination.to_string()) + ": not something it sends");
    return;
  }
  learn_client(source.node, from->address);  // where its session answers, not what it says
  caf::actor target;
  {
    std::shared_lock lock(mu_);
    if (destination.node == node_) {
      if (auto it = actors_.find(destination); it != actors_.end()) target = it->second;
    }
  }
  if (!target) {
    counters_.frames_unroutable.fetch_add(1, std::memory_order_relaxed);
    warn_limited("no actor " + sanitize_peer_text(destination.to_string()) +
                 " for a frame from " + sanitize_peer_text(source.to_string()));
    return;
  }
  caf::anon_send(target, InboundFrame{std::move(frame), std::move(from)});
}

}  // namespace tandem::runtime
