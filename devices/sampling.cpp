#include "devices/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>

namespace tandem::devices {
namespace {

template <class T>
Error range_error(const char* name, T value, const char* range) {
  std::ostringstream out;
  out << "sampling: " << name << " = " << value << " is outside " << range;
  return make_error(ErrorKind::invalid, out.str());
}

bool in_closed(float v, float lo, float hi) { return std::isfinite(v) && v >= lo && v <= hi; }

// Orders indices by weight descending, lower index first on ties (a strict weak order).
struct ByWeightDesc {
  const std::vector<double>* weight;
  bool operator()(int32_t a, int32_t b) const {
    double wa = (*weight)[static_cast<size_t>(a)], wb = (*weight)[static_cast<size_t>(b)];
    return wa != wb ? wa > wb : a < b;
  }
};

}  // namespace

Status SamplingParams::validate(int64_t vocab_count) const {
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return range_error("temperature", temperature, "[0, inf) (0 = greedy)");
  }
  if (top_k < 0) return range_error("top_k", top_k, "[0, inf) (0 = off)");
  if (!std::isfinite(top_p) || top_p <= 0.0f || top_p > 1.0f) {
    return range_error("top_p", top_p, "(0, 1]");
  }
  if (!in_closed(min_p, 0.0f, 1.0f)) return range_error("min_p", min_p, "[0, 1]");
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0.0f) {
    return range_error("repetition_penalty", repetition_penalty, "(0, inf) (1 = off)");
  }
  if (!in_closed(presence_penalty, -2.0f, 2.0f)) {
    return range_error("presence_penalty", presence_penalty, "[-2, 2]");
  }
  if (!in_closed(frequency_penalty, -2.0f, 2.0f)) {
    return range_error("frequency_penalty", frequency_penalty, "[-2, 2]");
  }
  if (logprobs_top_n < 0 || logprobs_top_n > logprobs_top_n_max) {
    return range_error("logprobs_top_n", logprobs_top_n, "[0, 20]");
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    int32_t id = stop_token_ids[i];
    if (id < 0 || (vocab_count > 0 && id >= vocab_count)) {
      std::string name = "stop_token_ids[" + std::to_string(i) + "]";
      std::string range = vocab_count > 0 ? "[0, " + std::to_string(vocab_count) + ")"
                                          : std::string("[0, inf)");
      return range_error(name.c_str(), id, range.c_str());
    }
  }
  return {};
}

Result<SamplingParams> validate(SamplingParams params, int64_t vocab_count) {
  if (Status s = params.validate(vocab_count); !s) return s.error();
  return params;
}

void apply_penalties(const SamplingParams& params, std::span<float> logits,
                     std::span<const int32_t> history, std::vector<uint32_t>& counts_scratch) {
  bool repetition = params.repetition_penalty != 1.0f;
  bool additive = params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f;
  if (!repetition && !additive) return;
  RT_ASSERT(!logits.empty(), "apply_penalties: empty logits");
  if (counts_scratch.size() < logits.size()) counts_scratch.assign(logits.size(), 0);
  for (int32_t t : history) {
    RT_ASSERT(t >= 0 && static_cast<size_t>(t) < logits.size(), "history token", t);
    ++counts_scratch[static_cast<size_t>(t)];
  }
  for (int32_t t : history) {
    auto i = static_cast<size_t>(t);
    uint32_t c = counts_scratch[i];
    if (c == 0) continue;  // already penalized (each distinct token once)
    float& l = logits[i];
    if (repetition) l = l > 0.0f ? l / params.repetition_penalty : l * params.repetition_penalty;
    if (additive) {
      l -= params.presence_penalty + params.frequency_penalty * static_cast<float>(c);
    }
    counts_scratch[i] = 0;  // leaves the scratch all-zero for the next call
  }
}

Sampler::Sampler(SamplingParams params) : params_(std::move(params)), rng_(params_.seed) {
  Status s = params_.validate();
  RT_ASSERT(s.ok(), "Sampler: params must be validated first:", s.ok() ? "" : s.error().message);
}

double Sampler::next_unit() {
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;  // 53 random bits, [0, 1)
}

