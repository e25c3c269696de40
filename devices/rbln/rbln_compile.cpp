#include "devices/rbln/rbln_compile.hpp"

#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

#include "devices/cpu/weights.hpp"
#include "devices/rbln/rbln_artifact.hpp"

namespace tandem::devices::rbln {
namespace fs = std::filesystem;

namespace {

// 'text' for /bin/sh: single-quoted, embedded quotes closed and escaped.
std::string quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct Ran {
  int status = -1;     // the command's exit status; -1: it could not run or was signalled
  std::string output;  // stdout and stderr
};

// Runs `command` by /bin/sh, its output captured (bounded: the last 64 KiB kept).
Ran run_shell(const std::string& command) {
  Ran ran;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return ran;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) {
    ran.output.append(buf, n);
    if (ran.output.size() > 65536) ran.output.erase(0, ran.output.size() - 65536);
  }
  int status = ::pclose(pipe);
  ran.status = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return ran;
}

std::string last_line(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  size_t at = text.rfind('\n');
  return at == std::string::npos ? text : text.substr(at + 1);
}

// A version as a directory name: [A-Za-z0-9._-], anything else '_'.
std::string safe_name(const std::string& text) {
  std::string out = text;
  for (char& c : out) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) c = '_';
  }
  return out.empty() ? "_" : out;
}

std::vector<std::string> graphs_of(const CompileRequest& r) {
  std::vector<std::string> names;
  if (r.stages > 1) {
    for (uint32_t s = 0; s < r.stages; ++s) names.push_back("prefill_stage_" + std::to_string(s));
    return names;
  }
  names.push_back("prefill");
  for (uint32_t b : r.buckets) names.push_back("decoder_batch_" + std::to_string(b));
  for (uint32_t b : r.buckets) {
    if (r.verify_tokens > 0) names.push_back("verify_batch_" + std::to_string(b));
  }
  return names;
}

std::string comma_list(const std::vector<uint32_t>& values) {
  std::string out;
  for (uint32_t v : values) out += (out.empty() ? "" : ",") + std::to_string(v);
  return out;
}

}  // namespace

CompileRequest compile_request(const DeviceSpec& spec) {
  CompileRequest r;
  r.model_path = spec.model_path;
  r.model_name = spec.rbln.model_name;
  r.block_tokens = spec.block_tokens;
  r.max_seq_len = spec.rbln.max_model_tokens;
  r.prefill_chunk = spec.rbln.prefill_chunk;
  r.stages = std::max<uint32_t>(spec.rbln.pipeline_stages, 1);
  r.stage_layers = spec.rbln.stage_layers;
  r.ranks = std::max<uint32_t>(spec.rbln.data_parallel, 1);
  const uint32_t all =
      spec.rbln.device_ids.empty() ? 1 : static_cast<uint32_t>(spec.rbln.device_ids.size());
  // The manifest refuses a split that leaves a remainder; a part is never narrower than one.
  r.devices = std::max<uint32_t>(all / (r.stages * r.ranks), 1);
  r.kv_blocks = spec.blocks_total + 1;
  r.kv_element_bytes = spec.rbln.kv_element_bytes;
  if (r.stages > 1) return r;  // a pipelined prefill compiles no decode graph
  const uint32_t top = std::max<uint32_t>(spec.rbln.decode_seqs_max, 1);
  for (uint32_t b = 1; b < top; b *= 2) r.buckets.push_back(b);
  r.buckets.push_back(top);
  if (spec.rbln.draft_tokens_max > 0) r.verify_tokens = spec.rbln.draft_tokens_max + 1;
  return r;
}

