#include "devices/rbln/rbln_artifact.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>
#include <nlohmann/json.hpp>

namespace tandem::devices::rbln {
namespace fs = std::filesystem;

std::string RblnArtifact::prefill_graph() const {
  return dir + "/prefill.rbln";
}

std::string RblnArtifact::stage_graph(uint32_t stage) const {
  return dir + "/prefill_stage_" + std::to_string(stage) + ".rbln";
}

uint32_t RblnArtifact::stage_first_layer(uint32_t stage) const {
  uint32_t first = 0;
  for (uint32_t s = 0; s < stage && s < stage_layers.size(); ++s) first += stage_layers[s];
  return first;
}

std::string RblnArtifact::decode_graph(uint32_t bucket) const {
  return dir + "/decoder_batch_" + std::to_string(bucket) + ".rbln";
}

std::string RblnArtifact::verify_graph(uint32_t bucket) const {
  return dir + "/verify_batch_" + std::to_string(bucket) + ".rbln";
}

uint32_t RblnArtifact::bucket_for(uint32_t rows) const {
  for (uint32_t b : buckets) {
    if (b >= rows) return b;
  }
  return 0;
}

namespace {

// Reads an unsigned key of `j` into `out`; an error names the file and key.
Status read_uint(const nlohmann::json& j, const std::string& file, const char* key, uint32_t& out,
                 bool required, uint32_t min = 1) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (!required) return {};
    return make_error(ErrorKind::invalid, file + ": key '" + key + "' is missing");
  }
  if (!it->is_number_integer() || it->get<int64_t>() < min ||
      it->get<int64_t>() > int64_t{UINT32_MAX}) {
    return make_error(ErrorKind::invalid, file + ": key '" + key + "' must be an integer >= " +
                                              std::to_string(min) + ", got " + it->dump());
  }
  out = it->get<uint32_t>();
  return {};
}

Status read_string(const nlohmann::json& j, const std::string& file, const char* key,
                   std::string& out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string() || it->get<std::string>().empty()) {
    return make_error(ErrorKind::invalid,
                      file + ": key '" + key + "' must be a non-empty string" +
                          (it == j.end() ? " (missing)" : ", got " + it->dump()));
  }
  out = it->get<std::string>();
  return {};
}

Status read_model(const nlohmann::json& j, const std::string& file, ModelConfig& m) {
  auto it = j.find("model");
  if (it == j.end() || !it->is_object()) {
    return make_error(ErrorKind::invalid, file + ": key 'model' must be an object");
  }
  const nlohmann::json& o = *it;
  std::string f = file + " model";
  for (auto [key, field] : {std::pair{"vocab_size", &m.vocab_size},
                            {"hidden", &m.hidden},
                            {"layers", &m.layers},
                            {"heads", &m.heads},
                            {"kv_heads", &m.kv_heads},
                            {"head_dim", &m.head_dim},
                            {"max_position", &m.max_position}}) {
    if (auto st = read_uint(o, f, key, *field, true); !st) return st;
  }
  uint32_t bos = 1, eos = 2;
  if (auto st = read_uint(o, f, "bos_id", bos, false, 0); !st) return st;
  if (auto st = read_uint(o, f, "eos_id", eos, false, 0); !st) return st;
  m.bos_id = static_cast<int32_t>(bos);
  m.eos_id = static_cast<int32_t>(eos);
  // Fields the backend does not compute with; set so ModelConfig::validate() holds.
  m.intermediate = m.hidden;
  m.rotary_dim = m.head_dim;
  if (auto st = m.validate(); !st) {
    return make_error(ErrorKind::invalid, file + ": " + st.error().message);
  }
  return {};
}

