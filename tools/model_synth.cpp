#include "tools/model_synth.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <random>

#include "devices/safetensors_writer.hpp"

namespace tandem::tools {
namespace {

namespace fs = std::filesystem;
using devices::Arch;
using nlohmann::ordered_json;

Error bad_flag(const std::string& flag, const std::string& why) {
  return make_error(ErrorKind::invalid, "--" + flag + " " + why);
}

uint64_t name_hash(const std::string& name) {  // FNV-1a, 64-bit
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// Values in [center - spread, center + spread], from (seed, tensor name) only.
std::vector<float> random_values(uint64_t seed, const std::string& name, uint64_t count,
                                 float center, float spread) {
  std::mt19937_64 rng(seed ^ name_hash(name));
  std::vector<float> v(count);
  for (auto& x : v) {
    double unit = static_cast<double>(rng() >> 11) * 0x1.0p-53;  // [0, 1)
    x = center + spread * static_cast<float>(2.0 * unit - 1.0);
  }
  return v;
}

class TensorSet {
 public:
  TensorSet(const SynthOptions& o) : o_(o) {}
  // A weight matrix [rows, cols] scaled by 1/sqrt(cols), or a vector around `center`.
  Status matrix(const std::string& name, uint64_t rows, uint64_t cols) {
    float spread = 1.0f / std::sqrt(static_cast<float>(cols));
    return writer_.add(name, o_.dtype, {rows, cols},
                       random_values(o_.seed, name, rows * cols, 0.0f, spread));
  }
  Status vector(const std::string& name, uint64_t n, float center, float spread) {
    return writer_.add(name, o_.dtype, {n}, random_values(o_.seed, name, n, center, spread));
  }
  const devices::SafetensorsWriter& writer() const { return writer_; }

 private:
  const SynthOptions& o_;
  devices::SafetensorsWriter writer_;
};

#define SYNTH_TRY(expr)                 \
  do {                                  \
    if (Status st_ = (expr); !st_) return st_; \
  } while (false)

Status add_layer(TensorSet& t, const devices::ModelConfig& c, uint32_t layer) {
  std::string p = "model.layers." + std::to_string(layer) + ".";
  uint64_t q = uint64_t{c.heads} * c.head_dim, kv = uint64_t{c.kv_heads} * c.head_dim;
  SYNTH_TRY(t.vector(p + "input_layernorm.weight", c.hidden, 1.0f, 0.1f));
  SYNTH_TRY(t.matrix(p + "self_attn.q_proj.weight", q, c.hidden));
  SYNTH_TRY(t.matrix(p + "self_attn.k_proj.weight", kv, c.hidden));
  SYNTH_TRY(t.matrix(p + "self_attn.v_proj.weight", kv, c.hidden));
  SYNTH_TRY(t.matrix(p + "self_attn.o_proj.weight", c.hidden, q));
  SYNTH_TRY(t.vector(p + "post_attention_layernorm.weight", c.hidden, 1.0f, 0.1f));
  if (c.arch == Arch::llama) {
    SYNTH_TRY(t.matrix(p + "mlp.gate_proj.weight", c.intermediate, c.hidden));
    SYNTH_TRY(t.matrix(p + "mlp.up_proj.weight", c.intermediate, c.hidden));
    SYNTH_TRY(t.matrix(p + "mlp.down_proj.weight", c.hidden, c.intermediate));
    return {};
  }
  SYNTH_TRY(t.vector(p + "self_attn.q_norm.weight", q, 1.0f, 0.1f));
  SYNTH_TRY(t.vector(p + "self_attn.k_norm.weight", kv, 1.0f, 0.1f));
  std::string m = p + "block_sparse_moe.";
  SYNTH_TRY(t.matrix(m + "gate.weight", c.experts, c.hidden));
  SYNTH_TRY(t.vector(m + "e_score_correction_bias", c.experts, 0.0f, 0.1f));
  for (uint32_t e = 0; e < c.experts; ++e) {
    std::string x = m + "experts." + std::to_string(e) + ".";
    SYNTH_TRY(t.matrix(x + "w1.weight", c.moe_intermediate, c.hidden));
    SYNTH_TRY(t.matrix(x + "w2.weight", c.hidden, c.moe_intermediate));
    SYNTH_TRY(t.matrix(x + "w3.weight", c.moe_intermediate, c.hidden));
  }
  return {};
}

std::string dtype_torch_name(devices::DType d) {
  return d == devices::DType::bf16 ? "bfloat16" : d == devices::DType::f16 ? "float16" : "float32";
}

ordered_json config_json(const devices::ModelConfig& c) {
  bool moe = c.arch == Arch::minimax_m2;
  ordered_json j;
  j["architectures"] = {moe ? "MiniMaxM2ForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = moe ? "minimax_m2" : "llama";
  j["hidden_size"] = c.hidden;
  j["intermediate_size"] = moe ? c.moe_intermediate : c.intermediate;
  j["num_hidden_layers"] = c.layers;
  j["num_attention_heads"] = c.heads;
  j["num_key_value_heads"] = c.kv_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["rope_theta"] = c.rope_theta;
  j["rotary_dim"] = c.rotary_dim;
  j["partial_rotary_factor"] = static_cast<double>(c.rotary_dim) / c.head_dim;
  j["rms_norm_eps"] = std::round(double{c.rms_eps} * 1e9) / 1e9;  // 1e-06, not 9.99e-07
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position;
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["attention_bias"] = false;
  j["bos_token_id"] = c.bos_id;
  j["eos_token_id"] = c.eos_id;
  j["torch_dtype"] = dtype_torch_name(c.weight_dtype);
  if (moe) {
    j["num_local_experts"] = c.experts;
    j["num_experts_per_tok"] = c.experts_per_token;
    j["use_qk_norm"] = c.qk_norm;
    j["qk_norm_type"] = "per_layer";
    j["scoring_func"] = "sigmoid";
    j["use_routing_bias"] = c.router_bias;
  }
  return j;
}

Status write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return make_error(ErrorKind::failed, "cannot write " + path.string());
  return {};
}

}  // namespace

Result<devices::ModelConfig> synth_config(const SynthOptions& o) {
  bool moe = o.arch == Arch::minimax_m2;
  auto added = synth_added_tokens(o.arch);
  if (o.layers < 1 || o.layers > 256) return bad_flag("layers", "must be in [1, 256]");
  if (o.hidden < 1 || o.hidden > 16384) return bad_flag("hidden", "must be in [1, 16384]");
  if (o.heads < 1) return bad_flag("heads", "must be >= 1");
  if (o.kv_heads < 1 || o.heads % o.kv_heads != 0) {
    return bad_flag("kv-heads", "must divide --heads " + std::to_string(o.heads));
  }
  if (o.head_dim < 2 || o.head_dim % 2 != 0) return bad_flag("head-dim", "must be even, >= 2");
  if (o.ffn < 1) return bad_flag("ffn", "must be >= 1");
  uint32_t rotary = o.rotary_dim != 0 ? o.rotary_dim : (moe ? o.head_dim / 2 : o.head_dim);
  if (rotary % 2 != 0 || rotary > o.head_dim) {
    return bad_flag("rotary-dim", "must be even and <= --head-dim " + std::to_string(o.head_dim));
  }
  if (moe && (o.experts < 1 || o.experts > 1024)) {
    return bad_flag("experts", "must be in [1, 1024]");
  }
  if (moe && (o.experts_per_token < 1 || o.experts_per_token > o.experts)) {
    return bad_flag("experts-per-token", "must be in [1, --experts]");
  }
  if (o.vocab < 256 + added.size() || o.vocab > (1u << 20)) {
    return bad_flag("vocab", "must be in [" + std::to_string(256 + added.size()) + ", 1048576]");
  }
  if (o.max_position < 2) return bad_flag("max-position", "must be >= 2");
  if (o.dtype == devices::DType::f8_e4m3) return bad_flag("dtype", "must be f32, bf16 or f16");
  if (o.shards < 1 || o.shards > devices::SafetensorsWriter::kShardCountMax) {
    return bad_flag("shards", "must be in [1, 99999]");
  }
  devices::ModelConfig c;
  c.arch = o.arch;
  c.vocab_size = o.vocab;
  c.hidden = o.hidden;
  c.layers = o.layers;
  c.heads = o.heads;
  c.kv_heads = o.kv_heads;
  c.head_dim = o.head_dim;
  c.intermediate = moe ? 0 : o.ffn;
  c.moe_intermediate = moe ? o.ffn : 0;
  c.experts = moe ? o.experts : 0;
  c.experts_per_token = moe ? o.experts_per_token : 0;
  c.rope_theta = moe ? 5e6f : 10000.0f;
  c.rotary_dim = rotary;
  c.rms_eps = moe ? 1e-6f : 1e-5f;
  c.qk_norm = moe;
  c.router_bias = moe;
  c.max_position = o.max_position;
  // The arch's first added token is bos; eos is "</s>" or "[e~[".
  uint32_t first_added = o.vocab - static_cast<uint32_t>(added.size());
  c.bos_id = static_cast<int32_t>(first_added);
  c.eos_id = static_cast<int32_t>(first_added + (moe ? 2 : 1));
  c.weight_dtype = o.dtype;
  if (Status st = c.validate(); !st) return st.error();
  return c;
}

Status synth_model(const SynthOptions& o, const std::string& out_dir) {
  auto config = synth_config(o);
  if (!config) return config.error();
  const devices::ModelConfig& c = *config;
  TensorSet t(o);
  SYNTH_TRY(t.matrix("model.embed_tokens.weight", c.vocab_size, c.hidden));
  for (uint32_t l = 0; l < c.layers; ++l) SYNTH_TRY(add_layer(t, c, l));
  SYNTH_TRY(t.vector("model.norm.weight", c.hidden, 1.0f, 0.1f));
  SYNTH_TRY(t.matrix("lm_head.weight", c.vocab_size, c.hidden));
  fs::path dir(out_dir);
  if (o.shards > t.writer().tensor_count()) {
    return bad_flag("shards", "must be <= the model's " +
                                  std::to_string(t.writer().tensor_count()) + " tensors");
  }
  std::error_code ec;  // only now: bad options leave no directory behind
  fs::create_directories(out_dir, ec);
  if (ec) return make_error(ErrorKind::failed, "cannot create " + out_dir + ": " + ec.message());
  SYNTH_TRY(t.writer().write_checkpoint(dir.string(), o.shards));
  SYNTH_TRY(write_text(dir / "config.json", config_json(c).dump(2) + "\n"));
  auto added = synth_added_tokens(o.arch);
  SYNTH_TRY(write_text(dir / "tokenizer.json", synth_tokenizer_json(c.vocab_size, added)));
  ordered_json tc = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                     {"bos_token", added.front().content},
                     {"eos_token", added[o.arch == Arch::llama ? 1 : 2].content},
                     {"model_max_length", c.max_position},
                     {"add_bos_token", false}, {"clean_up_tokenization_spaces", false}};
  return write_text(dir / "tokenizer_config.json", tc.dump(2) + "\n");
}

Status synth_eagle3(const devices::ModelConfig& target, const Eagle3SynthOptions& options,
                    const std::string& out_dir) {
  uint32_t vocab = target.vocab_size;
  uint32_t draft_vocab = options.draft_vocab ? options.draft_vocab : std::max(1u, vocab / 4);
  if (draft_vocab > vocab) {
    return bad_flag("draft-vocab", "(" + std::to_string(draft_vocab) +
                                       ") must not exceed the target's vocabulary (" +
                                       std::to_string(vocab) + ")");
  }
  uint32_t ffn = options.ffn ? options.ffn : 2 * target.hidden;
  SynthOptions o;
  o.seed = options.seed;
  o.dtype = options.dtype;
  TensorSet t(o);
  uint64_t h = target.hidden, q = uint64_t{target.heads} * target.head_dim,
           kv = uint64_t{target.kv_heads} * target.head_dim;
  SYNTH_TRY(t.matrix("fc.weight", h, 3 * h));
  std::string p = "midlayer.";
  SYNTH_TRY(t.vector(p + "input_layernorm.weight", h, 1.0f, 0.1f));
  SYNTH_TRY(t.vector(p + "hidden_norm.weight", h, 1.0f, 0.1f));
  SYNTH_TRY(t.matrix(p + "self_attn.q_proj.weight", q, 2 * h));
  SYNTH_TRY(t.matrix(p + "self_attn.k_proj.weight", kv, 2 * h));
  SYNTH_TRY(t.matrix(p + "self_attn.v_proj.weight", kv, 2 * h));
  SYNTH_TRY(t.matrix(p + "self_attn.o_proj.weight", h, q));
  SYNTH_TRY(t.vector(p + "post_attention_layernorm.weight", h, 1.0f, 0.1f));
  SYNTH_TRY(t.matrix(p + "mlp.gate_proj.weight", ffn, h));
  SYNTH_TRY(t.matrix(p + "mlp.up_proj.weight", ffn, h));
  SYNTH_TRY(t.matrix(p + "mlp.down_proj.weight", h, ffn));
  SYNTH_TRY(t.vector("norm.weight", h, 1.0f, 0.1f));
  SYNTH_TRY(t.matrix("lm_head.weight", draft_vocab, h));
  std::vector<int64_t> d2t(draft_vocab);
  for (uint32_t i = 0; i < draft_vocab; ++i) {
    d2t[i] = static_cast<int64_t>(uint64_t{i} * vocab / draft_vocab) - int64_t{i};
  }
  devices::SafetensorsWriter writer = t.writer();
  SYNTH_TRY(writer.add_i64("d2t", {draft_vocab}, d2t));
  ordered_json j;
  j["architectures"] = {"LlamaForCausalLMEagle3"};
  j["model_type"] = "llama";
  j["hidden_size"] = target.hidden;
  j["target_hidden_size"] = target.hidden;
  j["intermediate_size"] = ffn;
  j["num_hidden_layers"] = 1;
  j["num_attention_heads"] = target.heads;
  j["num_key_value_heads"] = target.kv_heads;
  j["head_dim"] = target.head_dim;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = std::round(double{target.rms_eps} * 1e9) / 1e9;
  j["rope_theta"] = target.rope_theta;
  j["max_position_embeddings"] = target.max_position;
  j["vocab_size"] = vocab;
  j["draft_vocab_size"] = draft_vocab;
  j["tie_word_embeddings"] = false;
  j["torch_dtype"] = dtype_torch_name(o.dtype);
  // No eagle_aux_hidden_state_layer_ids: the loader's default (2, L / 2, L - 3) applies.
  j["eagle_config"] = {{"use_aux_hidden_state", true}};
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return make_error(ErrorKind::failed, "cannot create " + out_dir + ": " + ec.message());
  fs::path dir(out_dir);
  SYNTH_TRY(writer.write_checkpoint(dir.string(), 1));
  return write_text(dir / "config.json", j.dump(2) + "\n");
}

}  // namespace tandem::tools