Result<std::vector<uint32_t>> stage_layers_for(const CompileRequest& r, uint32_t layers) {
  if (r.stages <= 1) return std::vector<uint32_t>{};
  if (r.stage_layers.empty()) {
    if (r.stages > layers || layers % r.stages != 0) {
      return make_error(ErrorKind::invalid,
                        "rbln compile: the model's " + std::to_string(layers) +
                            " layers do not split evenly into [rbln] prefill_pipeline_stages = " +
                            std::to_string(r.stages) +
                            "; list each stage's layers in [rbln] "
                            "prefill_stage_layers");
    }
    return std::vector<uint32_t>(r.stages, layers / r.stages);
  }
  uint64_t sum = 0;
  for (uint32_t n : r.stage_layers) sum += n;
  if (r.stage_layers.size() != r.stages || sum != layers) {
    return make_error(ErrorKind::invalid,
                      "rbln compile: [rbln] prefill_stage_layers [" + comma_list(r.stage_layers) +
                          "] sum to " + std::to_string(sum) + " layers over " +
                          std::to_string(r.stage_layers.size()) + " stages; the model has " +
                          std::to_string(layers) + " layers and prefill_pipeline_stages is " +
                          std::to_string(r.stages));
  }
  return r.stage_layers;
}

Result<std::string> compiler_version(const std::string& compiler) {
  Ran ran = run_shell(compiler + " --version");
  std::string first = ran.output.substr(0, ran.output.find('\n'));
  while (!first.empty() && (first.back() == ' ' || first.back() == '\r')) first.pop_back();
  if (ran.status != 0 || first.empty()) {
    return make_error(ErrorKind::failed,
                      "rbln compiler `" + compiler + " --version` " +
                          (ran.status != 0 ? "exited " + std::to_string(ran.status)
                                           : std::string("printed nothing")) +
                          (ran.output.empty() ? "" : ": " + last_line(ran.output)));
  }
  return first;
}

namespace {

// What a request resolves to against its model: the model's shape, each stage's layers, and
// the cache's shape directory (read and computed once per call).
struct Resolved {
  cpu::ModelShape shape;
  std::vector<uint32_t> layers;
  std::string dir;  // CACHE/<name>-<key>
};

Result<Resolved> resolve(const CompileRequest& r, const std::string& cache_dir) {
  auto shape = cpu::read_model_shape(r.model_path);
  if (!shape.ok()) return shape.error();
  // The resolved split: an equal split written out or left implicit is one entry.
  auto layers = stage_layers_for(r, shape->config.layers);
  if (!layers.ok()) return layers.error();
  std::string key =
      shape->fingerprint + "\nblock=" + std::to_string(r.block_tokens) +
      ";max_seq_len=" + std::to_string(r.max_seq_len) +
      ";chunk=" + std::to_string(r.prefill_chunk) + ";devices=" + std::to_string(r.devices) +
      ";stages=" + std::to_string(r.stages) + ":" + comma_list(*layers) +
      ";ranks=" + std::to_string(r.ranks) + ";kv_blocks=" + std::to_string(r.kv_blocks) +
      ";kv_element_bytes=" + std::to_string(r.kv_element_bytes) + ";buckets=";
  for (uint32_t b : r.buckets) key += std::to_string(b) + ",";
  // Appended only when set: the keys of entries without verify graphs stay what they were.
  if (r.verify_tokens > 0) key += ";verify_tokens=" + std::to_string(r.verify_tokens);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(XXH64(key.data(), key.size(), 0)));
  return Resolved{std::move(*shape), std::move(*layers),
                  cache_dir + "/" + safe_name(r.model_name) + "-" + hex};
}

// find_cached in the shape directory `shaped`.
Result<std::string> find_in(const std::string& shaped, const std::string& cache_dir,
                            const std::string& version) {
  std::string dir = shaped + "/" + safe_name(version);
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "rbln_config.json", ec)) return dir;
  std::string others;
  for (const auto& e : fs::directory_iterator(shaped, ec)) {
    if (!e.is_directory() || e.path().filename().string().rfind(".tmp", 0) == 0) continue;
    others += (others.empty() ? "" : ", ") + e.path().filename().string();
  }
  if (!others.empty()) {
    return make_error(ErrorKind::not_found,
                      "rbln: " + shaped + " holds graphs built by compiler " + others +
                          ", the installed compiler is " + version +
                          "; an artifact is only used with the compiler version that built it "
                          "(run `tandem model compile --manifest ...`)");
  }
  return make_error(ErrorKind::not_found, "rbln: nothing compiled for this executor in " +
                                              cache_dir +
                                              " (run `tandem model compile "
                                              "--manifest ...`)");
}

}  // namespace

