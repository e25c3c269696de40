// Envelope framing: round trips of every plane's messages, and malformed input refused.
#include <doctest.h>

#include <kj/exception.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>

#include "messages/convert.hpp"
#include "messages/envelope.hpp"

using namespace tandem;
using namespace tandem::messages;

namespace {

FrameBytes envelope_with(const std::function<void(wire::Envelope::Builder)>& fill) {
  capnp::MallocMessageBuilder message;
  auto envelope = message.initRoot<wire::Envelope>();
  envelope.setProtocolVersion(1);
  set_name(envelope.initSource(), {"node-a", "decode", "decode-0"});
  set_name(envelope.initDestination(), {"node-b", "prefill", "prefill-1"});
  envelope.setSourceAddress("127.0.0.1:17100");
  envelope.setCorrelationId(0xfeedbeefcafeull);
  envelope.setSourceIncarnation(99);
  fill(envelope);
  return encode_frame(message);
}

std::vector<std::byte> bytes_of(const FrameBytes& words) {
  auto span = frame_span(words);
  return {span.begin(), span.end()};
}

}  // namespace

TEST_CASE("ActorName parses node/role/instance and says what is wrong otherwise") {
  auto name = ActorName::parse("node-b/prefill/prefill-1");
  REQUIRE(name.ok());
  CHECK(name->node == "node-b");
  CHECK(name->role == "prefill");
  CHECK(name->instance == "prefill-1");
  CHECK(name->to_string() == "node-b/prefill/prefill-1");
  CHECK(ActorName::parse("node-b/node/").ok());
  CHECK_FALSE(ActorName::parse("node-b").ok());
  CHECK_FALSE(ActorName::parse("a/b/c/d").ok());
  CHECK_FALSE(ActorName::parse("/prefill/x").ok());
  CHECK(ActorName::parse("x").error().message.find("node/role/instance") != std::string::npos);
}

TEST_CASE("envelope round trip keeps header and a serving body") {
  auto words = envelope_with([](wire::Envelope::Builder e) {
    auto req = e.getBody().initPrefillRequest();
    req.setRequestId(77);
    auto tokens = req.initPromptTokenIds(3);
    tokens.set(0, 1), tokens.set(1, 9038), tokens.set(2, 2501);
    req.getSampling().setTemperature(0.0f);
    req.setHoldTimeoutMs(5000);
  });
  auto frame = decode_frame(frame_span(words), 1 << 20);
  REQUIRE(frame.ok());
  auto env = frame->envelope();
  CHECK(env.getProtocolVersion() == 1);
  CHECK(get_name(env.getSource()) == ActorName{"node-a", "decode", "decode-0"});
  CHECK(get_name(env.getDestination()) == ActorName{"node-b", "prefill", "prefill-1"});
  CHECK(env.getCorrelationId() == 0xfeedbeefcafeull);
  CHECK(env.getSourceIncarnation() == 99);
  REQUIRE(env.getBody().which() == wire::Envelope::Body::PREFILL_REQUEST);
  auto req = env.getBody().getPrefillRequest();
  CHECK(req.getRequestId() == 77);
  REQUIRE(req.getPromptTokenIds().size() == 3);
  CHECK(req.getPromptTokenIds()[1] == 9038);
  CHECK(req.getHoldTimeoutMs() == 5000);
  CHECK(req.getSampling().getTopP() == doctest::Approx(1.0));  // schema default
}

