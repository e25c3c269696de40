#include "devices/rbln/rbln_device.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <optional>

#include "devices/kv_segments.hpp"
#include "devices/rbln/rbln_api.hpp"
#include "devices/rbln/rbln_artifact.hpp"
#include "devices/rbln/rbln_compile.hpp"

namespace tandem::devices::rbln {
namespace {

// "compiled DIR: model M, compiler V, block B, max length L, chunk C, buckets [..] (or pipeline
// stages P (layers ..)), verify graphs of T tokens, data parallel D, devices N": what `tandem
// check` and `tandem shell executors` say of a compiled directory.
std::string describe_artifact(const RblnArtifact& a) {
  std::string buckets, shape;
  for (uint32_t b : a.buckets) buckets += (buckets.empty() ? "" : ", ") + std::to_string(b);
  if (a.stages > 1) {
    for (uint32_t l : a.stage_layers) shape += (shape.empty() ? "" : ", ") + std::to_string(l);
    shape = "pipeline stages " + std::to_string(a.stages) + " (layers " + shape + ")";
  } else {
    shape = "buckets [" + buckets + "]";
    if (a.verify_tokens > 0) {
      shape += ", verify graphs of " + std::to_string(a.verify_tokens) + " tokens";
    }
  }
  if (a.ranks > 1) shape += ", data parallel " + std::to_string(a.ranks);
  return "compiled " + a.dir + ": model " + a.model_name + ", compiler " + a.compiler_version +
         ", block " + std::to_string(a.block_tokens) + ", max length " +
         std::to_string(a.max_seq_len) + ", chunk " + std::to_string(a.prefill_chunk) + ", " +
         shape + ", devices " + std::to_string(a.devices_total());
}

constexpr int kPrefillInputs = 5;  // input_ids, cache_position, block_tables, query_position, kv
constexpr int kDecodeInputs = 4;   // input_ids, cache_position, block_tables, kv

// One chunk of a prefill pass: sequence `seq` of the batch, positions [first, first + len).
struct ChunkItem {
  size_t seq = 0;
  uint32_t first = 0, len = 0;
  bool last = false;  // the sequence's last chunk: its logits are the output
};

// The batch's chunks of at most `chunk` tokens, in batch order.
std::vector<ChunkItem> chunk_items(std::span<const PrefillSeq> batch, uint32_t chunk) {
  std::vector<ChunkItem> items;
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto n = static_cast<uint32_t>(batch[i].tokens.size());
    for (uint32_t c = 0; c < n; c += chunk) {
      items.push_back({i, batch[i].start_pos + c, std::min(chunk, n - c), c + chunk >= n});
    }
  }
  return items;
}

// The decode graphs of one set (one device, or one data-parallel rank), by bucket: one token per
// sequence, and with verify tokens T (the artifact's verify_tokens) T per sequence.
struct DecodeGraphs {
  std::map<uint32_t, RblnRuntime> decode, verify;
  // The graph of `bucket` taking `per_row` tokens per sequence (1: decode).
  RblnRuntime& at(uint32_t per_row, uint32_t bucket) {
    return per_row == 1 ? decode.at(bucket) : verify.at(bucket);
  }
};

// The name of the graph of `bucket` taking `per_row` tokens per sequence.
std::string decode_graph_name(uint32_t per_row, uint32_t bucket) {
  return (per_row == 1 ? "decoder_batch_" : "verify_batch_") + std::to_string(bucket);
}

// One stage of a pipelined prefill (artifact stages > 1): its graph's runtime on the stage's
// first device, and the KV of its layers (block-major, the pool's blocks plus the dummy) in a
// buffer of its own: on that device (kv_memory "device") or in host memory. The instance's host
// pool stays whole (all layers, what kv_region() exposes for RMA) and is the stages' staging
// copy, as a device buffer's is.
struct PipeStage {
  std::optional<RblnRuntime> runtime;
  int device_id = 0;
  KvLayout layout;
  void* kv = nullptr;                // the graph's kv_cache
  std::unique_ptr<PoolMemory> host;  // kv_memory "host": kv's memory
  std::vector<float> hidden[2];      // output (not the last stage), double-buffered by item
};

// One data-parallel rank (artifact ranks > 1): the graphs opened on the rank's first device,
// its KV (kv_memory "device": a buffer on that device, the whole pool plus the dummy; else the
// host pool, shared: ranks run disjoint sequences), and its own input and output buffers.
struct DpRank {
  int device_id = 0;
  std::optional<RblnRuntime> prefill;
  DecodeGraphs decode;
  void* kv = nullptr;
  bool on_device = false;
  std::vector<int32_t> ids, pos, tables, qpos;
  std::vector<float> logits;
};

class RblnDevice final : public Device {
 public:
  RblnDevice(std::shared_ptr<const RblnApi> api, RblnArtifact artifact, KvLayout layout,
             std::unique_ptr<PoolMemory> pool, std::optional<RblnRuntime> prefill,
             DecodeGraphs decode, std::chrono::milliseconds timeout, int device_id, void* device_kv,
             bool write_through)
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
    for (PipeStage& st : stages_) {
      if (!st.host && st.kv) (void)api_->free_device(st.device_id, st.kv);
    }
    for (DpRank& r : ranks_) {
      if (r.on_device && r.kv) (void)api_->free_device(r.device_id, r.kv);
    }
  }
  // Data-parallel ranks: they replace the one set of graphs.
  void set_ranks(std::vector<DpRank> ranks) {
    ranks_ = std::move(ranks);
    block_copies_.assign(layout_.blocks_total, ~uint64_t{0});  // nothing written yet
  }
  // A pipelined prefill: the stages replace the prefill graph (and there are no decode graphs).
  void set_stages(std::vector<PipeStage> stages) { stages_ = std::move(stages); }
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
  std::string describe() const override {
    const bool on_device = device_kv_ != nullptr || ranks_on_device() ||
                           (!stages_.empty() && stages_[0].host == nullptr);
    return describe_artifact(art_) + (on_device ? ", KV in device memory" : ", KV in host memory");
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
  // The same for one pipeline stage's buffer: the parts of `runs` (host-pool ranges) that hold
  // its layers.
  Status stage_one(PipeStage& st, int type, std::span<const KvRun> runs);
  // One copy between `buffer` + buffer_offset (a KV buffer, on `device_id` when device_side,
  // else in host memory: memcpy) and the host pool at pool_offset; type 0 host to buffer, 1 back.
  // A failed rbln_memcpy poisons the device.
  Status copy_kv(int device_id, bool device_side, int type, void* buffer, uint64_t buffer_offset,
                 uint64_t pool_offset, uint64_t bytes);
  // copy_kv for `runs` of a device buffer laid out as the host pool (same offsets).
  Status stage_buffer(int device_id, void* buffer, int type, std::span<const KvRun> runs);
  // The error of a graph run's wait (`which` names it); a timeout poisons the device.
  Status settle(const Status& waited, const std::string& which, int64_t id);
  bool staged() const {
    return device_kv_ != nullptr || !stages_.empty() || (!ranks_.empty() && ranks_[0].on_device);
  }
  Result<StepOutput> prefill_pipelined(std::span<const PrefillSeq> batch);
  // Data parallel: a sequence runs on rank seq_id % ranks; every graph run is a lockstep round
  // of all ranks, an idle rank on padding (token 0 at position 0, every table entry the dummy).
  uint32_t rank_of(uint64_t seq_id) const { return static_cast<uint32_t>(seq_id % ranks_.size()); }
  Result<StepOutput> prefill_parallel(std::span<const PrefillSeq> batch);
  Result<StepOutput> decode_parallel(std::span<const DecodeSeq> batch);
  // Submits one run per rank (runtimes[r] with rank r's buffers), then waits for every one.
  Status lockstep(const std::vector<RblnRuntime*>& runtimes, bool prefill,
                  const std::string& graph);
  Status stage_ranks(int type, std::span<const KvRun> runs);
  Status stage_rank(DpRank& rank, int type, std::span<const KvRun> runs);
  // Data parallel with KV in device memory: before a sequence on `rank` runs from start_pos,
  // the blocks holding its positions before start_pos are made current on that rank (a prefix
  // shared with a sequence of another rank was computed there): from the host pool when it is
  // current, else from a rank that is, through the host pool.
  Status bring(uint32_t rank, std::span<const uint32_t> table, uint32_t start_pos);
  // The host pool's copy of `block` made current (from a rank that is).
  Status host_current(uint32_t block);
  // After `rank` wrote positions [first, end) of a sequence: its copy of those blocks is the
  // current one (and the host pool's, when write-through staged the rows onto a current copy).
  void wrote(uint32_t rank, std::span<const uint32_t> table, uint32_t first, uint32_t end);
  bool ranks_on_device() const { return !ranks_.empty() && ranks_[0].on_device; }
  // Before a pass: the blocks its sequences import, and the destinations of its block copies
  // (made in the host pool), copied in.
  template <typename Seq>
  Status stage_in(std::span<const Seq> batch);
  void* kv_input() const { return device_kv_ ? device_kv_ : static_cast<void*>(pool_->base()); }
  // Tokens per sequence of the graphs a decode step of `batch` runs: 1 (decode graphs) when no
  // sequence has drafts, else the artifact's verify_tokens (verify graphs).
  uint32_t per_row(std::span<const DecodeSeq> batch) const {
    for (const DecodeSeq& s : batch) {
      if (s.tokens.size() > 1) return art_.verify_tokens;
    }
    return 1;
  }
  // Inputs for `bucket` rows of `per_row` slots, every row padding: token 0, its first slot at
  // position 0 and the others at -1, every table entry the dummy block; logits sized.
  void pad_decode(uint32_t bucket, uint32_t per_row, std::vector<int32_t>& ids,
                  std::vector<int32_t>& pos, std::vector<int32_t>& tables,
                  std::vector<float>& logits) const {
    ids.assign(size_t{bucket} * per_row, 0);
    pos.assign(size_t{bucket} * per_row, -1);
    for (uint32_t r = 0; r < bucket; ++r) pos[size_t{r} * per_row] = 0;
    tables.assign(size_t{bucket} * art_.table_blocks(), static_cast<int32_t>(dummy_));
    logits.resize(size_t{bucket} * per_row * model_.vocab_size);
  }
  // Row `row` of those inputs for `s`: its tokens at consecutive positions from start_pos.
  void fill_decode_row(const DecodeSeq& s, uint32_t row, uint32_t per_row, int32_t* ids,
                       int32_t* pos, int32_t* tables) const {
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      ids[row * per_row + i] = s.tokens[i];
      pos[row * per_row + i] = static_cast<int32_t>(s.start_pos + i);
    }
    fill_table(s.block_table, tables + size_t{row} * art_.table_blocks());
  }
  // The output of row `row`: one logits row per token of `s`.
  SeqOutput decode_output(const DecodeSeq& s, uint32_t row, uint32_t per_row,
                          const std::vector<float>& logits) const {
    SeqOutput so;
    so.seq_id = s.seq_id;
    so.rows_count = static_cast<uint32_t>(s.tokens.size());
    auto begin =
        logits.begin() + static_cast<std::ptrdiff_t>(size_t{row} * per_row * model_.vocab_size);
    so.logits.assign(
        begin, begin + static_cast<std::ptrdiff_t>(size_t{so.rows_count} * model_.vocab_size));
    return so;
  }
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
  std::optional<RblnRuntime> prefill_;      // empty when pipelined
  DecodeGraphs decode_;
  std::chrono::milliseconds timeout_;
  int device_id_ = 0;
  void* device_kv_ = nullptr;  // kv_memory = "device": the graphs' KV (pool_ is its staging)
  bool write_through_ = true;  // stage every pass's writes back (spec.rbln.pool_read_remotely)
  uint32_t dummy_ = 0;
  std::vector<PipeStage> stages_;  // pipelined prefill: prefill_ is unused
  std::vector<DpRank> ranks_;      // data parallel: prefill_ and decode_ are unused
  // Data parallel, KV in device memory: per block, which copies hold its current bytes (bit r:
  // rank r's buffer; kHostCopy: the host pool).
  static constexpr uint64_t kHostCopy = uint64_t{1} << 63;
  std::vector<uint64_t> block_copies_;
  std::string poisoned_;  // non-empty: a run that never completed
  std::vector<int32_t> ids_, pos_, tables_, qpos_;
  std::vector<float> logits_;
};