// pipeline_stage_layers: absent, an equal split of the model's layers into a.stages; else one
// count >= 1 per stage, summing to the layers.
Status read_stage_layers(const nlohmann::json& j, const std::string& file, RblnArtifact& a) {
  const uint32_t layers = a.model.layers;
  if (a.stages > layers) {
    return make_error(ErrorKind::invalid, file + ": pipeline_parallel_size " +
                                              std::to_string(a.stages) + " exceeds the model's " +
                                              std::to_string(layers) + " layers");
  }
  auto it = j.find("pipeline_stage_layers");
  if (it == j.end()) {
    if (layers % a.stages != 0) {
      return make_error(ErrorKind::invalid,
                        file + ": " + std::to_string(layers) + " layers do not split evenly into " +
                            std::to_string(a.stages) +
                            " pipeline stages; list them in pipeline_stage_layers");
    }
    a.stage_layers.assign(a.stages, layers / a.stages);
    return {};
  }
  if (!it->is_array() || it->size() != a.stages) {
    return make_error(ErrorKind::invalid, file +
                                              ": pipeline_stage_layers must be an array of "
                                              "pipeline_parallel_size (" +
                                              std::to_string(a.stages) + ") counts, got " +
                                              it->dump());
  }
  uint64_t sum = 0;
  for (const auto& v : *it) {
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > layers) {
      return make_error(ErrorKind::invalid, file + ": pipeline_stage_layers holds " + v.dump() +
                                                ", not a layer count in [1, " +
                                                std::to_string(layers) + "]");
    }
    a.stage_layers.push_back(v.get<uint32_t>());
    sum += a.stage_layers.back();
  }
  if (sum != layers) {
    return make_error(ErrorKind::invalid, file + ": pipeline_stage_layers sum to " +
                                              std::to_string(sum) + ", the model has " +
                                              std::to_string(layers) + " layers");
  }
  return {};
}

}  // namespace

Result<RblnArtifact> load_artifact(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return make_error(ErrorKind::not_found, "rbln: no compiled model directory at " + dir);
  }
  std::string file = dir + "/rbln_config.json";
  std::ifstream in(file);
  if (!in) return make_error(ErrorKind::not_found, "rbln: " + file + " is missing");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto parsed = parse_artifact_config(text, dir);
  if (!parsed.ok()) return parsed.error();
  RblnArtifact a = std::move(parsed).value();
  std::vector<std::string> graphs;
  if (a.stages == 1) graphs.push_back(a.prefill_graph());
  for (uint32_t stage = 0; a.stages > 1 && stage < a.stages; ++stage) {
    graphs.push_back(a.stage_graph(stage));
  }
  for (uint32_t bucket : a.buckets) graphs.push_back(a.decode_graph(bucket));
  for (uint32_t bucket : a.buckets) {
    if (a.verify_tokens > 0) graphs.push_back(a.verify_graph(bucket));
  }
  for (const std::string& g : graphs) {
    if (!fs::is_regular_file(g, ec)) {
      return make_error(ErrorKind::not_found,
                        "rbln: compiled graph " + g + " is missing (" + file + " lists it)");
    }
  }
  return a;
}

