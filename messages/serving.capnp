@0xe6c33197fff7ccba;
# Serving plane: one request's life from the gateway through router, decode and prefill.
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("tandem::wire");

using Kv = import "kv.capnp";

struct SamplingParams {
  temperature @0 :Float32 = 1.0;   # 0 = greedy
  topP @1 :Float32 = 1.0;          # (0, 1]
  topK @2 :Int32 = 0;              # 0 = off
  minP @3 :Float32 = 0.0;          # [0, 1]
  repetitionPenalty @4 :Float32 = 1.0;
  presencePenalty @5 :Float32 = 0.0;
  frequencyPenalty @6 :Float32 = 0.0;
  seed @7 :UInt64;
  hasSeed @8 :Bool;
  logprobsTopN @9 :UInt32;          # alternatives per token, [0, 20]; needs `logprobs`
  stopTokenIds @10 :List(Int32);
  logprobs @11 :Bool;               # report each token's logprob (top 0 = the sampled one only)
}

struct Limits {
  maxTokens @0 :UInt32;             # output tokens at most
  deadlineUnixNs @1 :UInt64;        # 0 = none
  stopStrings @2 :List(Text);
  ignoreEos @3 :Bool;
  noSpeculation @4 :Bool;           # the request turned speculative decoding off
}

# Gateway -> router: where should this go? Answered by RouteReply.
struct RouteRequest {
  requestId @0 :UInt64;
  promptTokens @1 :UInt32;
  blockHashes @2 :List(Data);       # the prompt's full blocks, chained, computed once by the gateway
}

struct RouteReply {
  decodeInstance @0 :Text;          # "node/decode/name"
  prefillInstance @1 :Text;         # empty = decode prefills locally
  cachedBlocks @2 :UInt32;          # the router's estimate on the chosen decode instance
  tier2Source @3 :Text;             # "node/kv-offload/name" on another node whose tier 2 holds
                                    # more of the prompt than prefill's own node; empty = own
}

# Gateway -> decode: generate a completion. Decode answers with a stream of TokenChunk and
# one Finish (or Error), all carrying the same requestId.
struct GenerateRequest {
  requestId @0 :UInt64;
  promptTokenIds @1 :List(Int32);
  blockHashes @2 :List(Data);
  sampling @3 :SamplingParams;
  limits @4 :Limits;
  prefillInstance @5 :Text;         # chosen by the router; empty = prefill locally
  replyTo @6 :Text;                 # "node/gateway/name" that receives the tokens
  cacheSalt @7 :Text;
  tier2Source @8 :Text;             # from RouteReply: where prefill reads tier 2 (empty = own node)
}

# Decode -> prefill: compute the prompt's KV and the first token. Answered by PrefillResult.
struct PrefillRequest {
  requestId @0 :UInt64;
  promptTokenIds @1 :List(Int32);
  blockHashes @2 :List(Data);
  sampling @3 :SamplingParams;
  holdTimeoutMs @4 :UInt32;         # prefill frees the blocks if no PullDone by then
  tier2Source @5 :Text;             # the kv-offload to ask for the blocks it lacks; empty = its
                                    # node's (a remote one is read over the fabric the same way)
}

# Prefill -> decode: the first token and where the KV is. The blocks stay pinned until
# KvPullDone (kv.capnp) or holdTimeoutMs.
struct PrefillResult {
  requestId @0 :UInt64;
  firstTokenId @1 :Int32;
  firstTokenLogprob @2 :Float32;
  blocks @3 :List(Kv.BlockDescriptor);
  cachedTokens @4 :UInt32;          # prompt tokens that came from prefill's prefix cache
  computeNs @5 :UInt64;
  firstTokenTop @6 :TopLogprobs;    # the first token's alternatives (empty unless asked)
}

# Decode -> gateway: new tokens of a request, in order. When the request asked for logprobs
# (sampling.logprobs), `logprobs` and `topLogprobs` have one entry per token id (topLogprobs[i]
# may be empty: top 0); otherwise both are empty (no cost).
struct TokenChunk {
  requestId @0 :UInt64;
  tokenIds @1 :List(Int32);
  logprobs @2 :List(Float32);       # natural log of the sampled token's probability, <= 0
  topLogprobs @3 :List(TopLogprobs);
  firstIndex @4 :UInt32;            # index of tokenIds[0] in the output
}

# The most probable tokens at one position, descending by logprob; both lists the same length.
struct TopLogprobs {
  tokenIds @0 :List(Int32);
  logprobs @1 :List(Float32);
}

enum FinishReason {
  stop @0;            # EOS or a stop token
  length @1;          # max tokens or context length
  stopString @2;
  cancelled @3;
  error @4;
}

# Decode -> gateway: the request ended. Last message for its requestId.
struct Finish {
  requestId @0 :UInt64;
  reason @1 :FinishReason;
  promptTokens @2 :UInt32;
  cachedTokens @3 :UInt32;
  outputTokens @4 :UInt32;
  matchedStop @5 :Text;
}

# Decode -> gateway: what one decode step (or one finished KV pull) produced for the requests
# of one gateway, in order. Each event means exactly what it means sent alone; batching them
# makes a step cost one frame per gateway instead of one (or two) per request. A step's
# events for one gateway may be split over several frames (frame size), sent in order.
struct StepEvents {
  events @0 :List(StepEvent);
}

struct StepEvent {
  union {
    tokenChunk @0 :TokenChunk;
    finish @1 :Finish;
  }
}

# Anyone -> the request's current holders: stop work, free its KV. Not answered.
struct Cancel {
  requestId @0 :UInt64;
  reason @1 :Text;
}

enum ErrorKind {
  invalid @0;
  notFound @1;
  overloaded @2;
  disconnected @3;
  timedOut @4;
  unimplemented @5;
  failed @6;
}

# An expected failure of a request or admin call, with the same correlation as what failed.
struct Error {
  requestId @0 :UInt64;
  kind @1 :ErrorKind;
  message @2 :Text;
  tokensSent @3 :UInt32;            # output tokens already delivered (0 = safe to retry)
}
