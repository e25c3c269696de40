// Fuzz target: a frame received from a peer (messages/envelope.hpp decode_frame), as the node
// reads it (STYLE.md §8, issue 12). decode_frame must turn any bytes into a Frame or an
// Error, never throw or crash. On a Frame, what the node's fabric thread reads before any
// handler guard (runtime/node/bridge.cpp: version, source, destination, source address,
// the body's tag) must not throw either. The body is then converted the way the shells do
// (messages/convert.hpp), inside a kj::Exception catch as their handler guard has
// (actors/common/shell.cpp): there a throw is an answer, but memory errors are findings.
//   libFuzzer: build-fuzz/tests/fuzz_frame (tests/fuzz/README.md)
//   here: build/tests/fuzz_frame_replay tests/fuzz/corpus/frame (a test)
#include <kj/exception.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>

#include "actors/kv_offload/offload_core.hpp"
#include "messages/convert.hpp"
#include "messages/envelope.hpp"

namespace {

using namespace tandem;
using namespace tandem::messages;

void require(bool condition) {
  if (!condition) std::abort();  // a finding: the fuzzer (or the replay test) reports it
}

void read_hashes(capnp::List<capnp::Data>::Reader list) {
  auto hashes = get_hashes(list);
  if (hashes.ok()) require(hashes.value().size() == list.size());
}

// What kv-offload's on_lookup does with a lookup before its core sees it: the block and
// sub-block hashes converted, the ask checked, its positions counted and cut (a valid ask's
// cut stays valid).
void read_lookup(wire::OffloadLookup::Reader lookup) {
  auto hashes = get_hashes(lookup.getBlockHashes());
  auto sub = get_hashes(lookup.getSubBlockHashes());
  if (!hashes.ok() || !sub.ok()) return;
  const uint32_t k = sub->empty() ? 1 : lookup.getSubBlocks();
  const kv_offload::PartialAsk ask{*sub, k, sub->empty() ? 0 : lookup.getSubBlocksHeld(),
                                   lookup.getPartialGainMin()};
  Status valid = kv_offload::check_partial_ask(*hashes, ask);
  if (!valid.ok()) {
    require(!valid.error().message.empty());
    return;
  }
  const uint32_t positions = kv_offload::lookup_positions(*hashes, ask);
  require(positions >= hashes->size() && positions <= hashes->size() + 1);
  kv_offload::truncate_ask(*hashes, *sub, k, positions / 2);
  require(kv_offload::check_partial_ask(*hashes, {*sub, k, ask.held, ask.gain_min}).ok());
}

void read_sampling(wire::SamplingParams::Reader sampling) {
  for (int64_t vocab : {int64_t(0), int64_t(32000)}) {
    auto params = get_sampling(sampling, vocab);
    if (!params.ok()) require(!params.error().message.empty());
  }
}

void read_chunk(wire::TokenChunk::Reader chunk) {
  auto tokens = get_tokens(chunk.getTokenIds());
  auto logprobs = get_logprobs(chunk);
  if (logprobs.ok() && !logprobs.value().empty()) {
    require(logprobs.value().size() == tokens.size());
  }
}

void read_blocks(capnp::List<wire::BlockDescriptor>::Reader blocks) {
  for (auto block : blocks) {
    (void)block.getRegion().getFabricAddress();
    (void)block.getBlockHash().size();
    (void)block.getLayout().getBlockBytes();
  }
}

// What the shells read of each body kind (the handlers convert it and answer an error).
void read_body(wire::Envelope::Body::Reader body) {
  using Body = wire::Envelope::Body;
  switch (body.which()) {
    case Body::HELLO: (void)body.getHello().getNodeName(); break;
    case Body::HELLO_ACK: (void)body.getHelloAck().getReason(); break;
    case Body::HEARTBEAT:
      for (auto load : body.getHeartbeat().getLoad()) (void)load.getInstance();
      break;
    case Body::PING: (void)body.getPing().getPayload(); break;
    case Body::ADMIN_REQUEST:
      for (auto arg : body.getAdminRequest().getArgs()) (void)arg;
      break;
    case Body::ADMIN_REPLY:
      for (auto row : body.getAdminReply().getRows()) {
        for (auto cell : row) (void)cell;
      }
      break;
    case Body::ROUTE_REQUEST: read_hashes(body.getRouteRequest().getBlockHashes()); break;
    case Body::GENERATE_REQUEST: {
      auto request = body.getGenerateRequest();
      (void)get_tokens(request.getPromptTokenIds());
      read_hashes(request.getBlockHashes());
      read_sampling(request.getSampling());
      for (auto stop : request.getLimits().getStopStrings()) (void)stop;
      (void)ActorName::parse(request.getReplyTo().cStr());
      break;
    }
    case Body::PREFILL_REQUEST: {
      auto request = body.getPrefillRequest();
      (void)get_tokens(request.getPromptTokenIds());
      read_hashes(request.getBlockHashes());
      read_sampling(request.getSampling());
      break;
    }
    case Body::PREFILL_RESULT: {
      auto result = body.getPrefillResult();
      read_blocks(result.getBlocks());
      (void)get_top(result.getFirstTokenTop(), "firstTokenTop");
      break;
    }
    case Body::TOKEN_CHUNK: read_chunk(body.getTokenChunk()); break;
    case Body::STEP_EVENTS:
      for (auto event : body.getStepEvents().getEvents()) {
        if (event.isTokenChunk()) read_chunk(event.getTokenChunk());
        if (event.isFinish()) (void)event.getFinish().getMatchedStop();
      }
      break;
    case Body::ERROR: (void)from_wire(body.getError().getKind()); break;
    case Body::KV_EVENTS:
      read_hashes(body.getKvEvents().getStored());
      read_hashes(body.getKvEvents().getRemoved());
      break;
    case Body::KV_RESYNC: (void)body.getKvResync().getReason(); break;
    case Body::OFFLOAD_STORE: read_blocks(body.getOffloadStore().getBlocks()); break;
    case Body::OFFLOAD_LOOKUP: read_lookup(body.getOffloadLookup()); break;
    case Body::OFFLOAD_LOOKUP_REPLY:
      read_blocks(body.getOffloadLookupReply().getBlocks());
      break;
    default: break;  // no pointer fields the shells read
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto bytes = std::as_bytes(std::span<const uint8_t>(data, size));
  auto decoded = decode_frame(bytes, 1u << 20);
  if (!decoded.ok()) {
    require(decoded.error().kind == ErrorKind::invalid);
    require(!decoded.error().message.empty());
    return 0;
  }
  Frame frame = std::move(decoded).value();
  require(frame.size_bytes() == size);
  // runtime/node/bridge.cpp, on the fabric thread: none of this may throw.
  auto envelope = frame.envelope();
  (void)envelope.getProtocolVersion();
  ActorName source = get_name(envelope.getSource());
  ActorName destination = get_name(envelope.getDestination());
  std::string address = envelope.getSourceAddress();
  (void)envelope.getCorrelationId();
  (void)envelope.getBody().which();
  auto parsed = ActorName::parse(destination.to_string());
  if (parsed.ok()) require(parsed.value() == destination);
  (void)source;
  (void)address;
  try {
    read_body(envelope.getBody());
  } catch (const kj::Exception&) {
    // A field of the wrong shape: the shell's handler guard answers it (not a finding).
  }
  return 0;
}
