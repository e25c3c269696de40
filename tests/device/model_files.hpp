// Test-only model files: a llama2.c reader (into HF tensor names) and a tiny safetensors
// writer for random-weight models. Independent of devices/cpu.
#pragma once

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/device/ref_model.hpp"

namespace reftest {

inline bool read_llama2c(const std::string& path, RefModel* m) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  int32_t h[7];
  in.read(reinterpret_cast<char*>(h), sizeof h);
  ModelConfig& c = m->c;
  c.arch = tandem::devices::Arch::llama;
  c.hidden = uint32_t(h[0]);
  c.intermediate = uint32_t(h[1]);
  c.layers = uint32_t(h[2]);
  c.heads = uint32_t(h[3]);
  c.kv_heads = uint32_t(h[4]);
  c.vocab_size = uint32_t(std::abs(h[5]));
  c.max_position = uint32_t(h[6]);
  c.head_dim = c.hidden / c.heads;
  c.rotary_dim = c.head_dim;
  c.rope_style = tandem::devices::RopeStyle::interleaved;
  c.tie_embeddings = h[5] > 0;
  c.rms_eps = 1e-5f;
  auto read = [&in](size_t n) {
    std::vector<float> v(n);
    in.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * 4));
    return v;
  };
  size_t D = c.hidden, F = c.intermediate, KV = size_t(c.kv_heads) * c.head_dim;
  m->t["model.embed_tokens.weight"] = read(c.vocab_size * D);
  const char* names[] = {"input_layernorm.weight",       "self_attn.q_proj.weight",
                         "self_attn.k_proj.weight",      "self_attn.v_proj.weight",
                         "self_attn.o_proj.weight",      "post_attention_layernorm.weight",
                         "mlp.gate_proj.weight",         "mlp.down_proj.weight",
                         "mlp.up_proj.weight"};
  size_t sizes[] = {D, D * D, KV * D, KV * D, D * D, D, F * D, D * F, F * D};
  for (int k = 0; k < 9; ++k) {
    for (uint32_t l = 0; l < c.layers; ++l) m->t[m->L(l, names[k])] = read(sizes[k]);
  }
  m->t["model.norm.weight"] = read(D);
  read(size_t(c.max_position) * c.head_dim);
  if (!c.tie_embeddings) m->t["lm_head.weight"] = read(c.vocab_size * D);
  return bool(in);
}

struct TensorShape {
  std::string name;
  std::vector<uint64_t> shape;
};

// Random weights for every tensor the config needs, with HF names.
inline Tensors random_tensors(const ModelConfig& c, uint32_t seed, bool whole_qk_norm) {
  std::mt19937 rng(seed);
  Tensors t;
  auto fill = [&rng, &t](const std::string& name, size_t n, float center, float spread) {
    std::uniform_real_distribution<float> u(center - spread, center + spread);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng);
    t[name] = std::move(v);
  };
  size_t D = c.hidden, Q = size_t(c.heads) * c.head_dim, KV = size_t(c.kv_heads) * c.head_dim;
  fill("model.embed_tokens.weight", c.vocab_size * D, 0.0f, 1.0f);
  fill("model.norm.weight", D, 1.0f, 0.2f);
  if (!c.tie_embeddings) fill("lm_head.weight", c.vocab_size * D, 0.0f, 0.3f);
  for (uint32_t l = 0; l < c.layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    fill(p + "input_layernorm.weight", D, 1.0f, 0.2f);
    fill(p + "post_attention_layernorm.weight", D, 1.0f, 0.2f);
    fill(p + "self_attn.q_proj.weight", Q * D, 0.0f, 0.5f);
    fill(p + "self_attn.k_proj.weight", KV * D, 0.0f, 0.5f);
    fill(p + "self_attn.v_proj.weight", KV * D, 0.0f, 0.5f);
    fill(p + "self_attn.o_proj.weight", D * Q, 0.0f, 0.3f);
    if (c.qk_norm) {
      fill(p + "self_attn.q_norm.weight", whole_qk_norm ? Q : c.head_dim, 1.0f, 0.3f);
      fill(p + "self_attn.k_norm.weight", whole_qk_norm ? KV : c.head_dim, 1.0f, 0.3f);
    }
    if (c.experts == 0) {
      fill(p + "mlp.gate_proj.weight", c.intermediate * D, 0.0f, 0.3f);
      fill(p + "mlp.up_proj.weight", c.intermediate * D, 0.0f, 0.3f);
      fill(p + "mlp.down_proj.weight", D * c.intermediate, 0.0f, 0.3f);
      continue;
    }
    std::string m = p + "block_sparse_moe.";
    fill(m + "gate.weight", c.experts * D, 0.0f, 0.5f);
    if (c.router_bias) fill(m + "e_score_correction_bias", c.experts, 0.0f, 0.3f);
    for (uint32_t e = 0; e < c.experts; ++e) {
      std::string x = m + "experts." + std::to_string(e) + ".";
      fill(x + "w1.weight", c.moe_intermediate * D, 0.0f, 0.3f);
      fill(x + "w3.weight", c.moe_intermediate * D, 0.0f, 0.3f);
      fill(x + "w2.weight", D * c.moe_intermediate, 0.0f, 0.3f);
    }
  }
  return t;
}

