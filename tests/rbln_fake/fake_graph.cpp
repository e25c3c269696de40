#include "tests/rbln_fake/fake_graph.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>

#include "devices/cpu/cpu_device.hpp"

namespace tandem::rbln_fake {
namespace {

namespace fs = std::filesystem;

// One compiled directory's model: the cpu device (weights and a scratch KV pool of the
// artifact's block count) and the shapes the graphs were "compiled" for.
struct FakeModel {
  std::mutex mu;  // one run at a time (the cpu device is not thread-safe)
  std::unique_ptr<devices::Device> cpu;
  uint32_t block_tokens = 0, table_blocks = 0, chunk = 0, vocab = 0, kv_blocks = 0, hidden = 0;
  std::vector<uint32_t> stage_layers;  // pipeline_parallel_size > 1: layers per stage
  uint32_t verify_tokens = 0;          // verify_batch_N graphs: tokens per row
  std::string fail_graph, hang_graph;
  std::string hang_once_file;  // set: hang_graph hangs only while this file does not exist
  uint32_t run_delay_ms = 0;  // every run waits this long before it computes
  // Data parallel (ranks > 1): the collective rounds (fake_graph.hpp).
  uint32_t ranks = 1;
  std::mutex rounds_mu;
  std::condition_variable rounds_cv;
  std::map<int, uint64_t> submitted;  // per device: runs submitted so far
  struct Round {
    std::vector<std::pair<int, std::string>> joined;  // (device, graph), in arrival order
    uint32_t done = 0;                                // runs that left it
  };
  std::map<uint64_t, Round> rounds;  // bounded: a round is erased when its last run leaves
};

std::mutex models_mu;
std::map<std::string, std::weak_ptr<FakeModel>> models;  // by directory

std::shared_ptr<FakeModel> load(const std::string& dir, std::string& error) {
  std::lock_guard lock(models_mu);
  if (auto m = models[dir].lock()) return m;
  std::ifstream in(dir + "/rbln_config.json");
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (!in || j.is_discarded() || !j.is_object() ||
      !(j.contains("fake_model_path") || j.contains("source_model_path"))) {
    error = dir +
            "/rbln_config.json: missing, not JSON, or without fake_model_path or "
            "source_model_path";
    return nullptr;
  }
  auto m = std::make_shared<FakeModel>();
  m->block_tokens = j.value("kvcache_block_size", 0u);
  m->kv_blocks = j.value("kvcache_num_blocks", 0u);
  m->chunk = j.value("prefill_chunk_size", 0u);
  uint32_t max_len = j.value("max_seq_len", 0u);
  m->fail_graph = j.value("fake_fail_graph", std::string());
  m->hang_graph = j.value("fake_hang_graph", std::string());
  m->hang_once_file = j.value("fake_hang_once_file", std::string());
  m->run_delay_ms = j.value("fake_run_delay_ms", 0u);
  m->verify_tokens = j.value("verify_tokens", 0u);
  m->ranks = std::max(1u, j.value("data_parallel_size", 1u));
  // A runtime slow to load its graphs (the first graph of the directory waits this long).
  if (auto delay = j.value("fake_load_delay_ms", 0u); delay > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay));
  }
  if (m->block_tokens == 0 || m->kv_blocks == 0 || m->chunk == 0 || max_len == 0 ||
      j.value("kv_element_bytes", 2u) != 4) {
    error = dir +
            "/rbln_config.json: the fake needs kvcache_block_size, kvcache_num_blocks, "
            "prefill_chunk_size, max_seq_len and kv_element_bytes 4 (fp32, the cpu pool's)";
    return nullptr;
  }
  m->table_blocks = max_len / m->block_tokens;
  devices::DeviceSpec spec;
  spec.kind = config::DeviceKind::cpu;
  spec.model_path = j.value("fake_model_path", j.value("source_model_path", std::string()));
  spec.block_tokens = m->block_tokens;
  spec.blocks_total = m->kv_blocks;
  spec.threads = 1;
  auto cpu = devices::cpu::make_cpu_device(spec);
  if (!cpu.ok()) {
    error = "fake model " + spec.model_path + ": " + cpu.error().describe();
    return nullptr;
  }
  m->cpu = std::move(cpu).value();
  m->vocab = m->cpu->model_config().vocab_size;
  m->hidden = m->cpu->model_config().hidden;
  const uint32_t layers = m->cpu->model_config().layers;
  const uint32_t stages = j.value("pipeline_parallel_size", 1u);
  if (stages > 1) {
    m->stage_layers = j.value("pipeline_stage_layers", std::vector<uint32_t>());
    if (m->stage_layers.empty() && layers % stages == 0) {
      m->stage_layers.assign(stages, layers / stages);
    }
    uint32_t sum = 0;
    for (uint32_t l : m->stage_layers) sum += l;
    if (m->stage_layers.size() != stages || sum != layers) {
      error = dir + "/rbln_config.json: the pipeline stages do not split the model's layers";
      return nullptr;
    }
  }
  models[dir] = m;
  return m;
}