Result<std::string> find_cached(const CompileRequest& r, const std::string& cache_dir,
                                const std::string& version) {
  auto resolved = resolve(r, cache_dir);
  if (!resolved.ok()) return resolved.error();
  return find_in(resolved->dir, cache_dir, version);
}

Result<CompileOutcome> compile(const CompileRequest& r, const std::string& compiler,
                               const std::string& cache_dir) {
  auto version = compiler_version(compiler);
  if (!version.ok()) return version.error();
  auto resolved = resolve(r, cache_dir);
  if (!resolved.ok()) return resolved.error();
  auto found = find_in(resolved->dir, cache_dir, *version);
  if (found.ok()) return CompileOutcome{*found, true, 0};
  std::string final_dir = resolved->dir + "/" + safe_name(*version);
  std::string tmp = resolved->dir + "/.tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) {
    return make_error(ErrorKind::failed,
                      "rbln compile: cannot create " + tmp + ": " + ec.message());
  }
  CompileOutcome out{final_dir, false, 0};
  // One call for all of the executor's graphs: they are compiled together, as the public stack
  // does, so they share one KV cache on the device.
  std::string command =
      compiler + " --model " + quoted(r.model_path) + " --out " + quoted(std::as_const(tmp)) +
      " --block-tokens " + std::to_string(r.block_tokens) + " --max-seq-len " +
      std::to_string(r.max_seq_len) + " --prefill-chunk " + std::to_string(r.prefill_chunk) +
      (r.stages > 1 ? " --pipeline-stages " + std::to_string(r.stages) + " --stage-layers " +
                          comma_list(resolved->layers)
                    : " --buckets " + comma_list(r.buckets)) +
      " --devices " + std::to_string(r.devices) + " --kv-blocks " + std::to_string(r.kv_blocks) +
      " --kv-element-bytes " + std::to_string(r.kv_element_bytes) +
      (r.ranks > 1 ? " --data-parallel " + std::to_string(r.ranks) : std::string()) +
      (r.verify_tokens > 0 ? " --verify-tokens " + std::to_string(r.verify_tokens) : std::string());
  Ran ran = run_shell(command);
  if (ran.status != 0) {
    fs::remove_all(tmp, ec);
    return make_error(ErrorKind::failed, "rbln compile failed (exit " + std::to_string(ran.status) +
                                             "): " + last_line(ran.output));
  }
  for (const std::string& graph : graphs_of(r)) {
    if (!fs::is_regular_file(tmp + "/" + graph + ".rbln", ec)) {
      fs::remove_all(tmp, ec);
      return make_error(ErrorKind::failed,
                        "rbln compile wrote no " + graph +
                            ".rbln (the compiler exited 0): " + last_line(ran.output));
    }
    ++out.graphs;
  }
  RblnArtifact art;
  art.model_name = r.model_name;
  art.compiler_version = *version;
  art.model = resolved->shape.config;
  art.block_tokens = r.block_tokens;
  art.kv_blocks = r.kv_blocks;
  art.kv_element_bytes = r.kv_element_bytes;
  art.max_seq_len = r.max_seq_len;
  art.prefill_chunk = r.prefill_chunk;
  art.buckets = r.buckets;
  art.devices = r.devices;
  art.stages = r.stages;
  art.stage_layers = resolved->layers;
  art.ranks = r.ranks;
  art.verify_tokens = r.verify_tokens;
  nlohmann::json j = artifact_config_json(art);
  j["source_model_path"] = r.model_path;
  std::ofstream(tmp + "/rbln_config.json") << j.dump(2);
  fs::remove_all(final_dir, ec);
  fs::rename(tmp, final_dir, ec);
  if (ec) {
    fs::remove_all(tmp, ec);
    return make_error(ErrorKind::failed, "rbln compile: cannot move the graphs into " + final_dir);
  }
  return out;
}

}  // namespace tandem::devices::rbln
