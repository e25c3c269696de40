#include "messages/convert.hpp"

#include <cstring>

namespace tandem::messages {

Result<std::vector<kv::BlockHash>> get_hashes(capnp::List<capnp::Data>::Reader list) {
  std::vector<kv::BlockHash> out;
  out.reserve(list.size());
  for (unsigned i = 0; i < list.size(); ++i) {
    auto data = list[i];
    if (data.size() != sizeof(kv::BlockHash::bytes)) {
      return make_error(ErrorKind::invalid, "blockHashes[" + std::to_string(i) + "] has " +
                                                std::to_string(data.size()) +
                                                " bytes, expected 32");
    }
    kv::BlockHash hash;
    std::memcpy(hash.bytes.data(), data.begin(), hash.bytes.size());
    out.push_back(hash);
  }
  return out;
}

void set_hashes(capnp::List<capnp::Data>::Builder list, const std::vector<kv::BlockHash>& hashes) {
  RT_ASSERT(list.size() == hashes.size(), list.size(), hashes.size());
  for (unsigned i = 0; i < hashes.size(); ++i) {
    list.set(i, kj::arrayPtr(hashes[i].bytes.data(), hashes[i].bytes.size()));
  }
}

capnp::List<capnp::Data>::Builder init_hashes(
    const std::function<capnp::List<capnp::Data>::Builder(unsigned)>& init,
    const std::vector<kv::BlockHash>& hashes) {
  auto list = init(static_cast<unsigned>(hashes.size()));
  set_hashes(list, hashes);
  return list;
}

std::vector<int32_t> get_tokens(capnp::List<int32_t>::Reader list) {
  std::vector<int32_t> out(list.size());
  for (unsigned i = 0; i < list.size(); ++i) out[i] = list[i];
  return out;
}

void set_tokens(capnp::List<int32_t>::Builder list, const std::vector<int32_t>& tokens) {
  RT_ASSERT(list.size() == tokens.size());
  for (unsigned i = 0; i < tokens.size(); ++i) list.set(i, tokens[i]);
}

Result<devices::SamplingParams> get_sampling(wire::SamplingParams::Reader r, int64_t vocab_count) {
  devices::SamplingParams p;
  p.temperature = r.getTemperature();
  p.top_p = r.getTopP();
  p.top_k = r.getTopK();
  p.min_p = r.getMinP();
  p.repetition_penalty = r.getRepetitionPenalty();
  p.presence_penalty = r.getPresencePenalty();
  p.frequency_penalty = r.getFrequencyPenalty();
  p.seed = r.getSeed();
  p.logprobs_top_n = static_cast<int32_t>(std::min<uint32_t>(r.getLogprobsTopN(), 1000));
  p.stop_token_ids = get_tokens(r.getStopTokenIds());
  return devices::validate(std::move(p), vocab_count);
}

void set_sampling(wire::SamplingParams::Builder b, const devices::SamplingParams& p,
                  bool has_seed) {
  b.setTemperature(p.temperature);
  b.setTopP(p.top_p);
  b.setTopK(p.top_k);
  b.setMinP(p.min_p);
  b.setRepetitionPenalty(p.repetition_penalty);
  b.setPresencePenalty(p.presence_penalty);
  b.setFrequencyPenalty(p.frequency_penalty);
  b.setSeed(p.seed);
  b.setHasSeed(has_seed);
  b.setLogprobsTopN(static_cast<uint32_t>(p.logprobs_top_n));
  set_tokens(b.initStopTokenIds(static_cast<unsigned>(p.stop_token_ids.size())),
             p.stop_token_ids);
}

wire::ErrorKind to_wire(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::invalid: return wire::ErrorKind::INVALID;
    case ErrorKind::not_found: return wire::ErrorKind::NOT_FOUND;
    case ErrorKind::overloaded: return wire::ErrorKind::OVERLOADED;
    case ErrorKind::disconnected: return wire::ErrorKind::DISCONNECTED;
    case ErrorKind::timed_out: return wire::ErrorKind::TIMED_OUT;
    case ErrorKind::unimplemented: return wire::ErrorKind::UNIMPLEMENTED;
    case ErrorKind::failed: return wire::ErrorKind::FAILED;
  }
  return wire::ErrorKind::FAILED;
}

ErrorKind from_wire(wire::ErrorKind kind) {
  switch (kind) {
    case wire::ErrorKind::INVALID: return ErrorKind::invalid;
    case wire::ErrorKind::NOT_FOUND: return ErrorKind::not_found;
    case wire::ErrorKind::OVERLOADED: return ErrorKind::overloaded;
    case wire::ErrorKind::DISCONNECTED: return ErrorKind::disconnected;
    case wire::ErrorKind::TIMED_OUT: return ErrorKind::timed_out;
    case wire::ErrorKind::UNIMPLEMENTED: return ErrorKind::unimplemented;
    case wire::ErrorKind::FAILED: return ErrorKind::failed;
  }
  return ErrorKind::failed;
}

}  // namespace tandem::messages
