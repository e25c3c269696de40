#include "actors/decode/spec_step.hpp"

#include <string>

#include "actors/decode/spec_verify.hpp"

namespace tandem::decode {

Result<Emitted> verify_step(const devices::SamplingParams& params, uint32_t position,
                            const SpecRows& rows, uint32_t vocab, std::span<const int32_t> drafts,
                            std::span<const int32_t> history) {
  const size_t rows_count = drafts.size() + 1;
  Emitted out;
  if (!rows.tokens.empty()) {
    if (rows.tokens.size() < rows_count) {
      return make_error(ErrorKind::failed, "device returned " +
                                               std::to_string(rows.tokens.size()) +
                                               " tokens for " + std::to_string(rows_count) +
                                               " rows");
    }
    while (out.accepted < drafts.size() && rows.tokens[out.accepted] == drafts[out.accepted]) {
      ++out.accepted;
    }
    for (uint32_t i = 0; i <= out.accepted; ++i) {
      devices::SampledToken t;
      t.token = rows.tokens[i];
      for (int32_t stop : params.stop_token_ids) t.is_stop = t.is_stop || stop == t.token;
      if (params.logprobs_top_n > 0) t.top.push_back({t.token, 0.0f});  // deterministic
      out.tokens.push_back(std::move(t));
    }
    return out;
  }
  if (vocab == 0 || rows.logits.size() < rows_count * vocab) {
    return make_error(ErrorKind::failed, "device returned too few logits for " +
                                             std::to_string(rows_count) + " rows");
  }
  devices::Sampler sampler(devices::seeded_at(params, position));
  std::vector<int32_t> context(history.begin(), history.end());
  context.reserve(history.size() + rows_count);
  auto row = [&](size_t i) { return rows.logits.subspan(i * vocab, vocab); };
  // Each row processed over its own history: the drafts before it count for penalties.
  std::vector<float> probs(rows_count * size_t{vocab});
  std::vector<float> one;
  for (size_t i = 0; i < rows_count; ++i) {
    if (Status s = sampler.distribution(row(i), context, one); !s.ok()) return s.error();
    std::copy(one.begin(), one.end(), probs.begin() + static_cast<ptrdiff_t>(i * vocab));
    if (i < drafts.size()) context.push_back(drafts[i]);
  }
  auto verified = params.temperature == 0.0f
                      ? verify_greedy(probs, vocab, drafts)
                      : verify_sampled(probs, vocab, drafts, {}, [&] { return sampler.unit(); });
  if (!verified.ok()) return verified.error();
  out.accepted = verified->accepted;
  context.resize(history.size());
  for (uint32_t i = 0; i <= out.accepted; ++i) {
    int32_t token = i < out.accepted ? drafts[i] : verified->next;
    auto scored = sampler.score(row(i), context, token);
    if (!scored.ok()) return scored.error();
    out.tokens.push_back(std::move(scored).value());
    context.push_back(token);
  }
  return out;
}

}  // namespace tandem::decode