TEST_CASE("envelope round trip of a KV block descriptor and a control heartbeat") {
  auto words = envelope_with([](wire::Envelope::Builder e) {
    auto result = e.getBody().initPrefillResult();
    result.setFirstTokenId(42);
    auto blocks = result.initBlocks(1);
    auto region = blocks[0].initRegion();
    region.setFabricAddress("127.0.0.1:17111");
    region.setBaseAddress(0x7f0000000000ull);
    region.setLengthBytes(1 << 30);
    region.setKey(5);
    blocks[0].setOffsetBytes(4096);
    blocks[0].setLengthBytes(126976);
    blocks[0].getLayout().setBlockTokens(16);
  });
  auto frame = decode_frame(frame_span(words), 1 << 20);
  REQUIRE(frame.ok());
  auto block = frame->envelope().getBody().getPrefillResult().getBlocks()[0];
  CHECK(block.getRegion().getKey() == 5);
  CHECK(block.getRegion().getBaseAddress() == 0x7f0000000000ull);
  CHECK(block.getOffsetBytes() == 4096);
  CHECK(block.getLayout().getBlockTokens() == 16);

  auto hb_words = envelope_with([](wire::Envelope::Builder e) {
    auto hb = e.getBody().initHeartbeat();
    hb.setSequence(12);
    auto load = hb.initLoad(1);
    load[0].setInstance("decode-0");
    load[0].setKvBlocksUsed(10);
    load[0].setKvBlocksTotal(100);
  });
  auto hb = decode_frame(frame_span(hb_words), 1 << 20);
  REQUIRE(hb.ok());
  auto hbr = hb->envelope().getBody().getHeartbeat();
  CHECK(hbr.getSequence() == 12);
  CHECK(std::string(hbr.getLoad()[0].getInstance().cStr()) == "decode-0");
}

TEST_CASE("malformed frames are refused with a reason, never a crash") {
  auto good = bytes_of(envelope_with([](wire::Envelope::Builder e) {
    e.getBody().initPing().setNonce(1);
  }));
  CHECK(decode_frame({}, 1 << 20).error().message == "empty frame");
  CHECK(decode_frame(good, 16).error().message.find("exceeds frame_bytes_max") !=
        std::string::npos);
  std::vector<std::byte> odd(good.begin(), good.end() - 3);
  CHECK(decode_frame(odd, 1 << 20).error().message.find("8-byte words") != std::string::npos);
  std::vector<std::byte> truncated(good.begin(), good.begin() + (good.size() / 16) * 8);
  auto t = decode_frame(truncated, 1 << 20);
  REQUIRE_FALSE(t.ok());
  CHECK(t.error().kind == ErrorKind::invalid);
  CHECK(t.error().message.find("truncated") != std::string::npos);

  // Random garbage of many sizes: every one is either refused or decodes to something
  // traversable; nothing throws or crashes.
  uint64_t x = 88172645463325252ull;
  for (size_t size = 8; size <= 4096; size += 8) {
    std::vector<std::byte> junk(size);
    for (auto& b : junk) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      b = static_cast<std::byte>(x);
    }
    auto r = decode_frame(junk, 1 << 20);
    if (r.ok()) (void)r->envelope().getBody().which();
  }
  // A segment table that claims a huge segment.
  std::vector<std::byte> liar(16);
  uint32_t header[2] = {0, 0x7fffffff};
  std::memcpy(liar.data(), header, 8);
  CHECK(decode_frame(liar, 1 << 20).error().message.find("truncated") != std::string::npos);
}

