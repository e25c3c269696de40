#include "devices/cpu/weights.hpp"

#include "devices/cpu/eagle3.hpp"

#include <optional>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

namespace tandem::devices::cpu {

namespace fs = std::filesystem;

// ---- MappedFile ----

MappedFile::MappedFile(const std::byte* data, uint64_t size_bytes, std::string path)
    : data_(data), size_bytes_(size_bytes), path_(std::move(path)) {}

MappedFile::~MappedFile() {
  if (data_ != nullptr && size_bytes_ > 0) {
    munmap(const_cast<std::byte*>(data_), size_bytes_);
  }
}

Result<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    auto kind = errno == ENOENT ? ErrorKind::not_found : ErrorKind::failed;
    return make_error(kind, path + ": cannot open: " + std::strerror(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(ErrorKind::invalid, path + ": not a regular file");
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  const std::byte* data = nullptr;
  if (size > 0) {
    void* addr = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) {
      ::close(fd);
      return make_error(ErrorKind::failed, path + ": mmap failed: " + std::strerror(errno));
    }
    data = static_cast<const std::byte*>(addr);
  }
  ::close(fd);
  return std::unique_ptr<MappedFile>(new MappedFile(data, size, path));  // private ctor
}

namespace {

Error invalid(std::string message) { return make_error(ErrorKind::invalid, std::move(message)); }

// ---- half-precision conversion ----

float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t{h} << 16;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t{h} & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | (uint32_t(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// ---- safetensors ----

struct TensorRef {
  DType dtype = DType::f32;
  std::vector<uint64_t> shape;
  const std::byte* data = nullptr;
  uint64_t size_bytes = 0;
  const MappedFile* file = nullptr;
  bool i64 = false;  // an I64 tensor (dtype is meaningless then): EAGLE-3's d2t
};

std::optional<DType> dtype_from_string(const std::string& s) {
  if (s == "F32") return DType::f32;
  if (s == "BF16") return DType::bf16;
  if (s == "F16") return DType::f16;
  if (s == "F8_E4M3") return DType::f8_e4m3;
  return std::nullopt;
}

Error unsupported_dtype(const std::string& file, const std::string& name, const std::string& dt) {
  return make_error(ErrorKind::unimplemented, file + ": tensor '" + name + "': dtype " + dt +
                                                  " is not supported (F32, BF16, F16 are)");
}

Status parse_tensor_entry(const MappedFile& file, uint64_t data_start, const std::string& name,
                          const nlohmann::json& entry, TensorRef* out) {
  const std::string& path = file.path();
  if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
      !entry.contains("data_offsets")) {
    return invalid(path + ": tensor '" + name + "': header entry lacks dtype/shape/data_offsets");
  }
  std::string dt = entry["dtype"].is_string() ? entry["dtype"].get<std::string>() : "?";
  out->i64 = dt == "I64";
  auto dtype = out->i64 ? std::optional<DType>(DType::f32) : dtype_from_string(dt);
  if (!dtype || *dtype == DType::f8_e4m3) return unsupported_dtype(path, name, dt);
  uint32_t width = out->i64 ? 8 : dtype_bytes(*dtype);
  const auto& offs = entry["data_offsets"];
  if (!offs.is_array() || offs.size() != 2 || !offs[0].is_number_unsigned() ||
      !offs[1].is_number_unsigned()) {
    return invalid(path + ": tensor '" + name + "': data_offsets must be two unsigned ints");
  }
  uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
  uint64_t elems = 1;
  if (!entry["shape"].is_array()) return invalid(path + ": tensor '" + name + "': bad shape");
  for (const auto& d : entry["shape"]) {
    if (!d.is_number_unsigned()) return invalid(path + ": tensor '" + name + "': bad shape");
    out->shape.push_back(d.get<uint64_t>());
    elems *= d.get<uint64_t>();
  }
  uint64_t data_bytes = file.size_bytes() - data_start;
  if (begin > end || end > data_bytes) {
    return invalid(path + ": tensor '" + name + "': data_offsets [" + std::to_string(begin) +
                   ", " + std::to_string(end) + ") outside the file's " +
                   std::to_string(data_bytes) + " data bytes (truncated file?)");
  }
  if (end - begin != elems * width) {
    return invalid(path + ": tensor '" + name + "': " + std::to_string(end - begin) +
                   " bytes do not match its shape and dtype");
  }
  out->dtype = *dtype;
  out->data = file.data() + data_start + begin;
  out->size_bytes = end - begin;
  out->file = &file;
  return {};
}

Status parse_safetensors(const MappedFile& file, std::map<std::string, TensorRef>* tensors) {
  const std::string& path = file.path();
  if (file.size_bytes() < 8) return invalid(path + ": too short for a safetensors header");
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file.data(), 8);  // little-endian host (x86_64, aarch64)
  if (header_bytes > file.size_bytes() - 8 || header_bytes > (100u << 20)) {
    return invalid(path + ": safetensors header length " + std::to_string(header_bytes) +
                   " exceeds the file (truncated or not safetensors)");
  }
  auto header = nlohmann::json::parse(reinterpret_cast<const char*>(file.data()) + 8,
                                      reinterpret_cast<const char*>(file.data()) + 8 + header_bytes,
                                      nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return invalid(path + ": safetensors header is not a JSON object");
  }
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    TensorRef ref;
    if (auto st = parse_tensor_entry(file, 8 + header_bytes, name, entry, &ref); !st) return st;
    (*tensors)[name] = std::move(ref);
  }
  return {};
}

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorKind::not_found, path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---- tensor binding ----

class Binder {
 public:
  // `source` names where the tensors came from, for the missing-tensor error.
  Binder(std::map<std::string, TensorRef>* tensors, WeightStorage* storage, std::string source)
      : tensors_(tensors), storage_(storage), source_(std::move(source)) {}

