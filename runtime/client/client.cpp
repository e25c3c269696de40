#include "runtime/client/client.hpp"

#include <unistd.h>

#include <algorithm>
#include <random>

#include "runtime/node/credentials.hpp"

namespace tandem::runtime {

using messages::ActorName;

std::string default_client_bind(const config::Manifest& manifest) {
  for (const auto& node : manifest.nodes) {
    if (node.host.rfind("127.", 0) == 0 || node.host == "localhost") return "127.0.0.1";
  }
  return "";
}

ClusterClient::ClusterClient(const config::Manifest& manifest, std::string name)
    : manifest_(manifest), name_(std::move(name)) {}

ClusterClient::~ClusterClient() { fabric_.reset(); }

Result<std::unique_ptr<ClusterClient>> ClusterClient::connect(const config::Manifest& manifest,
                                                              const std::string& bind_host,
                                                              const std::string& token_file) {
  std::random_device rd;
  std::string name = "client-" + std::to_string(getpid()) + "-" + std::to_string(rd() % 100000);
  auto client = std::make_unique<ClusterClient>(manifest, name);
  FabricOptions options;
  options.provider = manifest.fabric.provider;
  options.host = bind_host;
  options.port = 0;
  options.frame_bytes_max = manifest.fabric.frame_bytes_max;
  options.recv_buffers = 8;
  options.spin_us = manifest.fabric.spin_us;
  auto channel = client_channel(manifest, name, token_file);
  if (!channel.ok()) return channel.error();
  options.channel = std::move(channel).value();
  ClusterClient* raw = client.get();
  auto fabric = open_fabric(options, [raw](std::span<const std::byte> b, const PeerRef& from) {
    raw->on_frame(b, from);
  });
  if (!fabric.ok()) return fabric.error();
  client->fabric_ = std::move(fabric).value();
  return client;
}

void ClusterClient::on_frame(std::span<const std::byte> bytes, const PeerRef& from) {
  if (from == nullptr) return;
  auto decoded = messages::decode_frame(bytes, manifest_.fabric.frame_bytes_max);
  if (!decoded.ok()) return;
  auto frame = std::make_shared<messages::Frame>(std::move(decoded).value());
  if (std::string_view(frame->envelope().getSource().getNode().cStr()) != from->name) return;
  uint64_t correlation = frame->envelope().getCorrelationId();
  std::lock_guard lock(mu_);
  if (!awaited_.count(correlation)) return;
  replies_[correlation] = std::move(frame);
  cv_.notify_all();
}

Result<std::string> ClusterClient::address_of(const std::string& node) const {
  const config::Node* n = manifest_.find_node(node);
  if (n == nullptr) return make_error(ErrorKind::not_found, "no node named '" + node + "'");
  return n->host + ":" + std::to_string(n->fabric_port);
}

Result<std::shared_ptr<messages::Frame>> ClusterClient::call(
    const ActorName& to, const std::function<void(wire::Envelope::Builder)>& fill,
    std::chrono::milliseconds timeout) {
  auto address = address_of(to.node);
  if (!address.ok()) return address.error();
  auto peer = fabric_->peer(*address);
  if (!peer.ok()) return peer.error();
  uint64_t correlation = 0;
  {
    std::lock_guard lock(mu_);
    if (awaited_.size() >= pending_max) {
      return make_error(ErrorKind::overloaded, "too many calls in flight");
    }
    correlation = next_correlation_++;
    awaited_[correlation] = true;
  }
  capnp::MallocMessageBuilder message;
  auto envelope = message.initRoot<wire::Envelope>();
  envelope.setProtocolVersion(manifest_.cluster.protocol_version);
  messages::set_name(envelope.initSource(), {name_, "client", ""});
  messages::set_name(envelope.initDestination(), to);
  envelope.setSourceAddress(fabric_->address());
  envelope.setCorrelationId(correlation);
  fill(envelope);
  auto words = messages::encode_frame(message);
  auto bytes = messages::frame_span(words);
  auto before = fabric_->session_info(*peer);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  Status sent = fabric_->send(*peer, bytes);
  std::unique_lock lock(mu_);
  auto answered = [&] { return replies_.count(correlation) > 0; };
  bool got = sent.ok() && cv_.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() +
                                                                      probe_after(timeout)),
                                         answered);
  if (sent.ok() && !got && before.session_id != 0) {
    // No answer yet: a new handshake tells whether the node restarted (a new incarnation; it
    // never saw the request, which went on a session it no longer has) or is only slow.
    lock.unlock();
    (void)fabric_->refresh_session(*peer);
    lock.lock();
    FabricEndpoint::SessionInfo now{};
    while (!got && std::chrono::steady_clock::now() < deadline) {
      got = cv_.wait_for(lock, std::chrono::milliseconds(10), answered);
      lock.unlock();
      now = fabric_->session_info(*peer);
      lock.lock();
      if (now.session_id != before.session_id) break;
    }
    if (!got && now.session_id != before.session_id &&
        now.peer_incarnation != before.peer_incarnation) {
      lock.unlock();
      sent = fabric_->send(*peer, bytes);
      lock.lock();
    }
    if (!got && sent.ok()) got = cv_.wait_until(lock, deadline, answered);
  }
  awaited_.erase(correlation);
  if (!sent.ok()) return sent.error();
  if (!got) {
    // A peer that stays silent may hold a broken connection; start fresh next time.
    fabric_->reset_peer(*address);
    return make_error(ErrorKind::timed_out, to.to_string() + " did not answer within " +
                                                std::to_string(timeout.count()) + " ms");
  }
  auto frame = std::move(replies_[correlation]);
  replies_.erase(correlation);
  return frame;
}

