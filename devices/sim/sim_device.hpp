// tandem/devices/sim: the `sim` Device. No math: a timing model of one serving instance
// (npu_count Rebel100s running MiniMax-M2.7), deterministic tokens, and a real KV pool whose
// bytes say what was written (see sim_model.hpp and docs/sim-device.md).
//
// Outputs are tokens (SeqOutput::tokens), never logits. Each pass:
//   1. validates the whole batch (nothing is written on a validation error);
//   2. reads each sequence's context [0, start_pos) back: from its own per-sequence cache
//      when the pool still agrees with it, else from the KV rows in its blocks (so blocks
//      copied in from another device work). KV that was never written there -> failed;
//   3. writes the new positions' KV rows, picks tokens with sim::next_output_token (inside
//      the chat format's markup, spec.sim_markup);
//   4. models the pass time (prefill_time_s / decode_step_time_s) and, when
//      time_factor > 0, sets StepOutput::ready_at to when modelled time * time_factor has
//      passed since the pass began (the host work of steps 1-3 counts toward it), or since
//      the previous pass's ready_at if that is later: the modelled device runs one pass at a
//      time. It never sleeps: the caller waits (the executor on a timer, holding no thread).
// Not thread-safe (one executor thread), like every Device.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "devices/device.hpp"
#include "devices/sim/sim_model.hpp"

namespace tandem::devices::sim {

// Page-aligned anonymous memory (mmap), zero-filled, owned; unmapped on destruction.
class PageBuffer {
 public:
  // Errors: invalid (length 0), failed (mmap refused: the message has errno's text).
  static Result<std::unique_ptr<PageBuffer>> create(uint64_t length_bytes);
  ~PageBuffer();
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;
  std::byte* data() const { return base_; }
  uint64_t size() const { return length_bytes_; }

  struct Key {  // only create() makes one: the constructor is for make_unique
   private:
    friend class PageBuffer;
    Key() = default;
  };
  PageBuffer(Key, std::byte* base, uint64_t length_bytes)
      : base_(base), length_bytes_(length_bytes) {}

 private:
  std::byte* base_;
  uint64_t length_bytes_;
};

class SimDevice final : public Device {
 public:
  // seqs_max: sequences whose context the device caches; the least recently used is dropped
  // beyond it (its context is then read back from the pool, and its output length counts
  // from the first pass seen after that).
  static constexpr size_t seqs_max = 65536;

  // spec.kind must be sim. Pool: spec.blocks_total, or spec.kv_bytes_max / block bytes.
  // Errors (invalid): bad spec.sim keys or values, bad spec.sim_markup (validate_markup), no
  // pool size, block_tokens 0, a pool
  // holding more tokens than the modelled HBM (kv_capacity_tokens); failed: mmap refused.
  static Result<std::unique_ptr<SimDevice>> create(const DeviceSpec& spec);

  const ModelConfig& model_config() const override { return model_; }
  const KvLayout& kv_layout() const override { return layout_; }
  MemoryRegion kv_region() override { return {pool_->data(), pool_->size()}; }
  Result<StepOutput> prefill(std::span<const PrefillSeq> batch) override;
  Result<StepOutput> decode(std::span<const DecodeSeq> batch) override;
  Status copy_blocks_out(std::span<const uint32_t> blocks, std::span<std::byte> dst) override;
  Status copy_blocks_in(std::span<const uint32_t> blocks, std::span<const std::byte> src) override;

  const SimParams& params() const { return params_; }
  double last_pass_modelled_s() const { return last_pass_s_; }   // the latest pass
  double total_modelled_s() const { return total_s_; }           // since creation

  struct Key {  // only create() makes one: the constructor is for make_unique
   private:
    friend class SimDevice;
    Key() = default;
  };
  SimDevice(Key, SimParams params, uint64_t seed, SimMarkup markup, KvLayout layout,
            std::unique_ptr<PageBuffer> pool);

 private:
  struct SeqState {
    std::vector<int32_t> tokens;   // context, positions [0, size)
    std::vector<uint64_t> hashes;  // context_hash at each position
    uint32_t prompt_tokens = 0;    // 0 = unknown yet
    uint64_t last_used = 0;
  };
  struct Pass {
    uint64_t seq_id;
    std::span<const uint32_t> block_table;
    uint32_t start_pos;
    std::span<const int32_t> tokens;
  };

  Status validate_batch(std::span<const Pass> batch) const;
  Result<SeqState*> load_context(const Pass& pass);
  Status rebuild_context(const Pass& pass, SeqState& state) const;
  void write_token(const Pass& pass, SeqState& state, uint32_t index_in_pass);
  Result<StepOutput> run(std::span<const Pass> batch, bool is_prefill);
  // Returns the pass's ready_at (default: no modelled wait).
  std::chrono::steady_clock::time_point model_time(std::span<const Pass> batch, bool is_prefill,
                                                   std::chrono::steady_clock::time_point started);
  void evict_if_full();

  SimParams params_;
  uint64_t seed_;
  SimMarkup markup_;  // the chat format's markup (spec.sim_markup)
  ModelConfig model_;
  KvLayout layout_;
  std::unique_ptr<PageBuffer> pool_;
  std::vector<uint64_t> row_salts_;  // row_salt(layer, part) at layer * 2 + part
  std::unordered_map<uint64_t, SeqState> seqs_;
  uint64_t pass_count_ = 0;
  double last_pass_s_ = 0;
  double total_s_ = 0;
  std::chrono::steady_clock::time_point busy_until_{};  // the latest pass's ready_at
  std::function<std::chrono::steady_clock::time_point()> clock_;  // spec.clock; may be empty
};

// For make_device(): the sim backend behind the Device interface.
Result<std::unique_ptr<Device>> make_sim_device(const DeviceSpec& spec);

}  // namespace tandem::devices::sim