  // Binds a tensor of exactly `shape`; nullptr + error when missing or mismatched.
  const float* get(const std::string& name, std::vector<uint64_t> shape, bool optional = false) {
    auto it = tensors_->find(name);
    if (it == tensors_->end()) {
      if (!optional && !error_) {
        error_ = invalid("missing tensor '" + name + "' (not in " + source_ + ")");
      }
      return nullptr;
    }
    const TensorRef& t = it->second;
    if (!check(t, name, shape, false)) return nullptr;
    return to_f32(t);
  }
  // An I64 tensor of exactly `shape`, copied; nullopt (+ error unless optional and missing).
  std::optional<std::vector<int64_t>> get_i64(const std::string& name,
                                              std::vector<uint64_t> shape, bool optional) {
    auto it = tensors_->find(name);
    if (it == tensors_->end()) {
      if (!optional && !error_) {
        error_ = invalid("missing tensor '" + name + "' (not in " + source_ + ")");
      }
      return std::nullopt;
    }
    const TensorRef& t = it->second;
    if (!check(t, name, shape, true)) return std::nullopt;
    std::vector<int64_t> out(t.size_bytes / 8);
    std::memcpy(out.data(), t.data, t.size_bytes);
    return out;
  }
  uint64_t elems_of(const std::string& name) const {
    auto it = tensors_->find(name);
    if (it == tensors_->end()) return 0;
    uint64_t n = 1;
    for (auto d : it->second.shape) n *= d;
    return n;
  }
  bool has(const std::string& name) const { return tensors_->count(name) > 0; }
  const std::optional<Error>& error() const { return error_; }

 private:
  bool check(const TensorRef& t, const std::string& name, const std::vector<uint64_t>& shape,
             bool want_i64) {
    if (t.i64 != want_i64) {
      if (!error_) error_ = invalid(t.file->path() + ": tensor '" + name + "' is " +
                                    (t.i64 ? "I64" : "a float tensor") + ", expected " +
                                    (want_i64 ? "I64" : "F32, BF16 or F16"));
      return false;
    }
    if (t.shape != shape) {
      if (!error_) error_ = invalid(t.file->path() + ": tensor '" + name + "' has shape " +
                                    shape_text(t.shape) + ", expected " + shape_text(shape));
      return false;
    }
    return true;
  }
  static std::string shape_text(const std::vector<uint64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
  }
  const float* to_f32(const TensorRef& t) {
    uint64_t elems = t.size_bytes / dtype_bytes(t.dtype);
    if (t.dtype == DType::f32 && reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0) {
      return reinterpret_cast<const float*>(t.data);  // in place, from the mmap
    }
    std::vector<float> buf(elems);
    for (uint64_t i = 0; i < elems; ++i) {
      if (t.dtype == DType::f32) {
        std::memcpy(&buf[i], t.data + i * 4, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, t.data + i * 2, 2);
        buf[i] = t.dtype == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
    }
    storage_->owned.push_back(std::move(buf));
    return storage_->owned.back().data();
  }
  std::map<std::string, TensorRef>* tensors_;
  WeightStorage* storage_;
  std::string source_;
  std::optional<Error> error_;
};

}  // namespace

namespace {

using nlohmann::json;

// Reads an unsigned field; absent -> fallback (or error when fallback is nullopt).
Result<uint32_t> get_u32(const json& j, const std::string& key, const std::string& file,
                         std::optional<uint32_t> fallback) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback) return *fallback;
    return invalid(file + ": missing key '" + key + "'");
  }
  if (!j[key].is_number_integer() || j[key].get<int64_t>() < 0 ||
      j[key].get<int64_t>() > int64_t{UINT32_MAX}) {
    return invalid(file + ": key '" + key + "' must be a non-negative integer");
  }
  return j[key].get<uint32_t>();
}

