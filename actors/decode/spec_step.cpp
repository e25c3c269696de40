#include "actors/decode/spec_step.hpp"

#include <cmath>
#include <string>

#include "actors/decode/spec_verify.hpp"

namespace tandem::decode {
namespace {

// The sampler's greedy choice: the lowest index of the largest logit; a NaN or an all -inf row
// is an error, as in Sampler::sample.
Result<int32_t> argmax_checked(std::span<const float> row) {
  size_t best = 0;
  for (size_t t = 0; t < row.size(); ++t) {
    if (std::isnan(row[t])) {
      return make_error(ErrorKind::invalid, "sampling: logits[" + std::to_string(t) + "] is nan");
    }
    if (row[t] > row[best]) best = t;
  }
  if (row.empty() || !std::isfinite(row[best])) {
    return make_error(ErrorKind::invalid, "sampling: the largest logit is not finite");
  }
  return static_cast<int32_t>(best);
}

}  // namespace

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
    const bool scored = rows.scored.size() > out.accepted;  // the emitted rows, scored
    for (uint32_t i = 0; i <= out.accepted; ++i) {
      devices::SampledToken t;
      if (scored) {
        t = rows.scored[i];
        RT_ASSERT(t.token == rows.tokens[i], "a scored row's token is its token");
      } else {
        t.token = rows.tokens[i];
        if (params.logprobs_top_n > 0) t.top.push_back({t.token, 0.0f});  // deterministic
      }
      t.is_stop = false;
      for (int32_t stop : params.stop_token_ids) t.is_stop = t.is_stop || stop == t.token;
      out.tokens.push_back(std::move(t));
    }
    return out;
  }
  if (vocab == 0 || rows.logits.size() < rows_count * vocab) {
    return make_error(ErrorKind::failed, "device returned too few logits for " +
                                             std::to_string(rows_count) + " rows");
  }
  auto row = [&](size_t i) { return rows.logits.subspan(i * vocab, vocab); };
  // Row i's history: the drafts before it count for penalties.
  std::vector<int32_t> context(history.begin(), history.end());
  context.reserve(history.size() + rows_count);
  auto context_for = [&](size_t i) {
    context.resize(history.size());
    context.insert(context.end(), drafts.begin(), drafts.begin() + static_cast<ptrdiff_t>(i));
  };
  devices::Sampler sampler(devices::seeded_at(params, position));
  Verified verified;
  if (params.temperature == 0.0f) {
    // Greedy: the argmax of each penalized row, no softmax (what the sampler's greedy picks).
    const bool penalized = params.repetition_penalty != 1.0f || params.presence_penalty != 0.0f ||
                           params.frequency_penalty != 0.0f;
    std::vector<float> work;
    std::vector<uint32_t> counts;
    for (size_t i = 0;; ++i) {
      std::span<const float> r = row(i);
      if (penalized) {
        context_for(i);
        work.assign(r.begin(), r.end());
        devices::apply_penalties(params, work, context, counts);
        r = work;
      }
      auto best = argmax_checked(r);
      if (!best.ok()) return best.error();
      if (i < drafts.size() && *best == drafts[i]) continue;
      verified.accepted = static_cast<uint32_t>(i);
      verified.next = *best;
      break;
    }
  } else {
    std::vector<float> probs;
    auto target = [&](size_t i) -> Result<std::span<const float>> {
      context_for(i);
      if (Status s = sampler.distribution(row(i), context, probs); !s.ok()) return s.error();
      return std::span<const float>(probs);
    };
    auto v = verify_sampled_rows(target, vocab, drafts, {}, [&] { return sampler.unit(); });
    if (!v.ok()) return v.error();
    verified = *v;
  }
  out.accepted = verified.accepted;
  const bool logprobs = params.logprobs || params.logprobs_top_n > 0;
  for (uint32_t i = 0; i <= out.accepted; ++i) {
    int32_t token = i < out.accepted ? drafts[i] : verified.next;
    if (!logprobs) {
      devices::SampledToken t;
      t.token = token;
      for (int32_t stop : params.stop_token_ids) t.is_stop = t.is_stop || stop == token;
      out.tokens.push_back(std::move(t));
      continue;
    }
    context_for(i);
    auto scored = sampler.score(row(i), context, token);
    if (!scored.ok()) return scored.error();
    out.tokens.push_back(std::move(scored).value());
  }
  return out;
}

}  // namespace tandem::decode
