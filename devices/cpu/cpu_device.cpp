#include "devices/cpu/cpu_device.hpp"

#include "devices/cpu/eagle3.hpp"
#include "devices/cpu/ops.hpp"
#include "devices/cpu/small_gemm.hpp"

#include <cblas.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <unordered_map>

// OpenBLAS DYNAMIC_ARCH internals (exported by Debian's libopenblas0-pthread/-openmp): re-run
// the kernel selection, which reads OPENBLAS_CORETYPE. Weak: absent in single-arch builds.
extern "C" __attribute__((weak)) void gotoblas_dynamic_init(void);
extern "C" __attribute__((weak)) void gotoblas_dynamic_quit(void);

namespace tandem::devices::cpu {
namespace {

// Sequences whose draft KV the EAGLE-3 head keeps (least recently used out beyond).
constexpr uint32_t kDraftContextsMax = 1024;

// A sequence of either kind, as the forward pass sees it.
struct SeqView {
  uint64_t seq_id;
  const std::vector<uint32_t>* block_table;
  uint32_t start_pos;
  const std::vector<int32_t>* tokens;
  bool argmax_only = false;  // decode: return each row's argmax, not its logits
  int32_t logprobs_top_n = -1;  // with argmax_only, >= 0: each row scored too
};



// One new token of the batch.
struct TokenSlot {
  uint32_t seq_index;
  uint32_t pos;
};

// MoE routing scratch, reused across layers and steps.
struct RouteScratch {
  std::vector<float> logits, score, rank, weights;
  std::vector<uint32_t> order, chosen;
  std::vector<std::vector<std::pair<uint32_t, float>>> per_expert;  // (token, weight)
};

class CpuDevice final : public Device {
 public:
  CpuDevice(ModelWeights weights, KvLayout layout, std::unique_ptr<PoolMemory> pool,
            int threads, int single_token_threads)
      : w_(std::move(weights)),
        layout_(layout),
        pool_(std::move(pool)),
        threads_(threads),
        single_token_threads_(single_token_threads) {
    RT_ASSERT(pool_->bytes() == layout_.pool_bytes(), "pool size");
    RT_ASSERT(layout_.element_bytes == sizeof(float), "cpu pool is fp32");
  }

  const ModelConfig& model_config() const override { return w_.config; }
  const KvLayout& kv_layout() const override { return layout_; }
  MemoryRegion kv_region() override { return {pool_->base(), pool_->bytes()}; }
  uint64_t bytes_per_token() const { return w_.bytes_per_token; }

  Result<StepOutput> prefill(std::span<const PrefillSeq> batch) override {
    views_.clear();
    for (const auto& s : batch) {
      views_.push_back({s.seq_id, &s.block_table, s.start_pos, &s.tokens});
    }
    // Nothing is written unless the whole pass is valid.
    if (auto st = check_copies(batch, layout_); !st) return st.error();
    if (auto st = validate(views_, "prefill"); !st) return st.error();
    apply_copies(batch, layout_, kv_region());
    return run(views_, false, "prefill");
  }
  Result<StepOutput> decode(std::span<const DecodeSeq> batch) override {
    views_.clear();
    for (const auto& s : batch) {
      views_.push_back(
          {s.seq_id, &s.block_table, s.start_pos, &s.tokens, s.argmax_only, s.logprobs_top_n});
    }
    return run(views_, true, "decode");
  }
  Status copy_blocks_out(std::span<const uint32_t> blocks, std::span<std::byte> dst) override;
  Status copy_blocks_in(std::span<const uint32_t> blocks,
                        std::span<const std::byte> src) override;

  void set_draft_head(std::unique_ptr<Eagle3Head> head) { draft_ = std::move(head); }
  bool has_draft_model() const override { return draft_ != nullptr; }
  Result<std::vector<DraftOutput>> draft(std::span<const DraftSeq> batch,
                                         std::span<const uint64_t> forget) override;

 private:
  // A decode pass's rows as the draft head reads them: per row, the residual stream entering
  // each of the head's aux layers (3 x hidden).
  struct KeptRows {
    uint32_t start_pos = 0;
    uint32_t rows = 0;
    std::vector<float> states;  // rows x 3 x hidden
  };
  void keep_aux_state(uint32_t layer, uint32_t tokens_count);
  void keep_rows(const std::vector<SeqView>& seqs);

