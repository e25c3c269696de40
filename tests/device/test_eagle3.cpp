// EAGLE-3 on the cpu device (issue 14): the draft head's forward against an independent
// reference written here (double precision, dense, unpaged; the target's states from the test
// reference transformer), through the device's whole path: the target's decode pass keeps
// three layers' inputs, Device::draft feeds the emitted positions and drafts on the head's own
// state and KV, rejected positions are overwritten, forget restarts a context. Loader errors
// name what is wrong. Weights are synthesized (tandem model synth --arch eagle3).
#include <doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "devices/cpu/cpu_device.hpp"
#include "devices/cpu/eagle3.hpp"
#include "devices/cpu/weights.hpp"
#include "devices/safetensors_writer.hpp"
#include "tests/device/model_files.hpp"
#include "tests/support/process.hpp"
#include "tools/model_synth.hpp"

using namespace tandem;

namespace {

using Tokens = std::vector<int32_t>;
using Vec = std::vector<double>;

// The head, as the EAGLE-3 paper and its checkpoints define it, one row at a time.
struct RefHead {
  reftest::Tensors t;
  const std::vector<float>* embed = nullptr;  // the target's [vocab, hidden]
  uint32_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0, draft_vocab = 0;
  double eps = 1e-5, theta = 10000.0;
  std::map<uint32_t, Vec> k, v;  // position -> kv row; positions from `base`
  uint32_t base = 0;

  const std::vector<float>& at(const std::string& name) const {
    auto it = t.find(name);
    REQUIRE_MESSAGE(it != t.end(), name);
    return it->second;
  }
  static Vec matvec(const std::vector<float>& w, const Vec& x, size_t out) {
    Vec y(out, 0.0);
    for (size_t o = 0; o < out; ++o) {
      for (size_t i = 0; i < x.size(); ++i) y[o] += double(w[o * x.size() + i]) * x[i];
    }
    return y;
  }
  Vec norm(const Vec& x, const std::vector<float>& w) const {
    double ss = 0;
    for (double e : x) ss += e * e;
    double scale = 1.0 / std::sqrt(ss / double(x.size()) + eps);
    Vec y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = double(w[i]) * x[i] * scale;
    return y;
  }
  void rope(Vec& x, uint32_t count, uint32_t pos) const {  // HF rotate_half
    uint32_t half = head_dim / 2;
    for (uint32_t h = 0; h < count; ++h) {
      for (uint32_t j = 0; j < half; ++j) {
        double a = pos / std::pow(theta, 2.0 * j / head_dim);
        double x0 = x[h * head_dim + j], x1 = x[h * head_dim + j + half];
        x[h * head_dim + j] = x0 * std::cos(a) - x1 * std::sin(a);
        x[h * head_dim + j + half] = x0 * std::sin(a) + x1 * std::cos(a);
      }
    }
  }
  // `state`: 3 x target hidden (fused) or hidden (the head's own). Returns (logits, prenorm).
  std::pair<Vec, Vec> row(int32_t token, uint32_t pos, const Vec& state) {
    Vec h = state.size() == 3 * size_t{hidden} ? matvec(at("fc.weight"), state, hidden) : state;
    Vec e(embed->begin() + long(token) * hidden, embed->begin() + long(token + 1) * hidden);
    Vec x = norm(e, at("midlayer.input_layernorm.weight"));
    Vec hn = norm(h, at("midlayer.hidden_norm.weight"));
    x.insert(x.end(), hn.begin(), hn.end());
    Vec q = matvec(at("midlayer.self_attn.q_proj.weight"), x, heads * head_dim);
    Vec kr = matvec(at("midlayer.self_attn.k_proj.weight"), x, kv_heads * head_dim);
    Vec vr = matvec(at("midlayer.self_attn.v_proj.weight"), x, kv_heads * head_dim);
    rope(q, heads, pos);
    rope(kr, kv_heads, pos);
    for (auto it = k.lower_bound(pos); it != k.end();) it = k.erase(it);  // rewritten from pos
    for (auto it = v.lower_bound(pos); it != v.end();) it = v.erase(it);
    k[pos] = kr;
    v[pos] = vr;
    Vec att(heads * head_dim, 0.0);
    for (uint32_t hd = 0; hd < heads; ++hd) {
      uint32_t g = hd / (heads / kv_heads);
      std::vector<double> s;
      for (uint32_t j = base; j <= pos; ++j) {
        double d = 0;
        for (uint32_t i = 0; i < head_dim; ++i) d += q[hd * head_dim + i] * k.at(j)[g * head_dim + i];
        s.push_back(d / std::sqrt(double(head_dim)));
      }
      double mx = *std::max_element(s.begin(), s.end()), sum = 0;
      for (double& x2 : s) sum += (x2 = std::exp(x2 - mx));
      for (uint32_t j = base; j <= pos; ++j) {
        for (uint32_t i = 0; i < head_dim; ++i) {
          att[hd * head_dim + i] += s[j - base] / sum * v.at(j)[g * head_dim + i];
        }
      }
    }
    Vec r = matvec(at("midlayer.self_attn.o_proj.weight"), att, hidden);
    for (uint32_t i = 0; i < hidden; ++i) r[i] += h[i];
    Vec rn = norm(r, at("midlayer.post_attention_layernorm.weight"));
    Vec g = matvec(at("midlayer.mlp.gate_proj.weight"), rn, ffn);
    Vec u = matvec(at("midlayer.mlp.up_proj.weight"), rn, ffn);
    for (uint32_t i = 0; i < ffn; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    Vec m = matvec(at("midlayer.mlp.down_proj.weight"), g, hidden);
    for (uint32_t i = 0; i < hidden; ++i) r[i] += m[i];
    Vec logits = matvec(at("lm_head.weight"), norm(r, at("norm.weight")), draft_vocab);
    return {logits, r};
  }
  int32_t to_target(const Vec& logits) const {  // d2t as synthesized: floor(i * V / D)
    auto best = uint64_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    return int32_t(best * vocab / draft_vocab);
  }
  // The reference of Device::draft: rows for the emitted positions, then drafting.
  Tokens draft(uint32_t start, const std::vector<Vec>& states, const Tokens& emitted,
               uint32_t count) {
    std::pair<Vec, Vec> out;
    for (size_t i = 0; i < emitted.size(); ++i) {
      out = row(emitted[i], start + uint32_t(i), states[i]);
    }
    Tokens drafts{to_target(out.first)};
    uint32_t pos = start + uint32_t(emitted.size());
    while (drafts.size() < count) {
      out = row(drafts.back(), pos++, out.second);
      drafts.push_back(to_target(out.first));
    }
    return drafts;
  }
};

struct Models {
  std::string target_dir, head_dir;
  devices::ModelConfig config;
  reftest::RefModel target;
  RefHead head;

