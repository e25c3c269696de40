#include "messages/convert.hpp"

#include <cmath>
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

Result<std::vector<std::optional<kv::BlockHash>>> get_parent_hashes(
    capnp::List<capnp::Data>::Reader list) {
  std::vector<std::optional<kv::BlockHash>> out;
  out.reserve(list.size());
  for (unsigned i = 0; i < list.size(); ++i) {
    auto data = list[i];
    if (data.size() == 0) {
      out.emplace_back();
      continue;
    }
    if (data.size() != sizeof(kv::BlockHash::bytes)) {
      return make_error(ErrorKind::invalid, "storedParents[" + std::to_string(i) + "] has " +
                                                std::to_string(data.size()) +
                                                " bytes, expected 32 or 0");
    }
    kv::BlockHash hash;
    std::memcpy(hash.bytes.data(), data.begin(), hash.bytes.size());
    out.emplace_back(hash);
  }
  return out;
}

void set_parent_hashes(capnp::List<capnp::Data>::Builder list,
                       std::span<const std::optional<kv::BlockHash>> parents) {
  RT_ASSERT(list.size() == parents.size(), list.size(), parents.size());
  for (unsigned i = 0; i < parents.size(); ++i) {
    if (parents[i]) list.set(i, kj::arrayPtr(parents[i]->bytes.data(), parents[i]->bytes.size()));
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
  p.logprobs = r.getLogprobs();
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
  b.setLogprobs(p.logprobs);
  set_tokens(b.initStopTokenIds(static_cast<unsigned>(p.stop_token_ids.size())),
             p.stop_token_ids);
}

void set_top(wire::TopLogprobs::Builder builder, const std::vector<devices::TokenLogprob>& top) {
  RT_ASSERT(top.size() <= size_t(devices::logprobs_top_n_max), top.size());
  auto ids = builder.initTokenIds(static_cast<unsigned>(top.size()));
  auto lps = builder.initLogprobs(static_cast<unsigned>(top.size()));
  for (unsigned i = 0; i < top.size(); ++i) {
    ids.set(i, top[i].token);
    lps.set(i, top[i].logprob);
  }
}

void set_logprobs(wire::TokenChunk::Builder chunk, std::span<const devices::SampledToken> tokens) {
  auto ids = chunk.getTokenIds();
  RT_ASSERT(ids.size() == tokens.size(), ids.size(), tokens.size());
  auto lps = chunk.initLogprobs(static_cast<unsigned>(tokens.size()));
  auto tops = chunk.initTopLogprobs(static_cast<unsigned>(tokens.size()));
  for (unsigned i = 0; i < tokens.size(); ++i) {
    RT_ASSERT(ids[i] == tokens[i].token, i, ids[i], tokens[i].token);
    lps.set(i, tokens[i].logprob);
    set_top(tops[i], tokens[i].top);
  }
}

namespace {

Status check_logprob(float logprob, const std::string& field) {
  // A logprob is a natural log of a probability: <= 0 (a little float slack), never NaN.
  if (std::isnan(logprob) || logprob > 1e-4f) {
    return make_error(ErrorKind::invalid,
                      field + " = " + std::to_string(logprob) + " is not a logprob (<= 0)");
  }
  return {};
}

}  // namespace

Result<std::vector<devices::TokenLogprob>> get_top(wire::TopLogprobs::Reader reader,
                                                   const std::string& field) {
  auto ids = reader.getTokenIds();
  auto lps = reader.getLogprobs();
  if (ids.size() != lps.size()) {
    return make_error(ErrorKind::invalid, field + ": " + std::to_string(ids.size()) +
                                              " token ids but " + std::to_string(lps.size()) +
                                              " logprobs");
  }
  if (ids.size() > unsigned(devices::logprobs_top_n_max)) {
    return make_error(ErrorKind::invalid, field + ": " + std::to_string(ids.size()) +
                                              " alternatives, at most 20");
  }
  std::vector<devices::TokenLogprob> out(ids.size());
  for (unsigned i = 0; i < ids.size(); ++i) {
    Status ok = check_logprob(lps[i], field + ".logprobs[" + std::to_string(i) + "]");
    if (!ok.ok()) return ok.error();
    out[i] = {ids[i], lps[i]};
  }
  return out;
}

Result<std::vector<devices::SampledToken>> get_logprobs(wire::TokenChunk::Reader chunk) {
  auto ids = chunk.getTokenIds();
  auto lps = chunk.getLogprobs();
  auto tops = chunk.getTopLogprobs();
  if (lps.size() == 0 && tops.size() == 0) return std::vector<devices::SampledToken>{};
  if (lps.size() != ids.size() || tops.size() != ids.size()) {
    return make_error(ErrorKind::invalid, "TokenChunk: " + std::to_string(ids.size()) +
                                              " tokenIds but " + std::to_string(lps.size()) +
                                              " logprobs and " + std::to_string(tops.size()) +
                                              " topLogprobs");
  }
  std::vector<devices::SampledToken> out(ids.size());
  for (unsigned i = 0; i < ids.size(); ++i) {
    std::string index = "[" + std::to_string(i) + "]";
    Status ok = check_logprob(lps[i], "TokenChunk.logprobs" + index);
    if (!ok.ok()) return ok.error();
    auto top = get_top(tops[i], "TokenChunk.topLogprobs" + index);
    if (!top.ok()) return top.error();
    out[i].token = ids[i];
    out[i].logprob = lps[i];
    out[i].top = std::move(top).value();
  }
  return out;
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