Status Sampler::prepare(std::span<const float> logits, std::span<const int32_t> history) {
  if (logits.empty()) return make_error(ErrorKind::invalid, "sampling: logits row is empty");
  auto vocab = static_cast<int64_t>(logits.size());
  for (size_t i = 0; i < history.size(); ++i) {
    if (history[i] < 0 || history[i] >= vocab) {
      return make_error(ErrorKind::invalid,
                        "sampling: history[" + std::to_string(i) + "] = " +
                            std::to_string(history[i]) + " is outside [0, " +
                            std::to_string(vocab) + ")");
    }
  }
  work_.assign(logits.begin(), logits.end());
  apply_penalties(params_, work_, history, counts_);
  float max_logit = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < work_.size(); ++i) {
    if (std::isnan(work_[i]) || work_[i] == std::numeric_limits<float>::infinity()) {
      return make_error(ErrorKind::invalid, "sampling: logits[" + std::to_string(i) +
                                                "] is " + std::to_string(work_[i]));
    }
    max_logit = std::max(max_logit, work_[i]);
  }
  if (!std::isfinite(max_logit)) {
    return make_error(ErrorKind::invalid, "sampling: every logit is -inf");
  }
  double inv_t = params_.temperature == 0.0f ? 1.0 : 1.0 / params_.temperature;
  weight_.resize(work_.size());
  for (size_t i = 0; i < work_.size(); ++i) {
    weight_[i] = std::exp((static_cast<double>(work_[i]) - max_logit) * inv_t);  // in [0, 1]
  }
  return {};
}

Result<SampledToken> Sampler::sample(std::span<const float> logits,
                                     std::span<const int32_t> history) {
  if (Status ready = prepare(logits, history); !ready.ok()) return ready.error();
  const auto vocab = static_cast<int64_t>(logits.size());
  SampledToken out = params_.temperature == 0.0f ? sample_greedy() : sample_random();
  RT_ASSERT(out.token >= 0 && out.token < vocab, "sampled token out of range", out.token);
  RT_ASSERT(out.logprob <= 1e-6f, "logprob must be <= 0", out.logprob);
  out.is_stop = std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(),
                          out.token) != params_.stop_token_ids.end();
  return out;
}

SampledToken Sampler::sample_greedy() {
  // Argmax: the first index whose weight is 1 (its logit equals the max).
  auto best = std::max_element(weight_.begin(), weight_.end());
  double total = std::accumulate(weight_.begin(), weight_.end(), 0.0);
  RT_ASSERT(*best == 1.0, "greedy: the max weight is exp(0)");
  RT_ASSERT(total >= 1.0, "greedy: total weight includes the max", total);
  SampledToken out;
  out.token = static_cast<int32_t>(best - weight_.begin());
  out.logprob = static_cast<float>(-std::log(total));
  if (params_.logprobs_top_n > 0) {
    order_.resize(weight_.size());
    std::iota(order_.begin(), order_.end(), 0);
    fill_top(out, order_, false, std::log(total));
  }
  return out;
}

void Sampler::keep_head() {
  ByWeightDesc by{&weight_};
  auto nth = [this, &by](size_t k) {
    std::nth_element(order_.begin(), order_.begin() + static_cast<ptrdiff_t>(k), order_.end(),
                     by);
  };
  size_t k = params_.top_k > 0 ? static_cast<size_t>(params_.top_k) : order_.size();
  if (k < order_.size()) {
    nth(k);
    order_.resize(k);
  }
  double total = 0.0;  // the mass top_p is relative to: what top_k kept
  for (int32_t t : order_) total += weight_[static_cast<size_t>(t)];
  double target = params_.top_p * total;
  RT_ASSERT(total > 0.0, "keep_head: the max token (weight 1) is always in the head", total);
  if (params_.top_p < 1.0f) {
    // Avoid sorting the whole vocab: grow a head (by the same total order) until its mass
    // clearly reaches top_p; the kept prefix of the sorted order lies inside it.
    for (size_t head = std::min<size_t>(64, order_.size()); head < order_.size(); head *= 4) {
      nth(head);
      double mass = 0.0;
      for (size_t i = 0; i < head; ++i) mass += weight_[static_cast<size_t>(order_[i])];
      if (mass > target * (1.0 + 1e-9)) {
        order_.resize(head);
        break;
      }
    }
  }
  std::sort(order_.begin(), order_.end(), by);
  if (params_.top_p >= 1.0f) return;
  double mass_before = 0.0;
  size_t keep = 0;
  // Keep a token while the mass of the tokens before it is still below top_p (HF semantics:
  // the smallest head whose mass reaches top_p; never empty).
  while (keep < order_.size() && mass_before < target) {
    mass_before += weight_[static_cast<size_t>(order_[keep])];
    ++keep;
  }
  RT_ASSERT(keep >= 1 && keep <= order_.size(), "top_p kept", keep);
  order_.resize(keep);
}

void Sampler::keep_filtered() {
  order_.resize(weight_.size());
  std::iota(order_.begin(), order_.end(), 0);
  if (params_.top_k > 0 || params_.top_p < 1.0f) keep_head();
  if (params_.min_p > 0.0f) {
    // p / p_max == weight / 1, so the min_p cut is on the weights directly. The max token
    // (weight 1) always survives. Erasing keeps the order (sorted or by index).
    double cut = params_.min_p;
    std::erase_if(order_, [this, cut](int32_t t) { return weight_[static_cast<size_t>(t)] < cut; });
  }
  RT_ASSERT(!order_.empty(), "filters kept no token");
}

