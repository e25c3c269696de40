#include "devices/rbln/rbln_device.hpp"

#include <algorithm>
#include <cstring>
#include <map>

#include "devices/kv_segments.hpp"
#include "devices/rbln/rbln_api.hpp"
#include "devices/rbln/rbln_artifact.hpp"
#include "devices/rbln/rbln_compile.hpp"

namespace tandem::devices::rbln {
namespace {

constexpr int kPrefillInputs = 5;  // input_ids, cache_position, block_tables, query_position, kv
constexpr int kDecodeInputs = 4;   // input_ids, cache_position, block_tables, kv

class RblnDevice final : public Device {
 public:
  RblnDevice(std::shared_ptr<const RblnApi> api, RblnArtifact artifact, KvLayout layout,
             std::unique_ptr<PoolMemory> pool, RblnRuntime prefill,
             std::map<uint32_t, RblnRuntime> decode, std::chrono::milliseconds timeout,
             int device_id, void* device_kv, bool write_through)
      : api_(std::move(api)),
        art_(std::move(artifact)),
        layout_(layout),
        pool_(std::move(pool)),
        prefill_(std::move(prefill)),
        decode_(std::move(decode)),
        timeout_(timeout),
        device_id_(device_id),
        device_kv_(device_kv),
        write_through_(write_through) {
    model_ = art_.model;
    model_.max_position = art_.max_seq_len;
    dummy_ = layout_.blocks_total;  // the one block past what the executor allocates from
  }

  ~RblnDevice() override {
    if (device_kv_) (void)api_->free_device(device_id_, device_kv_);
  }
  RblnDevice(const RblnDevice&) = delete;
  RblnDevice& operator=(const RblnDevice&) = delete;

  const ModelConfig& model_config() const override { return model_; }
  const KvLayout& kv_layout() const override { return layout_; }
  MemoryRegion kv_region() override { return {pool_->base(), layout_.pool_bytes()}; }

  Result<StepOutput> prefill(std::span<const PrefillSeq> batch) override;
  Result<StepOutput> decode(std::span<const DecodeSeq> batch) override;
  Status copy_blocks_out(std::span<const uint32_t> blocks, std::span<std::byte> dst) override;
  Status copy_blocks_in(std::span<const uint32_t> blocks, std::span<const std::byte> src) override;
  std::string lost() const override {
    return poisoned_.empty() ? "" : "rbln " + poisoned_ + " (restart the node)";
  }

 private:
  // Submits one run and waits for it; a timeout poisons the device.
  Status run(RblnRuntime& runtime, const std::string& graph, std::vector<void*> inputs,
             void* logits);
  Status usable() const {
    if (poisoned_.empty()) return {};
    return make_error(ErrorKind::failed, "rbln device: " + poisoned_ +
                                             "; the runtime may still write its buffers, so "
                                             "this device takes no more runs (restart the node)");
  }
  // kv_memory = "device": copies `runs` of the pool between the device's KV and the host pool
  // (type 0 host to device, 1 device to host). A copy that fails poisons the device: the two
  // copies of some block now disagree, and which requests read it later is not known here.
  Status stage(int type, std::span<const KvRun> runs);
  // Before a pass: the blocks its sequences import, and the destinations of its block copies
  // (made in the host pool), copied in.
  template <typename Seq>
  Status stage_in(std::span<const Seq> batch);
  void* kv_input() const { return device_kv_ ? device_kv_ : static_cast<void*>(pool_->base()); }
  void fill_table(std::span<const uint32_t> table, int32_t* out) const {
    const uint32_t n = art_.table_blocks();
    for (uint32_t i = 0; i < n; ++i) {
      out[i] = static_cast<int32_t>(i < table.size() ? table[i] : dummy_);
    }
  }