  Status validate(const std::vector<SeqView>& seqs, const char* what) const;
  Result<StepOutput> run(const std::vector<SeqView>& seqs, bool all_rows, const char* what);

 public:
  Result<StageOutput> run_stage(const PrefillSeq& seq, uint32_t layer_first, uint32_t layer_end,
                                std::span<const float> hidden_in);

 private:
  void attention_block(uint32_t layer, const std::vector<SeqView>& seqs,
                       const std::vector<TokenSlot>& slots);
  void qkv_project(const LayerWeights& lw, uint32_t tokens_count);
  void qk_norm_rope(const LayerWeights& lw, const std::vector<TokenSlot>& slots);
  void attend_one(uint32_t layer, const SeqView& seq, uint32_t pos, const float* q, float* out);
  void ffn_block(uint32_t layer, uint32_t tokens_count);
  void moe_block(const LayerWeights& lw, uint32_t tokens_count);
  StepOutput head(const std::vector<SeqView>& seqs, bool all_rows, uint32_t tokens_count);
  float* kv_row(const SeqView& seq, uint32_t pos, uint32_t layer, KvPart part) {
    uint32_t bt = layout_.block_tokens;
    uint32_t block = (*seq.block_table)[pos / bt];
    uint64_t off = layout_.slot_offset_bytes(block, layer, part, pos % bt);
    return reinterpret_cast<float*>(pool_->base() + off);
  }

  // BLAS threads for this pass (process-wide OpenBLAS setting; set only when it changes).
  void set_blas_threads(uint32_t tokens_count) {
    int want = tokens_count == 1 ? single_token_threads_ : threads_;
    RT_ASSERT(want >= 1, "blas threads", want);
    if (openblas_get_num_threads() != want) openblas_set_num_threads(want);
  }

