// Converters between wire readers/builders and core values. Wire input is checked here,
// where it is used: a malformed field is an Error (kind invalid) naming the field, never an
// assertion.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "devices/sampling.hpp"
#include "kvstore/block_hash.hpp"
#include "messages/envelope.capnp.h"
#include "runtime/base/result.hpp"

namespace tandem::messages {

Result<std::vector<kv::BlockHash>> get_hashes(capnp::List<capnp::Data>::Reader list);
void set_hashes(capnp::List<capnp::Data>::Builder list, const std::vector<kv::BlockHash>& hashes);
// Parent hashes (KvEvents.storedParents): an empty Data is nullopt (a chain's first block).
Result<std::vector<std::optional<kv::BlockHash>>> get_parent_hashes(
    capnp::List<capnp::Data>::Reader list);
void set_parent_hashes(capnp::List<capnp::Data>::Builder list,
                       std::span<const std::optional<kv::BlockHash>> parents);
capnp::List<capnp::Data>::Builder init_hashes(
    const std::function<capnp::List<capnp::Data>::Builder(unsigned)>& init,
    const std::vector<kv::BlockHash>& hashes);

std::vector<int32_t> get_tokens(capnp::List<int32_t>::Reader list);
void set_tokens(capnp::List<int32_t>::Builder list, const std::vector<int32_t>& tokens);

// Sampling parameters from the wire, validated (vocab_count 0 = unknown).
Result<devices::SamplingParams> get_sampling(wire::SamplingParams::Reader reader,
                                             int64_t vocab_count);
void set_sampling(wire::SamplingParams::Builder builder, const devices::SamplingParams& params,
                  bool has_seed);

// Per-token logprobs of a TokenChunk (or a PrefillResult's first token): `token`, `logprob`
// and `top` of each SampledToken (is_stop is not carried).
// set_logprobs fills chunk.logprobs / chunk.topLogprobs, one entry per token; the chunk's
// tokenIds must already hold the same tokens (asserted: sizes and ids match).
void set_logprobs(wire::TokenChunk::Builder chunk, std::span<const devices::SampledToken> tokens);
void set_top(wire::TopLogprobs::Builder builder, const std::vector<devices::TokenLogprob>& top);
// Reads them back, checked: empty when the chunk carries none (both lists empty). Errors
// (invalid, naming the field and index): a list whose length differs from tokenIds, top
// lists of different lengths, a logprob that is NaN or > 0, more than logprobs_top_n_max
// alternatives.
Result<std::vector<devices::SampledToken>> get_logprobs(wire::TokenChunk::Reader chunk);
Result<std::vector<devices::TokenLogprob>> get_top(wire::TopLogprobs::Reader reader,
                                                   const std::string& field);

wire::ErrorKind to_wire(ErrorKind kind);
ErrorKind from_wire(wire::ErrorKind kind);

}  // namespace tandem::messages