class Graph final : public FakeGraph {
 public:
  Graph(std::shared_ptr<FakeModel> model, std::string name, uint32_t bucket, int stage = -1,
        uint32_t per_row = 1)
      : m_(std::move(model)),
        name_(std::move(name)),
        bucket_(bucket),
        stage_(stage),
        per_row_(per_row) {}
  int inputs() const override { return bucket_ == 0 ? 5 : 4; }
  bool hangs() const override {
    if (m_->hang_graph != name_) return false;
    if (m_->hang_once_file.empty()) return true;
    // A fault that a new process clears: the first run to create the file hangs (in whichever
    // process), every later one runs.
    int fd = ::open(m_->hang_once_file.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd < 0) return false;
    ::close(fd);
    return true;
  }

  uint64_t submit(int device) override {
    if (m_->ranks < 2) return 0;
    std::lock_guard lock(m_->rounds_mu);
    return m_->submitted[device]++;
  }

  std::string run(const std::vector<void*>& in, void* logits, int device, uint64_t round,
                  const std::atomic<bool>& abandon) override {
    if (m_->fail_graph == name_) return name_ + ": the device failed the run (fake_fail_graph)";
    if (m_->ranks > 1) {
      if (std::string error = join(device, round, abandon); !error.empty()) return error;
    }
    // A stage's share of the delay is its share of the layers (a device computing fewer layers).
    const uint64_t layers = m_->cpu->model_config().layers;
    const uint64_t share = stage_ >= 0 ? m_->stage_layers[static_cast<size_t>(stage_)] : layers;
    std::this_thread::sleep_for(
        std::chrono::microseconds(m_->run_delay_ms * 1000 * share / layers));
    std::lock_guard lock(m_->mu);
    auto* kv = static_cast<std::byte*>(in.back());
    if (stage_ >= 0) return stage_run(in, kv, static_cast<float*>(logits));
    return bucket_ == 0 ? prefill(in, kv, static_cast<float*>(logits))
                        : decode(in, kv, static_cast<float*>(logits));
  }

 private:
  // Waits until the D ranks have joined `round` (the collective of an expert-parallel step);
  // "" when all ran this graph, else the error.
  std::string join(int device, uint64_t round, const std::atomic<bool>& abandon) {
    std::unique_lock lock(m_->rounds_mu);
    if (m_->submitted.size() > m_->ranks) {
      return name_ + ": device " + std::to_string(device) + " is the " +
             std::to_string(m_->submitted.size()) +
             "th device running this data-parallel directory's graphs in this process; "
             "data_parallel_size is " +
             std::to_string(m_->ranks) + " (the fake runs one instance per directory)";
    }
    FakeModel::Round& r = m_->rounds[round];
    r.joined.emplace_back(device, name_);
    m_->rounds_cv.notify_all();
    while (r.joined.size() < m_->ranks) {
      if (abandon) {
        if (++r.done == r.joined.size()) m_->rounds.erase(round);
        return name_ + ": abandoned waiting for the other ranks of round " + std::to_string(round) +
               " (the runtime was destroyed)";
      }
      m_->rounds_cv.wait_for(lock, std::chrono::milliseconds(20));
    }
    std::string error;
    for (const auto& [d, graph] : r.joined) {
      if (graph != name_) {
        error = name_ + ": collective mismatch in round " + std::to_string(round) + ":";
        for (const auto& [d2, g2] : r.joined)
          error += " device " + std::to_string(d2) + " ran " + g2 + ",";
        error.pop_back();
        break;
      }
    }
    if (++r.done == r.joined.size()) m_->rounds.erase(round);
    return error;
  }

  // The block ids a row's table names for positions [0, end).
  std::vector<uint32_t> table(const int32_t* row, uint32_t end) const {
    uint32_t n = std::min((end + m_->block_tokens - 1) / m_->block_tokens, m_->table_blocks);
    return {row, row + n};
  }
  bool bad(const std::vector<uint32_t>& blocks) const {
    return std::any_of(blocks.begin(), blocks.end(),
                       [&](uint32_t b) { return b >= m_->kv_blocks; });
  }
  // KV in: the device's (kv_cache) blocks into the cpu pool; out: the written ones back.
  void blocks_in(const std::set<uint32_t>& ids, const std::byte* kv) {
    const uint64_t bb = m_->cpu->kv_layout().block_bytes();
    std::byte* pool = m_->cpu->kv_region().base;
    for (uint32_t b : ids) std::memcpy(pool + b * bb, kv + b * bb, bb);
  }
  void blocks_out(const std::set<uint32_t>& ids, std::byte* kv) {
    const uint64_t bb = m_->cpu->kv_layout().block_bytes();
    const std::byte* pool = m_->cpu->kv_region().base;
    for (uint32_t b : ids) std::memcpy(kv + b * bb, pool + b * bb, bb);
  }