  ModelWeights w_;
  KvLayout layout_;
  std::unique_ptr<PoolMemory> pool_;
  int threads_;               // >= 1
  int single_token_threads_;  // >= 1
  // Scratch, resized per pass (grow-only in practice): a decode step allocates nothing but
  // its output logits.
  std::vector<float> x_, xn_, q_, k_, v_, att_, tmp_, gate_, up_, scores_, logits_;
  std::vector<SeqView> views_;
  std::vector<TokenSlot> slots_;
  std::vector<uint32_t> rows_;
  RouteScratch route_;
  std::unique_ptr<Eagle3Head> draft_;  // null: no draft model
  std::vector<float> aux_;             // this pass's tokens x 3 x hidden (draft_ set)
  std::unordered_map<uint64_t, KeptRows> kept_;  // the last decode pass's sequences
  std::vector<float> draft_logits_, draft_prenorm_, draft_states_;
};

Status CpuDevice::validate(const std::vector<SeqView>& seqs, const char* what) const {
  std::string w = std::string("cpu device ") + what;
  if (seqs.empty()) return make_error(ErrorKind::invalid, w + ": empty batch");
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqView& s = seqs[i];
    if (auto st =
            check_seq(w, i, {s.seq_id, *s.tokens, s.start_pos, *s.block_table}, w_.config, layout_);
        !st) {
      return st;
    }
  }
  return {};
}

Result<StepOutput> CpuDevice::run(const std::vector<SeqView>& seqs, bool all_rows,
                                  const char* what) {
  if (auto st = validate(seqs, what); !st) return st.error();
  const ModelConfig& c = w_.config;
  std::vector<TokenSlot>& slots = slots_;
  slots.clear();
  for (uint32_t i = 0; i < seqs.size(); ++i) {
    for (uint32_t j = 0; j < seqs[i].tokens->size(); ++j) {
      slots.push_back({i, seqs[i].start_pos + j});
    }
  }
  uint32_t n = static_cast<uint32_t>(slots.size());
  set_blas_threads(n);
  x_.resize(uint64_t{n} * c.hidden);
  for (uint32_t t = 0; t < n; ++t) {
    int32_t id = (*seqs[slots[t].seq_index].tokens)[slots[t].pos - seqs[slots[t].seq_index].start_pos];
    std::memcpy(&x_[uint64_t{t} * c.hidden], w_.embed + uint64_t(id) * c.hidden,
                sizeof(float) * c.hidden);
  }
  bool keep = draft_ != nullptr && all_rows;  // decode: the draft head reads its states
  if (keep) aux_.resize(uint64_t{n} * 3 * c.hidden);
  for (uint32_t l = 0; l < c.layers; ++l) {
    if (keep) keep_aux_state(l, n);
    attention_block(l, seqs, slots);
    ffn_block(l, n);
  }
  if (keep) keep_rows(seqs);
  StepOutput out = head(seqs, all_rows, n);
  RT_ASSERT(out.seqs.size() == seqs.size(), "one output per sequence");
  return out;
}

Result<StageOutput> CpuDevice::run_stage(const PrefillSeq& seq, uint32_t layer_first,
                                         uint32_t layer_end, std::span<const float> hidden_in) {
  const ModelConfig& c = w_.config;
  if (layer_first >= layer_end || layer_end > c.layers) {
    return make_error(ErrorKind::invalid,
                      "cpu device stage: layers [" + std::to_string(layer_first) + ", " +
                          std::to_string(layer_end) + ") of " + std::to_string(c.layers));
  }
  views_.clear();
  views_.push_back({seq.seq_id, &seq.block_table, seq.start_pos, &seq.tokens});
  if (auto st = validate(views_, "stage"); !st) return st.error();
  const auto n = static_cast<uint32_t>(seq.tokens.size());
  if (layer_first > 0 && hidden_in.size() != uint64_t{n} * c.hidden) {
    return make_error(ErrorKind::invalid, "cpu device stage: " + std::to_string(hidden_in.size()) +
                                              " hidden values for " + std::to_string(n) +
                                              " tokens of width " + std::to_string(c.hidden));
  }
  slots_.clear();
  for (uint32_t j = 0; j < n; ++j) slots_.push_back({0, seq.start_pos + j});
  set_blas_threads(n);
  x_.resize(uint64_t{n} * c.hidden);
  if (layer_first == 0) {
    for (uint32_t t = 0; t < n; ++t) {
      std::memcpy(&x_[uint64_t{t} * c.hidden], w_.embed + uint64_t(seq.tokens[t]) * c.hidden,
                  sizeof(float) * c.hidden);
    }
  } else {
    std::copy(hidden_in.begin(), hidden_in.end(), x_.begin());
  }
  for (uint32_t l = layer_first; l < layer_end; ++l) {
    attention_block(l, views_, slots_);
    ffn_block(l, n);
  }
  StageOutput out;
  if (layer_end < c.layers) {
    out.hidden = x_;
    return out;
  }
  StepOutput logits = head(views_, false, n);
  out.logits = std::move(logits.seqs[0].logits);
  if (out.logits.empty()) {  // the head sampled greedily: never for a prefill view
    return make_error(ErrorKind::failed, "cpu device stage: no logits row");
  }
  return out;
}

void CpuDevice::keep_aux_state(uint32_t layer, uint32_t n) {
  const ModelConfig& c = w_.config;
  const auto& aux = draft_->config().aux_layers;
  for (uint32_t a = 0; a < aux.size(); ++a) {
    if (aux[a] != layer) continue;
    for (uint32_t t = 0; t < n; ++t) {
      std::memcpy(&aux_[(uint64_t{t} * 3 + a) * c.hidden], &x_[uint64_t{t} * c.hidden],
                  sizeof(float) * c.hidden);
    }
  }
}

void CpuDevice::keep_rows(const std::vector<SeqView>& seqs) {
  uint64_t width = 3 * uint64_t{w_.config.hidden};
  kept_.clear();
  uint64_t first = 0;
  for (const SeqView& s : seqs) {
    uint32_t rows = static_cast<uint32_t>(s.tokens->size());
    KeptRows& k = kept_[s.seq_id];
    k.start_pos = s.start_pos;
    k.rows = rows;
    k.states.assign(aux_.begin() + static_cast<std::ptrdiff_t>(first * width),
                    aux_.begin() + static_cast<std::ptrdiff_t>((first + rows) * width));
    first += rows;
  }
}

Result<std::vector<DraftOutput>> CpuDevice::draft(std::span<const DraftSeq> batch,
                                                  std::span<const uint64_t> forget) {
  if (!draft_) return Device::draft(batch, forget);
  for (uint64_t seq : forget) draft_->drop(seq);
  const Eagle3Config& dc = draft_->config();
  uint32_t limit = std::min(dc.max_position, w_.config.max_position);
  std::vector<Eagle3Head::Row> rows;
  std::vector<uint32_t> last_row(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const DraftSeq& d = batch[i];
    std::string where = "cpu device draft: seq " + std::to_string(d.seq_id);
    auto it = kept_.find(d.seq_id);
    if (it == kept_.end()) {
      return make_error(ErrorKind::invalid, where + " was not in the last decode pass");
    }
    const KeptRows& k = it->second;
    if (d.emitted.empty() || d.emitted.size() > k.rows || d.draft_tokens == 0) {
      return make_error(ErrorKind::invalid,
                        where + ": " + std::to_string(d.emitted.size()) +
                            " emitted tokens for a pass of " + std::to_string(k.rows) +
                            " rows, " + std::to_string(d.draft_tokens) +
                            " draft tokens wanted (needs 1..rows and >= 1)");
    }
    for (uint32_t r = 0; r < d.emitted.size(); ++r) {
      rows.push_back({d.seq_id, k.start_pos + r, d.emitted[r],
                      &k.states[uint64_t{r} * 3 * w_.config.hidden], true});
    }
    last_row[i] = static_cast<uint32_t>(rows.size() - 1);
  }
  std::vector<DraftOutput> out(batch.size());
  if (batch.empty()) return out;
  set_blas_threads(static_cast<uint32_t>(rows.size()));
  uint32_t h = dc.hidden;
  // Step 0 feeds the emitted positions (the target's states); each later step one position
  // per sequence still drafting (the head's own state).
  std::vector<size_t> drafting(batch.size());
  std::iota(drafting.begin(), drafting.end(), size_t{0});
  for (uint32_t step = 0; !drafting.empty(); ++step) {
    if (auto st = draft_->forward(rows, draft_logits_, draft_prenorm_); !st) return st.error();
    draft_states_.resize(uint64_t(drafting.size()) * h);
    std::vector<size_t> next;
    std::vector<Eagle3Head::Row> next_rows;
    for (size_t j = 0; j < drafting.size(); ++j) {
      size_t i = drafting[j];
      uint32_t r = step == 0 ? last_row[i] : static_cast<uint32_t>(j);
      int32_t token = draft_->argmax_target(&draft_logits_[uint64_t{r} * dc.draft_vocab]);
      out[i].seq_id = batch[i].seq_id;
      out[i].tokens.push_back(token);
      std::memcpy(&draft_states_[uint64_t(next.size()) * h], &draft_prenorm_[uint64_t{r} * h],
                  sizeof(float) * h);
      uint32_t pos = rows[r].pos + 1;  // the drafted token sits at pos + 1
      if (out[i].tokens.size() < batch[i].draft_tokens && pos + 1 < limit) {
        next_rows.push_back({batch[i].seq_id, pos, token, nullptr, false});
        next.push_back(i);
      }
    }
    for (size_t j = 0; j < next_rows.size(); ++j) next_rows[j].state = &draft_states_[j * h];
    rows = std::move(next_rows);
    drafting = std::move(next);
  }
  return out;
}

void CpuDevice::qkv_project(const LayerWeights& lw, uint32_t n) {
  const ModelConfig& c = w_.config;
  uint32_t q_out = c.heads * c.head_dim, kv_out = c.kv_heads * c.head_dim;
  xn_.resize(uint64_t{n} * c.hidden);
  for (uint32_t t = 0; t < n; ++t) {
    rmsnorm(&xn_[uint64_t{t} * c.hidden], &x_[uint64_t{t} * c.hidden], lw.attn_norm, c.hidden,
            c.rms_eps);
  }
  q_.resize(uint64_t{n} * q_out);
  k_.resize(uint64_t{n} * kv_out);
  v_.resize(uint64_t{n} * kv_out);
  gemm_nt(xn_.data(), n, c.hidden, lw.wq, q_out, q_.data());
  gemm_nt(xn_.data(), n, c.hidden, lw.wk, kv_out, k_.data());
  gemm_nt(xn_.data(), n, c.hidden, lw.wv, kv_out, v_.data());
  auto add_bias = [n](std::vector<float>& m, const float* bias, uint32_t width) {
    if (bias == nullptr) return;
    for (uint32_t t = 0; t < n; ++t) {
      for (uint32_t i = 0; i < width; ++i) m[uint64_t{t} * width + i] += bias[i];
    }
  };
  add_bias(q_, lw.bq, q_out);
  add_bias(k_, lw.bk, kv_out);
  add_bias(v_, lw.bv, kv_out);
}

// In-place RMSNorm of `count` groups of `width` elements with a shared weight.
void norm_groups(float* v, uint32_t count, uint32_t width, const float* weight, float eps) {
  for (uint32_t g = 0; g < count; ++g) rmsnorm(v + uint64_t{g} * width, v + uint64_t{g} * width,
                                               weight, width, eps);
}

void CpuDevice::qk_norm_rope(const LayerWeights& lw, const std::vector<TokenSlot>& slots) {
  const ModelConfig& c = w_.config;
  uint32_t q_out = c.heads * c.head_dim, kv_out = c.kv_heads * c.head_dim;
  for (uint32_t t = 0; t < slots.size(); ++t) {
    float* q = &q_[uint64_t{t} * q_out];
    float* k = &k_[uint64_t{t} * kv_out];
    if (c.qk_norm) {
      RT_ASSERT(lw.q_norm != nullptr && lw.k_norm != nullptr, "qk_norm weights bound");
      norm_groups(q, q_out / lw.q_norm_elems, lw.q_norm_elems, lw.q_norm, c.rms_eps);
      norm_groups(k, kv_out / lw.k_norm_elems, lw.k_norm_elems, lw.k_norm, c.rms_eps);
    }
    RopeShape shape{c.head_dim, c.rotary_dim, c.rope_theta, c.rope_style};
    rope(q, c.heads, shape, slots[t].pos);
    rope(k, c.kv_heads, shape, slots[t].pos);
  }
}

void CpuDevice::attention_block(uint32_t layer, const std::vector<SeqView>& seqs,
                                const std::vector<TokenSlot>& slots) {
  const ModelConfig& c = w_.config;
  const LayerWeights& lw = w_.layers[layer];
  uint32_t n = static_cast<uint32_t>(slots.size());
  uint32_t q_out = c.heads * c.head_dim, kv_out = c.kv_heads * c.head_dim;
  qkv_project(lw, n);
  qk_norm_rope(lw, slots);
  // Write every new token's K and V first: a token attends to earlier tokens of its own chunk.
  for (uint32_t t = 0; t < n; ++t) {
    const SeqView& s = seqs[slots[t].seq_index];
    std::memcpy(kv_row(s, slots[t].pos, layer, KvPart::k), &k_[uint64_t{t} * kv_out],
                sizeof(float) * kv_out);
    std::memcpy(kv_row(s, slots[t].pos, layer, KvPart::v), &v_[uint64_t{t} * kv_out],
                sizeof(float) * kv_out);
  }
  att_.resize(uint64_t{n} * q_out);
  for (uint32_t t = 0; t < n; ++t) {
    attend_one(layer, seqs[slots[t].seq_index], slots[t].pos, &q_[uint64_t{t} * q_out],
               &att_[uint64_t{t} * q_out]);
  }
  // x += att * wo^T
  gemm_nt(att_.data(), n, q_out, lw.wo, c.hidden, x_.data(), 1.0f);
}

// Causal attention of one query token (all heads) over positions [0, pos] of its sequence.
void CpuDevice::attend_one(uint32_t layer, const SeqView& seq, uint32_t pos, const float* q,
                           float* out) {
  const ModelConfig& c = w_.config;
  RT_ASSERT(pos < c.max_position, "pos", pos);
  RT_ASSERT(c.heads % c.kv_heads == 0, "GQA grouping");
  attend(
      q, c.heads, c.kv_heads, c.head_dim, pos + 1,
      [&](uint32_t j) { return kv_row(seq, j, layer, KvPart::k); },
      [&](uint32_t j) { return kv_row(seq, j, layer, KvPart::v); }, scores_, out);
}

void CpuDevice::ffn_block(uint32_t layer, uint32_t n) {
  const ModelConfig& c = w_.config;
  const LayerWeights& lw = w_.layers[layer];
  xn_.resize(uint64_t{n} * c.hidden);
  for (uint32_t t = 0; t < n; ++t) {
    rmsnorm(&xn_[uint64_t{t} * c.hidden], &x_[uint64_t{t} * c.hidden], lw.ffn_norm, c.hidden,
            c.rms_eps);
  }
  if (c.experts > 0) {
    moe_block(lw, n);
    return;
  }
  uint64_t width = c.intermediate;
  gate_.resize(n * width);
  up_.resize(n * width);
  gemm_nt(xn_.data(), n, c.hidden, lw.w1, c.intermediate, gate_.data());
  gemm_nt(xn_.data(), n, c.hidden, lw.w3, c.intermediate, up_.data());
  for (uint64_t i = 0; i < n * width; ++i) gate_[i] = silu(gate_[i]) * up_[i];
  gemm_nt(gate_.data(), n, c.intermediate, lw.w2, c.hidden, x_.data(), 1.0f);
}

// Top-k expert choice for one token: sigmoid scores; bias (if any) only ranks; weights are the
// chosen experts' sigmoid scores normalized to sum 1. Ties go to the lower expert index.
// Fills r.chosen and r.weights.
void route_token(const float* logits, const float* bias, uint32_t experts, uint32_t k,
                 RouteScratch& r) {
  RT_ASSERT(k > 0 && k <= experts, "experts_per_token", k, experts);
  r.score.resize(experts);
  r.rank.resize(experts);
  for (uint32_t e = 0; e < experts; ++e) {
    r.score[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    r.rank[e] = r.score[e] + (bias ? bias[e] : 0.0f);
  }
  r.order.resize(experts);
  std::iota(r.order.begin(), r.order.end(), 0u);
  const std::vector<float>& rank = r.rank;
  std::partial_sort(r.order.begin(), r.order.begin() + k, r.order.end(),
                    [&rank](uint32_t a, uint32_t b) {
                      return rank[a] > rank[b] || (rank[a] == rank[b] && a < b);
                    });
  r.chosen.assign(r.order.begin(), r.order.begin() + k);
  float sum = 0.0f;
  for (uint32_t e : r.chosen) sum += r.score[e];
  r.weights.clear();
  for (uint32_t e : r.chosen) r.weights.push_back(r.score[e] / sum);
  RT_ASSERT(r.weights.size() == k, "one weight per chosen expert");
}

void CpuDevice::moe_block(const LayerWeights& lw, uint32_t n) {
  const ModelConfig& c = w_.config;
  RT_ASSERT(lw.router != nullptr, "router bound");
  RT_ASSERT(lw.experts.size() == c.experts, "experts bound");
  RouteScratch& r = route_;
  r.logits.resize(uint64_t{n} * c.experts);
  gemm_nt(xn_.data(), n, c.hidden, lw.router, c.experts, r.logits.data());
  r.per_expert.resize(c.experts);
  for (auto& rows : r.per_expert) rows.clear();
  for (uint32_t t = 0; t < n; ++t) {
    route_token(&r.logits[uint64_t{t} * c.experts], lw.router_bias, c.experts,
                c.experts_per_token, r);
    for (uint32_t i = 0; i < r.chosen.size(); ++i) {
      r.per_expert[r.chosen[i]].push_back({t, r.weights[i]});
    }
  }
  uint64_t width = c.moe_intermediate;
  for (uint32_t e = 0; e < c.experts; ++e) {
    const auto& rows = r.per_expert[e];
    if (rows.empty()) continue;
    uint32_t m = static_cast<uint32_t>(rows.size());
    tmp_.resize(uint64_t{m} * c.hidden);
    for (uint32_t i = 0; i < m; ++i) {
      std::memcpy(&tmp_[uint64_t{i} * c.hidden], &xn_[uint64_t{rows[i].first} * c.hidden],
                  sizeof(float) * c.hidden);
    }
    gate_.resize(m * width);
    up_.resize(m * width);
    gemm_nt(tmp_.data(), m, c.hidden, lw.experts[e].w1, c.moe_intermediate, gate_.data());
    gemm_nt(tmp_.data(), m, c.hidden, lw.experts[e].w3, c.moe_intermediate, up_.data());
    for (uint64_t i = 0; i < m * width; ++i) gate_[i] = silu(gate_[i]) * up_[i];
    gemm_nt(gate_.data(), m, c.moe_intermediate, lw.experts[e].w2, c.hidden, tmp_.data());
    for (uint32_t i = 0; i < m; ++i) {
      float* xr = &x_[uint64_t{rows[i].first} * c.hidden];
      const float* o = &tmp_[uint64_t{i} * c.hidden];
      for (uint32_t d = 0; d < c.hidden; ++d) xr[d] += rows[i].second * o[d];
    }
  }
}

StepOutput CpuDevice::head(const std::vector<SeqView>& seqs, bool all_rows, uint32_t n) {
  const ModelConfig& c = w_.config;
  std::vector<uint32_t>& rows = rows_;  // token indices (into the batch) that get logits
  rows.clear();
  uint32_t first = 0;
  for (const auto& s : seqs) {
    uint32_t count = static_cast<uint32_t>(s.tokens->size());
    for (uint32_t j = all_rows ? 0 : count - 1; j < count; ++j) rows.push_back(first + j);
    first += count;
  }
  RT_ASSERT(first == n, "token count", first, n);
  uint32_t r = static_cast<uint32_t>(rows.size());
  xn_.resize(uint64_t{r} * c.hidden);
  for (uint32_t i = 0; i < r; ++i) {
    rmsnorm(&xn_[uint64_t{i} * c.hidden], &x_[uint64_t{rows[i]} * c.hidden], w_.final_norm,
            c.hidden, c.rms_eps);
  }
  std::vector<float>& logits = logits_;
  logits.resize(uint64_t{r} * c.vocab_size);
  gemm_nt(xn_.data(), r, c.hidden, w_.lm_head, c.vocab_size, logits.data());
  StepOutput out;
  uint64_t row = 0;
  for (const auto& s : seqs) {
    SeqOutput so;
    so.seq_id = s.seq_id;
    so.rows_count = all_rows ? static_cast<uint32_t>(s.tokens->size()) : 1;
    auto begin = logits.begin() + static_cast<std::ptrdiff_t>(row * c.vocab_size);
    bool argmax = s.argmax_only;
    for (uint32_t i = 0; argmax && i < so.rows_count; ++i) {
      auto best = static_cast<int32_t>(row_argmax(&*begin + uint64_t{i} * c.vocab_size,
                                                  c.vocab_size));
      argmax = best >= 0;  // a NaN row: the logits go back, for the sampler to report
      so.tokens.push_back(best);
    }
    if (argmax && s.logprobs_top_n >= 0) {
      // The row's logprobs beside the device: what the caller's greedy sampler would report.
      SamplingParams greedy;
      greedy.temperature = 0.0f;
      greedy.logprobs = true;
      greedy.logprobs_top_n = std::min(s.logprobs_top_n, logprobs_top_n_max);
      Sampler scorer(greedy);
      // Only the rows greedy verification emits: up to the first whose argmax is not the
      // next input token (the draft it verifies).
      for (uint32_t i = 0; argmax && i < so.rows_count; ++i) {
        std::span<const float> one(&*begin + uint64_t{i} * c.vocab_size, c.vocab_size);
        auto scored = scorer.score(one, {}, so.tokens[i]);
        argmax = scored.ok();
        if (argmax) so.scored.push_back(std::move(scored).value());
        if (i + 1 < so.rows_count && so.tokens[i] != (*s.tokens)[i + 1]) break;
      }
    }
    if (!argmax) {
      so.tokens.clear();
      so.scored.clear();
      so.logits.assign(begin, begin + static_cast<std::ptrdiff_t>(so.rows_count) * c.vocab_size);
    }
    row += so.rows_count;
    out.seqs.push_back(std::move(so));
  }
  RT_ASSERT(row == r, "rows", row, r);
  return out;
}

Status CpuDevice::copy_blocks_out(std::span<const uint32_t> blocks, std::span<std::byte> dst) {
  if (auto st = check_block_copy(blocks, dst.size(), layout_, "copy_blocks_out"); !st) return st;
  uint64_t bb = layout_.block_bytes();
  for (size_t i = 0; i < blocks.size(); ++i) {
    std::memcpy(dst.data() + i * bb, pool_->base() + uint64_t{blocks[i]} * bb, bb);
  }
  return {};
}

Status CpuDevice::copy_blocks_in(std::span<const uint32_t> blocks,
                                 std::span<const std::byte> src) {
  if (auto st = check_block_copy(blocks, src.size(), layout_, "copy_blocks_in"); !st) return st;
  uint64_t bb = layout_.block_bytes();
  for (size_t i = 0; i < blocks.size(); ++i) {
    std::memcpy(pool_->base() + uint64_t{blocks[i]} * bb, src.data() + i * bb, bb);
  }
  return {};
}

}  // namespace

namespace {

bool avx512_usable() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

std::string reselect_blas_kernels() {
  std::string before = openblas_get_corename();
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) {
    return "OpenBLAS core " + before + " (OPENBLAS_CORETYPE set by the operator)";
  }
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (before != "Prescott" || !avx2) return "OpenBLAS core " + before;
  if (gotoblas_dynamic_init == nullptr || gotoblas_dynamic_quit == nullptr) {
    return "OpenBLAS core " + before + " (not a DYNAMIC_ARCH build; cannot reselect)";
  }
  const char* want = avx512_usable() ? "SkylakeX" : "Haswell";
  setenv("OPENBLAS_CORETYPE", want, 0);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  std::string after = openblas_get_corename();
  RT_ASSERT(!after.empty(), "OpenBLAS has a core after reselection");
  return "OpenBLAS core " + after + " (was " + before + ": CPU model unknown to OpenBLAS)";
}

}  // namespace

