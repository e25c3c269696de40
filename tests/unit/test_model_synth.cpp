#include <doctest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "devices/safetensors_writer.hpp"
#include "tools/model_synth.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using tandem::devices::DType;
using tandem::devices::SafetensorsWriter;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("tandem_synth_" + std::to_string(getpid()) + name);
  fs::remove_all(d);
  return d;
}

struct Parsed {
  json header;
  uint64_t data_start = 0;
  std::string bytes;
};

// Parses a safetensors file and checks the layout invariants every loader relies on.
Parsed parse_safetensors(const fs::path& p) {
  Parsed out;
  out.bytes = slurp(p);
  REQUIRE(out.bytes.size() >= 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(out.bytes[i])) << (8 * i);
  REQUIRE(8 + n <= out.bytes.size());
  out.data_start = 8 + n;
  CHECK(out.data_start % 8 == 0);
  out.header = json::parse(out.bytes.substr(8, n));
  // Offsets tile the data region exactly, and match shape * dtype width.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto& item : out.header.items()) {
    // Not a structured binding: clang 14 cannot capture one in doctest's CHECK_MESSAGE lambda.
    const std::string name = item.key();
    auto& e = item.value();
    if (name == "__metadata__") continue;
    uint64_t elems = 1;
    for (auto d : e["shape"]) elems *= d.get<uint64_t>();
    std::string dt = e["dtype"];
    uint64_t width = dt == "F32" ? 4 : 2;
    auto b = e["data_offsets"][0].get<uint64_t>(), en = e["data_offsets"][1].get<uint64_t>();
    CHECK_MESSAGE(en - b == elems * width, name);
    ranges.push_back({b, en});
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (auto [b, e] : ranges) {
    CHECK(b == at);
    at = e;
  }
  CHECK(out.data_start + at == out.bytes.size());
  return out;
}

