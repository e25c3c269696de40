// The fabric's authenticated, private channel: who may speak to a node, and sealing every
// frame they exchange.
//
// Every peer proves at connect that it holds a key the cluster accepts (the cluster key, or
// the admin token for an admin client), by a mutual challenge-response over fresh nonces:
//
//   initiator -> responder  INIT     key id, initiator session id, nonce_i, class,
//                                    incarnation, name, address,
//                                    MAC_K("init" | cluster | INIT)
//   responder -> initiator  RESP     key id, both session ids, nonce_r, class, incarnation,
//                                    name, MAC_K("resp" | cluster | INIT | RESP)
//   initiator -> responder  CONFIRM  both session ids, MAC_K("confirm" | cluster | INIT | RESP
//                                    | CONFIRM)
//
// (MAC: HMAC-SHA-256; K: the key named by its id.) Both sides then derive per-direction
// session keys from K and the whole transcript, and every later frame is sealed with
// ChaCha20-Poly1305: a 36-byte header + tag around the Cap'n Proto frame, the nonce the
// direction's sequence number on one of two lanes (control, data). Open refuses a frame whose
// tag fails or whose sequence number is not above the last one seen on its lane (replays and
// reorders; the endpoint asks the provider for send-after-send ordering, so a peer's frames
// arrive in the order it sealed them).
//
// A frame that fails any check is dropped before anything is parsed or allocated for it: an
// INIT is only MAC-checked (nothing is kept), and state is kept only for an INIT whose MAC
// holds (bounded: pending_max, oldest dropped). The cluster name is in every MAC, so a
// key shared by two clusters still keeps them apart. Nothing a stranger sends is answered.
//
// Identity: a peer's name and class are the ones it authenticated with; `admit` decides
// whether that name may connect, and where it is answered (a manifest node only at its
// manifest address: a holder of the key who claims another node's name at another address
// never completes the handshake, because the RESP goes to the real node). The frames of a
// session carry that identity; a name inside a frame is checked against it by the caller.
//
// Thread-safety: every method may be called from any thread. on_frame and the handshake calls
// take the channel's mutex briefly; seal() takes only its session's lock; open (inside
// on_frame) runs the AEAD outside the channel's mutex on one thread at a time per session
// (the fabric's progress thread).
//
// Costs: seal/open ~ one ChaCha20-Poly1305 pass over the frame (a few GB/s on one core);
// a handshake: a few HMACs.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/base/result.hpp"

namespace tandem::runtime {

using ChannelClock = std::chrono::steady_clock;

enum class PeerClass : uint8_t { node = 1, client = 2 };
// What a key lets its holder do: `cluster` everything a member may; `admin` only the admin
// plane (admin commands and pings to node actors), as a client.
enum class KeyRole : uint8_t { cluster = 1, admin = 2 };
std::string_view to_string(PeerClass c);
std::string_view to_string(KeyRole r);

inline constexpr size_t channel_key_bytes_min = 32;
inline constexpr size_t channel_key_bytes_max = 4096;

struct ChannelKey {
  KeyRole role = KeyRole::cluster;
  std::vector<uint8_t> secret;  // channel_key_bytes_min .. _max bytes
  // The key's id: the first 4 bytes of SHA-256("tandem key id" | secret), so peers name a
  // key without revealing it and two keys are told apart during a rotation.
  uint32_t id() const;
};

// Who is on the other end of a session, as authenticated.
struct PeerIdentity {
  std::string name;
  PeerClass peer_class = PeerClass::node;
  KeyRole key_role = KeyRole::cluster;
  uint32_t key_id = 0;
  std::string address;  // "host:port" its frames are answered at
  // The peer process's random incarnation: a new value means the peer restarted (and lost
  // every session it had), so a request sent before on an old session never arrived.
  uint64_t incarnation = 0;
};

using PeerRef = std::shared_ptr<const PeerIdentity>;

// What a peer claims in its handshake, for `admit` to decide on.
struct PeerClaim {
  std::string name;
  PeerClass peer_class = PeerClass::node;
  KeyRole key_role = KeyRole::cluster;
  std::string address;  // where it says it listens
};

enum class Lane : uint8_t { control = 0, data = 1 };

// Why a frame was dropped (tandem:fabric_auth_failures_total{reason}).
enum class ChannelDrop : uint8_t {
  not_sealed,       // not a channel frame (garbage, a plaintext envelope, a bad header)
  malformed,        // a handshake frame that does not parse
  unknown_key,      // a key id this node does not accept
  bad_mac,          // a handshake MAC that does not verify (wrong key, tampered)
  refused,          // `admit` said no (unknown node name, a client using a node's name, ...)
  stale,            // a RESP/CONFIRM for no handshake in progress (late, replayed)
  unknown_session,  // a sealed frame for no session here (a peer's old process, forged)
  bad_tag,          // a sealed frame whose AEAD tag fails (tampered, wrong session)
  replayed,         // a sealed frame whose sequence number is not above the last one seen
  kinds_count,
};
std::string_view to_string(ChannelDrop d);

struct ChannelConfig {
  std::string cluster;       // bound into every MAC
  std::string self_name;     // node or client name
  PeerClass self_class = PeerClass::node;
  std::string self_address;  // "host:port" this endpoint listens at (set before use)
  uint64_t incarnation = 0;  // this process's; 0: a random one is drawn
  // Keys accepted from peers; keys[0] is the one this side initiates with. Non-empty.
  std::vector<ChannelKey> keys;
  // Decides whether a claimed peer may connect and returns the address it is answered at
  // (for a node: its manifest address). On the initiating side the returned address must be
  // the one this side connected to. Empty function: every claim is refused (a pure client
  // accepts no INIT).
  std::function<Result<std::string>(const PeerClaim&)> admit;
  uint32_t pending_max = 256;            // handshakes in progress, each side
  uint32_t sessions_max = 4096;          // established sessions (oldest dropped beyond)
  uint32_t sessions_per_peer_max = 4;    // per peer name (a restart, a simultaneous open)
  std::chrono::milliseconds handshake_timeout{5000};
};

// One established session. Sealing is serialised per session (tx lock); opening is done by
// one thread at a time (the progress thread).
class ChannelSession;

class SecureChannel {
 public:
  static constexpr size_t header_bytes = 20;  // magic(2) version(1) type(1) session(8) seq(8)
  static constexpr size_t tag_bytes = 16;
  static constexpr size_t overhead_bytes = header_bytes + tag_bytes;
  static constexpr size_t handshake_bytes_max = 1024;

