// The Bridge connects a node's actors to the cluster: naming, sending and receiving.
//
// Naming: every actor has a cluster-wide name node/role/instance. send() takes a name and
// works the same for local and remote destinations: a local destination gets the encoded
// frame in its mailbox directly; a remote one gets it over the fabric. Replies to clients
// (the admin shell) find them through the address carried in their envelopes.
//
// Trust: the fabric is an authenticated channel (runtime/fabric/secure_channel.hpp) keyed by
// the cluster key (runtime/node/credentials.hpp); frames from anyone who has not proved it
// are dropped before they are parsed. A frame's sender is the peer its session authenticated:
// its envelope's source node must be that peer's name (else dropped, counted), and what it
// sends must be what its role sends to the destination's (messages/senders.hpp): a client,
// with the cluster key or the admin token, sends only hellos, pings and admin requests.
//
// Threads: all public methods are thread-safe (called from actor handlers and from the
// fabric progress thread). Frames for this node are validated, version-checked and delivered
// to the destination actor's mailbox as InboundFrame; malformed, truncated, oversized and
// unroutable frames are dropped, logged (rate-limited) and counted — never a crash.
#pragma once

#include <caf/actor.hpp>

#include <array>
#include <functional>
#include <chrono>
#include <map>
#include <mutex>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include "config/manifest.hpp"
#include "messages/envelope.hpp"
#include "runtime/fabric/endpoint.hpp"

namespace spdlog {
class logger;
}

namespace tandem::runtime {

struct BridgeCounters {
  std::atomic<uint64_t> frames_malformed{0};      // failed decode_frame
  std::atomic<uint64_t> frames_version_refused{0};
  std::atomic<uint64_t> frames_unroutable{0};     // no such actor here / not for this node
  std::atomic<uint64_t> frames_local{0};          // delivered without the fabric
  std::atomic<uint64_t> sends_failed{0};
  std::atomic<uint64_t> frames_before_ready{0};
  std::atomic<uint64_t> kv_events_dropped{0};     // TEST HOOK drop_next_kv_events
  // Frames the channel refused, by reason (ChannelDrop), and authenticated frames refused:
  // a source name that is not the sender's, a kind its sender's role does not send there.
  std::array<std::atomic<uint64_t>, static_cast<size_t>(ChannelDrop::kinds_count)> auth_failures{};
  std::atomic<uint64_t> identity_mismatch{0};
  std::atomic<uint64_t> protocol_refused{0};  // a kind its sender's role never sends there
};

class Bridge {
 public:
  using Fill = std::function<void(wire::Envelope::Builder)>;

  // `manifest` and `log` outlive the bridge. `node` must be a manifest node (asserted).
  Bridge(const config::Manifest& manifest, std::string node, uint64_t incarnation,
         std::shared_ptr<spdlog::logger> log);
  ~Bridge();

  // Opens the fabric endpoint on the node's host:fabric_port. Error names the address.
  Status start();
  void stop();  // stops the fabric; later sends fail with disconnected
  // Frames are delivered only after set_ready() (every local actor registered); earlier ones
  // are dropped and counted (peers retry: hellos and heartbeats repeat).
  void set_ready();

  void register_actor(const messages::ActorName& name, caf::actor actor);
  // Forgets a registered actor (it died): a supervisor then registers its replacement.
  void unregister_actor(const messages::ActorName& name);
  std::vector<messages::ActorName> local_actors() const;
  // The registered local actors of one role ("kv-offload"), by name.
  std::vector<std::pair<messages::ActorName, caf::actor>> local_actors_with_role(
      const std::string& role) const;

  // Sends one envelope. `fill` sets the body (and may read nothing else). Errors:
  // not_found (unknown node), overloaded (peer queue full), disconnected (stopped).
  Status send(const messages::ActorName& from, const messages::ActorName& to,
              uint64_t correlation_id, const Fill& fill);

  // Forget connection state for a node that restarted or went down.
  void reset_peer(const std::string& node);

  // TEST HOOK (`debug-drop-kv-events`, nodes run with --test-hooks): the next `frames`
  // numbered KvEvents envelopes of `tier` (2: tier 2; 1: device caches) this node sends (not
  // keepalives) are lost, as a network would lose them (send() reports success). Lets a test
  // show that the router finds the gap and resyncs.
  void drop_next_kv_events(uint32_t frames, uint8_t tier = 2) {
    drop_kv_tier_.store(tier);
    drop_kv_events_.store(frames);
  }

  const std::string& node() const { return node_; }
  uint64_t incarnation() const { return incarnation_; }
  std::string address() const;
  FabricEndpoint* fabric() { return fabric_.get(); }
  const BridgeCounters& counters() const { return counters_; }
  // "host:port" of a manifest node or a client heard from. Error not_found otherwise.
  Result<std::string> address_of(const std::string& node) const;

  static constexpr size_t clients_max = 1024;  // remembered client addresses (LRU-ish)

 private:
  void on_frame(std::span<const std::byte> bytes, const PeerRef& from);
  void on_auth_drop(ChannelDrop why, const std::string& peer_hint);
  void deliver(std::shared_ptr<messages::Frame> frame, std::shared_ptr<const PeerIdentity> from);
  Result<std::string> address_of_locked(const std::string& node) const;  // mu_ held
  void learn_client(const std::string& node, const std::string& address);
  void refuse_version(messages::Frame& frame, const PeerIdentity& from);
  void warn_limited(const std::string& what);

  const config::Manifest& manifest_;
  std::string node_;
  uint64_t incarnation_;
  std::shared_ptr<spdlog::logger> log_;
  std::unique_ptr<FabricEndpoint> fabric_;
  mutable std::shared_mutex mu_;
  std::map<messages::ActorName, caf::actor> actors_;
  std::map<std::string, std::string> client_addresses_;
  std::vector<std::string> client_order_;
  std::atomic<uint64_t> warnings_{0};
  // Auth failures logged once per (peer, reason) and interval: when each was last logged and
  // how many were not logged since. Bounded (auth_log_max).
  struct AuthLog {
    std::chrono::steady_clock::time_point logged;
    uint64_t suppressed = 0;
  };
  std::mutex auth_log_mu_;
  std::map<std::string, AuthLog> auth_log_;
  static constexpr size_t auth_log_max = 1024;
  static constexpr std::chrono::seconds auth_log_interval{10};
  std::atomic<bool> ready_{false};
  std::atomic<uint8_t> drop_kv_tier_{2};
  std::atomic<uint32_t> drop_kv_events_{0};
  BridgeCounters counters_;
};

}  // namespace tandem::runtime