  std::string prefill(const std::vector<void*>& in, std::byte* kv, float* logits) {
    const auto* ids = static_cast<const int32_t*>(in[0]);
    const auto* pos = static_cast<const int32_t*>(in[1]);
    const auto* tables = static_cast<const int32_t*>(in[2]);
    const int32_t q = *static_cast<const int32_t*>(in[3]);
    if (q < 0 || static_cast<uint32_t>(q) >= m_->chunk || pos[0] < 0) {
      return "prefill: query_position " + std::to_string(q) + " or cache_position " +
             std::to_string(pos[0]) + " out of range";
    }
    devices::PrefillSeq s;
    s.start_pos = static_cast<uint32_t>(pos[0]);
    for (int32_t i = 0; i <= q; ++i) {
      if (pos[i] != pos[0] + i) return "prefill: cache_position is not consecutive";
      s.tokens.push_back(ids[i]);
    }
    s.block_table = table(tables, s.start_pos + static_cast<uint32_t>(s.tokens.size()));
    if (bad(s.block_table)) return "prefill: a block table entry is out of range";
    blocks_in({s.block_table.begin(), s.block_table.end()}, kv);
    auto out = m_->cpu->prefill(std::span<const devices::PrefillSeq>(&s, 1));
    if (!out.ok()) return "prefill: " + out.error().describe();
    std::set<uint32_t> written(s.block_table.begin() + s.start_pos / m_->block_tokens,
                               s.block_table.end());
    blocks_out(written, kv);
    std::memcpy(logits, out->seqs[0].logits.data(), sizeof(float) * m_->vocab);
    return "";
  }

  // A pipeline stage: its layers' KV is a block-major pool of those layers only (kv), moved
  // to and from the cpu pool (all layers) around the stage's layers' forward.
  std::string stage_run(const std::vector<void*>& in, std::byte* kv, float* out) {
    const auto stage = static_cast<uint32_t>(stage_);
    uint32_t first = 0;
    for (uint32_t s = 0; s < stage; ++s) first += m_->stage_layers[s];
    const uint32_t end = first + m_->stage_layers[stage];
    const auto* pos = static_cast<const int32_t*>(in[1]);
    const auto* tables = static_cast<const int32_t*>(in[2]);
    const int32_t q = *static_cast<const int32_t*>(in[3]);
    if (q < 0 || static_cast<uint32_t>(q) >= m_->chunk || pos[0] < 0) return name_ + ": bad query";
    devices::PrefillSeq s;
    s.start_pos = static_cast<uint32_t>(pos[0]);
    const auto* ids = static_cast<const int32_t*>(in[0]);
    for (int32_t i = 0; i <= q; ++i) {
      if (pos[i] != pos[0] + i) return name_ + ": cache_position is not consecutive";
      s.tokens.push_back(stage == 0 ? ids[i] : 0);  // later stages read the hidden input
    }
    s.block_table = table(tables, s.start_pos + static_cast<uint32_t>(s.tokens.size()));
    if (bad(s.block_table)) return name_ + ": a block table entry is out of range";
    const uint64_t part = m_->cpu->kv_layout().part_bytes();
    const uint64_t bb = m_->cpu->kv_layout().block_bytes(), sbb = (end - first) * 2 * part;
    std::byte* pool = m_->cpu->kv_region().base;
    for (uint32_t b : s.block_table)
      std::memcpy(pool + b * bb + first * 2 * part, kv + b * sbb, sbb);
    const auto n = static_cast<uint32_t>(s.tokens.size());
    std::span<const float> hidden;
    if (stage > 0) hidden = {static_cast<const float*>(in[0]), size_t{n} * m_->hidden};
    auto r = devices::cpu::run_stage(*m_->cpu, s, first, end, hidden);
    if (!r.ok()) return name_ + ": " + r.error().describe();
    for (size_t i = s.start_pos / m_->block_tokens; i < s.block_table.size(); ++i) {
      const uint32_t b = s.block_table[i];
      std::memcpy(kv + b * sbb, pool + b * bb + first * 2 * part, sbb);
    }
    const std::vector<float>& values = r->logits.empty() ? r->hidden : r->logits;
    std::memcpy(out, values.data(), sizeof(float) * values.size());
    return "";
  }