inline std::vector<uint64_t> shape_of(const ModelConfig& c, const std::string& name, size_t n) {
  // 2-D weights are [out, in]; "in" is hidden except for o_proj / down-projections.
  if (name.find("o_proj") != std::string::npos) return {c.hidden, n / c.hidden};
  if (name.find("down_proj") != std::string::npos || name.find(".w2.") != std::string::npos) {
    return {c.hidden, n / c.hidden};
  }
  if (name.find("norm") != std::string::npos || name.find("bias") != std::string::npos) {
    return {n};
  }
  return {n / c.hidden, c.hidden};
}

inline uint16_t to_bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return uint16_t(b >> 16);  // truncation; tests round values first so this is exact
}

// Writes one safetensors file holding `t` (as F32, or BF16 when bf16 is set).
inline void write_safetensors(const std::string& path, const ModelConfig& c, const Tensors& t,
                              bool bf16 = false) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, v] : t) {
    size_t begin = data.size();
    if (bf16) {
      for (float f : v) {
        uint16_t h = to_bf16(f);
        data.append(reinterpret_cast<const char*>(&h), 2);
      }
    } else {
      data.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
    }
    header[name] = {{"dtype", bf16 ? "BF16" : "F32"},
                    {"shape", shape_of(c, name, v.size())},
                    {"data_offsets", {begin, data.size()}}};
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h += ' ';
  uint64_t n = h.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(h.data(), std::streamsize(h.size()));
  out.write(data.data(), std::streamsize(data.size()));
}

inline nlohmann::json hf_config_json(const ModelConfig& c) {
  nlohmann::json j = {{"model_type", c.arch == tandem::devices::Arch::llama ? "llama" : "minimax_m2"},
                      {"vocab_size", c.vocab_size},
                      {"hidden_size", c.hidden},
                      {"num_hidden_layers", c.layers},
                      {"num_attention_heads", c.heads},
                      {"num_key_value_heads", c.kv_heads},
                      {"head_dim", c.head_dim},
                      {"rope_theta", c.rope_theta},
                      {"rotary_dim", c.rotary_dim},
                      {"rms_norm_eps", c.rms_eps},
                      {"tie_word_embeddings", c.tie_embeddings},
                      {"max_position_embeddings", c.max_position},
                      {"bos_token_id", c.bos_id},
                      {"eos_token_id", c.eos_id}};
  if (c.experts == 0) {
    j["intermediate_size"] = c.intermediate;
  } else {
    j["intermediate_size"] = c.moe_intermediate;
    j["num_local_experts"] = c.experts;
    j["num_experts_per_tok"] = c.experts_per_token;
    j["use_qk_norm"] = c.qk_norm;
    j["use_routing_bias"] = c.router_bias;
    j["scoring_func"] = "sigmoid";
  }
  return j;
}

inline void write_hf_dir(const std::string& dir, const ModelConfig& c, const Tensors& t,
                         bool bf16 = false) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << hf_config_json(c).dump(2);
  write_safetensors(dir + "/model.safetensors", c, t, bf16);
}

// Reads every tensor of an F32 safetensors file into `t` (by name). Independent of
// devices/cpu. Returns false (with a message on stderr) on any other dtype (unless
// skip_other: such tensors are left out) or a bad file.
inline bool read_safetensors_f32(const std::string& path, Tensors* t, bool skip_other = false) {
  std::ifstream in(path, std::ios::binary);
  uint64_t header_bytes = 0;
  if (!in.read(reinterpret_cast<char*>(&header_bytes), 8)) return false;
  std::string h(header_bytes, '\0');
  if (!in.read(h.data(), std::streamsize(header_bytes))) return false;
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::json header = nlohmann::json::parse(h, nullptr, false);
  if (header.is_discarded()) return false;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    if (info["dtype"] != "F32" && skip_other) continue;
    if (info["dtype"] != "F32") {
      std::fprintf(stderr, "read_safetensors_f32: %s is %s\n", name.c_str(),
                   info["dtype"].dump().c_str());
      return false;
    }
    uint64_t begin = info["data_offsets"][0], end = info["data_offsets"][1];
    if (end > data.size() || begin > end || (end - begin) % 4 != 0) return false;
    std::vector<float> v((end - begin) / 4);
    std::memcpy(v.data(), data.data() + begin, end - begin);
    (*t)[name] = std::move(v);
  }
  return true;
}

}  // namespace reftest