  Models() {
    target_dir = testing::make_temp_dir("eagle3-target");
    head_dir = testing::make_temp_dir("eagle3-head");
    tools::SynthOptions o;
    o.vocab = 300;
    o.layers = 8;
    o.seed = 11;
    REQUIRE(tools::synth_model(o, target_dir).ok());
    config = *tools::synth_config(o);
    tools::Eagle3SynthOptions e;
    e.draft_vocab = 120;
    e.seed = 5;
    REQUIRE(tools::synth_eagle3(config, e, head_dir).ok());
    target.c = config;
    REQUIRE(reftest::read_safetensors_f32(target_dir + "/model.safetensors", &target.t));
    REQUIRE(reftest::read_safetensors_f32(head_dir + "/model.safetensors", &head.t, true));
    head.embed = &target.t.at("model.embed_tokens.weight");
    head.hidden = config.hidden;
    head.heads = config.heads;
    head.kv_heads = config.kv_heads;
    head.head_dim = config.head_dim;
    head.ffn = 2 * config.hidden;
    head.vocab = config.vocab_size;
    head.draft_vocab = 120;
    head.eps = config.rms_eps;
    head.theta = config.rope_theta;
  }
  ~Models() {
    std::filesystem::remove_all(target_dir);
    std::filesystem::remove_all(head_dir);
  }
  // The reference target's states for one token: the inputs of layers (2, L/2, L-3) =
  // (2, 4, 5) for L = 8, the default when a checkpoint names none.
  Vec states_after_step(int32_t token, uint32_t pos) {
    target.step(token, pos);
    uint32_t l = config.layers;
    uint32_t ids[3] = {2, l / 2, l - 3};
    Vec s;
    for (uint32_t id : ids) {
      s.insert(s.end(), target.layer_inputs[id].begin(), target.layer_inputs[id].end());
    }
    return s;
  }
};

std::unique_ptr<devices::Device> device_with_head(const Models& m) {
  auto weights = devices::cpu::load_model(m.target_dir);
  REQUIRE(weights.ok());
  devices::cpu::CpuDeviceOptions options;
  options.blocks_total = 8;
  options.threads = 1;
  options.draft_model_path = m.head_dir;
  auto made = devices::cpu::make_cpu_device(std::move(*weights), options);
  REQUIRE_MESSAGE(made.ok(), (made.ok() ? "" : made.error().describe()));
  return std::move(made).value();
}

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream(path) << j.dump(2);
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("EAGLE-3: the head's forward equals the reference; the device keeps the target's "
          "states and drafts from them") {
  Models m;
  auto device = device_with_head(m);
  REQUIRE(device->has_draft_model());
  const std::vector<uint32_t> table{0, 1};
  Tokens prompt{5, 77, 120, 9, 200, 31, 64};
  REQUIRE(device->prefill(std::vector<devices::PrefillSeq>{{1, table, 0, prompt, {}}}).ok());
  for (uint32_t p = 0; p < prompt.size(); ++p) m.target.step(prompt[p], p);
  const uint32_t start = uint32_t(prompt.size());

  // A verification pass of {last, d1, d2} at positions 7..9; the step accepted d1 (17) and
  // the target then gave 55, so 2 tokens were emitted.
  Tokens pass{42, 17, 99};
  REQUIRE(device->decode(std::vector<devices::DecodeSeq>{{1, table, start, pass}}).ok());
  std::vector<Vec> states;
  for (uint32_t i = 0; i < pass.size(); ++i) states.push_back(m.states_after_step(pass[i], start + i));
  m.head.base = start;
  Tokens want = m.head.draft(start, states, {17, 55}, 3);
  auto got = device->draft(std::vector<devices::DraftSeq>{{1, {17, 55}, 3}}, {});
  REQUIRE_MESSAGE(got.ok(), (got.ok() ? "" : got.error().describe()));
  REQUIRE(got->size() == 1);
  CHECK((*got)[0].seq_id == 1);
  CHECK((*got)[0].tokens == want);

  // The next pass starts at 9 (token 55); all its drafts are rejected: one token (201)
  // emitted. The head's KV at 9.. is rewritten; 7 and 8 stay.
  Tokens pass2{55, want[0], want[1]};
  REQUIRE(device->decode(std::vector<devices::DecodeSeq>{{1, table, start + 2, pass2}}).ok());
  std::vector<Vec> states2;
  for (uint32_t i = 0; i < pass2.size(); ++i) {
    states2.push_back(m.states_after_step(pass2[i], start + 2 + i));
  }
  Tokens want2 = m.head.draft(start + 2, states2, {201}, 4);
  auto got2 = device->draft(std::vector<devices::DraftSeq>{{1, {201}, 4}}, {});
  REQUIRE(got2.ok());
  CHECK((*got2)[0].tokens == want2);

  // Forgotten, the sequence's next draft starts a context at its pass's first position.
  auto forgot = device->draft({}, std::vector<uint64_t>{1});
  REQUIRE(forgot.ok());
  CHECK(forgot->empty());
  RefHead fresh = m.head;
  fresh.k.clear();
  fresh.v.clear();
  fresh.base = start + 2;
  Tokens want3 = fresh.draft(start + 2, states2, {201}, 2);
  auto got3 = device->draft(std::vector<devices::DraftSeq>{{1, {201}, 2}}, {});
  REQUIRE(got3.ok());
  CHECK((*got3)[0].tokens == want3);
  // The head's context matters: with the history the drafts may differ from without it, but
  // both follow their own reference exactly (checked above).
}

TEST_CASE("EAGLE-3: the head's logits and pre-norm state match the reference within fp32") {
  Models m;
  auto target = devices::cpu::load_model(m.target_dir);
  REQUIRE(target.ok());
  auto weights = devices::cpu::load_eagle3_dir(m.head_dir, target->config);
  REQUIRE_MESSAGE(weights.ok(), (weights.ok() ? "" : weights.error().describe()));
  CHECK(weights->config.draft_vocab == 120);
  CHECK(weights->config.aux_layers == std::array<uint32_t, 3>{2, 4, 5});
  CHECK(weights->draft_to_target[119] == int32_t(119 * 300 / 120));
  devices::cpu::Eagle3Head head(std::move(*weights), target->embed, 4);
  // Two rows from target-like states, then one on the head's own state, in separate passes,
  // and two sequences in one pass.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto random_state = [&](size_t n) {
    std::vector<float> s(n);
    for (auto& x : s) x = u(rng);
    return s;
  };
  uint32_t h = m.config.hidden;
  auto s0 = random_state(3 * h), s1 = random_state(3 * h), s2 = random_state(3 * h);
  std::vector<devices::cpu::Eagle3Head::Row> rows{
      {1, 4, 10, s0.data(), true}, {1, 5, 11, s1.data(), true}, {2, 0, 12, s2.data(), true}};
  std::vector<float> logits, prenorm;
  REQUIRE(head.forward(rows, logits, prenorm).ok());
  RefHead r1 = m.head, r2 = m.head;
  r1.base = 4;
  r2.base = 0;
  auto close = [](const std::vector<float>& got, size_t off, const Vec& want) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::abs(double(got[off + i]) - want[i]));
      scale = std::max(scale, std::abs(want[i]));
    }
    return worst <= 1e-4 * std::max(1.0, scale);
  };
  auto a = r1.row(10, 4, Vec(s0.begin(), s0.end()));
  auto b = r1.row(11, 5, Vec(s1.begin(), s1.end()));
  auto c = r2.row(12, 0, Vec(s2.begin(), s2.end()));
  CHECK(close(logits, 0, a.first));
  CHECK(close(logits, 120, b.first));
  CHECK(close(logits, 240, c.first));
  CHECK(close(prenorm, 0, a.second));
  CHECK(close(prenorm, h, b.second));
  std::vector<float> own(prenorm.begin() + h, prenorm.begin() + 2 * h);
  std::vector<devices::cpu::Eagle3Head::Row> next{{1, 6, 13, own.data(), false}};
  REQUIRE(head.forward(next, logits, prenorm).ok());
  auto d = r1.row(13, 6, b.second);
  CHECK(close(logits, 0, d.first));
  CHECK(head.contexts_count() == 2);

  SUBCASE("rows out of order, bad tokens and positions are errors naming them") {
    std::vector<devices::cpu::Eagle3Head::Row> gap{{1, 7, 1, own.data(), false},
                                                   {1, 9, 1, own.data(), false}};
    auto st = head.forward(gap, logits, prenorm);
    REQUIRE(!st.ok());
    CHECK(st.error().message.find("position 9 follows 7") != std::string::npos);
    std::vector<devices::cpu::Eagle3Head::Row> bad{{1, 7, 300, own.data(), false}};
    st = head.forward(bad, logits, prenorm);
    REQUIRE(!st.ok());
    CHECK(st.error().message.find("token 300") != std::string::npos);
    bad[0] = {1, 256, 1, own.data(), false};
    st = head.forward(bad, logits, prenorm);
    REQUIRE(!st.ok());
    CHECK(st.error().message.find("max_position") != std::string::npos);
  }
  SUBCASE("the contexts are bounded: the least recently used goes") {
    for (uint64_t seq = 10; seq < 20; ++seq) {
      std::vector<devices::cpu::Eagle3Head::Row> one{{seq, 0, 1, own.data(), false}};
      REQUIRE(head.forward(one, logits, prenorm).ok());
      CHECK(head.contexts_count() <= 4);
    }
    CHECK(head.contexts_count() == 4);
  }
}