Result<float> get_float(const json& j, const std::string& key, const std::string& file,
                        float fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number()) return invalid(file + ": key '" + key + "' must be a number");
  return j[key].get<float>();
}

int32_t token_id(const json& j, const std::string& key, int32_t fallback) {
  if (!j.contains(key)) return fallback;
  const json& v = j[key];
  if (v.is_number_integer()) return v.get<int32_t>();
  if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int32_t>();
  return fallback;
}

#define TRY_ASSIGN(lhs, expr)          \
  do {                                 \
    auto r_ = (expr);                  \
    if (!r_) return r_.error();        \
    lhs = *r_;                         \
  } while (false)

Status parse_arch(const json& j, const std::string& file, ModelConfig* c) {
  std::string type = j.value("model_type", std::string());
  if (type == "llama" || type == "mistral" || type == "qwen2") {
    c->arch = Arch::llama;
  } else if (type == "minimax_m2" || type == "minimax") {
    c->arch = Arch::minimax_m2;
  } else {
    return make_error(ErrorKind::unimplemented,
                      file + ": unsupported architecture model_type='" + type +
                          "' (supported: llama, mistral, qwen2, minimax_m2)");
  }
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const json& rs = j["rope_scaling"];
    std::string kind = rs.is_object() ? rs.value("rope_type", rs.value("type", "")) : "";
    if (kind != "default") {
      return make_error(ErrorKind::unimplemented,
                        file + ": rope_scaling '" + kind + "' is not supported");
    }
  }
  return {};
}

Status parse_moe(const json& j, const std::string& file, ModelConfig* c) {
  TRY_ASSIGN(c->experts, get_u32(j, "num_local_experts", file, std::nullopt));
  TRY_ASSIGN(c->experts_per_token, get_u32(j, "num_experts_per_tok", file, std::nullopt));
  TRY_ASSIGN(c->moe_intermediate, get_u32(j, "intermediate_size", file, std::nullopt));
  c->intermediate = 0;
  c->qk_norm = j.value("use_qk_norm", true);
  c->router_bias = j.value("use_routing_bias", true);
  std::string scoring = j.value("scoring_func", std::string("sigmoid"));
  if (scoring != "sigmoid") {
    return make_error(ErrorKind::unimplemented,
                      file + ": scoring_func '" + scoring + "' is not supported (sigmoid is)");
  }
  return {};
}

}  // namespace

Result<ModelConfig> parse_hf_config(const std::string& json_text, const std::string& file) {
  json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid(file + ": not a JSON object");
  ModelConfig c;
  if (auto st = parse_arch(j, file, &c); !st) return st.error();
  TRY_ASSIGN(c.vocab_size, get_u32(j, "vocab_size", file, std::nullopt));
  TRY_ASSIGN(c.hidden, get_u32(j, "hidden_size", file, std::nullopt));
  TRY_ASSIGN(c.layers, get_u32(j, "num_hidden_layers", file, std::nullopt));
  TRY_ASSIGN(c.heads, get_u32(j, "num_attention_heads", file, std::nullopt));
  TRY_ASSIGN(c.kv_heads, get_u32(j, "num_key_value_heads", file, c.heads));
  uint32_t default_head_dim = c.heads ? c.hidden / c.heads : 0;
  TRY_ASSIGN(c.head_dim, get_u32(j, "head_dim", file, default_head_dim));
  TRY_ASSIGN(c.intermediate, get_u32(j, "intermediate_size", file, 0u));
  TRY_ASSIGN(c.rope_theta, get_float(j, "rope_theta", file, 10000.0f));
  float partial = 1.0f;
  TRY_ASSIGN(partial, get_float(j, "partial_rotary_factor", file, 1.0f));
  TRY_ASSIGN(c.rotary_dim, get_u32(j, "rotary_dim", file,
                                   static_cast<uint32_t>(partial * float(c.head_dim))));
  c.rope_style = RopeStyle::rotate_half;
  TRY_ASSIGN(c.rms_eps, get_float(j, "rms_norm_eps", file, 1e-6f));
  c.tie_embeddings = j.value("tie_word_embeddings", false);
  TRY_ASSIGN(c.max_position, get_u32(j, "max_position_embeddings", file, 2048u));
  c.bos_id = token_id(j, "bos_token_id", 1);
  c.eos_id = token_id(j, "eos_token_id", 2);
  if (c.arch == Arch::minimax_m2) {
    if (auto st = parse_moe(j, file, &c); !st) return st.error();
  }
  if (auto st = c.validate(); !st) return invalid(file + ": " + st.error().message);
  return c;
}