int run_tandem(const std::string& args, std::string* err = nullptr) {
  const char* root = std::getenv("TANDEM_BUILD_ROOT");
  REQUIRE(root != nullptr);
  fs::path errfile = temp_dir("_stderr.txt");
  std::string cmd = std::string(root) + "/tools/tandem model synth " + args + " >/dev/null 2>" +
                    errfile.string();
  int status = std::system(cmd.c_str());
  if (err) *err = slurp(errfile);
  fs::remove(errfile);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("f32 converts to bf16 and f16 with round-to-nearest-even") {
  using tandem::devices::f32_to_bf16;
  using tandem::devices::f32_to_f16;
  CHECK(f32_to_bf16(1.0f) == 0x3f80);
  CHECK(f32_to_bf16(-2.0f) == 0xc000);
  CHECK(f32_to_bf16(1.00390625f) == 0x3f80);  // exact tie -> even
  CHECK(f32_to_bf16(1.01171875f) == 0x3f82);  // tie -> even (up)
  CHECK(f32_to_f16(1.0f) == 0x3c00);
  CHECK(f32_to_f16(-2.0f) == 0xc000);
  CHECK(f32_to_f16(65504.0f) == 0x7bff);
  CHECK(f32_to_f16(1e6f) == 0x7c00);
  CHECK(f32_to_f16(0.0f) == 0x0000);
  CHECK(f32_to_f16(5.9604645e-8f) == 0x0001);  // 2^-24, the smallest subnormal
  CHECK(f32_to_f16(6.1035156e-5f) == 0x0400);  // 2^-14, the smallest normal
  CHECK(f32_to_f16(0.333333f) == 0x3555);
}

TEST_CASE("the safetensors writer lays out header and data as the format says") {
  SafetensorsWriter w;
  std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {1.0f, -2.0f};
  REQUIRE(w.add("a", DType::f32, {2, 3}, a).ok());
  REQUIRE(w.add("b", DType::bf16, {2}, b).ok());
  REQUIRE(w.add("c", DType::f16, {1, 2}, b).ok());
  CHECK(w.add("a", DType::f32, {6}, a).error().message.find("added twice") != std::string::npos);
  CHECK(w.add("d", DType::f32, {4}, a).error().message.find("shape holds 4 elements, 6 given") !=
        std::string::npos);
  CHECK_FALSE(w.add("e", DType::f32, {0, 6}, a).ok());
  CHECK_FALSE(w.add("f", DType::f8_e4m3, {6}, a).ok());
  fs::path file = temp_dir("_writer.safetensors");
  REQUIRE(w.write(file.string()).ok());
  Parsed p = parse_safetensors(file);
  CHECK(p.header["__metadata__"]["format"] == "pt");
  CHECK(p.header["a"]["dtype"] == "F32");
  CHECK(p.header["a"]["shape"] == json::array({2, 3}));
  CHECK(p.header["a"]["data_offsets"] == json::array({0, 24}));
  CHECK(p.header["b"]["data_offsets"] == json::array({24, 28}));
  CHECK(p.header["c"]["dtype"] == "F16");
  float third;
  std::memcpy(&third, p.bytes.data() + p.data_start + 8, 4);
  CHECK(third == 3.0f);
  CHECK(static_cast<unsigned char>(p.bytes[p.data_start + 24]) == 0x80);  // bf16 1.0 = 0x3f80
  CHECK(static_cast<unsigned char>(p.bytes[p.data_start + 25]) == 0x3f);
  fs::remove(file);
  CHECK(w.write("/nonexistent-dir/x.safetensors").error().kind == tandem::ErrorKind::failed);
}

TEST_CASE("synth llama: names, shapes, config and tokenizer agree") {
  tandem::tools::SynthOptions o;  // 2 layers, hidden 64, 4 heads, 2 kv heads, 16 dim, ffn 128
  fs::path dir = temp_dir("_llama");
  REQUIRE(tandem::tools::synth_model(o, dir.string()).ok());
  Parsed p = parse_safetensors(dir / "model.safetensors");
  std::map<std::string, std::vector<uint64_t>> want = {
      {"model.embed_tokens.weight", {512, 64}}, {"model.norm.weight", {64}},
      {"lm_head.weight", {512, 64}}};
  for (int l = 0; l < 2; ++l) {
    std::string x = "model.layers." + std::to_string(l) + ".";
    want[x + "input_layernorm.weight"] = {64};
    want[x + "post_attention_layernorm.weight"] = {64};
    want[x + "self_attn.q_proj.weight"] = {64, 64};
    want[x + "self_attn.k_proj.weight"] = {32, 64};
    want[x + "self_attn.v_proj.weight"] = {32, 64};
    want[x + "self_attn.o_proj.weight"] = {64, 64};
    want[x + "mlp.gate_proj.weight"] = {128, 64};
    want[x + "mlp.up_proj.weight"] = {128, 64};
    want[x + "mlp.down_proj.weight"] = {64, 128};
  }
  CHECK(p.header.size() == want.size() + 1);  // + __metadata__
  for (auto& entry : want) {
    const std::string& name = entry.first;  // clang 14: no structured binding in the lambda
    const auto& shape = entry.second;
    REQUIRE_MESSAGE(p.header.contains(name), name);
    CHECK(p.header[name]["shape"].get<std::vector<uint64_t>>() == shape);
    CHECK(p.header[name]["dtype"] == "F32");
  }
  json config = json::parse(slurp(dir / "config.json"));
  CHECK(config["model_type"] == "llama");
  CHECK(config["architectures"][0] == "LlamaForCausalLM");
  CHECK(config["num_key_value_heads"] == 2);
  CHECK(config["rms_norm_eps"] == 1e-5);
  json tok = json::parse(slurp(dir / "tokenizer.json"));
  const json& vocab = tok["model"]["vocab"];
  CHECK(tok["model"]["type"] == "BPE");
  CHECK(vocab.size() == 512);
  std::set<int> ids;
  for (auto& [text, id] : vocab.items()) ids.insert(id.get<int>());
  CHECK(ids.size() == 512);
  CHECK(*ids.rbegin() == 511);
  CHECK(tok["model"]["merges"].size() > 100);
  for (const auto& m : tok["model"]["merges"]) {
    std::string s = m, a = s.substr(0, s.find(' ')), b = s.substr(s.find(' ') + 1);
    CHECK_MESSAGE((vocab.contains(a) && vocab.contains(b) && vocab.contains(a + b)), s);
  }
  CHECK(vocab["</s>"] == config["eos_token_id"]);
  CHECK(vocab["<s>"] == config["bos_token_id"]);
  CHECK(vocab["\xc4\xa0"] == 32);  // "Ġ" is the byte ' '
  json tc = json::parse(slurp(dir / "tokenizer_config.json"));
  CHECK(tc["eos_token"] == "</s>");
  fs::remove_all(dir);
}

TEST_CASE("synth minimax-m2: MoE, QK-norm and router bias tensors; bf16") {
  fs::path dir = temp_dir("_mm");
  REQUIRE(run_tandem("--arch minimax-m2 --out " + dir.string() +
                     " --layers 1 --experts 3 --experts-per-token 2 --dtype bf16 --vocab 300") ==
          0);
  Parsed p = parse_safetensors(dir / "model.safetensors");
  std::string x = "model.layers.0.";
  CHECK(p.header[x + "block_sparse_moe.gate.weight"]["shape"] == json::array({3, 64}));
  CHECK(p.header[x + "block_sparse_moe.e_score_correction_bias"]["shape"] == json::array({3}));
  CHECK(p.header[x + "block_sparse_moe.experts.2.w1.weight"]["shape"] == json::array({32, 64}));
  CHECK(p.header[x + "block_sparse_moe.experts.2.w2.weight"]["shape"] == json::array({64, 32}));
  CHECK(p.header[x + "block_sparse_moe.experts.0.w3.weight"]["shape"] == json::array({32, 64}));
  CHECK(p.header[x + "self_attn.q_norm.weight"]["shape"] == json::array({64}));
  CHECK(p.header[x + "self_attn.k_norm.weight"]["shape"] == json::array({32}));
  CHECK_FALSE(p.header.contains(x + "block_sparse_moe.experts.3.w1.weight"));
  CHECK_FALSE(p.header.contains(x + "mlp.gate_proj.weight"));
  CHECK(p.header["lm_head.weight"]["dtype"] == "BF16");
  json config = json::parse(slurp(dir / "config.json"));
  CHECK(config["model_type"] == "minimax_m2");
  CHECK(config["num_local_experts"] == 3);
  CHECK(config["num_experts_per_tok"] == 2);
  CHECK(config["rotary_dim"] == 8);
  CHECK(config["use_qk_norm"] == true);
  json tok = json::parse(slurp(dir / "tokenizer.json"));
  CHECK(tok["model"]["vocab"].size() == 300);
  CHECK(tok["model"]["vocab"]["[e~["] == config["eos_token_id"]);
  CHECK(tok["model"]["vocab"]["]~!b["] == config["bos_token_id"]);
  fs::remove_all(dir);
}

TEST_CASE("synth is deterministic for a seed and differs across seeds") {
  fs::path a = temp_dir("_a"), b = temp_dir("_b"), c = temp_dir("_c");
  REQUIRE(run_tandem("--arch llama --seed 5 --out " + a.string()) == 0);
  REQUIRE(run_tandem("--arch llama --seed 5 --out " + b.string()) == 0);
  REQUIRE(run_tandem("--arch llama --seed 6 --out " + c.string()) == 0);
  for (const char* f : {"model.safetensors", "config.json", "tokenizer.json",
                        "tokenizer_config.json"}) {
    CHECK_MESSAGE(slurp(a / f) == slurp(b / f), f);
  }
  CHECK(slurp(a / "model.safetensors") != slurp(c / "model.safetensors"));
  CHECK(slurp(a / "config.json") == slurp(c / "config.json"));
  for (auto& d : {a, b, c}) fs::remove_all(d);
}

TEST_CASE("bad flags exit 2 with a message naming the flag") {
  fs::path out = temp_dir("_bad");
  std::string err;
  CHECK(run_tandem("--arch gpt2 --out " + out.string(), &err) == 2);
  CHECK(err.find("--arch") != std::string::npos);
  CHECK(run_tandem("--arch llama", &err) == 2);
  CHECK(err.find("--out") != std::string::npos);
  CHECK(run_tandem("--arch llama --heads 6 --kv-heads 4 --out " + out.string(), &err) == 2);
  CHECK(err.find("--kv-heads") != std::string::npos);
  CHECK(run_tandem("--arch llama --layers x --out " + out.string(), &err) == 2);
  CHECK(err.find("--layers") != std::string::npos);
  CHECK(run_tandem("--arch minimax-m2 --experts 2 --experts-per-token 3 --out " + out.string(),
                   &err) == 2);
  CHECK(err.find("--experts-per-token") != std::string::npos);
  CHECK(run_tandem("--arch llama --vocab 100 --out " + out.string(), &err) == 2);
  CHECK(err.find("--vocab") != std::string::npos);
  CHECK(run_tandem("--arch llama --dtype f64 --out " + out.string(), &err) == 2);
  CHECK(run_tandem("--arch llama --rotary-dim 7 --out " + out.string(), &err) == 2);
  CHECK(run_tandem("--arch llama --bogus 1 --out " + out.string(), &err) == 2);
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("--shards N writes HF's sharded layout; bad values exit 2 naming --shards") {
  fs::path dir = temp_dir("_shards");
  REQUIRE(run_tandem("--arch llama --shards 3 --out " + dir.string()) == 0);
  CHECK_FALSE(fs::exists(dir / "model.safetensors"));
  json index = json::parse(slurp(dir / "model.safetensors.index.json"));
  uint64_t data_bytes = 0;
  size_t tensors = 0;
  for (const char* f : {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                        "model-00003-of-00003.safetensors"}) {
    Parsed p = parse_safetensors(dir / f);
    data_bytes += p.bytes.size() - p.data_start;
    for (auto& [name, e] : p.header.items()) {
      if (name == "__metadata__") continue;
      CHECK(index["weight_map"][name] == f);
      ++tensors;
    }
  }
  CHECK(index["weight_map"].size() == tensors);
  CHECK(tensors == 21u);  // 2 layers x 9 + embed, norm, lm_head
  CHECK(index["metadata"]["total_size"].get<uint64_t>() == data_bytes);
  fs::path bad = temp_dir("_bad_shards");
  std::string err;
  for (const char* n : {"0", "22", "-1"}) {
    CAPTURE(n);
    CHECK(run_tandem(std::string("--arch llama --shards ") + n + " --out " + bad.string(),
                     &err) == 2);
    CHECK(err.find("--shards") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(bad));
}
