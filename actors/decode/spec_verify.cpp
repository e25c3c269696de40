#include "actors/decode/spec_verify.hpp"

#include <cmath>
#include <string>

#include "runtime/base/assert.hpp"

namespace tandem::decode {
namespace {

Status check_shape(std::span<const float> rows, uint32_t vocab, std::span<const int32_t> drafts) {
  if (vocab == 0) return make_error(ErrorKind::invalid, "verify: the vocabulary is empty");
  const size_t want = (drafts.size() + 1) * size_t{vocab};
  if (rows.size() != want) {
    return make_error(ErrorKind::invalid, "verify: " + std::to_string(rows.size()) +
                                              " target values for " +
                                              std::to_string(drafts.size()) + " drafts of a " +
                                              std::to_string(vocab) + "-token vocabulary, not " +
                                              std::to_string(want));
  }
  for (size_t i = 0; i < drafts.size(); ++i) {
    if (drafts[i] < 0 || static_cast<uint32_t>(drafts[i]) >= vocab) {
      return make_error(ErrorKind::invalid, "verify: draft " + std::to_string(i) + " is token " +
                                                std::to_string(drafts[i]) + ", outside [0, " +
                                                std::to_string(vocab) + ")");
    }
  }
  return {};
}

Status check_probabilities(std::span<const float> values, uint32_t vocab, const char* what) {
  for (size_t r = 0; r * vocab < values.size(); ++r) {
    double total = 0;
    for (size_t t = 0; t < vocab; ++t) {
      const float v = values[r * vocab + t];
      if (!(v >= 0.0f) || !std::isfinite(v)) {
        return make_error(ErrorKind::invalid, std::string("verify: ") + what + " row " +
                                                  std::to_string(r) + " token " +
                                                  std::to_string(t) + " has probability " +
                                                  std::to_string(v));
      }
      total += v;
    }
    if (!(total > 0)) {
      return make_error(ErrorKind::invalid, std::string("verify: ") + what + " row " +
                                                std::to_string(r) + " sums to 0");
    }
  }
  return {};
}

// A draw from weights w (not normalized; total > 0) with one uniform u in [0, 1).
int32_t draw(std::span<const double> w, double total, double u) {
  RT_ASSERT(total > 0, total);
  double target = u * total, run = 0;
  int32_t last_positive = 0;
  for (size_t t = 0; t < w.size(); ++t) {
    if (w[t] <= 0) continue;
    run += w[t];
    last_positive = static_cast<int32_t>(t);
    if (target < run) return last_positive;
  }
  return last_positive;  // rounding at the top end
}

}  // namespace

int32_t argmax_of(std::span<const float> row) {
  RT_ASSERT(!row.empty());
  size_t best = 0;
  for (size_t t = 1; t < row.size(); ++t) {
    if (row[t] > row[best]) best = t;
  }
  return static_cast<int32_t>(best);
}

Result<Verified> verify_greedy(std::span<const float> rows, uint32_t vocab,
                               std::span<const int32_t> drafts) {
  if (Status s = check_shape(rows, vocab, drafts); !s.ok()) return s.error();
  Verified v;
  while (v.accepted < drafts.size() &&
         argmax_of(rows.subspan(size_t{v.accepted} * vocab, vocab)) == drafts[v.accepted]) {
    ++v.accepted;
  }
  v.next = argmax_of(rows.subspan(size_t{v.accepted} * vocab, vocab));
  return v;
}

Result<Verified> verify_sampled(std::span<const float> rows, uint32_t vocab,
                                std::span<const int32_t> drafts, std::span<const float> draft_q,
                                const std::function<double()>& unit) {
  if (Status s = check_shape(rows, vocab, drafts); !s.ok()) return s.error();
  if (Status s = check_probabilities(rows, vocab, "target"); !s.ok()) return s.error();
  return verify_sampled_rows(
      [&](size_t i) -> Result<std::span<const float>> { return rows.subspan(i * vocab, vocab); },
      vocab, drafts, draft_q, unit);
}

Result<Verified> verify_sampled_rows(const TargetRow& row, uint32_t vocab,
                                     std::span<const int32_t> drafts,
                                     std::span<const float> draft_q,
                                     const std::function<double()>& unit) {
  if (vocab == 0) return make_error(ErrorKind::invalid, "verify: the vocabulary is empty");
  for (size_t i = 0; i < drafts.size(); ++i) {
    if (drafts[i] < 0 || static_cast<uint32_t>(drafts[i]) >= vocab) {
      return make_error(ErrorKind::invalid, "verify: draft " + std::to_string(i) + " is token " +
                                                std::to_string(drafts[i]) + ", outside [0, " +
                                                std::to_string(vocab) + ")");
    }
  }
  if (!draft_q.empty() && draft_q.size() != drafts.size() * size_t{vocab}) {
    return make_error(ErrorKind::invalid, "verify: " + std::to_string(draft_q.size()) +
                                              " draft probabilities for " +
                                              std::to_string(drafts.size()) + " drafts");
  }
  if (Status s = check_probabilities(draft_q, vocab, "draft"); !s.ok()) return s.error();
  auto target = [&](size_t i) -> Result<std::span<const float>> {
    auto p = row(i);
    if (!p.ok()) return p.error();
    if (p->size() != vocab) {
      return make_error(ErrorKind::invalid, "verify: target row " + std::to_string(i) + " has " +
                                                std::to_string(p->size()) + " values, not " +
                                                std::to_string(vocab));
    }
    if (Status s = check_probabilities(*p, vocab, "target"); !s.ok()) return s.error();
    return p;
  };
  std::vector<double> w(vocab);
  Verified v;
  for (; v.accepted < drafts.size(); ++v.accepted) {
    const size_t i = v.accepted;
    auto got = target(i);
    if (!got.ok()) return got.error();
    auto p = *got;
    const int32_t d = drafts[i];
    const double q_d = draft_q.empty() ? 1.0 : draft_q[i * vocab + static_cast<size_t>(d)];
    if (!(q_d > 0)) {
      return make_error(ErrorKind::invalid, "verify: draft " + std::to_string(i) + " (token " +
                                                std::to_string(d) + ") has draft probability 0");
    }
    double p_total = 0;
    for (float x : p) p_total += x;
    const double p_d = p[static_cast<size_t>(d)] / p_total;
    if (unit() < std::min(1.0, p_d / q_d)) continue;  // accepted
    // Rejected: the residual norm(max(0, p - q)).
    double total = 0;
    for (size_t t = 0; t < vocab; ++t) {
      const double q_t = draft_q.empty() ? (static_cast<int32_t>(t) == d ? 1.0 : 0.0)
                                         : draft_q[i * vocab + t];
      w[t] = std::max(0.0, p[t] / p_total - q_t);
      total += w[t];
    }
    // p_d < q_d guarantees mass elsewhere up to rounding; if none is left, the target's own
    // row (p_d was ~1: the rejection itself had probability ~0).
    if (!(total > 1e-12)) {
      for (size_t t = 0; t < vocab; ++t) w[t] = p[t];
      total = p_total;
    }
    v.next = draw(w, total, unit());
    return v;
  }
  auto got = target(drafts.size());
  if (!got.ok()) return got.error();
  double total = 0;
  for (size_t t = 0; t < vocab; ++t) {
    w[t] = (*got)[t];
    total += w[t];
  }
  v.next = draw(w, total, unit());
  return v;
}

}  // namespace tandem::decode