Result<RblnArtifact> parse_artifact_config(std::string_view text, const std::string& dir) {
  std::string file = dir + "/rbln_config.json";
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return make_error(ErrorKind::invalid, file + ": not a JSON object");
  }
  RblnArtifact a;
  a.dir = dir;
  if (auto st = read_string(j, file, "model_name", a.model_name); !st) return st.error();
  if (auto st = read_string(j, file, "compiler_version", a.compiler_version); !st) {
    return st.error();
  }
  if (auto st = read_model(j, file, a.model); !st) return st.error();
  struct Key {
    const char* name;
    uint32_t* out;
  };
  for (Key k : {Key{"kvcache_block_size", &a.block_tokens}, Key{"kvcache_num_blocks", &a.kv_blocks},
                Key{"max_seq_len", &a.max_seq_len}, Key{"prefill_chunk_size", &a.prefill_chunk}}) {
    if (auto st = read_uint(j, file, k.name, *k.out, true); !st) return st.error();
  }
  if (auto st = read_uint(j, file, "kv_element_bytes", a.kv_element_bytes, false); !st) {
    return st.error();
  }
  if (auto st = read_uint(j, file, "tensor_parallel_size", a.devices, false); !st) {
    return st.error();
  }
  if (a.kv_element_bytes != 1 && a.kv_element_bytes != 2 && a.kv_element_bytes != 4) {
    return make_error(ErrorKind::invalid, file + ": kv_element_bytes must be 1, 2 or 4, got " +
                                              std::to_string(a.kv_element_bytes));
  }
  if (a.max_seq_len % a.block_tokens != 0) {
    return make_error(ErrorKind::invalid, file + ": max_seq_len " + std::to_string(a.max_seq_len) +
                                              " is not a multiple of kvcache_block_size " +
                                              std::to_string(a.block_tokens));
  }
  if (a.prefill_chunk % 64 != 0) {
    return make_error(ErrorKind::invalid, file + ": prefill_chunk_size " +
                                              std::to_string(a.prefill_chunk) +
                                              " is not a multiple of 64");
  }
  if (a.kv_blocks < 2) {
    return make_error(ErrorKind::invalid, file +
                                              ": kvcache_num_blocks must be >= 2 (one is the "
                                              "padding rows' dummy block), got " +
                                              std::to_string(a.kv_blocks));
  }
  if (a.max_seq_len > a.model.max_position) {
    return make_error(ErrorKind::invalid, file + ": max_seq_len " + std::to_string(a.max_seq_len) +
                                              " exceeds model max_position " +
                                              std::to_string(a.model.max_position));
  }
  if (auto st = read_uint(j, file, "pipeline_parallel_size", a.stages, false); !st) {
    return st.error();
  }
  if (auto st = read_stage_layers(j, file, a); !st) return st.error();
  if (auto st = read_uint(j, file, "data_parallel_size", a.ranks, false); !st) return st.error();
  if (a.ranks > 1 && a.stages > 1) {
    return make_error(ErrorKind::invalid, file + ": data_parallel_size " + std::to_string(a.ranks) +
                                              " with pipeline_parallel_size " +
                                              std::to_string(a.stages) +
                                              ": a pipelined prefill has one rank");
  }
  if (a.ranks > 32) {
    return make_error(ErrorKind::invalid,
                      file + ": data_parallel_size " + std::to_string(a.ranks) + " exceeds 32");
  }
  if (auto st = read_uint(j, file, "verify_tokens", a.verify_tokens, false, 2); !st) {
    return st.error();
  }
  if (a.verify_tokens > 64) {
    return make_error(ErrorKind::invalid,
                      file + ": verify_tokens " + std::to_string(a.verify_tokens) + " exceeds 64");
  }
  auto b = j.find("decoder_batch_sizes");
  if (a.stages > 1) {
    for (const char* key : {"decoder_batch_sizes", "verify_tokens"}) {
      if (j.contains(key)) {
        return make_error(ErrorKind::invalid,
                          file + ": pipeline_parallel_size " + std::to_string(a.stages) + " with " +
                              key +
                              ": a pipelined artifact is prefill-only (decode runs one "
                              "instance per device)");
      }
    }
    return a;
  }
  if (b == j.end() || !b->is_array() || b->empty()) {
    return make_error(ErrorKind::invalid,
                      file + ": key 'decoder_batch_sizes' must be a non-empty array");
  }
  for (const auto& v : *b) {
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 4096) {
      return make_error(ErrorKind::invalid, file + ": decoder_batch_sizes holds " + v.dump() +
                                                ", not a batch size in [1, 4096]");
    }
    uint32_t size = v.get<uint32_t>();
    if (!a.buckets.empty() && size <= a.buckets.back()) {
      return make_error(ErrorKind::invalid, file + ": decoder_batch_sizes must ascend, " +
                                                std::to_string(size) + " follows " +
                                                std::to_string(a.buckets.back()));
    }
    a.buckets.push_back(size);
  }
  return a;
}