  std::shared_ptr<const RblnApi> api_;
  RblnArtifact art_;
  ModelConfig model_;
  KvLayout layout_;
  std::unique_ptr<PoolMemory> pool_;  // layout_.blocks_total + 1 blocks: the last is the dummy
  RblnRuntime prefill_;
  std::map<uint32_t, RblnRuntime> decode_;  // by bucket
  std::chrono::milliseconds timeout_;
  int device_id_ = 0;
  void* device_kv_ = nullptr;  // kv_memory = "device": the graphs' KV (pool_ is its staging)
  bool write_through_ = true;  // stage every pass's writes back (spec.rbln.pool_read_remotely)
  uint32_t dummy_ = 0;
  std::string poisoned_;  // non-empty: a run that never completed
  std::vector<int32_t> ids_, pos_, tables_, qpos_;
  std::vector<float> logits_;
};

Status RblnDevice::run(RblnRuntime& runtime, const std::string& graph, std::vector<void*> inputs,
                       void* logits) {
  inputs.push_back(kv_input());
  auto id = runtime.submit(inputs, {logits});
  if (!id.ok()) return make_error(ErrorKind::failed, "rbln " + graph + ": " + id.error().message);
  Status waited = runtime.wait(*id, timeout_);
  if (waited.ok()) return {};
  if (waited.error().kind == ErrorKind::timed_out) {
    poisoned_ = graph + " run " + std::to_string(*id) + " did not complete within " +
                std::to_string(timeout_.count()) + " ms";
  }
  return make_error(waited.error().kind, "rbln " + graph + ": " + waited.error().message);
}

Status RblnDevice::stage(int type, std::span<const KvRun> runs) {
  if (!device_kv_) return {};
  auto* device = static_cast<std::byte*>(device_kv_);
  for (const KvRun& r : runs) {
    std::byte* host = pool_->base() + r.offset;
    void* dst = type == 0 ? static_cast<void*>(device + r.offset) : static_cast<void*>(host);
    const void* src = type == 0 ? static_cast<const void*>(host) : device + r.offset;
    if (api_->memcpy_device(device_id_, dst, src, r.bytes, type) != 0) {
      poisoned_ = std::string("KV staging: rbln_memcpy (") +
                  (type == 0 ? "host to device" : "device to host") + ", " +
                  std::to_string(r.bytes) + " bytes at KV offset " + std::to_string(r.offset) +
                  ") failed: " + api_->last_error();
      return make_error(ErrorKind::failed, "rbln device: " + poisoned_);
    }
  }
  return {};
}

template <typename Seq>
Status RblnDevice::stage_in(std::span<const Seq> batch) {
  if (!device_kv_) return {};
  std::vector<uint32_t> blocks;
  for (const Seq& s : batch) {
    blocks.insert(blocks.end(), s.imported.begin(), s.imported.end());
    if constexpr (std::is_same_v<Seq, PrefillSeq>) {
      for (const BlockCopy& c : s.copies) blocks.push_back(c.dst);
    }
  }
  std::sort(blocks.begin(), blocks.end());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
  std::vector<KvRun> runs;
  const uint64_t bb = layout_.block_bytes();
  for (uint32_t b : blocks) append_run(runs, {b * bb, bb});
  return stage(0, runs);
}

Result<StepOutput> RblnDevice::prefill(std::span<const PrefillSeq> batch) {
  if (auto st = usable(); !st) return st.error();
  if (batch.empty()) return make_error(ErrorKind::invalid, "rbln device prefill: empty batch");
  for (size_t i = 0; i < batch.size(); ++i) {
    const PrefillSeq& s = batch[i];
    if (auto st = check_seq("rbln device prefill", i,
                            {s.seq_id, s.tokens, s.start_pos, s.block_table}, model_, layout_);
        !st) {
      return st.error();
    }
    if (auto st = check_imported("rbln device prefill", i, s.seq_id, s.imported, layout_); !st) {
      return st.error();
    }
  }
  if (auto st = check_copies(batch, layout_); !st) return st.error();
  apply_copies(batch, layout_, kv_region());
  if (auto st = stage_in(batch); !st) return st.error();
  const uint32_t chunk = art_.prefill_chunk, vocab = model_.vocab_size;
  ids_.resize(chunk);
  pos_.resize(chunk);
  tables_.resize(art_.table_blocks());
  qpos_.resize(1);
  logits_.resize(vocab);
  StepOutput out;
  for (const PrefillSeq& s : batch) {
    fill_table(s.block_table, tables_.data());
    const size_t n = s.tokens.size();
    for (size_t c = 0; c < n; c += chunk) {
      const size_t len = std::min<size_t>(chunk, n - c);
      for (size_t i = 0; i < chunk; ++i) {
        ids_[i] = i < len ? s.tokens[c + i] : 0;
        pos_[i] = i < len ? static_cast<int32_t>(s.start_pos + c + i) : -1;
      }
      qpos_[0] = static_cast<int32_t>(len - 1);
      std::string graph = "prefill (seq " + std::to_string(s.seq_id) + ", positions " +
                          std::to_string(s.start_pos + c) + ".." +
                          std::to_string(s.start_pos + c + len) + ")";
      if (auto st = run(prefill_, graph, {ids_.data(), pos_.data(), tables_.data(), qpos_.data()},
                        logits_.data());
          !st) {
        return st.error();
      }
      const auto first = static_cast<uint32_t>(s.start_pos + c);
      if (!write_through_) continue;
      if (auto st = stage(
              1, written_runs(layout_, s.block_table, first, first + static_cast<uint32_t>(len)));
          !st) {
        return st.error();
      }
    }
    SeqOutput so;
    so.seq_id = s.seq_id;
    so.rows_count = 1;
    so.logits = logits_;
    out.seqs.push_back(std::move(so));
  }
  return out;
}

Result<StepOutput> RblnDevice::decode(std::span<const DecodeSeq> batch) {
  if (auto st = usable(); !st) return st.error();
  if (batch.empty()) return make_error(ErrorKind::invalid, "rbln device decode: empty batch");
  for (size_t i = 0; i < batch.size(); ++i) {
    const DecodeSeq& s = batch[i];
    if (auto st = check_seq("rbln device decode", i,
                            {s.seq_id, s.tokens, s.start_pos, s.block_table}, model_, layout_);
        !st) {
      return st.error();
    }
    if (s.tokens.size() != 1) {
      return make_error(ErrorKind::invalid,
                        "rbln device decode: seq " + std::to_string(i) + " (id " +
                            std::to_string(s.seq_id) + ") has " + std::to_string(s.tokens.size()) +
                            " tokens; the decode graphs take one per sequence (speculative "
                            "verification is not built for rbln)");
    }
    if (auto st = check_imported("rbln device decode", i, s.seq_id, s.imported, layout_); !st) {
      return st.error();
    }
  }
  if (auto st = stage_in(batch); !st) return st.error();
  const uint32_t vocab = model_.vocab_size, table = art_.table_blocks();
  const uint32_t largest = art_.buckets.back();
  StepOutput out;
  for (size_t first = 0; first < batch.size(); first += largest) {
    const uint32_t rows = static_cast<uint32_t>(std::min<size_t>(largest, batch.size() - first));
    const uint32_t bucket = art_.bucket_for(rows);
    ids_.assign(bucket, 0);
    pos_.assign(bucket, 0);
    tables_.assign(size_t{bucket} * table, static_cast<int32_t>(dummy_));
    logits_.resize(size_t{bucket} * vocab);
    for (uint32_t r = 0; r < rows; ++r) {
      const DecodeSeq& s = batch[first + r];
      ids_[r] = s.tokens[0];
      pos_[r] = static_cast<int32_t>(s.start_pos);
      fill_table(s.block_table, tables_.data() + size_t{r} * table);
    }
    std::string graph =
        "decoder_batch_" + std::to_string(bucket) + " (" + std::to_string(rows) + " rows)";
    if (auto st = run(decode_.at(bucket), graph, {ids_.data(), pos_.data(), tables_.data()},
                      logits_.data());
        !st) {
      return st.error();
    }
    for (uint32_t r = 0; r < rows && write_through_; ++r) {
      const DecodeSeq& s = batch[first + r];
      if (auto st = stage(1, written_runs(layout_, s.block_table, s.start_pos, s.start_pos + 1));
          !st) {
        return st.error();
      }
    }
    for (uint32_t r = 0; r < rows; ++r) {
      SeqOutput so;
      so.seq_id = batch[first + r].seq_id;
      so.rows_count = 1;
      auto begin = logits_.begin() + static_cast<std::ptrdiff_t>(size_t{r} * vocab);
      so.logits.assign(begin, begin + vocab);
      out.seqs.push_back(std::move(so));
    }
  }
  return out;
}

Status RblnDevice::copy_blocks_out(std::span<const uint32_t> blocks, std::span<std::byte> dst) {
  if (auto st = check_block_copy(blocks, dst.size(), layout_, "rbln copy_blocks_out"); !st) {
    return st;
  }
  const uint64_t bb = layout_.block_bytes();
  for (size_t i = 0; i < blocks.size(); ++i) {
    const KvRun run{uint64_t{blocks[i]} * bb, bb};
    if (auto st = stage(1, {&run, 1}); !st) return st;  // the host pool is current after it
    std::memcpy(dst.data() + i * bb, pool_->base() + run.offset, bb);
  }
  return {};
}

Status RblnDevice::copy_blocks_in(std::span<const uint32_t> blocks,
                                  std::span<const std::byte> src) {
  if (auto st = check_block_copy(blocks, src.size(), layout_, "rbln copy_blocks_in"); !st) {
    return st;
  }
  const uint64_t bb = layout_.block_bytes();
  for (size_t i = 0; i < blocks.size(); ++i) {
    const KvRun run{uint64_t{blocks[i]} * bb, bb};
    std::memcpy(pool_->base() + run.offset, src.data() + i * bb, bb);
    if (auto st = stage(0, {&run, 1}); !st) return st;
  }
  return {};
}

// Opens one graph's runtime and checks its input and output counts.
Result<RblnRuntime> open_graph(const std::shared_ptr<const RblnApi>& api, const std::string& path,
                               const std::string& name, int device_id, int inputs) {
  auto rt = RblnRuntime::open(api, path, name, device_id);
  if (!rt.ok()) return rt.error();
  if (rt->inputs_count() != inputs || rt->outputs_count() != 1) {
    return make_error(ErrorKind::invalid,
                      "rbln graph " + path + " has " + std::to_string(rt->inputs_count()) +
                          " inputs and " + std::to_string(rt->outputs_count()) +
                          " outputs; Tandem drives it with " + std::to_string(inputs) +
                          " inputs and 1 output (docs/rbln.md)");
  }
  return rt;
}

// The compiled directory of `spec`, checked against what the manifest expects.
Result<RblnArtifact> checked_artifact(const DeviceSpec& spec) {
  const RblnSpec& r = spec.rbln;
  if (spec.blocks_total == 0) {
    return make_error(ErrorKind::invalid, "rbln device: kv_blocks must be > 0");
  }
  std::string dir = r.artifacts, version;
  if (!r.compiler.empty()) {
    auto v = compiler_version(r.compiler);
    if (!v.ok()) return v.error();
    version = *v;
    auto cached = find_cached(compile_request(spec), r.cache_dir, version);
    if (!cached.ok()) return cached.error();
    dir = *cached;
  }
  auto artifact = load_artifact(dir);
  if (!artifact.ok()) return artifact.error();
  if (!version.empty() && artifact->compiler_version != version) {
    return make_error(ErrorKind::invalid, "rbln artifact " + dir + ": built by compiler " +
                                              artifact->compiler_version +
                                              ", the installed compiler is " + version);
  }
  ArtifactExpect expect;
  expect.model_name = r.model_name;
  expect.served_names = r.served_names;
  expect.block_tokens = spec.block_tokens;
  expect.max_model_tokens = r.max_model_tokens;
  expect.devices = r.device_ids.empty() ? 1 : static_cast<uint32_t>(r.device_ids.size());
  expect.decode_seqs_max = r.decode_seqs_max;
  expect.kv_blocks = spec.blocks_total;
  if (auto st = check_artifact(*artifact, expect); !st) return st.error();
  return artifact;
}

// When the library reports its device count (rbln_get_device_count, optional), every device the
// instance names must be below it. invalid naming the device and the count.
Status check_device_ids(const RblnApi& api, const std::vector<uint32_t>& ids) {
  int count = 0;
  if (!api.device_count || api.device_count(&count) != 0) return {};
  for (uint32_t id : ids) {
    if (id >= static_cast<uint32_t>(std::max(count, 0))) {
      return make_error(ErrorKind::invalid, "rbln device " + std::to_string(id) +
                                                ": this host has " + std::to_string(count) +
                                                " RBLN devices (rbln_get_device_count); "
                                                "the executor's devices must be 0.." +
                                                std::to_string(count - 1));
    }
  }
  return {};
}

}  // namespace

Result<std::string> probe_rbln(const DeviceSpec& spec) {
  auto artifact = checked_artifact(spec);
  if (!artifact.ok()) return artifact.error();
  auto api = RblnApi::load(spec.rbln.library);
  if (!api.ok()) return api.error();
  if (spec.rbln.kv_on_device) {
    if (auto st = (*api)->require_device_memory(); !st) return st.error();
  }
  if (auto st = check_device_ids(**api, spec.rbln.device_ids); !st) return st.error();
  const RblnArtifact& a = *artifact;
  std::string buckets;
  for (uint32_t b : a.buckets) buckets += (buckets.empty() ? "" : ", ") + std::to_string(b);
  return "library " + spec.rbln.library + " (" + std::to_string(rbln_required_symbols().size()) +
         " symbols" +
         ((*api)->require_device_memory().ok() ? ", device-memory calls present" : "") +
         (spec.rbln.kv_on_device ? ", KV in device memory" : "") + "); compiled " + a.dir +
         ": model " + a.model_name + ", compiler " + a.compiler_version + ", block " +
         std::to_string(a.block_tokens) + ", max length " + std::to_string(a.max_seq_len) +
         ", chunk " + std::to_string(a.prefill_chunk) + ", buckets [" + buckets + "], devices " +
         std::to_string(a.devices);
}

Result<std::unique_ptr<Device>> make_rbln_device(const DeviceSpec& spec) {
  const RblnSpec& r = spec.rbln;
  auto artifact = checked_artifact(spec);
  if (!artifact.ok()) return artifact.error();
  auto api = RblnApi::load(r.library);
  if (!api.ok()) return api.error();
  if (auto st = check_device_ids(**api, r.device_ids); !st) return st.error();

  KvLayout layout;
  layout.block_tokens = artifact->block_tokens;
  layout.blocks_total = spec.blocks_total;
  layout.layers = artifact->model.layers;
  layout.kv_heads = artifact->model.kv_heads;
  layout.head_dim = artifact->model.head_dim;
  layout.element_bytes = artifact->kv_element_bytes;
  auto pool = PoolMemory::allocate(layout.pool_bytes() + layout.block_bytes(), "rbln device");
  if (!pool.ok()) return pool.error();

  const int device_id = r.device_ids.empty() ? 0 : static_cast<int>(r.device_ids.front());
  if (r.kv_on_device) {
    if (auto st = (*api)->require_device_memory(); !st) return st.error();
  }
  auto prefill = open_graph(*api, artifact->prefill_graph(), "prefill", device_id, kPrefillInputs);
  if (!prefill.ok()) return prefill.error();
  std::map<uint32_t, RblnRuntime> decode;
  for (uint32_t bucket : artifact->buckets) {
    auto rt = open_graph(*api, artifact->decode_graph(bucket),
                         "decoder_batch_" + std::to_string(bucket), device_id, kDecodeInputs);
    if (!rt.ok()) return rt.error();
    decode.emplace(bucket, std::move(rt).value());
  }
  // The device KV buffer last: nothing after it can fail, and the device frees it.
  void* device_kv = nullptr;
  if (r.kv_on_device) {
    const uint64_t bytes = layout.pool_bytes() + layout.block_bytes();
    if ((*api)->malloc_device(device_id, bytes, &device_kv) != 0 || device_kv == nullptr) {
      return make_error(ErrorKind::failed,
                        "rbln_malloc(device " + std::to_string(device_id) + ", " +
                            std::to_string(bytes) +
                            " bytes for the KV cache) failed: " + (*api)->last_error());
    }
  }
  return std::unique_ptr<Device>(new RblnDevice(
      std::move(api).value(), std::move(artifact).value(), layout, std::move(pool).value(),
      std::move(prefill).value(), std::move(decode), std::chrono::milliseconds(r.run_timeout_ms),
      device_id, device_kv, r.pool_read_remotely));
}

}  // namespace tandem::devices::rbln