// A pointer of the wrong kind in the envelope's own fields (found by fuzz_frame,
// tests/fuzz/corpus/frame/source_is_a_list.bin): the traversal accepts it (it is in bounds),
// but reading the field throws, and the node reads these on its fabric thread outside any
// handler guard. decode_frame must refuse the frame instead.
TEST_CASE("an envelope field holding a pointer of the wrong kind is refused") {
  auto words = envelope_with([](wire::Envelope::Builder e) {
    e.getBody().initPing().setNonce(1);
  });
  REQUIRE(words.size() > 2);
  // One segment: table word 0, then the root pointer (word 1) to the Envelope struct.
  uint64_t root = 0;
  std::memcpy(&root, &words[1], 8);
  const uint64_t offset_words = (root >> 2) & 0x3fffffff;
  const uint64_t data_words = (root >> 32) & 0xffff;
  const size_t pointers_at = 2 + offset_words + data_words;  // source, sourceAddress, dest
  const uint64_t empty_byte_list = 1 | (uint64_t(2) << 32);  // kind list, bytes, 0 elements
  const uint64_t empty_struct = 0xfffffffcull;  // kind struct, no words (offset -1: not null)
  for (auto entry : {std::pair{size_t(0), empty_byte_list}, {size_t(1), empty_struct},
                     {size_t(2), empty_byte_list}}) {
    // Not a structured binding: clang 14 cannot capture one in doctest's INFO lambda.
    const size_t index = entry.first;
    const uint64_t pointer = entry.second;
    INFO("pointer " << index);
    // Copied word by word: capnp::word is not copyable in clang debug builds (CAPNP_DEBUG_TYPES).
    FrameBytes bad(words.size());
    std::memcpy(bad.data(), words.data(), words.size() * sizeof(capnp::word));
    REQUIRE(pointers_at + index < bad.size());
    std::memcpy(static_cast<void*>(&bad[pointers_at + index]), &pointer, 8);
    auto decoded = decode_frame(frame_span(bad), 1 << 20);
    REQUIRE_FALSE(decoded.ok());
    CHECK(decoded.error().kind == ErrorKind::invalid);
    CHECK(decoded.error().message.find("malformed frame") != std::string::npos);
  }
}

// A 400-byte heartbeat whose load list claims 41,943,040 zero-sized InstanceLoad structs (found
// by fuzz_frame: the node actor made one message per element). Its bytes are in bounds, so only
// the per-frame traversal limit (a multiple of the frame's size) stops it: reading the list
// throws, and the handler guard drops the frame.
TEST_CASE("a list of empty structs cannot amplify a small frame") {
  const char* root = std::getenv("TANDEM_SOURCE_ROOT");
  REQUIRE_MESSAGE(root != nullptr, "TANDEM_SOURCE_ROOT is not set");
  std::ifstream in(std::string(root) + "/tests/fuzz/corpus/frame/heartbeat_41m_empty_loads.bin",
                   std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() == 400);
  auto decoded = decode_frame(std::as_bytes(std::span(bytes.data(), bytes.size())), 1 << 20);
  if (!decoded.ok()) return;  // refused outright: as good
  auto body = decoded->envelope().getBody();
  REQUIRE(body.which() == wire::Envelope::Body::HEARTBEAT);
  CHECK_THROWS_AS((void)body.getHeartbeat().getLoad().size(), kj::Exception);
}

// The per-frame limit leaves room for what receivers do: a frame read in full many times.
TEST_CASE("a frame can be read in full many times within its traversal limit") {
  auto words = envelope_with([](wire::Envelope::Builder e) {
    auto ids = e.getBody().initTokenChunk().initTokenIds(4096);
    for (unsigned i = 0; i < ids.size(); ++i) ids.set(i, int32_t(i));
  });
  auto frame = decode_frame(frame_span(words), 1 << 20);
  REQUIRE(frame.ok());
  int64_t sum = 0;
  for (int pass = 0; pass < int(frame_traversal_factor) - 2; ++pass) {
    for (int32_t id : frame->envelope().getBody().getTokenChunk().getTokenIds()) sum += id;
  }
  CHECK(sum == int64_t(frame_traversal_factor - 2) * 4095 * 4096 / 2);
}

// ---- per-token logprobs (messages/convert.hpp) ----

namespace {

using devices::SampledToken;
using devices::TokenLogprob;

// Builds a TokenChunk with `tokens` (ids and, when with_logprobs, their logprobs) and reads
// the logprobs back through a frame, as the gateway does.
Result<std::vector<SampledToken>> chunk_round_trip(const std::vector<SampledToken>& tokens,
                                                   bool with_logprobs) {
  auto words = envelope_with([&](wire::Envelope::Builder e) {
    auto chunk = e.getBody().initTokenChunk();
    chunk.setRequestId(5);
    auto ids = chunk.initTokenIds(static_cast<unsigned>(tokens.size()));
    for (unsigned i = 0; i < tokens.size(); ++i) ids.set(i, tokens[i].token);
    if (with_logprobs) set_logprobs(chunk, tokens);
  });
  auto frame = decode_frame(frame_span(words), 1 << 20);
  REQUIRE(frame.ok());
  return get_logprobs(frame->envelope().getBody().getTokenChunk());
}

}  // namespace

