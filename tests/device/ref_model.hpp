// Test-only reference transformer: dense, unbatched, unpaged, written independently of
// devices/cpu (no shared code beyond the ModelConfig value type). Tensors are held by their
// HF names; a llama2.c checkpoint is read into the same names by read_llama2c().
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "devices/device.hpp"

namespace reftest {

using tandem::devices::ModelConfig;
using Tensors = std::map<std::string, std::vector<float>>;

struct RefModel {
  ModelConfig c;
  Tensors t;
  // Per-layer dense caches: [layer][pos * kv_width + i]
  std::vector<std::vector<double>> kc, vc;
  // The last step's residual stream entering each layer (EAGLE-3's target states).
  std::vector<std::vector<double>> layer_inputs;

  const std::vector<float>& at(const std::string& name) const {
    auto it = t.find(name);
    if (it == t.end()) {
      std::fprintf(stderr, "reference: missing %s\n", name.c_str());
      std::abort();
    }
    return it->second;
  }
  std::string L(uint32_t l, const std::string& rest) const {
    return "model.layers." + std::to_string(l) + "." + rest;
  }
  // y[out] = W[out, in] x[in]  (double accumulation)
  static std::vector<double> matvec(const std::vector<float>& w, const std::vector<double>& x,
                                    size_t out) {
    std::vector<double> y(out, 0.0);
    for (size_t o = 0; o < out; ++o) {
      double s = 0;
      for (size_t i = 0; i < x.size(); ++i) s += double(w[o * x.size() + i]) * x[i];
      y[o] = s;
    }
    return y;
  }
  std::vector<double> norm(const std::vector<double>& x, const std::vector<float>& w, size_t off,
                           size_t n) const {
    std::vector<double> y(x);
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
    double scale = 1.0 / std::sqrt(ss / double(n) + double(c.rms_eps));
    for (size_t i = 0; i < n; ++i) y[off + i] = double(w[i % w.size()]) * x[off + i] * scale;
    return y;
  }
  void rope_vec(std::vector<double>& v, uint32_t heads, uint32_t pos) const {
    uint32_t half = c.rotary_dim / 2;
    bool inter = c.rope_style == tandem::devices::RopeStyle::interleaved;
    for (uint32_t h = 0; h < heads; ++h) {
      for (uint32_t j = 0; j < half; ++j) {
        double freq = 1.0 / std::pow(double(c.rope_theta), 2.0 * j / double(c.rotary_dim));
        double a = pos * freq;
        size_t i0 = h * c.head_dim + (inter ? 2 * j : j);
        size_t i1 = h * c.head_dim + (inter ? 2 * j + 1 : j + half);
        double x0 = v[i0], x1 = v[i1];
        v[i0] = x0 * std::cos(a) - x1 * std::sin(a);
        v[i1] = x0 * std::sin(a) + x1 * std::cos(a);
      }
    }
  }
  void qk_norm(std::vector<double>& v, const std::vector<float>& w) const {
    size_t groups = v.size() / w.size();
    for (size_t g = 0; g < groups; ++g) v = norm(v, w, g * w.size(), w.size());
  }
  static std::vector<double> add_bias(std::vector<double> v, const Tensors& t,
                                      const std::string& name) {
    auto it = t.find(name);
    if (it != t.end()) {
      for (size_t i = 0; i < v.size(); ++i) v[i] += it->second[i];
    }
    return v;
  }
  std::vector<double> swiglu(const std::vector<double>& x, const std::vector<float>& w1,
                             const std::vector<float>& w2, const std::vector<float>& w3,
                             size_t width) const {
    auto g = matvec(w1, x, width), u = matvec(w3, x, width);
    for (size_t i = 0; i < width; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    return matvec(w2, g, c.hidden);
  }
  std::vector<double> moe(uint32_t l, const std::vector<double>& x) const {
    auto logits = matvec(at(L(l, "block_sparse_moe.gate.weight")), x, c.experts);
    std::vector<double> score(c.experts), rank(c.experts);
    for (uint32_t e = 0; e < c.experts; ++e) {
      score[e] = 1.0 / (1.0 + std::exp(-logits[e]));
      rank[e] = score[e];
      if (c.router_bias) rank[e] += at(L(l, "block_sparse_moe.e_score_correction_bias"))[e];
    }
    std::vector<uint32_t> order(c.experts);
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(),
                     [&rank](uint32_t a, uint32_t b) { return rank[a] > rank[b]; });
    double sum = 0;
    for (uint32_t i = 0; i < c.experts_per_token; ++i) sum += score[order[i]];
    std::vector<double> out(c.hidden, 0.0);
    for (uint32_t i = 0; i < c.experts_per_token; ++i) {
      uint32_t e = order[i];
      std::string p = L(l, "block_sparse_moe.experts." + std::to_string(e) + ".");
      auto y = swiglu(x, at(p + "w1.weight"), at(p + "w2.weight"), at(p + "w3.weight"),
                      c.moe_intermediate);
      for (uint32_t d = 0; d < c.hidden; ++d) out[d] += score[e] / sum * y[d];
    }
    return out;
  }
  std::vector<double> attention(uint32_t l, const std::vector<double>& xn, uint32_t pos) {
    uint32_t qw = c.heads * c.head_dim, kw = c.kv_heads * c.head_dim;
    auto q = add_bias(matvec(at(L(l, "self_attn.q_proj.weight")), xn, qw), t,
                      L(l, "self_attn.q_proj.bias"));
    auto k = add_bias(matvec(at(L(l, "self_attn.k_proj.weight")), xn, kw), t,
                      L(l, "self_attn.k_proj.bias"));
    auto v = add_bias(matvec(at(L(l, "self_attn.v_proj.weight")), xn, kw), t,
                      L(l, "self_attn.v_proj.bias"));
    if (c.qk_norm) {
      qk_norm(q, at(L(l, "self_attn.q_norm.weight")));
      qk_norm(k, at(L(l, "self_attn.k_norm.weight")));
    }
    rope_vec(q, c.heads, pos);
    rope_vec(k, c.kv_heads, pos);
    kc[l].resize(size_t(pos + 1) * kw);
    vc[l].resize(size_t(pos + 1) * kw);
    std::copy(k.begin(), k.end(), kc[l].begin() + long(pos) * kw);
    std::copy(v.begin(), v.end(), vc[l].begin() + long(pos) * kw);
    std::vector<double> out(qw, 0.0);
    uint32_t group = c.heads / c.kv_heads;
    for (uint32_t h = 0; h < c.heads; ++h) {
      size_t ko = size_t(h / group) * c.head_dim;
      std::vector<double> s(pos + 1);
      double mx = -1e300, sum = 0;
      for (uint32_t j = 0; j <= pos; ++j) {
        double d = 0;
        for (uint32_t i = 0; i < c.head_dim; ++i) d += q[h * c.head_dim + i] * kc[l][j * kw + ko + i];
        s[j] = d / std::sqrt(double(c.head_dim));
        mx = std::max(mx, s[j]);
      }
      for (auto& x : s) sum += (x = std::exp(x - mx));
      for (uint32_t j = 0; j <= pos; ++j) {
        for (uint32_t i = 0; i < c.head_dim; ++i) {
          out[h * c.head_dim + i] += s[j] / sum * vc[l][j * kw + ko + i];
        }
      }
    }
    return matvec(at(L(l, "self_attn.o_proj.weight")), out, c.hidden);
  }
  // Feeds token at position pos (positions must come in order 0, 1, 2, ...). Returns logits.
  std::vector<double> step(int32_t token, uint32_t pos) {
    if (kc.empty()) {
      kc.resize(c.layers);
      vc.resize(c.layers);
    }
    const auto& emb = at("model.embed_tokens.weight");
    std::vector<double> x(emb.begin() + long(token) * c.hidden,
                          emb.begin() + long(token + 1) * c.hidden);
    layer_inputs.resize(c.layers);
    for (uint32_t l = 0; l < c.layers; ++l) {
      layer_inputs[l] = x;
      auto a = attention(l, norm(x, at(L(l, "input_layernorm.weight")), 0, c.hidden), pos);
      for (uint32_t d = 0; d < c.hidden; ++d) x[d] += a[d];
      auto xn = norm(x, at(L(l, "post_attention_layernorm.weight")), 0, c.hidden);
      auto f = c.experts ? moe(l, xn)
                         : swiglu(xn, at(L(l, "mlp.gate_proj.weight")),
                                  at(L(l, "mlp.down_proj.weight")),
                                  at(L(l, "mlp.up_proj.weight")), c.intermediate);
      for (uint32_t d = 0; d < c.hidden; ++d) x[d] += f[d];
    }
    x = norm(x, at("model.norm.weight"), 0, c.hidden);
    return matvec(at(c.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"), x,
                  c.vocab_size);
  }
};

}  // namespace reftest