Status Sampler::distribution(std::span<const float> logits, std::span<const int32_t> history,
                             std::vector<float>& out) {
  if (Status ready = prepare(logits, history); !ready.ok()) return ready;
  out.assign(weight_.size(), 0.0f);
  if (params_.temperature == 0.0f) {
    out[static_cast<size_t>(std::max_element(weight_.begin(), weight_.end()) -
                            weight_.begin())] = 1.0f;
    return {};
  }
  keep_filtered();
  double total = 0.0;
  for (int32_t t : order_) total += weight_[static_cast<size_t>(t)];
  RT_ASSERT(total > 0.0, "kept mass must be positive", total);
  for (int32_t t : order_) {
    out[static_cast<size_t>(t)] = static_cast<float>(weight_[static_cast<size_t>(t)] / total);
  }
  return {};
}

Result<SampledToken> Sampler::score(std::span<const float> logits,
                                    std::span<const int32_t> history, int32_t token) {
  if (token < 0 || static_cast<size_t>(token) >= logits.size()) {
    return make_error(ErrorKind::invalid, "sampling: token " + std::to_string(token) +
                                              " is outside the vocabulary [0, " +
                                              std::to_string(logits.size()) + ")");
  }
  if (Status ready = prepare(logits, history); !ready.ok()) return ready.error();
  SampledToken out;
  out.token = token;
  bool sorted = false;
  if (params_.temperature == 0.0f) {
    order_.resize(weight_.size());
    std::iota(order_.begin(), order_.end(), 0);
  } else {
    sorted = params_.top_k > 0 || params_.top_p < 1.0f;
    keep_filtered();
  }
  double total = 0.0;
  bool kept = false;
  for (int32_t t : order_) {
    total += weight_[static_cast<size_t>(t)];
    kept = kept || t == token;
  }
  RT_ASSERT(total > 0.0, "kept mass must be positive", total);
  double w = kept ? weight_[static_cast<size_t>(token)] : 0.0;
  out.logprob = w > 0.0 ? static_cast<float>(std::log(w / total))
                        : -std::numeric_limits<float>::infinity();
  if (params_.logprobs_top_n > 0) fill_top(out, order_, sorted, std::log(total));
  out.is_stop = std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(),
                          token) != params_.stop_token_ids.end();
  return out;
}

SamplingParams seeded_at(const SamplingParams& params, uint32_t position) {
  SamplingParams seeded = params;
  seeded.seed = params.seed * 0x9e3779b97f4a7c15ull + position + 1;
  return seeded;
}

SampledToken Sampler::sample_random() {
  bool sorted = params_.top_k > 0 || params_.top_p < 1.0f;
  keep_filtered();
  double total = 0.0;
  for (int32_t t : order_) total += weight_[static_cast<size_t>(t)];
  RT_ASSERT(total > 0.0, "kept mass must be positive", total);
  double target = next_unit() * total, acc = 0.0;
  int32_t chosen = order_.back();
  for (int32_t t : order_) {
    acc += weight_[static_cast<size_t>(t)];
    if (target < acc) {
      chosen = t;
      break;
    }
  }
  SampledToken out;
  out.token = chosen;
  out.logprob = static_cast<float>(std::log(weight_[static_cast<size_t>(chosen)] / total));
  if (params_.logprobs_top_n > 0) fill_top(out, order_, sorted, std::log(total));
  return out;
}

void Sampler::fill_top(SampledToken& out, std::span<const int32_t> kept, bool kept_sorted,
                       double log_total) {
  size_t n = std::min(kept.size(), static_cast<size_t>(params_.logprobs_top_n));
  RT_ASSERT(n >= 1, "fill_top with nothing to report");
  std::vector<int32_t> head;
  if (kept_sorted) {
    head.assign(kept.begin(), kept.begin() + static_cast<ptrdiff_t>(n));
  } else {
    head.assign(kept.begin(), kept.end());
    std::partial_sort(head.begin(), head.begin() + static_cast<ptrdiff_t>(n), head.end(),
                      ByWeightDesc{&weight_});
    head.resize(n);
  }
  out.top.clear();
  for (int32_t t : head) {
    double w = weight_[static_cast<size_t>(t)];
    if (w <= 0.0) break;  // underflowed to probability 0: not reportable
    out.top.push_back({t, static_cast<float>(std::log(w) - log_total)});
  }
  RT_ASSERT(out.top.size() <= n, "top-N overflow");
}

}  // namespace tandem::devices