TEST_CASE("EAGLE-3: Device::draft refuses what it cannot draft, and nothing is drafted") {
  Models m;
  auto device = device_with_head(m);
  const std::vector<uint32_t> table{0, 1};
  REQUIRE(device->prefill(std::vector<devices::PrefillSeq>{{1, table, 0, {5, 6, 7}, {}}}).ok());
  REQUIRE(device->decode(std::vector<devices::DecodeSeq>{{1, table, 3, {8, 9}}}).ok());
  auto expect_invalid = [&](std::vector<devices::DraftSeq> batch, const std::string& text) {
    auto r = device->draft(batch, {});
    REQUIRE(!r.ok());
    CHECK(r.error().kind == ErrorKind::invalid);
    CHECK_MESSAGE(r.error().message.find(text) != std::string::npos, r.error().message);
  };
  expect_invalid({{2, {4}, 1}}, "was not in the last decode pass");
  expect_invalid({{1, {4, 5, 6}, 1}}, "3 emitted tokens for a pass of 2 rows");
  expect_invalid({{1, {}, 1}}, "0 emitted tokens");
  expect_invalid({{1, {4}, 0}}, "0 draft tokens wanted");
  expect_invalid({{1, {400}, 1}}, "token 400");

  SUBCASE("a device without a draft model refuses draft()") {
    auto plain = devices::cpu::load_model(m.target_dir);
    REQUIRE(plain.ok());
    devices::cpu::CpuDeviceOptions options;
    options.blocks_total = 4;
    auto made = devices::cpu::make_cpu_device(std::move(*plain), options);
    REQUIRE(made.ok());
    CHECK(!(*made)->has_draft_model());
    auto r = (*made)->draft(std::vector<devices::DraftSeq>{{1, {4}, 1}}, {});
    REQUIRE(!r.ok());
    CHECK(r.error().kind == ErrorKind::unimplemented);
  }
  SUBCASE("the sim device refuses a draft model") {
    devices::DeviceSpec spec;
    spec.kind = config::DeviceKind::sim;
    spec.blocks_total = 4;
    spec.draft_model_path = m.head_dir;
    auto made = devices::make_device(spec);
    REQUIRE(!made.ok());
    CHECK(made.error().kind == ErrorKind::unimplemented);
    CHECK(made.error().message.find("draft model") != std::string::npos);
  }
}