namespace {

void bind_attention(Binder& b, const ModelConfig& c, const std::string& p, LayerWeights* l) {
  uint64_t q_out = uint64_t{c.heads} * c.head_dim, kv_out = uint64_t{c.kv_heads} * c.head_dim;
  l->attn_norm = b.get(p + "input_layernorm.weight", {c.hidden});
  l->wq = b.get(p + "self_attn.q_proj.weight", {q_out, c.hidden});
  l->wk = b.get(p + "self_attn.k_proj.weight", {kv_out, c.hidden});
  l->wv = b.get(p + "self_attn.v_proj.weight", {kv_out, c.hidden});
  l->wo = b.get(p + "self_attn.o_proj.weight", {c.hidden, q_out});
  l->bq = b.get(p + "self_attn.q_proj.bias", {q_out}, true);
  l->bk = b.get(p + "self_attn.k_proj.bias", {kv_out}, true);
  l->bv = b.get(p + "self_attn.v_proj.bias", {kv_out}, true);
  if (c.qk_norm) {
    std::string qn = p + "self_attn.q_norm.weight", kn = p + "self_attn.k_norm.weight";
    // Per-head ([head_dim]) or whole-projection ([heads*head_dim]) norms are both accepted.
    l->q_norm_elems = b.elems_of(qn) == c.head_dim ? c.head_dim : static_cast<uint32_t>(q_out);
    l->k_norm_elems = b.elems_of(kn) == c.head_dim ? c.head_dim : static_cast<uint32_t>(kv_out);
    l->q_norm = b.get(qn, {l->q_norm_elems});
    l->k_norm = b.get(kn, {l->k_norm_elems});
  }
  l->ffn_norm = b.get(p + "post_attention_layernorm.weight", {c.hidden});
}

void bind_ffn(Binder& b, const ModelConfig& c, const std::string& p, LayerWeights* l) {
  if (c.experts == 0) {
    l->w1 = b.get(p + "mlp.gate_proj.weight", {c.intermediate, c.hidden});
    l->w2 = b.get(p + "mlp.down_proj.weight", {c.hidden, c.intermediate});
    l->w3 = b.get(p + "mlp.up_proj.weight", {c.intermediate, c.hidden});
    return;
  }
  std::string m = p + "block_sparse_moe.";
  l->router = b.get(m + "gate.weight", {c.experts, c.hidden});
  if (c.router_bias) l->router_bias = b.get(m + "e_score_correction_bias", {c.experts});
  for (uint32_t e = 0; e < c.experts; ++e) {
    std::string x = m + "experts." + std::to_string(e) + ".";
    ExpertWeights ew;
    ew.w1 = b.get(x + "w1.weight", {c.moe_intermediate, c.hidden});
    ew.w2 = b.get(x + "w2.weight", {c.hidden, c.moe_intermediate});
    ew.w3 = b.get(x + "w3.weight", {c.moe_intermediate, c.hidden});
    l->experts.push_back(ew);
  }
}

uint64_t compute_bytes_per_token(const ModelConfig& c) {
  uint64_t q = uint64_t{c.heads} * c.head_dim, kv = uint64_t{c.kv_heads} * c.head_dim;
  uint64_t per_layer = c.hidden * (q + 2 * kv) + q * c.hidden + 2 * uint64_t{c.hidden};
  if (c.experts == 0) {
    per_layer += 3 * uint64_t{c.intermediate} * c.hidden;
  } else {
    per_layer += uint64_t{c.experts} * c.hidden +
                 uint64_t{c.experts_per_token} * 3 * c.moe_intermediate * c.hidden;
  }
  return 4 * (per_layer * c.layers + uint64_t{c.vocab_size} * c.hidden + c.hidden);
}

// model.safetensors.index.json's weight_map, grouped by shard file (in first-seen order).
struct ShardIndex {
  std::vector<std::string> files;
  std::map<std::string, std::vector<std::string>> tensors_by_file;
};

Result<ShardIndex> read_shard_index(const std::string& index_path) {
  auto text = read_text(index_path);
  if (!text) return text.error();
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid(index_path + ": not a JSON object");
  if (!j.contains("weight_map") || !j["weight_map"].is_object()) {
    return invalid(index_path + ": no \"weight_map\" object (tensor name -> shard file)");
  }
  if (j["weight_map"].empty()) return invalid(index_path + ": \"weight_map\" is empty");
  ShardIndex index;
  for (const auto& [name, file] : j["weight_map"].items()) {
    std::string where = index_path + ": weight_map[\"" + name + "\"]";
    if (!file.is_string()) return invalid(where + " must be a file name string");
    std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
      return invalid(where + " = '" + f + "' is not a file name in the model directory");
    }
    auto& names = index.tensors_by_file[f];
    if (names.empty()) index.files.push_back(f);
    names.push_back(name);
  }
  RT_ASSERT(!index.files.empty(), index_path);
  RT_ASSERT(index.files.size() == index.tensors_by_file.size(), index_path);
  return index;
}