std::chrono::milliseconds ClusterClient::probe_after(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 4, std::chrono::milliseconds(100), std::chrono::milliseconds(500));
}

Result<AdminAnswer> ClusterClient::admin(const std::string& node, const std::string& command,
                                         const std::vector<std::string>& args,
                                         std::chrono::milliseconds timeout) {
  auto reply = call({node, "node", ""}, [&](wire::Envelope::Builder b) {
    auto request = b.getBody().initAdminRequest();
    request.setCommand(command);
    auto list = request.initArgs(args.size());
    for (size_t i = 0; i < args.size(); ++i) list.set(i, args[i]);
  }, timeout);
  if (!reply.ok()) return reply.error();
  auto envelope = (*reply)->envelope();
  if (envelope.getBody().which() != wire::Envelope::Body::ADMIN_REPLY) {
    return make_error(ErrorKind::failed, "node " + node + " answered with an unexpected message");
  }
  auto body = envelope.getBody().getAdminReply();
  AdminAnswer answer{body.getOk(), body.getText(), {}, node};
  for (auto row : body.getRows()) {
    std::vector<std::string> cells;
    for (auto cell : row) cells.emplace_back(cell);
    answer.rows.push_back(std::move(cells));
  }
  return answer;
}

Result<AdminAnswer> ClusterClient::admin_any(const std::string& command,
                                             std::chrono::milliseconds timeout) {
  Error last = make_error(ErrorKind::not_found, "the manifest has no nodes");
  for (const auto& node : manifest_.nodes) {
    auto answer = admin(node.name, command, {}, timeout);
    if (answer.ok()) return answer;
    last = answer.error();
  }
  return make_error(last.kind, "no node answered; last: " + last.message);
}

Result<std::chrono::nanoseconds> ClusterClient::ping(const ActorName& to,
                                                     std::chrono::milliseconds timeout,
                                                     size_t payload_bytes) {
  auto start = std::chrono::steady_clock::now();
  std::vector<uint8_t> payload(payload_bytes, 0x5a);
  auto reply = call(to, [&](wire::Envelope::Builder b) {
    auto ping = b.getBody().initPing();
    ping.setNonce(42);
    ping.setSentMonoNs(start.time_since_epoch().count());
    if (payload_bytes) ping.setPayload(kj::arrayPtr(payload.data(), payload.size()));
  }, timeout);
  if (!reply.ok()) return reply.error();
  if ((*reply)->envelope().getBody().which() != wire::Envelope::Body::PONG) {
    return make_error(ErrorKind::failed, to.to_string() + " answered a ping with something else");
  }
  return std::chrono::steady_clock::now() - start;
}

Status ClusterClient::send_raw(const std::string& address, std::vector<std::byte> bytes) {
  auto peer = fabric_->peer(address);
  if (!peer.ok()) return peer.error();
  return fabric_->send(*peer, std::move(bytes));
}

}  // namespace tandem::runtime
