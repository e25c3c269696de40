// Sharded HF safetensors checkpoints: `tandem model synth --shards N` (its library,
// tools/model_synth.hpp, and devices/safetensors_writer.hpp write_checkpoint) against the
// cpu device's loader (devices/cpu/weights.cpp): a sharded model gives the same logits, bit
// for bit, as the same model in one file; broken indexes and shards give errors naming the
// file and tensor.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "devices/device.hpp"
#include "devices/safetensors_writer.hpp"
#include "tests/device/model_files.hpp"
#include "tools/model_synth.hpp"

namespace {

namespace fs = std::filesystem;
using namespace tandem::devices;
using nlohmann::json;
using tandem::ErrorKind;

std::string temp_dir(const std::string& name) {
  auto dir = fs::temp_directory_path() /
             ("tandem-shard-test-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in, "cannot read " << path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  REQUIRE(out.good());
}

// One safetensors file's tensors: name -> (header entry without data_offsets, raw bytes).
struct RawTensor {
  std::string dtype;
  std::vector<uint64_t> shape;
  std::string bytes;
  bool operator==(const RawTensor&) const = default;
};
struct RawFile {
  std::map<std::string, RawTensor> tensors;
  uint64_t data_bytes = 0;
};

RawFile read_raw(const std::string& path) {
  std::string file = read_bytes(path);
  REQUIRE(file.size() >= 8);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file.data(), 8);
  REQUIRE(8 + header_bytes <= file.size());
  REQUIRE((8 + header_bytes) % 8 == 0);  // data 8-byte aligned
  json header = json::parse(file.substr(8, header_bytes));
  RawFile out;
  out.data_bytes = file.size() - 8 - header_bytes;
  uint64_t covered = 0;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    uint64_t begin = entry["data_offsets"][0], end = entry["data_offsets"][1];
    REQUIRE(end <= out.data_bytes);
    covered += end - begin;
    out.tensors[name] = {entry["dtype"], entry["shape"].get<std::vector<uint64_t>>(),
                         file.substr(8 + header_bytes + begin, end - begin)};
  }
  CHECK(covered == out.data_bytes);  // no gaps, no overlaps (tensors back to back)
  return out;
}

tandem::tools::SynthOptions llama_options(DType dtype, uint32_t shards) {
  tandem::tools::SynthOptions o;
  o.arch = Arch::llama;
  o.heads = 8;
  o.kv_heads = 2;
  o.head_dim = 8;
  o.seed = 31;
  o.dtype = dtype;
  o.shards = shards;
  return o;
}

std::string synth(const std::string& name, const tandem::tools::SynthOptions& o) {
  std::string dir = temp_dir(name);
  auto st = tandem::tools::synth_model(o, dir);
  REQUIRE_MESSAGE(st.ok(), (st.ok() ? "" : st.error().describe()));
  return dir;
}

std::unique_ptr<Device> open_device(const std::string& path) {
  DeviceSpec spec;
  spec.kind = tandem::config::DeviceKind::cpu;
  spec.model_path = path;
  spec.block_tokens = 4;
  spec.blocks_total = 16;
  spec.threads = 1;
  auto dev = make_device(spec);
  REQUIRE_MESSAGE(dev.ok(), (dev.ok() ? "" : dev.error().describe()));
  return std::move(*dev);
}

tandem::Error load_error(const std::string& path) {
  DeviceSpec spec;
  spec.kind = tandem::config::DeviceKind::cpu;
  spec.model_path = path;
  spec.blocks_total = 8;
  auto dev = make_device(spec);
  REQUIRE_FALSE(dev.ok());
  MESSAGE(dev.error().describe());
  return dev.error();
}

// Prefill of 9 tokens, then one decode pass verifying 3 drafts: 1 + 4 logits rows.
std::vector<float> run_logits(Device& dev) {
  std::mt19937 rng(5);
  uint32_t vocab = dev.model_config().vocab_size;
  std::vector<int32_t> prompt{dev.model_config().bos_id};
  while (prompt.size() < 9) prompt.push_back(int32_t(rng() % 256));
  std::vector<uint32_t> blocks{7, 2, 11, 4};  // 16 positions at 4 per block
  PrefillSeq p{1, blocks, 0, prompt};
  auto pre = dev.prefill(std::span(&p, 1));
  REQUIRE_MESSAGE(pre.ok(), (pre.ok() ? "" : pre.error().describe()));
  std::vector<float> all = pre->seqs[0].logits;
  REQUIRE(all.size() == vocab);
  DecodeSeq d{1, blocks, 9, {int32_t(rng() % 256), 65, 66, 67}};
  auto dec = dev.decode(std::span(&d, 1));
  REQUIRE_MESSAGE(dec.ok(), (dec.ok() ? "" : dec.error().describe()));
  REQUIRE(dec->seqs[0].logits.size() == 4u * vocab);
  all.insert(all.end(), dec->seqs[0].logits.begin(), dec->seqs[0].logits.end());
  return all;
}

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