TEST_CASE("EAGLE-3: a head that does not fit its target is refused, naming file and key") {
  Models m;
  auto target = devices::cpu::load_model(m.target_dir);
  REQUIRE(target.ok());
  std::string cfg = m.head_dir + "/config.json";
  const nlohmann::json original = read_json(cfg);
  auto load_error = [&](nlohmann::json j) {
    write_json(cfg, j);
    auto r = devices::cpu::load_eagle3_dir(m.head_dir, target->config);
    write_json(cfg, original);
    REQUIRE(!r.ok());
    return r.error();
  };
  {
    auto j = original;
    j["vocab_size"] = 320;
    auto e = load_error(j);
    CHECK(e.kind == ErrorKind::invalid);
    CHECK(e.message.find("config.json: vocab_size is 320, the target's is 300") !=
          std::string::npos);
  }
  {
    auto j = original;
    j["num_hidden_layers"] = 2;
    CHECK(load_error(j).kind == ErrorKind::unimplemented);
  }
  {
    auto j = original;
    j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {0, 1, 8};
    auto e = load_error(j);
    CHECK(e.message.find("eagle_aux_hidden_state_layer_ids[2] must be a layer id in [0, 8)") !=
          std::string::npos);
  }
  {
    auto j = original;
    j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {0, 1, 3};
    write_json(cfg, j);
    auto r = devices::cpu::load_eagle3_dir(m.head_dir, target->config);
    write_json(cfg, original);
    REQUIRE(r.ok());
    CHECK(r->config.aux_layers == std::array<uint32_t, 3>{0, 1, 3});
  }
  {
    auto j = original;
    j["draft_vocab_size"] = 100;  // lm_head has 120 rows
    auto e = load_error(j);
    CHECK_MESSAGE(e.message.find("'lm_head.weight' has shape [120, 64], expected [100, 64]") !=
                      std::string::npos,
                  e.message);
  }
  // A d2t entry that maps outside the vocabulary (patched in the file).
  {
    std::string file = m.head_dir + "/model.safetensors";
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header_bytes = 0;
    f.read(reinterpret_cast<char*>(&header_bytes), 8);
    std::string header(header_bytes, '\0');
    f.read(header.data(), std::streamsize(header_bytes));
    auto h = nlohmann::json::parse(header);
    REQUIRE(h["d2t"]["dtype"] == "I64");
    uint64_t begin = h["d2t"]["data_offsets"][0];
    int64_t bad = 500;
    f.seekp(std::streamoff(8 + header_bytes + begin + 7 * 8));
    f.write(reinterpret_cast<const char*>(&bad), 8);
    f.close();
    auto r = devices::cpu::load_eagle3_dir(m.head_dir, target->config);
    REQUIRE(!r.ok());
    CHECK_MESSAGE(r.error().message.find("d2t[7] = 500 maps draft id 7 to 507, outside the "
                                         "vocabulary [0, 300)") != std::string::npos,
                  r.error().message);
  }
}