// Maps each shard the index names and takes from it exactly the tensors the index puts there
// (the index is authoritative: other tensors in a shard are ignored).
Status open_indexed_shards(const std::string& dir, const std::string& index_path,
                           WeightStorage* w, std::map<std::string, TensorRef>* tensors) {
  auto index = read_shard_index(index_path);
  if (!index) return index.error();
  for (const auto& f : index->files) {
    const auto& names = index->tensors_by_file.at(f);
    auto map = MappedFile::open((fs::path(dir) / f).string());
    if (!map) {
      return Error{map.error().kind, index_path + ": shard '" + f + "' (holds tensor '" +
                                         names.front() + "' and " +
                                         std::to_string(names.size() - 1) +
                                         " more): " + map.error().message};
    }
    std::map<std::string, TensorRef> in_file;
    if (auto st = parse_safetensors(**map, &in_file); !st) return st;
    for (const auto& name : names) {
      auto it = in_file.find(name);
      if (it == in_file.end()) {
        return invalid(index_path + ": weight_map puts tensor '" + name + "' in '" + f +
                       "', but " + (*map)->path() + " has no such tensor");
      }
      (*tensors)[name] = it->second;
    }
    w->maps.push_back(std::move(*map));
  }
  return {};
}

// Fills `tensors` from model.safetensors.index.json + its shards when the index exists,
// else from model.safetensors. `*source` names where tensors were looked up (for errors).
Status open_shards(const std::string& dir, WeightStorage* w,
                   std::map<std::string, TensorRef>* tensors, std::string* source) {
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(index, ec)) {
    *source = "model.safetensors.index.json's weight_map";
    return open_indexed_shards(dir, index.string(), w, tensors);
  }
  *source = "model.safetensors";
  auto map = MappedFile::open((fs::path(dir) / "model.safetensors").string());
  if (!map) return map.error();
  if (auto st = parse_safetensors(**map, tensors); !st) return st;
  w->maps.push_back(std::move(*map));
  return {};
}

}  // namespace

Result<ModelWeights> load_hf_dir(const std::string& dir) {
  fs::path cfg_path = fs::path(dir) / "config.json";
  auto text = read_text(cfg_path.string());
  if (!text) return make_error(ErrorKind::not_found, cfg_path.string() + ": cannot open");
  ModelWeights w;
  TRY_ASSIGN(w.config, parse_hf_config(*text, cfg_path.string()));
  std::map<std::string, TensorRef> tensors;
  std::string source;
  if (auto st = open_shards(dir, &w.storage, &tensors, &source); !st) return st.error();
  const ModelConfig& c = w.config;
  if (auto it = tensors.find("model.embed_tokens.weight"); it != tensors.end()) {
    w.config.weight_dtype = it->second.dtype;
  }
  Binder b(&tensors, &w.storage, source);
  w.embed = b.get("model.embed_tokens.weight", {c.vocab_size, c.hidden});
  w.final_norm = b.get("model.norm.weight", {c.hidden});
  w.lm_head = c.tie_embeddings ? w.embed : b.get("lm_head.weight", {c.vocab_size, c.hidden});
  w.layers.resize(c.layers);
  for (uint32_t i = 0; i < c.layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    bind_attention(b, c, p, &w.layers[i]);
    bind_ffn(b, c, p, &w.layers[i]);
    if (b.error()) break;
  }
  if (b.error()) return Error{b.error()->kind, dir + ": " + b.error()->message};
  w.bytes_per_token = compute_bytes_per_token(c);
  return w;
}

namespace {

struct Llama2cHeader {
  int32_t dim, hidden_dim, layers, heads, kv_heads, vocab, seq_len;
};

Status check_llama2c_header(const Llama2cHeader& h, const std::string& path) {
  constexpr int32_t limit = 1 << 20;
  auto in_range = [](int32_t v) { return v > 0 && v <= limit; };
  if (!in_range(h.dim) || !in_range(h.hidden_dim) || !in_range(h.layers) || !in_range(h.heads) ||
      !in_range(h.kv_heads) || !in_range(h.seq_len) || h.vocab == 0 || h.vocab < -limit ||
      h.vocab > limit) {
    return invalid(path + ": llama2.c header has a size out of range (dim=" +
                   std::to_string(h.dim) + " layers=" + std::to_string(h.layers) +
                   " vocab=" + std::to_string(h.vocab) + "); not a llama2.c checkpoint?");
  }
  if (h.dim % h.heads != 0 || h.heads % h.kv_heads != 0) {
    return invalid(path + ": llama2.c header: dim % heads or heads % kv_heads is not 0");
  }
  return {};
}

ModelConfig llama2c_config(const Llama2cHeader& h) {
  ModelConfig c;
  c.arch = Arch::llama;
  c.vocab_size = static_cast<uint32_t>(h.vocab < 0 ? -h.vocab : h.vocab);
  c.hidden = static_cast<uint32_t>(h.dim);
  c.layers = static_cast<uint32_t>(h.layers);
  c.heads = static_cast<uint32_t>(h.heads);
  c.kv_heads = static_cast<uint32_t>(h.kv_heads);
  c.head_dim = c.hidden / c.heads;
  c.intermediate = static_cast<uint32_t>(h.hidden_dim);
  c.rope_theta = 10000.0f;
  c.rotary_dim = c.head_dim;
  c.rope_style = RopeStyle::interleaved;
  c.rms_eps = 1e-5f;
  c.tie_embeddings = h.vocab > 0;
  c.max_position = static_cast<uint32_t>(h.seq_len);
  c.bos_id = 1;
  c.eos_id = 2;
  c.weight_dtype = DType::f32;
  return c;
}

}  // namespace

