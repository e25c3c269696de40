#include "devices/cpu/eagle3.hpp"

#include <cstring>

#include "devices/cpu/ops.hpp"

namespace tandem::devices::cpu {

Eagle3Head::Eagle3Head(Eagle3Weights weights, const float* target_embed, uint32_t contexts_max)
    : w_(std::move(weights)),
      embed_(w_.embed != nullptr ? w_.embed : target_embed),
      contexts_max_(contexts_max) {
  RT_ASSERT(embed_ != nullptr, "an embedding for the draft head");
  RT_ASSERT(contexts_max_ > 0, "contexts_max");
  RT_ASSERT(w_.draft_to_target.size() == w_.config.draft_vocab, "d2t covers the draft vocab");
}

Eagle3Head::Context& Eagle3Head::context_for(uint64_t seq, uint32_t pos) {
  auto it = contexts_.find(seq);
  if (it == contexts_.end()) {
    if (contexts_.size() >= contexts_max_) {
      auto oldest = contexts_.begin();
      for (auto c = contexts_.begin(); c != contexts_.end(); ++c) {
        if (c->second.used < oldest->second.used) oldest = c;
      }
      contexts_.erase(oldest);
    }
    it = contexts_.emplace(seq, Context{}).first;
    it->second.base = it->second.end = pos;
  }
  Context& ctx = it->second;
  if (pos < ctx.base || pos > ctx.end) {  // a gap (or before what it holds): start over here
    ctx.base = ctx.end = pos;
    ctx.k.clear();
    ctx.v.clear();
  }
  ctx.used = ++uses_;
  RT_ASSERT(contexts_.size() <= contexts_max_, "contexts bound");
  return ctx;
}

Status Eagle3Head::forward(std::span<const Row> rows, std::vector<float>& logits,
                           std::vector<float>& prenorm) {
  const Eagle3Config& c = w_.config;
  uint32_t n = static_cast<uint32_t>(rows.size());
  uint32_t h = c.hidden, kv_out = c.kv_heads * c.head_dim, q_out = c.heads * c.head_dim;
  for (uint32_t i = 0; i < n; ++i) {
    const Row& r = rows[i];
    std::string where = "eagle3 draft row " + std::to_string(i) + " (seq " +
                        std::to_string(r.seq) + ")";
    if (r.token < 0 || static_cast<uint32_t>(r.token) >= c.vocab_size) {
      return make_error(ErrorKind::invalid, where + ": token " + std::to_string(r.token) +
                                                " outside [0, " + std::to_string(c.vocab_size) +
                                                ")");
    }
    if (r.pos >= c.max_position) {
      return make_error(ErrorKind::invalid, where + ": position " + std::to_string(r.pos) +
                                                " >= max_position " +
                                                std::to_string(c.max_position));
    }
    if (r.state == nullptr) return make_error(ErrorKind::invalid, where + ": no state");
    auto [last, fresh] = last_pos_.emplace(r.seq, r.pos);
    if (!fresh && last->second + 1 != r.pos) {
      uint32_t before = last->second;  // read before the map is cleared
      last_pos_.clear();
      return make_error(ErrorKind::invalid, where + ": position " + std::to_string(r.pos) +
                                                " follows " + std::to_string(before) +
                                                " (a sequence's rows ascend by one)");
    }
    last->second = r.pos;
  }
  // Contexts are evicted LRU when a new sequence arrives; one pass may not need more than the
  // bound, or it would evict a context an earlier row of the same pass still points at.
  size_t seqs = last_pos_.size();
  last_pos_.clear();
  if (seqs > contexts_max_) {
    return make_error(ErrorKind::invalid, "eagle3 draft pass: " + std::to_string(seqs) +
                                              " sequences exceed the head's " +
                                              std::to_string(contexts_max_) + " contexts");
  }
  if (n == 0) return {};
  // h_: each row's state in the head's width (target layers fused by fc, or the head's own).
  h_.resize(uint64_t{n} * h);
  uint64_t wide = 3 * uint64_t{c.target_hidden};
  fused_in_.clear();
  for (uint32_t i = 0; i < n; ++i) {
    if (rows[i].fused) {
      fused_in_.insert(fused_in_.end(), rows[i].state, rows[i].state + wide);
    } else {
      std::memcpy(&h_[uint64_t{i} * h], rows[i].state, sizeof(float) * h);
    }
  }
  if (uint32_t m = static_cast<uint32_t>(fused_in_.size() / wide); m > 0) {
    fused_out_.resize(uint64_t{m} * h);
    gemm_nt(fused_in_.data(), m, static_cast<uint32_t>(wide), w_.fc, h, fused_out_.data());
    for (uint32_t i = 0, f = 0; i < n; ++i) {
      if (!rows[i].fused) continue;
      std::memcpy(&h_[uint64_t{i} * h], &fused_out_[uint64_t{f++} * h], sizeof(float) * h);
    }
  }
  // x_ = [input_layernorm(embed(token)); hidden_norm(state)]
  x_.resize(uint64_t{n} * 2 * h);
  fused_.resize(uint64_t{n} * h);  // the residual the attention output adds to
  for (uint32_t i = 0; i < n; ++i) {
    float* x = &x_[uint64_t{i} * 2 * h];
    rmsnorm(x, embed_ + uint64_t(rows[i].token) * h, w_.input_norm, h, c.rms_eps);
    rmsnorm(x + h, &h_[uint64_t{i} * h], w_.hidden_norm, h, c.rms_eps);
    const float* residual = c.norm_before_residual ? x + h : &h_[uint64_t{i} * h];
    std::memcpy(&fused_[uint64_t{i} * h], residual, sizeof(float) * h);
  }
  q_.resize(uint64_t{n} * q_out);
  k_.resize(uint64_t{n} * kv_out);
  v_.resize(uint64_t{n} * kv_out);
  gemm_nt(x_.data(), n, 2 * h, w_.wq, q_out, q_.data());
  gemm_nt(x_.data(), n, 2 * h, w_.wk, kv_out, k_.data());
  gemm_nt(x_.data(), n, 2 * h, w_.wv, kv_out, v_.data());
  RopeShape shape{c.head_dim, c.head_dim, c.rope_theta, RopeStyle::rotate_half};
  // Every row's K and V go in first: a row attends to the earlier rows of its pass.
  std::vector<Context*> ctx(n);
  for (uint32_t i = 0; i < n; ++i) {
    rope(&q_[uint64_t{i} * q_out], c.heads, shape, rows[i].pos);
    rope(&k_[uint64_t{i} * kv_out], c.kv_heads, shape, rows[i].pos);
    Context& cx = context_for(rows[i].seq, rows[i].pos);
    uint64_t at = uint64_t{rows[i].pos - cx.base} * kv_out;
    cx.k.resize(at + kv_out);
    cx.v.resize(at + kv_out);
    std::memcpy(&cx.k[at], &k_[uint64_t{i} * kv_out], sizeof(float) * kv_out);
    std::memcpy(&cx.v[at], &v_[uint64_t{i} * kv_out], sizeof(float) * kv_out);
    cx.end = rows[i].pos + 1;
    ctx[i] = &cx;
  }
  att_.resize(uint64_t{n} * q_out);
  for (uint32_t i = 0; i < n; ++i) {
    const Context& cx = *ctx[i];
    attend(
        &q_[uint64_t{i} * q_out], c.heads, c.kv_heads, c.head_dim, rows[i].pos - cx.base + 1,
        [&](uint32_t j) { return &cx.k[uint64_t{j} * kv_out]; },
        [&](uint32_t j) { return &cx.v[uint64_t{j} * kv_out]; }, scores_,
        &att_[uint64_t{i} * q_out]);
  }
  // r = residual + o_proj(att); out = r + mlp(post_attention_layernorm(r))
  gemm_nt(att_.data(), n, q_out, w_.wo, h, fused_.data(), 1.0f);
  xn_.resize(uint64_t{n} * h);
  for (uint32_t i = 0; i < n; ++i) {
    rmsnorm(&xn_[uint64_t{i} * h], &fused_[uint64_t{i} * h], w_.post_norm, h, c.rms_eps);
  }
  uint64_t width = c.intermediate;
  gate_.resize(n * width);
  up_.resize(n * width);
  gemm_nt(xn_.data(), n, h, w_.w1, c.intermediate, gate_.data());
  gemm_nt(xn_.data(), n, h, w_.w3, c.intermediate, up_.data());
  for (uint64_t i = 0; i < n * width; ++i) gate_[i] = silu(gate_[i]) * up_[i];
  gemm_nt(gate_.data(), n, c.intermediate, w_.w2, h, fused_.data(), 1.0f);
  prenorm.assign(fused_.begin(), fused_.begin() + static_cast<std::ptrdiff_t>(n * h));
  for (uint32_t i = 0; i < n; ++i) {
    rmsnorm(&xn_[uint64_t{i} * h], &fused_[uint64_t{i} * h], w_.final_norm, h, c.rms_eps);
  }
  logits.resize(uint64_t{n} * c.draft_vocab);
  gemm_nt(xn_.data(), n, h, w_.lm_head, c.draft_vocab, logits.data());
  return {};
}

int32_t Eagle3Head::argmax_target(const float* row) const {
  uint32_t best = 0;
  for (uint32_t i = 1; i < w_.config.draft_vocab; ++i) {
    if (row[i] > row[best]) best = i;
  }
  return w_.draft_to_target[best];
}

}  // namespace tandem::devices::cpu