  // Decode (per_row_ 1) or verify (per_row_ T): row r's slots [r x T, r x T + T); the slots at
  // position >= 0 come first and are consecutive, each computed with its own logits row.
  std::string decode(const std::vector<void*>& in, std::byte* kv, float* logits) {
    const auto* ids = static_cast<const int32_t*>(in[0]);
    const auto* pos = static_cast<const int32_t*>(in[1]);
    const auto* tables = static_cast<const int32_t*>(in[2]);
    std::vector<devices::DecodeSeq> batch(bucket_);
    std::set<uint32_t> read, written;
    for (uint32_t r = 0; r < bucket_; ++r) {
      devices::DecodeSeq& s = batch[r];
      const int32_t* row_pos = pos + size_t{r} * per_row_;
      if (row_pos[0] < 0) return name_ + ": row " + std::to_string(r) + " has a negative position";
      s.seq_id = r;
      s.start_pos = static_cast<uint32_t>(row_pos[0]);
      for (uint32_t i = 0; i < per_row_ && row_pos[i] >= 0; ++i) {
        if (row_pos[i] != row_pos[0] + static_cast<int32_t>(i)) {
          return name_ + ": row " + std::to_string(r) + "'s positions are not consecutive";
        }
        s.tokens.push_back(ids[size_t{r} * per_row_ + i]);
      }
      for (uint32_t i = static_cast<uint32_t>(s.tokens.size()); i < per_row_; ++i) {
        if (row_pos[i] >= 0) {
          return name_ + ": row " + std::to_string(r) + " has a position after a padded slot";
        }
      }
      const auto end = static_cast<uint32_t>(s.start_pos + s.tokens.size());
      s.block_table = table(tables + size_t{r} * m_->table_blocks, end);
      if (bad(s.block_table)) return name_ + ": a block table entry is out of range";
      read.insert(s.block_table.begin(), s.block_table.end());
      for (uint32_t b = s.start_pos / m_->block_tokens; b < s.block_table.size(); ++b) {
        written.insert(s.block_table[b]);
      }
    }
    blocks_in(read, kv);
    auto out = m_->cpu->decode(batch);
    if (!out.ok()) return name_ + ": " + out.error().describe();
    blocks_out(written, kv);
    for (uint32_t r = 0; r < bucket_; ++r) {
      const auto& rows = out->seqs[r].logits;
      std::memcpy(logits + size_t{r} * per_row_ * m_->vocab, rows.data(),
                  sizeof(float) * rows.size());
    }
    return "";
  }

  std::shared_ptr<FakeModel> m_;
  std::string name_;
  uint32_t bucket_;  // 0: the prefill graph
  int stage_;        // >= 0: prefill_stage_N
  uint32_t per_row_;  // tokens per row: 1 (decoder_batch_N) or verify_tokens (verify_batch_N)
};

}  // namespace

std::shared_ptr<FakeGraph> open_fake_graph(const std::string& path, std::string& error) {
  fs::path p(path);
  std::string name = p.stem().string();
  uint32_t bucket = 0;
  const bool verify = name.rfind("verify_batch_", 0) == 0;
  if (name.rfind("decoder_batch_", 0) == 0 || verify) {
    std::string digits = name.substr(verify ? 13 : 14);
    if (digits.empty() || digits.size() > 4 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      error = path + ": no batch size in the graph's name";
      return nullptr;
    }
    bucket = static_cast<uint32_t>(std::stoul(digits));
    if (verify) {
      auto model = load(p.parent_path().string(), error);
      if (!model) return nullptr;
      if (model->verify_tokens < 2) {
        error = path + ": rbln_config.json has no verify_tokens (>= 2) for a verify graph";
        return nullptr;
      }
      const uint32_t per_row = model->verify_tokens;
      return std::make_shared<Graph>(std::move(model), name, bucket, -1, per_row);
    }
  } else if (name.rfind("prefill_stage_", 0) == 0 && name.size() == 15 && name[14] >= '0' &&
             name[14] <= '9') {
    auto model = load(p.parent_path().string(), error);
    if (!model) return nullptr;
    if (static_cast<size_t>(name[14] - '0') >= model->stage_layers.size()) {
      error = path + ": no such pipeline stage in rbln_config.json";
      return nullptr;
    }
    return std::make_shared<Graph>(std::move(model), name, 0, name[14] - '0');
  } else if (name != "prefill") {
    error = path +
            ": not a graph the fake knows (prefill.rbln, prefill_stage_N.rbln, "
            "decoder_batch_N.rbln, verify_batch_N.rbln)";
    return nullptr;
  }
  auto model = load(p.parent_path().string(), error);
  if (!model) return nullptr;
  return std::make_shared<Graph>(std::move(model), name, bucket);
}

}  // namespace tandem::rbln_fake