  explicit SecureChannel(ChannelConfig config);
  ~SecureChannel();
  SecureChannel(const SecureChannel&) = delete;
  SecureChannel& operator=(const SecureChannel&) = delete;

  void set_self_address(std::string address);
  const ChannelConfig& config() const { return config_; }

  // Starts (or continues) a handshake with the peer at `address`: returns the INIT to send,
  // or nothing when one is already in flight and younger than `resend_after` (then nothing
  // needs sending). The same INIT is resent until the handshake completes or times out.
  std::vector<std::byte> initiate(const std::string& address, ChannelClock::time_point now,
                                  std::chrono::milliseconds resend_after);
  bool initiating(const std::string& address) const;

  // What on_frame made of one received frame.
  struct Received {
    enum class Kind { data, handshake, dropped } kind = Kind::dropped;
    ChannelDrop reason = ChannelDrop::not_sealed;  // dropped
    std::string peer_hint;  // dropped: who the frame claimed to be from, sanitised ("" unknown)
    // data: the opened frame (decrypted in place, inside the caller's buffer) and its sender.
    std::span<const std::byte> plaintext;
    std::shared_ptr<const PeerIdentity> from;
    // handshake: a frame to send back unsealed to reply_address (RESP or CONFIRM), and/or a
    // session to established_address that became usable.
    std::string reply_address;
    std::vector<std::byte> reply;
    std::string established_address;
  };
  // Any frame received. `frame` may be modified (decrypted in place).
  Received on_frame(std::span<std::byte> frame, ChannelClock::time_point now);

  // The newest session with the peer at `address`, or null.
  std::shared_ptr<ChannelSession> session_for(const std::string& address) const;
  // Seals `plaintext` on `session` (its lane's next sequence number). Thread-safe.
  static std::vector<std::byte> seal(ChannelSession& session, Lane lane,
                                     std::span<const std::byte> plaintext);
  static const PeerIdentity& peer_of(const ChannelSession& session);
  static uint64_t id_of(const ChannelSession& session);  // this side's session id

  // The peer at `address` restarted or went down: handshakes in flight are forgotten and all
  // but its newest session (which a restarted peer made itself) are dropped.
  void reset_peer(const std::string& address);
  // Drops handshakes older than handshake_timeout; returns the addresses whose initiation
  // timed out (frames waiting for them should fail).
  std::vector<std::string> expire(ChannelClock::time_point now);

  size_t sessions_count() const;
  size_t pending_count() const;  // both sides' handshakes in progress

 private:
  struct Initiation;
  struct Response;
  Received on_init(std::span<const std::byte> frame, ChannelClock::time_point now);
  Received on_resp(std::span<const std::byte> frame, ChannelClock::time_point now);
  Received on_confirm(std::span<const std::byte> frame, ChannelClock::time_point now);
  Received open(std::span<std::byte> frame, uint8_t lane);
  const ChannelKey* key_by_id(uint32_t id) const;
  uint64_t fresh_session_id();  // mu_ held
  void add_session(std::shared_ptr<ChannelSession> session);  // mu_ held

  ChannelConfig config_;
  mutable std::mutex mu_;
  std::map<uint64_t, std::unique_ptr<Initiation>> initiations_;  // by our session id
  std::map<uint64_t, std::unique_ptr<Response>> responses_;      // by our session id
  std::unordered_map<uint64_t, std::shared_ptr<ChannelSession>> sessions_;  // by our id
  std::deque<uint64_t> session_order_;  // oldest first (ids may be gone already)
};

// Sanitises text from a peer before it reaches a log line: printable ASCII kept, anything
// else (newlines, control characters, non-ASCII bytes) becomes '?', at most `max_bytes`.
std::string sanitize_peer_text(std::string_view text, size_t max_bytes = 128);

}  // namespace tandem::runtime
