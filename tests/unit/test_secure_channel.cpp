// The fabric's authenticated channel as a pure state machine: handshakes, sealing, and every
// way a stranger, a replay or a tampered frame is refused (runtime/fabric/secure_channel.hpp).
#include <doctest.h>

#include <cstring>
#include <map>

#include "runtime/fabric/secure_channel.hpp"

using namespace tandem;
using namespace tandem::runtime;
using namespace std::chrono_literals;
using Kind = SecureChannel::Received::Kind;

namespace {

ChannelKey key_of(char fill, KeyRole role = KeyRole::cluster) {
  return ChannelKey{role, std::vector<uint8_t>(40, static_cast<uint8_t>(fill))};
}

// A tiny cluster: node name -> address. Nodes are admitted only at their address; clients
// under any other name at the address they give.
struct Directory {
  std::map<std::string, std::string> nodes = {{"alpha", "10.0.0.1:7000"},
                                              {"beta", "10.0.0.2:7000"},
                                              {"gamma", "10.0.0.3:7000"}};
  Result<std::string> admit(const PeerClaim& c, const std::string& self) const {
    auto it = nodes.find(c.name);
    bool self_is_client = !nodes.count(self);
    if (c.peer_class == PeerClass::node) {
      // A node answering a client proves whichever key the client connected with.
      bool key_ok = c.key_role == KeyRole::cluster || self_is_client;
      if (it == nodes.end() || c.name == self || !key_ok) {
        return make_error(ErrorKind::invalid, "not a node");
      }
      return it->second;
    }
    if (it != nodes.end()) return make_error(ErrorKind::invalid, "a client under a node's name");
    return c.address;
  }
};

std::unique_ptr<SecureChannel> channel(const Directory& dir, const std::string& name,
                                       std::vector<ChannelKey> keys,
                                       PeerClass cls = PeerClass::node,
                                       std::string cluster = "test-cluster",
                                       uint32_t pending_max = 256) {
  ChannelConfig c;
  c.cluster = std::move(cluster);
  c.self_name = name;
  c.self_class = cls;
  c.self_address = dir.nodes.count(name) ? dir.nodes.at(name) : "10.0.0.9:4000";
  c.keys = std::move(keys);
  c.pending_max = pending_max;
  c.sessions_per_peer_max = 3;
  c.admit = [&dir, name](const PeerClaim& claim) { return dir.admit(claim, name); };
  return std::make_unique<SecureChannel>(std::move(c));
}

auto t0 = ChannelClock::now();

std::vector<std::byte> bytes(std::string_view text) {
  std::vector<std::byte> out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

std::string text(std::span<const std::byte> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

// Runs the three-message handshake from `a` to `b` (at `b_address`); true when both ends
// have a session.
bool handshake(SecureChannel& a, SecureChannel& b, const std::string& b_address) {
  auto init = a.initiate(b_address, t0, 250ms);
  if (init.empty()) return false;
  auto resp = b.on_frame(init, t0);
  if (resp.kind != Kind::handshake || resp.reply.empty()) return false;
  auto confirm = a.on_frame(resp.reply, t0);
  if (confirm.kind != Kind::handshake || confirm.established_address != b_address) return false;
  auto done = b.on_frame(confirm.reply, t0);
  return done.kind == Kind::handshake && !done.established_address.empty();
}

SecureChannel::Received open(SecureChannel& c, std::vector<std::byte>& frame) {
  return c.on_frame(frame, t0);
}

SecureChannel::Received feed(SecureChannel& c, std::vector<std::byte> frame) {
  return c.on_frame(frame, t0);
}

}  // namespace

TEST_CASE("two nodes with the cluster key handshake, then exchange sealed frames both ways") {
  Directory dir;
  auto alpha = channel(dir, "alpha", {key_of('k')});
  auto beta = channel(dir, "beta", {key_of('k')});
  REQUIRE(handshake(*alpha, *beta, dir.nodes["beta"]));
  auto a_to_b = alpha->session_for(dir.nodes["beta"]);
  auto b_to_a = beta->session_for(dir.nodes["alpha"]);
  REQUIRE(a_to_b);
  REQUIRE(b_to_a);
  CHECK(SecureChannel::peer_of(*a_to_b).name == "beta");
  CHECK(SecureChannel::peer_of(*b_to_a).name == "alpha");
  CHECK(SecureChannel::peer_of(*b_to_a).peer_class == PeerClass::node);
  CHECK(SecureChannel::peer_of(*b_to_a).key_role == KeyRole::cluster);
  CHECK(SecureChannel::peer_of(*b_to_a).incarnation == alpha->config().incarnation);
  CHECK(SecureChannel::peer_of(*a_to_b).incarnation == beta->config().incarnation);

  auto sealed = SecureChannel::seal(*a_to_b, Lane::data, bytes("route this request"));
  CHECK(sealed.size() == std::string("route this request").size() + SecureChannel::overhead_bytes);
  // The prompt text is not on the wire.
  CHECK(text(sealed).find("route this") == std::string::npos);
  auto got = open(*beta, sealed);
  REQUIRE(got.kind == Kind::data);
  CHECK(text(got.plaintext) == "route this request");
  CHECK(got.from->name == "alpha");
  auto back = SecureChannel::seal(*b_to_a, Lane::control, bytes("heartbeat"));
  auto got_back = open(*alpha, back);
  REQUIRE(got_back.kind == Kind::data);
  CHECK(text(got_back.plaintext) == "heartbeat");
  CHECK(alpha->pending_count() == 0);
  CHECK(beta->pending_count() == 0);
}

TEST_CASE("a stranger without the key gets nothing: no answer, no state, every frame dropped") {
  Directory dir;
  auto beta = channel(dir, "beta", {key_of('k')});
  SUBCASE("an INIT under another key") {
    auto stranger = channel(dir, "alpha", {key_of('x')});
    auto init = stranger->initiate(dir.nodes["beta"], t0, 250ms);
    auto r = beta->on_frame(init, t0);
    CHECK(r.kind == Kind::dropped);
    CHECK(r.reason == ChannelDrop::unknown_key);
    CHECK(r.reply.empty());
    CHECK(beta->pending_count() == 0);
  }
  SUBCASE("an INIT that forges the right key id but not the MAC") {
    auto stranger = channel(dir, "alpha", {key_of('x')});
    auto init = stranger->initiate(dir.nodes["beta"], t0, 250ms);
    uint32_t real = key_of('k').id();
    std::memcpy(init.data() + 4, &real, 4);  // little-endian on this machine
    auto r = beta->on_frame(init, t0);
    CHECK(r.reason == ChannelDrop::bad_mac);
    CHECK(beta->pending_count() == 0);
  }
  SUBCASE("the same key under another cluster name") {
    auto other = channel(dir, "alpha", {key_of('k')}, PeerClass::node, "other-cluster");
    auto r = feed(*beta, other->initiate(dir.nodes["beta"], t0, 250ms));
    CHECK(r.reason == ChannelDrop::bad_mac);
  }
  SUBCASE("garbage, a plaintext frame, truncated handshakes, a sealed frame for no session") {
    std::vector<std::byte> junk = bytes("\x10\x00\x00\x00garbage of some length here........");
    CHECK(beta->on_frame(junk, t0).reason == ChannelDrop::not_sealed);
    std::vector<std::byte> empty;
    CHECK(beta->on_frame(empty, t0).reason == ChannelDrop::not_sealed);
    auto alpha = channel(dir, "alpha", {key_of('k')});
    auto init = alpha->initiate(dir.nodes["beta"], t0, 250ms);
    for (size_t cut = 4; cut < init.size(); cut += 7) {
      std::vector<std::byte> part(init.begin(), init.begin() + cut);
      CHECK(beta->on_frame(part, t0).reason == ChannelDrop::malformed);
    }
    std::vector<std::byte> sealed = bytes(std::string("TD\x01\x11", 4) + std::string(40, 'z'));
    CHECK(beta->on_frame(sealed, t0).reason == ChannelDrop::unknown_session);
    CHECK(beta->pending_count() == 0);
  }
}

TEST_CASE("tampered, replayed and reordered sealed frames are refused; lanes count apart") {
  Directory dir;
  auto alpha = channel(dir, "alpha", {key_of('k')});
  auto beta = channel(dir, "beta", {key_of('k')});
  REQUIRE(handshake(*alpha, *beta, dir.nodes["beta"]));
  auto s = alpha->session_for(dir.nodes["beta"]);
  auto one = SecureChannel::seal(*s, Lane::data, bytes("one"));
  auto two = SecureChannel::seal(*s, Lane::data, bytes("two"));
  auto control = SecureChannel::seal(*s, Lane::control, bytes("control"));
  SUBCASE("a flipped bit anywhere: header, body or tag") {
    for (size_t at : {size_t{5}, size_t{13}, SecureChannel::header_bytes, one.size() - 1}) {
      auto bad = one;
      bad[at] ^= std::byte{0x01};
      auto r = open(*beta, bad);
      CHECK(r.kind == Kind::dropped);
      CHECK((r.reason == ChannelDrop::bad_tag || r.reason == ChannelDrop::unknown_session));
    }
    auto good = one;  // the original still opens: a failed open changes nothing
    CHECK(open(*beta, good).kind == Kind::data);
  }
  SUBCASE("a replay, and an older frame after a newer one") {
    auto copy = two;
    CHECK(open(*beta, two).kind == Kind::data);
    CHECK(open(*beta, copy).reason == ChannelDrop::replayed);
    CHECK(open(*beta, one).reason == ChannelDrop::replayed);
    // The control lane has its own sequence: a control frame sealed after both data frames
    // but sent ahead of queued data (as the endpoint does) still opens.
    CHECK(open(*beta, control).kind == Kind::data);
  }
  SUBCASE("a frame sealed for one peer does not open at another") {
    auto gamma = channel(dir, "gamma", {key_of('k')});
    REQUIRE(handshake(*alpha, *gamma, dir.nodes["gamma"]));
    CHECK(open(*gamma, one).kind == Kind::dropped);
  }
}

TEST_CASE("handshake replays: a replayed CONFIRM or RESP makes no session, a replayed INIT none") {
  Directory dir;
  auto alpha = channel(dir, "alpha", {key_of('k')});
  auto beta = channel(dir, "beta", {key_of('k')});
  auto init = alpha->initiate(dir.nodes["beta"], t0, 250ms);
  auto init_copy = init;
  auto resp = beta->on_frame(init, t0);
  auto resp_copy = resp.reply;
  auto confirm = alpha->on_frame(resp.reply, t0);
  auto confirm_copy = confirm.reply;
  REQUIRE(beta->on_frame(confirm.reply, t0).established_address == dir.nodes["alpha"]);
  CHECK(beta->sessions_count() == 1);
  CHECK(beta->on_frame(confirm_copy, t0).reason == ChannelDrop::stale);
  CHECK(alpha->on_frame(resp_copy, t0).reason == ChannelDrop::stale);
  CHECK(alpha->sessions_count() == 1);
  // A replayed INIT is answered (its MAC holds) but only to alpha's own address, and alpha,
  // which started no such handshake, drops the answer; beta's half-made state expires.
  auto again = beta->on_frame(init_copy, t0);
  CHECK(again.reply_address == dir.nodes["alpha"]);
  CHECK(alpha->on_frame(again.reply, t0).reason == ChannelDrop::stale);
  CHECK(beta->pending_count() == 1);
  beta->expire(t0 + 6s);
  CHECK(beta->pending_count() == 0);
  CHECK(beta->sessions_count() == 1);
}

TEST_CASE("identity: names are the manifest's, at the manifest's addresses") {
  Directory dir;
  auto beta = channel(dir, "beta", {key_of('k')});
  SUBCASE("a key holder claiming to be alpha is answered at alpha's address only") {
    auto impostor = channel(dir, "alpha", {key_of('k')});
    ChannelConfig c = impostor->config();
    auto r = feed(*beta, impostor->initiate(dir.nodes["beta"], t0, 250ms));
    CHECK(r.kind == Kind::handshake);
    CHECK(r.reply_address == dir.nodes["alpha"]);  // where the real alpha is, not the impostor
  }
  SUBCASE("a node name the manifest does not have, a client under a node's name") {
    auto unknown = channel(dir, "delta", {key_of('k')});
    CHECK(feed(*beta, unknown->initiate(dir.nodes["beta"], t0, 250ms)).reason ==
          ChannelDrop::refused);
    auto client = channel(dir, "gamma", {key_of('k')}, PeerClass::client);
    CHECK(feed(*beta, client->initiate(dir.nodes["beta"], t0, 250ms)).reason ==
          ChannelDrop::refused);
  }
  SUBCASE("the admin token makes a client, never a node") {
    auto node_with_token = channel(dir, "alpha", {key_of('t', KeyRole::admin)});
    auto beta2 = channel(dir, "beta", {key_of('k'), key_of('t', KeyRole::admin)});
    CHECK(feed(*beta2, node_with_token->initiate(dir.nodes["beta"], t0, 250ms)).reason ==
          ChannelDrop::refused);
    auto shell = channel(dir, "shell-1", {key_of('t', KeyRole::admin)}, PeerClass::client);
    REQUIRE(handshake(*shell, *beta2, dir.nodes["beta"]));
    auto s = beta2->session_for("10.0.0.9:4000");
    REQUIRE(s);
    CHECK(SecureChannel::peer_of(*s).key_role == KeyRole::admin);
    CHECK(SecureChannel::peer_of(*s).peer_class == PeerClass::client);
  }
  SUBCASE("the initiator refuses a responder that is not who lives at the address it called") {
    auto alpha = channel(dir, "alpha", {key_of('k')});
    auto gamma = channel(dir, "gamma", {key_of('k')});
    auto init = alpha->initiate(dir.nodes["beta"], t0, 250ms);  // beta's address, gamma answers
    auto resp = gamma->on_frame(init, t0);
    REQUIRE(resp.kind == Kind::handshake);
    CHECK(alpha->on_frame(resp.reply, t0).reason == ChannelDrop::refused);
    CHECK(alpha->sessions_count() == 0);
  }
}

TEST_CASE("rotation: every accepted key works, the first is the one a node connects with") {
  Directory dir;
  auto beta = channel(dir, "beta", {key_of('n'), key_of('o')});
  auto old_alpha = channel(dir, "alpha", {key_of('o')});
  auto new_gamma = channel(dir, "gamma", {key_of('n'), key_of('o')});
  CHECK(handshake(*old_alpha, *beta, dir.nodes["beta"]));
  CHECK(handshake(*new_gamma, *beta, dir.nodes["beta"]));
  CHECK(SecureChannel::peer_of(*beta->session_for(dir.nodes["gamma"])).key_id == key_of('n').id());
  CHECK(SecureChannel::peer_of(*beta->session_for(dir.nodes["alpha"])).key_id == key_of('o').id());
  CHECK(key_of('n').id() != key_of('o').id());
  auto retired = channel(dir, "alpha", {key_of('r')});
  CHECK(feed(*beta, retired->initiate(dir.nodes["beta"], t0, 250ms)).reason ==
        ChannelDrop::unknown_key);
}

TEST_CASE("bounds: handshakes in progress, sessions per peer; a restart keeps the newest") {
  Directory dir;
  SUBCASE("a flood of authentic INITs keeps at most pending_max half-made handshakes") {
    auto beta = channel(dir, "beta", {key_of('k')}, PeerClass::node, "test-cluster", 8);
    auto alpha = channel(dir, "alpha", {key_of('k')});
    for (int i = 0; i < 50; ++i) {
      auto init = alpha->initiate("10.0.0.2:7000", t0, 0ms);
      CHECK(beta->on_frame(init, t0).kind == Kind::handshake);
      alpha->reset_peer("10.0.0.2:7000");  // forget it, so the next INIT is a new one
    }
    CHECK(beta->pending_count() == 8);
  }
  SUBCASE("sessions per peer; reset_peer keeps only the newest") {
    auto alpha = channel(dir, "alpha", {key_of('k')});
    auto beta = channel(dir, "beta", {key_of('k')});
    for (int i = 0; i < 5; ++i) REQUIRE(handshake(*alpha, *beta, dir.nodes["beta"]));
    CHECK(alpha->sessions_count() == 3);
    CHECK(beta->sessions_count() == 3);
    auto newest = alpha->session_for(dir.nodes["beta"]);
    alpha->reset_peer(dir.nodes["beta"]);
    CHECK(alpha->sessions_count() == 1);
    CHECK(alpha->session_for(dir.nodes["beta"]) == newest);
  }
  SUBCASE("an unanswered INIT is resent as it was, then times out") {
    auto alpha = channel(dir, "alpha", {key_of('k')});
    auto first = alpha->initiate(dir.nodes["beta"], t0, 250ms);
    CHECK(alpha->initiate(dir.nodes["beta"], t0 + 100ms, 250ms).empty());
    CHECK(alpha->initiate(dir.nodes["beta"], t0 + 300ms, 250ms) == first);
    CHECK(alpha->expire(t0 + 4s).empty());
    auto timed_out = alpha->expire(t0 + 5s);
    REQUIRE(timed_out.size() == 1);
    CHECK(timed_out[0] == dir.nodes["beta"]);
    CHECK_FALSE(alpha->initiating(dir.nodes["beta"]));
  }
}

TEST_CASE("text from a peer is sanitised before a log line") {
  CHECK(sanitize_peer_text("decode\nFORGED LINE\r\x1b[31m") == "decode?FORGED LINE??[31m");
  CHECK(sanitize_peer_text(std::string(300, 'a')).size() == 128 + 3);
  CHECK(sanitize_peer_text("caf\xc3\xa9") == "caf??");
}