nlohmann::json artifact_config_json(const RblnArtifact& a) {
  const ModelConfig& m = a.model;
  nlohmann::json j = {
      {"model_name", a.model_name},
      {"compiler_version", a.compiler_version},
      {"model",
       {{"vocab_size", m.vocab_size},
        {"hidden", m.hidden},
        {"layers", m.layers},
        {"heads", m.heads},
        {"kv_heads", m.kv_heads},
        {"head_dim", m.head_dim},
        {"max_position", m.max_position},
        {"bos_id", m.bos_id},
        {"eos_id", m.eos_id}}},
      {"kvcache_block_size", a.block_tokens},
      {"kvcache_num_blocks", a.kv_blocks},
      {"kv_element_bytes", a.kv_element_bytes},
      {"max_seq_len", a.max_seq_len},
      {"prefill_chunk_size", a.prefill_chunk},
      {"tensor_parallel_size", a.devices},
  };
  if (a.ranks > 1) j["data_parallel_size"] = a.ranks;
  if (a.stages > 1) {
    j["pipeline_parallel_size"] = a.stages;
    if (!a.stage_layers.empty()) j["pipeline_stage_layers"] = a.stage_layers;
  } else {
    j["decoder_batch_sizes"] = a.buckets;
    if (a.verify_tokens > 0) j["verify_tokens"] = a.verify_tokens;
  }
  return j;
}

Status check_artifact(const RblnArtifact& a, const ArtifactExpect& e) {
  std::string who = "rbln artifact " + a.dir + ": ";
  auto mismatch = [&](const std::string& ours, const std::string& theirs) {
    return make_error(ErrorKind::invalid, who + ours + ", manifest " + theirs);
  };
  bool named =
      a.model_name == e.model_name ||
      std::find(e.served_names.begin(), e.served_names.end(), a.model_name) != e.served_names.end();
  if (!named) {
    return mismatch("model_name '" + a.model_name + "'", "[model] name '" + e.model_name + "'");
  }
  if (a.block_tokens != e.block_tokens) {
    return mismatch("kvcache_block_size " + std::to_string(a.block_tokens),
                    "[model] block_tokens " + std::to_string(e.block_tokens));
  }
  if (a.max_seq_len < e.max_model_tokens) {
    return mismatch("max_seq_len " + std::to_string(a.max_seq_len),
                    "[model] max_model_tokens " + std::to_string(e.max_model_tokens) +
                        " (a context longer than the graphs were compiled for)");
  }
  if (a.devices_total() != e.devices) {
    return mismatch(
        a.stages == 1 && a.ranks == 1
            ? "tensor_parallel_size " + std::to_string(a.devices)
            : "tensor_parallel_size " + std::to_string(a.devices) +
                  (a.stages > 1 ? " x pipeline_parallel_size " + std::to_string(a.stages)
                                : " x data_parallel_size " + std::to_string(a.ranks)) +
                  " = " + std::to_string(a.devices_total()) + " devices",
        "instance devices count " + std::to_string(e.devices));
  }
  if (a.stages > 1 && e.decode_seqs_max > 0) {
    return mismatch("pipeline_parallel_size " + std::to_string(a.stages) + " (prefill-only graphs)",
                    "a decode instance runs on this executor");
  }
  if (e.decode_seqs_max > 0 && a.buckets.back() < e.decode_seqs_max) {
    return mismatch("largest decoder_batch_sizes bucket " + std::to_string(a.buckets.back()),
                    "[decode] seqs_max " + std::to_string(e.decode_seqs_max) +
                        " (a decode step of seqs_max sequences fits no graph)");
  }
  if (e.draft_tokens_max > 0 && a.verify_tokens < e.draft_tokens_max + 1) {
    return mismatch(
        a.verify_tokens == 0 ? std::string("no verify graphs (verify_tokens absent)")
                             : "verify_tokens " + std::to_string(a.verify_tokens),
        "[speculative] draft_tokens_max " + std::to_string(e.draft_tokens_max) +
            " (a verify step takes the last token and up to that many drafts per sequence, " +
            std::to_string(e.draft_tokens_max + 1) + " tokens)");
  }
  if (a.kv_blocks < uint64_t{e.kv_blocks} + 1) {
    return mismatch(
        "kvcache_num_blocks " + std::to_string(a.kv_blocks),
        "executor kv_blocks " + std::to_string(e.kv_blocks) + " (+ 1 dummy block for padded rows)");
  }
  return {};
}

}  // namespace tandem::devices::rbln
