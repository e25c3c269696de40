// Fuzz target: a frame on the fabric port before anything else reads it: the authenticated
// channel (runtime/fabric/secure_channel.hpp) is the first parser of a stranger's bytes. Any
// input is a data frame, a handshake step or a drop, never a crash; a drop keeps nothing
// (handshakes in progress stay within pending_max, sessions within their bound); a frame that
// opens as data came from the one peer that holds a session (alpha).
// The first input byte picks the receiver (beta, which alpha handshook with, or alpha itself);
// the rest is the frame. Seeds: a valid INIT, RESP, CONFIRM and sealed frames of these keys.
//   libFuzzer: build-fuzz/tests/fuzz_channel (tests/fuzz/README.md)
//   here: build/tests/fuzz_channel_replay tests/fuzz/corpus/channel
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "runtime/fabric/secure_channel.hpp"

namespace {

using namespace tandem;
using namespace tandem::runtime;

void require(bool condition) {
  if (!condition) std::abort();
}

std::unique_ptr<SecureChannel> make(const char* name, const char* address, uint64_t incarnation) {
  ChannelConfig c;
  c.cluster = "fuzz";
  c.self_name = name;
  c.self_class = PeerClass::node;
  c.self_address = address;
  c.incarnation = incarnation;
  c.keys = {ChannelKey{KeyRole::cluster, std::vector<uint8_t>(32, 'k')},
            ChannelKey{KeyRole::admin, std::vector<uint8_t>(32, 't')}};
  c.pending_max = 16;
  c.sessions_max = 16;
  c.admit = [](const PeerClaim& claim) -> Result<std::string> {
    if (claim.peer_class == PeerClass::client) return claim.address;
    if (claim.name == "alpha") return std::string("10.0.0.1:7000");
    if (claim.name == "beta") return std::string("10.0.0.2:7000");
    return make_error(ErrorKind::invalid, "not a node");
  };
  return std::make_unique<SecureChannel>(std::move(c));
}

struct Pair {
  std::unique_ptr<SecureChannel> alpha = make("alpha", "10.0.0.1:7000", 1);
  std::unique_ptr<SecureChannel> beta = make("beta", "10.0.0.2:7000", 2);
  Pair() {  // one handshake, so that sealed frames have a session to name
    auto now = ChannelClock::time_point{};
    auto init = alpha->initiate("10.0.0.2:7000", now, std::chrono::milliseconds(0));
    auto resp = beta->on_frame(init, now);
    require(resp.kind == SecureChannel::Received::Kind::handshake);
    auto confirm = alpha->on_frame(resp.reply, now);
    require(!confirm.established_address.empty());
    auto done = beta->on_frame(confirm.reply, now);
    require(!done.established_address.empty());
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Pair pair;
  if (size == 0) return 0;
  SecureChannel& to = (data[0] & 1) ? *pair.alpha : *pair.beta;
  std::vector<std::byte> frame(size - 1);
  if (size > 1) std::memcpy(frame.data(), data + 1, size - 1);
  auto got = to.on_frame(frame, ChannelClock::time_point{});
  using Kind = SecureChannel::Received::Kind;
  if (got.kind == Kind::data) {
    require(got.from != nullptr);
    require(got.from->name == ((data[0] & 1) ? "beta" : "alpha"));
    require(got.plaintext.size() + SecureChannel::overhead_bytes == frame.size());
  }
  if (got.kind == Kind::handshake && !got.reply.empty()) {
    require(got.reply.size() <= SecureChannel::handshake_bytes_max);
  }
  require(to.pending_count() <= 2 * 16);
  require(to.sessions_count() <= 16);
  return 0;
}