Result<ModelShape> read_model_shape(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) {
    fs::path config = fs::path(path) / "config.json";
    if (fs::exists(config, ec)) {
      std::ifstream in(config, std::ios::binary);
      std::ostringstream text;
      text << in.rdbuf();
      auto c = parse_hf_config(text.str(), config.string());
      if (!c) return c.error();
      ModelShape shape{*c, text.str()};
      std::vector<std::string> shards;
      for (const auto& e : fs::directory_iterator(path, ec)) {
        if (e.path().extension() == ".safetensors") {
          shards.push_back(e.path().filename().string() + "=" +
                           std::to_string(fs::file_size(e.path(), ec)));
        }
      }
      std::sort(shards.begin(), shards.end());
      for (const auto& s : shards) shape.fingerprint += "\n" + s;
      return shape;
    }
    file.clear();
    for (const auto& e : fs::directory_iterator(path, ec)) {
      if (e.path().extension() == ".bin" && e.path().filename() != "tokenizer.bin") {
        file = e.path().string();
      }
    }
    if (file.empty()) {
      return make_error(ErrorKind::not_found,
                        path + ": neither config.json nor a llama2.c .bin checkpoint");
    }
  }
  std::ifstream in(file, std::ios::binary);
  Llama2cHeader h{};
  if (!in.read(reinterpret_cast<char*>(&h), sizeof h)) {
    return make_error(ErrorKind::not_found, file + ": cannot read a llama2.c header");
  }
  if (auto st = check_llama2c_header(h, file); !st) return st.error();
  ModelShape shape{llama2c_config(h), std::string(reinterpret_cast<const char*>(&h), sizeof h)};
  shape.fingerprint += "\nsize=" + std::to_string(fs::file_size(file, ec));
  return shape;
}

Result<ModelWeights> load_llama2c(const std::string& path) {
  auto map = MappedFile::open(path);
  if (!map) return map.error();
  const MappedFile& f = **map;
  Llama2cHeader h{};
  if (f.size_bytes() < sizeof h) return invalid(path + ": too short for a llama2.c header");
  std::memcpy(&h, f.data(), sizeof h);
  if (auto st = check_llama2c_header(h, path); !st) return st.error();
  ModelWeights w;
  w.config = llama2c_config(h);
  const ModelConfig& c = w.config;
  uint64_t L = c.layers, D = c.hidden, F = c.intermediate, V = c.vocab_size;
  uint64_t kv = uint64_t{c.kv_heads} * c.head_dim;
  uint64_t floats = V * D + L * D + L * D * D + 2 * L * D * kv + L * D * D + L * D +
                    2 * L * F * D + L * D * F + D + uint64_t{c.max_position} * c.head_dim +
                    (c.tie_embeddings ? 0 : V * D);
  uint64_t need = sizeof h + floats * 4;
  if (f.size_bytes() < need) {
    return invalid(path + ": truncated: " + std::to_string(f.size_bytes()) +
                   " bytes, the header's shapes need " + std::to_string(need));
  }
  const float* p = reinterpret_cast<const float*>(f.data() + sizeof h);  // offset 28: aligned
  auto take = [&p](uint64_t n) {
    const float* out = p;
    p += n;
    return out;
  };
  w.embed = take(V * D);
  const float* rms_att = take(L * D);
  const float* wq = take(L * D * D);
  const float* wk = take(L * D * kv);
  const float* wv = take(L * D * kv);
  const float* wo = take(L * D * D);
  const float* rms_ffn = take(L * D);
  const float* w1 = take(L * F * D);
  const float* w2 = take(L * D * F);
  const float* w3 = take(L * F * D);
  w.final_norm = take(D);
  take(uint64_t{c.max_position} * c.head_dim);  // freq_cis_real + freq_cis_imag (unused)
  w.lm_head = c.tie_embeddings ? w.embed : take(V * D);
  w.layers.resize(c.layers);
  for (uint64_t i = 0; i < L; ++i) {
    LayerWeights& l = w.layers[i];
    l.attn_norm = rms_att + i * D;
    l.wq = wq + i * D * D;
    l.wk = wk + i * kv * D;
    l.wv = wv + i * kv * D;
    l.wo = wo + i * D * D;
    l.ffn_norm = rms_ffn + i * D;
    l.w1 = w1 + i * F * D;
    l.w2 = w2 + i * D * F;
    l.w3 = w3 + i * F * D;
  }
  RT_ASSERT(reinterpret_cast<const std::byte*>(p) <= f.data() + f.size_bytes(), path);
  w.bytes_per_token = compute_bytes_per_token(c);
  w.storage.maps.push_back(std::move(*map));
  return w;
}