json read_json(const std::string& path) { return json::parse(read_bytes(path)); }

void write_json(const std::string& path, const json& j) { write_bytes(path, j.dump(2)); }

bool mentions(const tandem::Error& e, const std::string& text) {
  return e.message.find(text) != std::string::npos;
}

const char* kIndex = "/model.safetensors.index.json";
const char* kShard1 = "model-00001-of-00003.safetensors";
const char* kShard2 = "model-00002-of-00003.safetensors";
const char* kShard3 = "model-00003-of-00003.safetensors";

}  // namespace

TEST_CASE("shard: --shards 3 writes HF's layout holding exactly the one-file model's tensors") {
  std::string one = synth("layout-1", llama_options(DType::f32, 1));
  std::string three = synth("layout-3", llama_options(DType::f32, 3));
  CHECK_FALSE(fs::exists(one + kIndex));
  CHECK_FALSE(fs::exists(three + "/model.safetensors"));
  RawFile whole = read_raw(one + "/model.safetensors");
  json index = read_json(three + kIndex);
  REQUIRE(index.is_object());
  CHECK(index.size() == 2u);
  CHECK(index["metadata"]["total_size"].get<uint64_t>() == whole.data_bytes);
  const json& weight_map = index["weight_map"];
  CHECK(weight_map.size() == whole.tensors.size());
  std::map<std::string, RawTensor> merged;
  for (const char* shard : {kShard1, kShard2, kShard3}) {
    RawFile part = read_raw(three + "/" + shard);
    CHECK(!part.tensors.empty());
    // Balanced by bytes: no shard holds more than half of this model (3 shards).
    CHECK(part.data_bytes <= whole.data_bytes / 2);
    for (const auto& [name, t] : part.tensors) {
      CHECK(weight_map.value(name, std::string()) == shard);
      CHECK(merged.count(name) == 0);
      merged[name] = t;
    }
  }
  CHECK(merged == whole.tensors);  // same names, dtypes, shapes and bytes
  // HF writes the index with sorted keys, indent 2 and a trailing newline.
  CHECK(read_bytes(three + kIndex) == index.dump(2) + "\n");
}

TEST_CASE("shard: a 3-shard model gives bit-identical logits to the one-file model") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(safetensors_dtype_name(dtype));
    std::string name = std::string(safetensors_dtype_name(dtype));
    std::string one = synth("logits-1-" + name, llama_options(dtype, 1));
    std::string three = synth("logits-3-" + name, llama_options(dtype, 3));
    REQUIRE(fs::exists(three + "/" + kShard3));
    auto a = open_device(one), b = open_device(three);
    CHECK(a->model_config() == b->model_config());
    CHECK(b->model_config().weight_dtype == dtype);
    std::vector<float> la = run_logits(*a), lb = run_logits(*b);
    CHECK(bit_identical(la, lb));
  }
}

TEST_CASE("shard: rewriting a directory with another shard count leaves one checkpoint") {
  std::string dir = synth("rewrite", llama_options(DType::f32, 3));
  auto st = tandem::tools::synth_model(llama_options(DType::f32, 1), dir);
  REQUIRE(st.ok());
  CHECK_FALSE(fs::exists(dir + kIndex));
  CHECK_FALSE(fs::exists(dir + "/" + kShard1));
  CHECK(fs::exists(dir + "/model.safetensors"));
  st = tandem::tools::synth_model(llama_options(DType::f32, 2), dir);
  REQUIRE(st.ok());
  CHECK_FALSE(fs::exists(dir + "/model.safetensors"));
  CHECK(fs::exists(dir + "/model-00002-of-00002.safetensors"));
  open_device(dir);  // loads
}

TEST_CASE("shard: bad --shards values are errors naming the flag") {
  std::string dir = temp_dir("bad-flag");
  for (uint32_t shards : {0u, 100000u, 5000u}) {  // 5000 > the model's tensor count
    CAPTURE(shards);
    auto st = tandem::tools::synth_model(llama_options(DType::f32, shards), dir);
    REQUIRE_FALSE(st.ok());
    CHECK(st.error().kind == ErrorKind::invalid);
    CHECK(mentions(st.error(), "--shards"));
  }
  SafetensorsWriter w;
  std::vector<float> v{1.0f, 2.0f};
  REQUIRE(w.add("a", DType::f32, {2}, v).ok());
  REQUIRE(w.add("b", DType::f32, {2}, v).ok());
  CHECK_FALSE(w.write_checkpoint(dir, 3).ok());
  CHECK(w.write_checkpoint(dir, 2).ok());
  CHECK(w.shard_starts(2) == std::vector<size_t>{0, 1});
}

