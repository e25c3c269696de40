// tandem/devices/cpu: an EAGLE-3 draft head (Li et al., "EAGLE-3: Scaling up Inference
// Acceleration of Large Language Models via Training-Time Test", 2025) beside the cpu target.
//
// The head, as the published checkpoints lay it out (HF directory: config.json with
// num_hidden_layers 1, draft_vocab_size, optional target_hidden_size and
// eagle_config.eagle_aux_hidden_state_layer_ids; model.safetensors):
//   fc.weight                         [hidden, 3 * target_hidden]  fuses three target layers
//   midlayer.input_layernorm.weight   [hidden]   norms the token embedding
//   midlayer.hidden_norm.weight       [hidden]   norms the fused (or the head's own) state
//   midlayer.self_attn.{q,k,v}_proj   [heads*head_dim | kv_heads*head_dim, 2 * hidden]
//   midlayer.self_attn.o_proj         [hidden, heads*head_dim]
//   midlayer.post_attention_layernorm, midlayer.mlp.{gate,up,down}_proj   (Llama SwiGLU)
//   norm.weight                       [hidden]
//   lm_head.weight                    [draft_vocab, hidden]
//   d2t                               [draft_vocab] I64: target id = draft id + d2t[draft id]
//   embed_tokens.weight               [vocab, hidden], optional: else the target's embedding
// (`layers.0.` is accepted for `midlayer.`.)
//
// One draft row at position p of a sequence takes the token at p + 1 and a state h: the
// target's residual stream entering three of its layers at p (concatenated, fused by fc), or,
// further along a draft, the head's own pre-norm output at p - 1. Then
//   x = [input_layernorm(embed(token)); hidden_norm(h)]           (2 * hidden)
//   a = o_proj(attention(q_proj x, k_proj x, v_proj x))           (RoPE at p, causal over
//                                                                  the head's own KV)
//   r = h + a;  out = r + mlp(post_attention_layernorm(r))         (norm_before_residual:
//                                                                  r = hidden_norm(h) + a)
//   logits = lm_head(norm(out)) over the draft vocabulary; `out` (pre-norm) feeds the next.
// The head keeps its own KV per sequence (one layer), from the first position it was given;
// positions it never saw (the prompt, which was prefilled elsewhere) are not attended to.
// Not thread-safe; the cpu device owns it.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "devices/cpu/weights.hpp"
#include "devices/device.hpp"

namespace tandem::devices::cpu {

struct Eagle3Config {
  uint32_t hidden = 0;
  uint32_t heads = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t intermediate = 0;
  uint32_t vocab_size = 0;    // the target's
  uint32_t draft_vocab = 0;   // lm_head rows
  uint32_t target_hidden = 0;
  uint32_t max_position = 0;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-6f;
  bool norm_before_residual = false;
  // The target layers whose INPUT (the residual stream entering them) is fused, in order.
  std::array<uint32_t, 3> aux_layers{};
};

struct Eagle3Weights {
  Eagle3Config config;
  const float* embed = nullptr;  // [vocab, hidden]; null: use the target's
  const float* fc = nullptr;
  const float* input_norm = nullptr;
  const float* hidden_norm = nullptr;
  const float* wq = nullptr;
  const float* wk = nullptr;
  const float* wv = nullptr;
  const float* wo = nullptr;
  const float* post_norm = nullptr;
  const float* w1 = nullptr;  // gate
  const float* w2 = nullptr;  // down
  const float* w3 = nullptr;  // up
  const float* final_norm = nullptr;
  const float* lm_head = nullptr;
  std::vector<int32_t> draft_to_target;  // draft_vocab ids, each in [0, vocab)
  WeightStorage storage;
};

// Loads the head in `dir` for `target`. Errors: not_found (no config.json or weights),
// invalid naming the file and key or tensor (a shape that does not fit the target: vocab,
// target hidden, aux layer ids >= target layers, a d2t entry mapping outside the vocabulary),
// unimplemented (more than one decoder layer, rope_scaling).
Result<Eagle3Weights> load_eagle3_dir(const std::string& dir, const ModelConfig& target);

// The target layers fused when a checkpoint names none: (2, L / 2, L - 3) as the EAGLE-3
// training recipes use, clamped into [0, L) for shallow targets.
std::array<uint32_t, 3> eagle3_default_aux_layers(uint32_t target_layers);

class Eagle3Head {
 public:
  // contexts_max bounds the sequences whose KV is kept (the least recently used goes).
  // target_embed is used when the head has no embedding of its own. Precondition (asserted):
  // the weights came from load_eagle3_dir for a target with this embedding.
  Eagle3Head(Eagle3Weights weights, const float* target_embed, uint32_t contexts_max);

  const Eagle3Config& config() const { return w_.config; }

  struct Row {
    uint64_t seq = 0;
    uint32_t pos = 0;           // draft position (< max_position)
    int32_t token = 0;          // the target-vocabulary token at pos + 1
    const float* state = nullptr;  // 3 * target_hidden (fused = true) or hidden floats
    bool fused = true;
  };
  // One pass over `rows`: writes each row's KV at its position (a sequence's rows ascend,
  // consecutive), then attends each over its sequence's KV up to its position. A row whose
  // position is not the sequence's next (a gap, or the first row) starts a new context there.
  // Outputs, per row: logits over the draft vocabulary (rows x draft_vocab) and the pre-norm
  // state (rows x hidden). Errors (invalid): a token outside the vocabulary, a position past
  // max_position, a sequence's rows not consecutive.
  Status forward(std::span<const Row> rows, std::vector<float>& logits,
                 std::vector<float>& prenorm);
  // The target id of the draft-vocabulary argmax of one logits row (lowest wins ties).
  int32_t argmax_target(const float* logits_row) const;
  void drop(uint64_t seq) { contexts_.erase(seq); }
  size_t contexts_count() const { return contexts_.size(); }

 private:
  struct Context {
    uint32_t base = 0;  // first position held
    uint32_t end = 0;   // positions [base, end) held
    std::vector<float> k, v;  // (end - base) x kv_heads*head_dim
    uint64_t used = 0;
  };
  Context& context_for(uint64_t seq, uint32_t pos);

  Eagle3Weights w_;
  const float* embed_;
  uint32_t contexts_max_;
  uint64_t uses_ = 0;
  std::unordered_map<uint64_t, Context> contexts_;  // <= contexts_max_
  std::vector<float> x_, xn_, fused_, fused_in_, fused_out_, h_, q_, k_, v_, att_, gate_, up_,
      scores_;
  std::unordered_map<uint64_t, uint32_t> last_pos_;  // forward's row check, cleared after
};

}  // namespace tandem::devices::cpu