// A directory without config.json that holds one llama2.c checkpoint (any *.bin other than
// tokenizer.bin, like models/stories15M/) loads that checkpoint.
std::optional<std::string> single_llama2c_in(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "config.json", ec)) return std::nullopt;
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const auto& p = entry.path();
    if (p.extension() == ".bin" && p.filename() != "tokenizer.bin") found.push_back(p.string());
  }
  if (found.size() != 1) return std::nullopt;
  return found[0];
}

Result<ModelWeights> load_model(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return make_error(ErrorKind::not_found, path + ": no such file");
  if (fs::is_directory(path, ec)) {
    if (auto checkpoint = single_llama2c_in(path)) return load_llama2c(*checkpoint);
    return load_hf_dir(path);
  }
  return load_llama2c(path);
}

}  // namespace tandem::devices::cpu

// ---- EAGLE-3 draft head (eagle3.hpp) ----

namespace tandem::devices::cpu {

std::array<uint32_t, 3> eagle3_default_aux_layers(uint32_t target_layers) {
  RT_ASSERT(target_layers > 0, "a target has layers");
  auto clamp = [target_layers](int64_t id) {
    return static_cast<uint32_t>(std::clamp<int64_t>(id, 0, target_layers - 1));
  };
  int64_t l = target_layers;
  return {clamp(2), clamp(l / 2), clamp(l - 3)};
}

namespace {

Status parse_eagle3_config(const json& j, const std::string& file, const ModelConfig& target,
                           Eagle3Config* c) {
  uint32_t layers = 0;
  TRY_ASSIGN(layers, get_u32(j, "num_hidden_layers", file, 1u));
  if (layers != 1) {
    return make_error(ErrorKind::unimplemented,
                      file + ": num_hidden_layers is " + std::to_string(layers) +
                          "; EAGLE-3 heads of one decoder layer are supported");
  }
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    return make_error(ErrorKind::unimplemented, file + ": rope_scaling is not supported");
  }
  TRY_ASSIGN(c->hidden, get_u32(j, "hidden_size", file, std::nullopt));
  TRY_ASSIGN(c->heads, get_u32(j, "num_attention_heads", file, std::nullopt));
  TRY_ASSIGN(c->kv_heads, get_u32(j, "num_key_value_heads", file, c->heads));
  TRY_ASSIGN(c->head_dim, get_u32(j, "head_dim", file, c->heads ? c->hidden / c->heads : 0));
  TRY_ASSIGN(c->intermediate, get_u32(j, "intermediate_size", file, std::nullopt));
  TRY_ASSIGN(c->vocab_size, get_u32(j, "vocab_size", file, std::nullopt));
  TRY_ASSIGN(c->draft_vocab, get_u32(j, "draft_vocab_size", file, c->vocab_size));
  TRY_ASSIGN(c->target_hidden, get_u32(j, "target_hidden_size", file, c->hidden));
  TRY_ASSIGN(c->max_position, get_u32(j, "max_position_embeddings", file, target.max_position));
  TRY_ASSIGN(c->rope_theta, get_float(j, "rope_theta", file, 10000.0f));
  TRY_ASSIGN(c->rms_eps, get_float(j, "rms_norm_eps", file, 1e-6f));
  c->norm_before_residual = j.value("norm_before_residual", false);
  auto bad = [&file](const std::string& key, const std::string& why) {
    return invalid(file + ": " + key + " " + why);
  };
  if (c->hidden == 0 || c->heads == 0 || c->kv_heads == 0 || c->head_dim == 0 ||
      c->intermediate == 0 || c->draft_vocab == 0) {
    return invalid(file + ": hidden_size, num_attention_heads, num_key_value_heads, head_dim, "
                          "intermediate_size and draft_vocab_size must be above 0");
  }
  if (c->heads % c->kv_heads != 0) {
    return bad("num_attention_heads", "(" + std::to_string(c->heads) +
                                          ") is not a multiple of num_key_value_heads (" +
                                          std::to_string(c->kv_heads) + ")");
  }
  if (c->head_dim % 2 != 0) return bad("head_dim", "must be even (RoPE pairs)");
  if (c->vocab_size != target.vocab_size) {
    return bad("vocab_size", "is " + std::to_string(c->vocab_size) + ", the target's is " +
                                 std::to_string(target.vocab_size));
  }
  if (c->draft_vocab > c->vocab_size) {
    return bad("draft_vocab_size", "(" + std::to_string(c->draft_vocab) +
                                       ") exceeds vocab_size (" +
                                       std::to_string(c->vocab_size) + ")");
  }
  if (c->target_hidden != target.hidden) {
    return bad("target_hidden_size", "is " + std::to_string(c->target_hidden) +
                                         ", the target's hidden size is " +
                                         std::to_string(target.hidden));
  }
  c->aux_layers = eagle3_default_aux_layers(target.layers);
  const json* ids = nullptr;
  if (j.contains("eagle_config") && j["eagle_config"].is_object() &&
      j["eagle_config"].contains("eagle_aux_hidden_state_layer_ids")) {
    ids = &j["eagle_config"]["eagle_aux_hidden_state_layer_ids"];
  }
  if (ids != nullptr) {
    std::string key = "eagle_config.eagle_aux_hidden_state_layer_ids";
    if (!ids->is_array() || ids->size() != 3) return bad(key, "must list 3 layer ids");
    for (size_t i = 0; i < 3; ++i) {
      const json& v = (*ids)[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
          v.get<int64_t>() >= int64_t{target.layers}) {
        return bad(key + "[" + std::to_string(i) + "]",
                   "must be a layer id in [0, " + std::to_string(target.layers) +
                       ") of the target");
      }
      c->aux_layers[i] = v.get<uint32_t>();
    }
  }
  return {};
}

}  // namespace