TEST_CASE("shard: a broken sharded checkpoint gives an error naming the file and tensor") {
  std::string base = synth("broken-base", llama_options(DType::f32, 3));
  json index = read_json(base + kIndex);
  auto copy = [&base](const std::string& name) {
    std::string d = temp_dir(name);
    fs::copy(base, d, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    return d;
  };

  SUBCASE("the index names a shard file that is missing") {
    std::string d = copy("missing-shard");
    fs::remove(d + "/" + kShard2);
    auto e = load_error(d);
    CHECK(e.kind == ErrorKind::not_found);
    CHECK(mentions(e, "model.safetensors.index.json"));
    CHECK(mentions(e, std::string("shard '") + kShard2 + "'"));
  }
  SUBCASE("a tensor the model needs is in no shard (and not in the index)") {
    std::string d = copy("tensor-nowhere");
    std::string src = synth("tensor-nowhere-src", llama_options(DType::f32, 1));
    reftest::Tensors tensors;
    REQUIRE(reftest::read_safetensors_f32(src + "/model.safetensors", &tensors));
    RawFile whole = read_raw(src + "/model.safetensors");
    std::string gone = "model.layers.1.mlp.up_proj.weight";
    REQUIRE(tensors.erase(gone) == 1);
    SafetensorsWriter w;
    for (const auto& [name, v] : tensors) {
      REQUIRE(w.add(name, DType::f32, whole.tensors.at(name).shape, v).ok());
    }
    REQUIRE(w.write_checkpoint(d, 3).ok());
    auto e = load_error(d);
    CHECK(e.kind == ErrorKind::invalid);
    CHECK(mentions(e, "missing tensor '" + gone + "'"));
    CHECK(mentions(e, "model.safetensors.index.json"));
  }
  SUBCASE("the index puts a tensor in a shard that does not hold it") {
    std::string d = copy("wrong-shard");
    std::string moved = "model.norm.weight";
    std::string holder = index["weight_map"][moved];
    std::string other = holder == kShard1 ? kShard2 : kShard1;
    json j = index;
    j["weight_map"][moved] = other;
    write_json(d + kIndex, j);
    auto e = load_error(d);
    CHECK(e.kind == ErrorKind::invalid);
    CHECK(mentions(e, "tensor '" + moved + "'"));
    CHECK(mentions(e, other));
  }
  SUBCASE("a tensor listed in the index does not exist anywhere") {
    std::string d = copy("phantom");
    json j = index;
    j["weight_map"]["model.layers.0.phantom.weight"] = kShard3;
    write_json(d + kIndex, j);
    auto e = load_error(d);
    CHECK(e.kind == ErrorKind::invalid);
    CHECK(mentions(e, "model.layers.0.phantom.weight"));
    CHECK(mentions(e, kShard3));
  }
  SUBCASE("malformed indexes") {
    std::string d = copy("malformed");
    std::string path = d + kIndex;
    auto check_invalid = [&d, &path](const std::string& text, const std::string& detail) {
      CAPTURE(text);
      write_bytes(path, text);
      auto e = load_error(d);
      CHECK(e.kind == ErrorKind::invalid);
      CHECK(mentions(e, "model.safetensors.index.json"));
      CHECK(mentions(e, detail));
    };
    check_invalid("{ not json", "not a JSON object");
    check_invalid("[1, 2]", "not a JSON object");
    check_invalid(R"({"metadata": {}})", "weight_map");
    check_invalid(R"({"weight_map": []})", "weight_map");
    check_invalid(R"({"weight_map": {}})", "empty");
    check_invalid(R"({"weight_map": {"model.norm.weight": 3}})", "model.norm.weight");
    check_invalid(R"({"weight_map": {"model.norm.weight": "../x.safetensors"}})",
                  "../x.safetensors");
    write_bytes(path, "");
    CHECK(load_error(d).kind == ErrorKind::invalid);
  }
  SUBCASE("a shard that is not safetensors") {
    std::string d = copy("bad-shard");
    write_bytes(d + "/" + kShard1, "garbage");
    auto e = load_error(d);
    CHECK(e.kind == ErrorKind::invalid);
    CHECK(mentions(e, kShard1));
  }
}