Status RblnDevice::run(RblnRuntime& runtime, const std::string& graph, std::vector<void*> inputs,
                       void* logits) {
  inputs.push_back(kv_input());
  auto id = runtime.submit(inputs, {logits});
  if (!id.ok()) return make_error(ErrorKind::failed, "rbln " + graph + ": " + id.error().message);
  return settle(runtime.wait(*id, timeout_), graph, *id);
}

Status RblnDevice::settle(const Status& waited, const std::string& which, int64_t id) {
  if (waited.ok()) return {};
  if (waited.error().kind == ErrorKind::timed_out && poisoned_.empty()) {
    poisoned_ = which + " run " + std::to_string(id) + " did not complete within " +
                std::to_string(timeout_.count()) + " ms";
  }
  return make_error(waited.error().kind, "rbln " + which + ": " + waited.error().message);
}

Status RblnDevice::copy_kv(int device_id, bool device_side, int type, void* buffer,
                           uint64_t buffer_offset, uint64_t pool_offset, uint64_t bytes) {
  std::byte* host = pool_->base() + pool_offset;
  std::byte* kv = static_cast<std::byte*>(buffer) + buffer_offset;
  void* dst = type == 0 ? static_cast<void*>(kv) : static_cast<void*>(host);
  const void* src = type == 0 ? static_cast<const void*>(host) : static_cast<const void*>(kv);
  if (!device_side) {
    std::memcpy(dst, src, bytes);
    return {};
  }
  if (api_->memcpy_device(device_id, dst, src, bytes, type) == 0) return {};
  poisoned_ = std::string("KV staging: rbln_memcpy (") +
              (type == 0 ? "host to device" : "device to host") + ", " + std::to_string(bytes) +
              " bytes at KV offset " + std::to_string(pool_offset) +
              (stages_.empty() && ranks_.empty() ? "" : ", device " + std::to_string(device_id)) +
              ") failed: " + api_->last_error();
  return make_error(ErrorKind::failed, "rbln device: " + poisoned_);
}