Result<Eagle3Weights> load_eagle3_dir(const std::string& dir, const ModelConfig& target) {
  fs::path cfg_path = fs::path(dir) / "config.json";
  auto text = read_text(cfg_path.string());
  if (!text) return make_error(ErrorKind::not_found, cfg_path.string() + ": cannot open");
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid(cfg_path.string() + ": not a JSON object");
  Eagle3Weights w;
  if (auto st = parse_eagle3_config(j, cfg_path.string(), target, &w.config); !st) {
    return st.error();
  }
  std::map<std::string, TensorRef> tensors;
  std::string source;
  if (auto st = open_shards(dir, &w.storage, &tensors, &source); !st) return st.error();
  const Eagle3Config& c = w.config;
  uint64_t h = c.hidden, q_out = uint64_t{c.heads} * c.head_dim,
           kv_out = uint64_t{c.kv_heads} * c.head_dim;
  Binder b(&tensors, &w.storage, source);
  std::string p = b.has("midlayer.input_layernorm.weight") ? "midlayer." : "layers.0.";
  w.embed = b.get("embed_tokens.weight", {c.vocab_size, h}, true);
  if (w.embed == nullptr && c.hidden != target.hidden) {
    return invalid(dir + ": the head has no embed_tokens.weight and its hidden_size (" +
                   std::to_string(c.hidden) + ") differs from the target's (" +
                   std::to_string(target.hidden) + "), so it cannot share the target's");
  }
  w.fc = b.get("fc.weight", {h, 3 * uint64_t{c.target_hidden}});
  w.input_norm = b.get(p + "input_layernorm.weight", {h});
  w.hidden_norm = b.get(p + "hidden_norm.weight", {h});
  w.wq = b.get(p + "self_attn.q_proj.weight", {q_out, 2 * h});
  w.wk = b.get(p + "self_attn.k_proj.weight", {kv_out, 2 * h});
  w.wv = b.get(p + "self_attn.v_proj.weight", {kv_out, 2 * h});
  w.wo = b.get(p + "self_attn.o_proj.weight", {h, q_out});
  w.post_norm = b.get(p + "post_attention_layernorm.weight", {h});
  w.w1 = b.get(p + "mlp.gate_proj.weight", {c.intermediate, h});
  w.w3 = b.get(p + "mlp.up_proj.weight", {c.intermediate, h});
  w.w2 = b.get(p + "mlp.down_proj.weight", {h, c.intermediate});
  w.final_norm = b.get("norm.weight", {h});
  w.lm_head = b.get("lm_head.weight", {c.draft_vocab, h});
  auto d2t = b.get_i64("d2t", {c.draft_vocab}, c.draft_vocab == c.vocab_size);
  if (b.error()) return Error{b.error()->kind, dir + ": " + b.error()->message};
  w.draft_to_target.resize(c.draft_vocab);
  for (uint32_t i = 0; i < c.draft_vocab; ++i) {
    int64_t id = int64_t{i} + (d2t ? (*d2t)[i] : 0);
    if (id < 0 || id >= int64_t{c.vocab_size}) {
      return invalid(dir + ": d2t[" + std::to_string(i) + "] = " + std::to_string((*d2t)[i]) +
                     " maps draft id " + std::to_string(i) + " to " + std::to_string(id) +
                     ", outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
    }
    w.draft_to_target[i] = static_cast<int32_t>(id);
  }
  return w;
}

}  // namespace tandem::devices::cpu