TEST_CASE("TokenChunk logprobs round trip: sampled logprob and top-N per token") {
  std::vector<SampledToken> tokens(2);
  tokens[0].token = 42;
  tokens[0].logprob = -0.25f;
  tokens[0].top = {TokenLogprob{42, -0.25f}, TokenLogprob{7, -1.5f}, TokenLogprob{9, -3.0f}};
  tokens[1].token = 8;
  tokens[1].logprob = -2.0f;  // top 0: no alternatives
  auto back = chunk_round_trip(tokens, true);
  REQUIRE(back.ok());
  REQUIRE(back->size() == 2);
  CHECK((*back)[0].token == 42);
  CHECK((*back)[0].logprob == -0.25f);
  CHECK((*back)[0].top == tokens[0].top);
  CHECK((*back)[1].token == 8);
  CHECK((*back)[1].logprob == -2.0f);
  CHECK((*back)[1].top.empty());
}

TEST_CASE("TokenChunk without logprobs costs nothing and reads back empty") {
  std::vector<SampledToken> tokens(3);
  tokens[1].token = 4;
  auto back = chunk_round_trip(tokens, false);
  REQUIRE(back.ok());
  CHECK(back->empty());
}

TEST_CASE("malformed TokenChunk logprobs are refused naming the field") {
  auto read = [](const std::function<void(wire::TokenChunk::Builder)>& fill) {
    auto words = envelope_with([&](wire::Envelope::Builder e) {
      auto chunk = e.getBody().initTokenChunk();
      auto ids = chunk.initTokenIds(2);
      ids.set(0, 1), ids.set(1, 2);
      fill(chunk);
    });
    auto frame = decode_frame(frame_span(words), 1 << 20);
    REQUIRE(frame.ok());
    return get_logprobs(frame->envelope().getBody().getTokenChunk());
  };
  auto short_list = read([](wire::TokenChunk::Builder c) {
    c.initLogprobs(1).set(0, -1.0f);
    c.initTopLogprobs(1);
  });
  REQUIRE_FALSE(short_list.ok());
  CHECK(short_list.error().message.find("2 tokenIds but 1 logprobs") != std::string::npos);
  auto positive = read([](wire::TokenChunk::Builder c) {
    auto l = c.initLogprobs(2);
    l.set(0, -1.0f), l.set(1, 0.5f);
    c.initTopLogprobs(2);
  });
  REQUIRE_FALSE(positive.ok());
  CHECK(positive.error().message.find("TokenChunk.logprobs[1]") != std::string::npos);
  auto ragged = read([](wire::TokenChunk::Builder c) {
    auto l = c.initLogprobs(2);
    l.set(0, -1.0f), l.set(1, -1.0f);
    auto tops = c.initTopLogprobs(2);
    tops[0].initTokenIds(2);
    tops[0].initLogprobs(1);
  });
  REQUIRE_FALSE(ragged.ok());
  CHECK(ragged.error().message.find("TokenChunk.topLogprobs[0]") != std::string::npos);
}

TEST_CASE("sampling logprobs flag and top-N survive the wire") {
  devices::SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = true;
  p.logprobs_top_n = 0;
  capnp::MallocMessageBuilder message;
  auto b = message.initRoot<wire::SamplingParams>();
  set_sampling(b, p, false);
  auto back = get_sampling(b.asReader(), 100);
  REQUIRE(back.ok());
  CHECK(back->logprobs);
  CHECK(back->logprobs_top_n == 0);
  p.logprobs_top_n = 5;
  set_sampling(b, p, false);
  back = get_sampling(b.asReader(), 100);
  REQUIRE(back.ok());
  CHECK(back->logprobs_top_n == 5);
  CHECK(*back == p);
}