Status RblnDevice::stage(int type, std::span<const KvRun> runs) {
  if (!ranks_.empty()) return stage_ranks(type, runs);
  for (PipeStage& st : stages_) {
    if (auto s = stage_one(st, type, runs); !s) return s;
  }
  if (!device_kv_) return {};
  return stage_buffer(device_id_, device_kv_, type, runs);
}

Status RblnDevice::stage_buffer(int device_id, void* buffer, int type,
                                std::span<const KvRun> runs) {
  for (const KvRun& r : runs) {
    if (auto s = copy_kv(device_id, true, type, buffer, r.offset, r.offset, r.bytes); !s) return s;
  }
  return {};
}

Status RblnDevice::stage_one(PipeStage& st, int type, std::span<const KvRun> runs) {
  for (const KvCopy& c : slice_runs(layout_, st.layout, runs)) {
    if (auto s = copy_kv(st.device_id, !st.host, type, st.kv, c.dst_offset, c.src_offset, c.bytes);
        !s) {
      return s;
    }
  }
  return {};
}

template <typename Seq>
Status RblnDevice::stage_in(std::span<const Seq> batch) {
  if (!staged()) return {};
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
  for (const PrefillSeq& s : batch) {  // data parallel: the sources' host copies made current
    for (const BlockCopy& c : s.copies) {
      if (!ranks_on_device()) break;
      if (auto st = host_current(c.src); !st) return st.error();
    }
  }
  apply_copies(batch, layout_, kv_region());
  if (auto st = stage_in(batch); !st) return st.error();
  if (!stages_.empty()) return prefill_pipelined(batch);
  if (!ranks_.empty()) return prefill_parallel(batch);
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
      if (auto st = run(*prefill_, graph, {ids_.data(), pos_.data(), tables_.data(), qpos_.data()},
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

// Items are the batch's chunks in order; in wave t, stage s runs item t - s, so the stages work
// on consecutive chunks at once (a sequence's next chunk enters stage 0 while its previous one
// is in stage 1: stage s of chunk c needs stage s of chunk c - 1, done a wave earlier on the same
// runtime, and stage s - 1 of chunk c, done the wave before). A wave submits every stage's run,
// then waits for all of them, so no buffer is reused while a run may still read it.
Result<StepOutput> RblnDevice::prefill_pipelined(std::span<const PrefillSeq> batch) {
  const uint32_t chunk = art_.prefill_chunk, vocab = model_.vocab_size;
  const uint32_t table = art_.table_blocks();
  const std::vector<ChunkItem> items = chunk_items(batch, chunk);
  const size_t count = items.size();
  ids_.assign(count * chunk, 0);
  pos_.assign(count * chunk, -1);
  tables_.assign(count * table, 0);
  qpos_.assign(count, 0);
  for (size_t k = 0; k < count; ++k) {
    const ChunkItem& it = items[k];
    const PrefillSeq& s = batch[it.seq];
    for (uint32_t i = 0; i < it.len; ++i) {
      ids_[k * chunk + i] = s.tokens[it.first - s.start_pos + i];
      pos_[k * chunk + i] = static_cast<int32_t>(it.first + i);
    }
    qpos_[k] = static_cast<int32_t>(it.len - 1);
    fill_table(s.block_table, tables_.data() + k * table);
  }
  StepOutput out;
  for (const PrefillSeq& s : batch) {
    SeqOutput so;
    so.seq_id = s.seq_id;
    so.rows_count = 1;
    out.seqs.push_back(std::move(so));
  }
  logits_.resize(vocab);
  const auto stages = static_cast<uint32_t>(stages_.size());
  for (size_t wave = 0; wave + 1 < count + stages; ++wave) {
    struct Launched {
      uint32_t stage = 0;
      size_t item = 0;
      int64_t id = 0;
      std::string graph;
    };
    std::vector<Launched> launched;
    Status failed;
    for (uint32_t st = 0; st < stages; ++st) {
      if (wave < st || wave - st >= count) continue;
      const size_t k = wave - st;
      const ChunkItem& it = items[k];
      PipeStage& ps = stages_[st];
      void* first_input = st == 0 ? static_cast<void*>(ids_.data() + k * chunk)
                                  : stages_[st - 1].hidden[k % 2].data();
      void* output = st + 1 < stages ? static_cast<void*>(ps.hidden[k % 2].data())
                                     : static_cast<void*>(logits_.data());
      std::string graph = "prefill_stage_" + std::to_string(st) + " (seq " +
                          std::to_string(batch[it.seq].seq_id) + ", positions " +
                          std::to_string(it.first) + ".." + std::to_string(it.first + it.len) +
                          ", device " + std::to_string(ps.device_id) + ")";
      auto id = ps.runtime->submit({first_input, pos_.data() + k * chunk,
                                    tables_.data() + k * table, qpos_.data() + k, ps.kv},
                                   {output});
      if (!id.ok()) {
        failed = make_error(ErrorKind::failed, "rbln " + graph + ": " + id.error().message);
        break;
      }
      launched.push_back({st, k, *id, std::move(graph)});
    }
    // Every submitted run is waited for, even after a failure: its buffers are ours.
    for (const Launched& l : launched) {
      Status waited = settle(stages_[l.stage].runtime->wait(l.id, timeout_), l.graph, l.id);
      if (failed.ok()) failed = waited;
    }
    if (!failed.ok()) return failed.error();
    for (const Launched& l : launched) {
      const ChunkItem& it = items[l.item];
      if (write_through_) {
        auto runs = written_runs(layout_, batch[it.seq].block_table, it.first, it.first + it.len);
        if (auto st = stage_one(stages_[l.stage], 1, runs); !st) return st.error();
      }
      if (l.stage + 1 == stages && it.last) out.seqs[it.seq].logits = logits_;
    }
  }
  return out;
}

Status RblnDevice::stage_rank(DpRank& rank, int type, std::span<const KvRun> runs) {
  if (!rank.on_device) return {};
  return stage_buffer(rank.device_id, rank.kv, type, runs);
}

// Host -> device (whole blocks: imports, which ride on a pass's first sequence whichever rank
// reads them, and copy_blocks_in): lazily. The host pool becomes the block's only current copy
// and bring() hands it to the rank whose sequence reads it, before that rank's pass: one copy
// per reading rank instead of one per rank. Device -> host (copy_blocks_out): each block from a
// rank whose copy is current.
Status RblnDevice::stage_ranks(int type, std::span<const KvRun> runs) {
  if (!ranks_on_device()) return {};
  const uint64_t bb = layout_.block_bytes();
  for (const KvRun& run : runs) {
    for (uint64_t at = run.offset, end = run.offset + run.bytes; at < end;) {
      const uint64_t block = at / bb, piece = std::min(end, (block + 1) * bb) - at;
      at += piece;
      if (block >= block_copies_.size()) continue;  // the dummy block
      if (type == 1) {
        if (auto s = host_current(static_cast<uint32_t>(block)); !s) return s;
        continue;
      }
      block_copies_[block] = kHostCopy;
    }
  }
  return {};
}

Status RblnDevice::host_current(uint32_t block) {
  uint64_t& copies = block_copies_[block];
  if (copies & kHostCopy) return {};
  const KvRun one{uint64_t{block} * layout_.block_bytes(), layout_.block_bytes()};
  const auto owner = static_cast<uint32_t>(std::countr_zero(copies & ~kHostCopy));
  RT_ASSERT(owner < ranks_.size(), "a written block has a current copy", block, copies);
  if (auto s = stage_rank(ranks_[owner], 1, {&one, 1}); !s) return s;
  copies |= kHostCopy;
  return {};
}

Status RblnDevice::bring(uint32_t rank, std::span<const uint32_t> table, uint32_t start_pos) {
  if (!ranks_on_device()) return {};
  const uint32_t bt = layout_.block_tokens;
  const uint64_t bit = uint64_t{1} << rank;
  for (size_t i = 0; i < table.size() && i * bt < start_pos; ++i) {
    const uint32_t block = table[i];
    if (block >= block_copies_.size() || (block_copies_[block] & bit)) continue;
    if (auto s = host_current(block); !s) return s;
    const KvRun one{uint64_t{block} * layout_.block_bytes(), layout_.block_bytes()};
    if (auto s = stage_rank(ranks_[rank], 0, {&one, 1}); !s) return s;
    block_copies_[block] |= bit;
  }
  return {};
}

void RblnDevice::wrote(uint32_t rank, std::span<const uint32_t> table, uint32_t first,
                       uint32_t end) {
  if (!ranks_on_device() || first >= end) return;
  const uint32_t bt = layout_.block_tokens;
  for (uint32_t i = first / bt; i <= (end - 1) / bt && i < table.size(); ++i) {
    if (table[i] >= block_copies_.size()) continue;
    uint64_t& copies = block_copies_[table[i]];
    copies = (uint64_t{1} << rank) | (write_through_ && (copies & kHostCopy) ? kHostCopy : 0);
  }
}

Status RblnDevice::lockstep(const std::vector<RblnRuntime*>& runtimes, bool prefill,
                            const std::string& graph) {
  std::vector<std::pair<uint32_t, int64_t>> submitted;
  Status failed;
  for (uint32_t r = 0; r < ranks_.size(); ++r) {
    DpRank& k = ranks_[r];
    std::vector<void*> inputs{k.ids.data(), k.pos.data(), k.tables.data()};
    if (prefill) inputs.push_back(k.qpos.data());
    inputs.push_back(k.kv);
    auto id = runtimes[r]->submit(inputs, {k.logits.data()});
    if (!id.ok()) {
      failed = make_error(ErrorKind::failed, "rbln " + graph + " (rank " + std::to_string(r) +
                                                 ", device " + std::to_string(k.device_id) +
                                                 "): " + id.error().message);
      break;
    }
    submitted.emplace_back(r, *id);
  }
  // Every submitted run is waited for, even after a failure: its buffers are ours.
  for (const auto& [r, id] : submitted) {
    Status waited = runtimes[r]->wait(id, timeout_);
    if (waited.ok()) continue;
    waited = settle(waited,
                    graph + " (rank " + std::to_string(r) + ", device " +
                        std::to_string(ranks_[r].device_id) + ")",
                    id);
    if (failed.ok()) failed = waited;
  }
  return failed;
}

Result<StepOutput> RblnDevice::prefill_parallel(std::span<const PrefillSeq> batch) {
  const uint32_t chunk = art_.prefill_chunk, table = art_.table_blocks();
  const auto count = static_cast<uint32_t>(ranks_.size());
  for (const PrefillSeq& s : batch) {
    if (auto st = bring(rank_of(s.seq_id), s.block_table, s.start_pos); !st) return st.error();
  }
  std::vector<std::vector<ChunkItem>> items(count);
  size_t rounds = 0;
  for (const ChunkItem& it : chunk_items(batch, chunk)) {
    auto& mine = items[rank_of(batch[it.seq].seq_id)];
    mine.push_back(it);
    rounds = std::max(rounds, mine.size());
  }
  StepOutput out;
  out.seqs.resize(batch.size());
  for (size_t round = 0; round < rounds; ++round) {
    std::vector<RblnRuntime*> runtimes;
    for (uint32_t r = 0; r < count; ++r) {
      DpRank& k = ranks_[r];
      runtimes.push_back(&*k.prefill);
      k.ids.assign(chunk, 0);
      k.pos.assign(chunk, -1);
      k.tables.assign(table, static_cast<int32_t>(dummy_));
      k.qpos.assign(1, 0);
      k.logits.resize(model_.vocab_size);
      if (round >= items[r].size()) {
        k.pos[0] = 0;  // padding: token 0 at position 0 of the dummy block
        continue;
      }
      const ChunkItem& it = items[r][round];
      const PrefillSeq& s = batch[it.seq];
      for (uint32_t i = 0; i < it.len; ++i) {
        k.ids[i] = s.tokens[it.first - s.start_pos + i];
        k.pos[i] = static_cast<int32_t>(it.first + i);
      }
      k.qpos[0] = static_cast<int32_t>(it.len - 1);
      fill_table(s.block_table, k.tables.data());
    }
    if (auto st = lockstep(runtimes, true, "prefill round " + std::to_string(round)); !st) {
      return st.error();
    }
    for (uint32_t r = 0; r < count; ++r) {
      if (round >= items[r].size()) continue;
      const ChunkItem& it = items[r][round];
      const PrefillSeq& s = batch[it.seq];
      if (write_through_) {
        auto runs = written_runs(layout_, s.block_table, it.first, it.first + it.len);
        if (auto st = stage_rank(ranks_[r], 1, runs); !st) return st.error();
      }
      wrote(r, s.block_table, it.first, it.first + it.len);
      if (it.last) {
        out.seqs[it.seq].seq_id = s.seq_id;
        out.seqs[it.seq].rows_count = 1;
        out.seqs[it.seq].logits = ranks_[r].logits;
      }
    }
  }
  return out;
}

Result<StepOutput> RblnDevice::decode_parallel(std::span<const DecodeSeq> batch) {
  const auto count = static_cast<uint32_t>(ranks_.size());
  const uint32_t largest = art_.buckets.back(), slots = per_row(batch);
  std::vector<std::vector<size_t>> rows(count);
  for (size_t i = 0; i < batch.size(); ++i) {
    const uint32_t r = rank_of(batch[i].seq_id);
    rows[r].push_back(i);
    if (auto st = bring(r, batch[i].block_table, batch[i].start_pos); !st) return st.error();
  }
  StepOutput out;
  out.seqs.resize(batch.size());
  for (size_t done = 0;; done += largest) {
    uint32_t widest = 0;
    for (const auto& mine : rows) {
      if (mine.size() > done) {
        widest =
            std::max(widest, static_cast<uint32_t>(std::min<size_t>(largest, mine.size() - done)));
      }
    }
    if (widest == 0) break;
    const uint32_t bucket = art_.bucket_for(widest);
    std::vector<RblnRuntime*> runtimes;
    for (uint32_t r = 0; r < count; ++r) {
      DpRank& k = ranks_[r];
      runtimes.push_back(&k.decode.at(slots, bucket));
      pad_decode(bucket, slots, k.ids, k.pos, k.tables, k.logits);
      for (uint32_t j = 0; done + j < rows[r].size() && j < bucket; ++j) {
        fill_decode_row(batch[rows[r][done + j]], j, slots, k.ids.data(), k.pos.data(),
                        k.tables.data());
      }
    }
    if (auto st = lockstep(runtimes, false, decode_graph_name(slots, bucket)); !st) {
      return st.error();
    }
    for (uint32_t r = 0; r < count; ++r) {
      for (uint32_t j = 0; done + j < rows[r].size() && j < bucket; ++j) {
        const size_t index = rows[r][done + j];
        const DecodeSeq& s = batch[index];
        const auto end = static_cast<uint32_t>(s.start_pos + s.tokens.size());
        if (write_through_) {
          auto runs = written_runs(layout_, s.block_table, s.start_pos, end);
          if (auto st = stage_rank(ranks_[r], 1, runs); !st) return st.error();
        }
        wrote(r, s.block_table, s.start_pos, end);
        out.seqs[index] = decode_output(s, j, slots, ranks_[r].logits);
      }
    }
  }
  return out;
}

Result<StepOutput> RblnDevice::decode(std::span<const DecodeSeq> batch) {
  if (auto st = usable(); !st) return st.error();
  if (batch.empty()) return make_error(ErrorKind::invalid, "rbln device decode: empty batch");
  if (!stages_.empty()) {
    return make_error(ErrorKind::invalid,
                      "rbln device decode: the artifact is a pipelined prefill "
                      "(pipeline_parallel_size " +
                          std::to_string(stages_.size()) + "), with no decode graphs");
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    const DecodeSeq& s = batch[i];
    if (auto st = check_seq("rbln device decode", i,
                            {s.seq_id, s.tokens, s.start_pos, s.block_table}, model_, layout_);
        !st) {
      return st.error();
    }
    if (s.tokens.size() > 1 && s.tokens.size() > art_.verify_tokens) {
      return make_error(
          ErrorKind::invalid,
          "rbln device decode: seq " + std::to_string(i) + " (id " + std::to_string(s.seq_id) +
              ") has " + std::to_string(s.tokens.size()) + " tokens; " +
              (art_.verify_tokens == 0
                   ? std::string("the artifact has no verify graphs (verify_tokens), so its "
                                 "decode steps take one token per sequence")
                   : "the artifact's verify graphs take " + std::to_string(art_.verify_tokens) +
                         " per sequence (verify_tokens)"));
    }
    if (auto st = check_imported("rbln device decode", i, s.seq_id, s.imported, layout_); !st) {
      return st.error();
    }
  }
  if (auto st = stage_in(batch); !st) return st.error();
  if (!ranks_.empty()) return decode_parallel(batch);
  const uint32_t largest = art_.buckets.back(), slots = per_row(batch);
  StepOutput out;
  for (size_t first = 0; first < batch.size(); first += largest) {
    const uint32_t rows = static_cast<uint32_t>(std::min<size_t>(largest, batch.size() - first));
    const uint32_t bucket = art_.bucket_for(rows);
    pad_decode(bucket, slots, ids_, pos_, tables_, logits_);
    for (uint32_t r = 0; r < rows; ++r) {
      fill_decode_row(batch[first + r], r, slots, ids_.data(), pos_.data(), tables_.data());
    }
    std::string graph = decode_graph_name(slots, bucket) + " (" + std::to_string(rows) + " rows)";
    if (auto st = run(decode_.at(slots, bucket), graph, {ids_.data(), pos_.data(), tables_.data()},
                      logits_.data());
        !st) {
      return st.error();
    }
    for (uint32_t r = 0; r < rows && write_through_; ++r) {
      const DecodeSeq& s = batch[first + r];
      auto end = static_cast<uint32_t>(s.start_pos + s.tokens.size());
      if (auto st = stage(1, written_runs(layout_, s.block_table, s.start_pos, end)); !st) {
        return st.error();
      }
    }
    for (uint32_t r = 0; r < rows; ++r) {
      out.seqs.push_back(decode_output(batch[first + r], r, slots, logits_));
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

// The decode graphs of `art` (and its verify graphs), opened on `device_id`.
Result<DecodeGraphs> open_decode_graphs(const std::shared_ptr<const RblnApi>& api,
                                        const RblnArtifact& art, int device_id) {
  DecodeGraphs graphs;
  for (uint32_t bucket : art.buckets) {
    auto rt = open_graph(api, art.decode_graph(bucket), decode_graph_name(1, bucket), device_id,
                         kDecodeInputs);
    if (!rt.ok()) return rt.error();
    graphs.decode.emplace(bucket, std::move(rt).value());
    if (art.verify_tokens == 0) continue;
    auto verify =
        open_graph(api, art.verify_graph(bucket), decode_graph_name(art.verify_tokens, bucket),
                   device_id, kDecodeInputs);
    if (!verify.ok()) return verify.error();
    graphs.verify.emplace(bucket, std::move(verify).value());
  }
  return graphs;
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
  expect.draft_tokens_max = r.draft_tokens_max;
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

// A pipelined prefill (artifact stages > 1): stage s's graph opened on the instance's device
// s x tensor_parallel_size, with a KV buffer of its layers there (kv_memory "device") or in host
// memory.
Result<std::unique_ptr<Device>> make_pipelined(const DeviceSpec& spec,
                                               std::shared_ptr<const RblnApi> api,
                                               const RblnArtifact& art, const KvLayout& layout) {
  const RblnSpec& r = spec.rbln;
  auto pool = PoolMemory::allocate(layout.pool_bytes() + layout.block_bytes(), "rbln device");
  if (!pool.ok()) return pool.error();
  std::vector<PipeStage> stages;
  for (uint32_t st = 0; st < art.stages; ++st) {
    PipeStage ps;
    const uint32_t index = st * art.devices;
    ps.device_id = index < r.device_ids.size() ? static_cast<int>(r.device_ids[index]) : 0;
    auto rt = open_graph(api, art.stage_graph(st), "prefill_stage_" + std::to_string(st),
                         ps.device_id, kPrefillInputs);
    if (!rt.ok()) return rt.error();
    ps.runtime.emplace(std::move(rt).value());
    stages.push_back(std::move(ps));
  }
  for (uint32_t st = 0; st < art.stages; ++st) {
    PipeStage& ps = stages[st];
    ps.layout = layout;
    ps.layout.layer_first = art.stage_first_layer(st);
    ps.layout.layers = art.stage_layers[st];
    ps.layout.blocks_total = layout.blocks_total + 1;  // the dummy block
    if (st + 1 < art.stages) {
      for (auto& h : ps.hidden) h.assign(size_t{art.prefill_chunk} * art.model.hidden, 0.0f);
    }
    if (!r.kv_on_device) {
      auto host = PoolMemory::allocate(ps.layout.pool_bytes(), "rbln pipeline stage KV");
      if (!host.ok()) return host.error();
      ps.host = std::move(host).value();
      ps.kv = ps.host->base();
    } else if (api->malloc_device(ps.device_id, ps.layout.pool_bytes(), &ps.kv) != 0 ||
               ps.kv == nullptr) {
      ps.kv = nullptr;
      for (PipeStage& done : stages) {
        if (done.kv && !done.host) (void)api->free_device(done.device_id, done.kv);
      }
      return make_error(ErrorKind::failed, "rbln_malloc(device " + std::to_string(ps.device_id) +
                                               ", " + std::to_string(ps.layout.pool_bytes()) +
                                               " bytes for stage " + std::to_string(st) +
                                               "'s KV) failed: " + api->last_error());
    }
  }
  auto device = std::make_unique<RblnDevice>(
      api, art, layout, std::move(pool).value(), std::nullopt, DecodeGraphs{},
      std::chrono::milliseconds(r.run_timeout_ms), 0, nullptr, r.pool_read_remotely);
  device->set_stages(std::move(stages));
  return std::unique_ptr<Device>(std::move(device));
}

// Data parallel (artifact ranks > 1): rank r's graphs on the instance's device r x
// tensor_parallel_size, with its own KV buffer there (kv_memory "device") or the shared host pool.
Result<std::unique_ptr<Device>> make_data_parallel(const DeviceSpec& spec,
                                                   std::shared_ptr<const RblnApi> api,
                                                   const RblnArtifact& art,
                                                   const KvLayout& layout) {
  const RblnSpec& r = spec.rbln;
  auto pool = PoolMemory::allocate(layout.pool_bytes() + layout.block_bytes(), "rbln device");
  if (!pool.ok()) return pool.error();
  std::vector<DpRank> ranks(art.ranks);
  auto free_all = [&] {
    for (DpRank& k : ranks) {
      if (k.on_device && k.kv) (void)api->free_device(k.device_id, k.kv);
      k.kv = nullptr;
    }
  };
  for (uint32_t rank = 0; rank < art.ranks; ++rank) {
    DpRank& k = ranks[rank];
    const uint32_t index = rank * art.devices;
    k.device_id = index < r.device_ids.size() ? static_cast<int>(r.device_ids[index]) : 0;
    auto prefill = open_graph(api, art.prefill_graph(), "prefill", k.device_id, kPrefillInputs);
    if (!prefill.ok()) return prefill.error();
    k.prefill.emplace(std::move(prefill).value());
    auto decode = open_decode_graphs(api, art, k.device_id);
    if (!decode.ok()) return decode.error();
    k.decode = std::move(decode).value();
  }
  for (DpRank& k : ranks) {
    k.kv = (*pool)->base();
    if (!r.kv_on_device) continue;
    const uint64_t bytes = layout.pool_bytes() + layout.block_bytes();
    void* buffer = nullptr;
    if (api->malloc_device(k.device_id, bytes, &buffer) != 0 || buffer == nullptr) {
      free_all();
      return make_error(
          ErrorKind::failed,
          "rbln_malloc(device " + std::to_string(k.device_id) + ", " + std::to_string(bytes) +
              " bytes for a data-parallel rank's KV cache) failed: " + api->last_error());
    }
    k.kv = buffer;
    k.on_device = true;
  }
  auto device = std::make_unique<RblnDevice>(
      api, art, layout, std::move(pool).value(), std::nullopt, DecodeGraphs{},
      std::chrono::milliseconds(r.run_timeout_ms), 0, nullptr, r.pool_read_remotely);
  device->set_ranks(std::move(ranks));
  return std::unique_ptr<Device>(std::move(device));
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
  return "library " + spec.rbln.library + " (" + std::to_string(rbln_required_symbols().size()) +
         " symbols" +
         ((*api)->require_device_memory().ok() ? ", device-memory calls present" : "") +
         (spec.rbln.kv_on_device ? ", KV in device memory" : "") + "); " +
         describe_artifact(*artifact);
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
  if (artifact->stages > 1) return make_pipelined(spec, std::move(api).value(), *artifact, layout);
  if (artifact->ranks > 1) {
    return make_data_parallel(spec, std::move(api).value(), *artifact, layout);
  }
  auto prefill = open_graph(*api, artifact->prefill_graph(), "prefill", device_id, kPrefillInputs);
  if (!prefill.ok()) return prefill.error();
  auto decode = open_decode_graphs(*api, *artifact, device_id);
  if (!decode.ok()) return decode.error();
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
      std::move(prefill).value(), std::move(decode).value(),
      std::chrono::milliseconds(r.run_timeout_ms), device_id, device_kv, r.pool_read_remotely));
}

}  // namespace tandem::devices::rbln