std::string select_blas_kernels() {
  static std::once_flag once;  // OpenBLAS's kernel table is process-wide state
  static std::string description;
  std::call_once(once, [] { description = reselect_blas_kernels(); });
  RT_ASSERT(!description.empty(), "kernel selection described");
  return description;
}

Result<std::unique_ptr<Device>> make_cpu_device(ModelWeights weights,
                                                const CpuDeviceOptions& options) {
  select_blas_kernels();
  const ModelConfig& c = weights.config;
  if (auto st = c.validate(); !st) return st.error();
  if (options.block_tokens == 0) {
    return make_error(ErrorKind::invalid, "cpu device: block_tokens must be > 0");
  }
  KvLayout layout{options.block_tokens, 0, c.layers, c.kv_heads, c.head_dim, sizeof(float)};
  layout.blocks_total = options.blocks_total;
  if (layout.blocks_total == 0) {
    uint64_t blocks = options.kv_bytes_max / layout.block_bytes();
    if (blocks == 0 || blocks > UINT32_MAX) {
      return make_error(ErrorKind::invalid,
                        "cpu device: blocks_total is 0 and kv_bytes_max " +
                            std::to_string(options.kv_bytes_max) + " holds no whole block of " +
                            std::to_string(layout.block_bytes()) + " bytes");
    }
    layout.blocks_total = static_cast<uint32_t>(blocks);
  }
  auto pool = PoolMemory::allocate(layout.pool_bytes(), "cpu device");
  if (!pool) return pool.error();
  // OpenBLAS's own thread count at load is all cores (or OPENBLAS_NUM_THREADS).
  static const int blas_threads_at_load = openblas_get_num_threads();
  int threads = options.threads > 0 ? static_cast<int>(options.threads) : blas_threads_at_load;
  int single = options.single_token_threads > 0 ? static_cast<int>(options.single_token_threads)
                                                 : threads;
  std::unique_ptr<Eagle3Head> head;
  if (!options.draft_model_path.empty()) {
    auto draft = load_eagle3_dir(options.draft_model_path, c);
    if (!draft) {
      return Error{draft.error().kind, "draft model: " + draft.error().message};
    }
    head = std::make_unique<Eagle3Head>(std::move(*draft), weights.embed, kDraftContextsMax);
  }
  auto device = std::make_unique<CpuDevice>(std::move(weights), layout, std::move(*pool), threads,
                                            single);
  device->set_draft_head(std::move(head));
  return std::unique_ptr<Device>(std::move(device));
}

Result<std::unique_ptr<Device>> make_cpu_device(const DeviceSpec& spec) {
  auto weights = load_model(spec.model_path);
  if (!weights) return weights.error();
  CpuDeviceOptions options{spec.block_tokens, spec.blocks_total, spec.kv_bytes_max, spec.threads};
  options.draft_model_path = spec.draft_model_path;
  return make_cpu_device(std::move(*weights), options);
}

Result<StageOutput> run_stage(Device& cpu_device, const PrefillSeq& seq, uint32_t layer_first,
                              uint32_t layer_end, std::span<const float> hidden_in) {
  auto* cpu = dynamic_cast<CpuDevice*>(&cpu_device);
  RT_ASSERT(cpu != nullptr, "run_stage: not a cpu device");
  return cpu->run_stage(seq, layer_first, layer_end, hidden_in);
}

uint64_t weight_bytes_per_token(const Device& device) {
  const auto* cpu = dynamic_cast<const CpuDevice*>(&device);
  RT_ASSERT(cpu != nullptr, "weight_bytes_per_token: not a cpu device");
  return cpu->bytes_per_token();
}

}  // namespace tandem::devices::cpu
