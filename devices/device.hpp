// tandem/devices: the one seam between serving and hardware. Every backend (cpu, sim, rbln)
// implements `Device`; everything above it (executor, prefill, decode) sees only this file.
//
// A Device owns a loaded model and a paged KV pool. The caller (one executor, one thread at a
// time: a Device is NOT thread-safe) owns the block allocation policy: it hands each sequence
// a block table and says where the sequence's new tokens start. The Device computes, writes
// the new tokens' K and V into those blocks, and returns logits (or tokens, see StepOutput).
//
// Positions and blocks: position p of a sequence lives in block block_table[p / block_tokens],
// slot p % block_tokens. A pass over tokens [start_pos, start_pos + n) reads KV of positions
// [0, start_pos) from the pool (written by earlier passes, or copied in) and writes KV of the
// n new positions. Nothing else in the pool is touched.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "config/manifest.hpp"
#include "devices/sampling.hpp"
#include "runtime/base/result.hpp"

namespace tandem::devices {

enum class Arch { llama, minimax_m2 };  // llama: Llama/Qwen2/llama2.c; minimax_m2: MoE + QK-norm
enum class DType { f32, bf16, f16, f8_e4m3 };
// How RoPE pairs the rotated dimensions of a head (only the first rotary_dim dims rotate):
//   interleaved: pairs (2i, 2i+1)             -- llama2.c checkpoints
//   rotate_half: pairs (i, i + rotary_dim/2)  -- HF safetensors checkpoints
enum class RopeStyle { interleaved, rotate_half };

std::string_view to_string(Arch arch);
std::string_view to_string(DType dtype);
uint32_t dtype_bytes(DType dtype);  // 4, 2, 2, 1

// The model's shape. Value type; every size comes from here, nothing is hard-coded.
struct ModelConfig {
  Arch arch = Arch::llama;
  uint32_t vocab_size = 0;
  uint32_t hidden = 0;        // model width (d_model)
  uint32_t layers = 0;
  uint32_t heads = 0;         // query heads
  uint32_t kv_heads = 0;      // key/value heads (GQA: heads % kv_heads == 0)
  uint32_t head_dim = 0;
  uint32_t intermediate = 0;  // dense SwiGLU FFN width (llama); unused by minimax_m2
  float rope_theta = 10000.0f;
  uint32_t rotary_dim = 0;    // dims of each head that rotate; == head_dim for full RoPE
  RopeStyle rope_style = RopeStyle::rotate_half;
  float rms_eps = 1e-5f;
  bool tie_embeddings = false;   // lm head == token embedding
  bool qk_norm = false;          // RMSNorm on q and k (minimax_m2)
  uint32_t experts = 0;          // MoE experts per layer (0 = dense FFN)
  uint32_t experts_per_token = 0;
  uint32_t moe_intermediate = 0;  // each expert's SwiGLU width
  bool router_bias = false;       // sigmoid router + bias used only for expert selection
  uint32_t max_position = 0;      // positions [0, max_position) are valid, tokens
  int32_t bos_id = 1;
  int32_t eos_id = 2;
  DType weight_dtype = DType::f32;  // as stored in the checkpoint

  // invalid naming the first bad field (zero sizes, heads % kv_heads, rotary_dim odd or >
  // head_dim, experts_per_token > experts, ...).
  Status validate() const;
  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

enum class KvPart : uint32_t { k = 0, v = 1 };

// Where a pool keeps its (block, layer, K|V) parts (each part_bytes long):
//   block_major: a block holds every layer, contiguously (Tandem's pools: cpu, sim, the rbln
//                host pool), so a block is one run;
//   layer_major: one tensor per (layer, K|V) of [blocks] parts (the RBLN runtime's KV cache, a
//                pipeline stage's layers), so a block is 2 * layers runs.
enum class KvOrder : uint32_t { block_major = 0, layer_major = 1 };
// The element order inside one part:
//   slot_head_dim: [slot][kv_head][head_dim] (Tandem's);
//   head_slot_dim: [kv_head][slot][head_dim] (the RBLN cache's [blocks, kv_heads, block_tokens,
//                  head_dim] per layer).
// Parts of different inner orders are not byte copies of each other: a transfer refuses them.
enum class KvInner : uint32_t { slot_head_dim = 0, head_slot_dim = 1 };

// Layout of the KV pool. A block holds block_tokens positions of ALL layers, contiguously,
// so one block is one contiguous copy or one RMA read. Inside a block:
//   [layer][K|V][slot (token in block)][kv_head][head_dim] elements of element_bytes each.
struct KvLayout {
  uint32_t block_tokens = 0;
  uint32_t blocks_total = 0;
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t element_bytes = 0;  // cpu: 4 (fp32); sim: whatever it models (e.g. 1 for fp8)
  KvOrder order = KvOrder::block_major;
  KvInner inner = KvInner::slot_head_dim;
  // The model layers this pool holds: [layer_first, layer_first + layers). 0 and all layers for
  // a whole-model instance; a pipeline stage holds a slice.
  uint32_t layer_first = 0;

  uint64_t part_bytes() const;   // one (block, layer, K|V): block_tokens*kv_heads*head_dim*elem
  uint64_t block_bytes() const;  // layers * 2 * part_bytes()
  uint64_t pool_bytes() const;   // blocks_total * block_bytes()
  // Byte offset of (block, layer, part) from the pool base. Asserts block < blocks_total and
  // layer < layers (callers validate ids that came from outside first).
  // `layer` counts from this pool's first layer (0 .. layers-1), in either order.
  uint64_t offset_bytes(uint32_t block, uint32_t layer, KvPart part) const;
  // Byte offset of one slot's (token's) K or V row of kv_heads*head_dim elements.
  uint64_t slot_offset_bytes(uint32_t block, uint32_t layer, KvPart part, uint32_t slot) const;
  friend bool operator==(const KvLayout&, const KvLayout&) = default;
};

// The pool's memory: page-aligned, owned by the Device, valid for the Device's lifetime.
// The runtime registers it with libfabric for RMA reads.
struct MemoryRegion {
  std::byte* base = nullptr;
  uint64_t length_bytes = 0;
};

// Copies block `src` of the pool into block `dst` (every layer, whole block).
struct BlockCopy {
  uint32_t src = 0;
  uint32_t dst = 0;
};

// One sequence in a prefill pass (chunked prefill: start_pos > 0 continues earlier chunks,
// whose KV must already be in the blocks). block_table must cover start_pos + tokens.size()
// positions. Output: one logits row, for the last token.
struct PrefillSeq {
  uint64_t seq_id = 0;
  std::vector<uint32_t> block_table;
  uint32_t start_pos = 0;
  std::vector<int32_t> tokens;  // not empty
  // Done before any sequence of the pass is computed: a prefix hit that ends inside a block
  // (sub-block matching) brings that block's KV into the sequence's own block this way.
  std::vector<BlockCopy> copies;
  // Blocks whose pool bytes were written from outside the device since it last wrote them (an
  // RMA pull from prefill, a tier-2 load), before this pass. A device whose KV is not the host
  // pool itself (rbln with kv_memory = "device") copies them in before computing; the others
  // ignore it. Ids < blocks_total (check_imported).
  std::vector<uint32_t> imported;
};

// The copies of a prefill batch, checked (ids < blocks_total, src != dst; invalid naming
// the sequence) before anything is written, then applied within `region`.
Status check_copies(std::span<const PrefillSeq> batch, const KvLayout& layout);
void apply_copies(std::span<const PrefillSeq> batch, const KvLayout& layout, MemoryRegion region);

// One sequence in a decode pass. tokens = {last accepted token, draft_1, ..., draft_k}; the
// last token sits at position start_pos. Output: k+1 logits rows, row i predicts the token
// after tokens[i], so all drafts are verified in one pass. KV of all k+1 positions is written;
// the caller simply re-runs from the first rejected position next time (overwriting it).
struct DecodeSeq {
  uint64_t seq_id = 0;
  std::vector<uint32_t> block_table;
  uint32_t start_pos = 0;
  std::vector<int32_t> tokens;  // not empty
  // The caller needs only each row's argmax (greedy without penalties or logprobs: the token
  // itself, and drafts verified by comparison): the device returns SeqOutput::tokens, the
  // argmax of each row (lowest index wins ties), instead of rows x vocab logits. A row with a
  // NaN comes back as logits (the sampler reports it). Devices that return tokens anyway
  // (sim) ignore it.
  bool argmax_only = false;
  // With argmax_only, >= 0: the caller also reports logprobs (greedy, no penalties): the rows
  // greedy verification emits (up to the first whose argmax is not the next input token)
  // come back scored as Sampler::score scores their argmax at temperature 0 with this top-N
  // (the token's log-softmax and the N most probable), in SeqOutput::scored. -1: tokens only.
  int32_t logprobs_top_n = -1;
  std::vector<uint32_t> imported;  // as PrefillSeq::imported
};

// Output for one input sequence, in input order. Exactly one of the two is filled:
//   logits: rows_count * vocab_size floats, row-major (cpu, rbln). Sample with
//           devices/sampling.hpp.
//   tokens: rows_count token ids, already chosen (sim: it has no math; cpu for a decode
//           sequence with argmax_only: each row's argmax).
struct SeqOutput {
  uint64_t seq_id = 0;
  uint32_t rows_count = 0;      // prefill: 1; decode: tokens.size() of the input
  std::vector<float> logits;
  std::vector<int32_t> tokens;
  // With tokens, when DecodeSeq::logprobs_top_n >= 0 (cpu): the emitted rows' tokens scored
  // (their logprob and top-N; is_stop left false: stop ids are the caller's).
  std::vector<SampledToken> scored;
};

// Speculation with a draft model beside the target (EAGLE-3, DeviceSpec::draft_model_path).
// A device with one keeps, from its last decode pass, the target's states the draft model
// reads (three layers' hidden states per row). After verifying that pass, the caller asks for
// the next drafts of some of its sequences: `emitted` holds the tokens verification produced
// for the sequence (1 + its accepted drafts, in order: the token after each of the pass's
// first emitted.size() rows). The device feeds the draft model those positions with the kept
// states, then drafts up to draft_tokens tokens, each the draft model's greedy choice.
struct DraftSeq {
  uint64_t seq_id = 0;
  std::vector<int32_t> emitted;  // >= 1, <= the sequence's rows in the last decode pass
  uint32_t draft_tokens = 1;     // >= 1
};
struct DraftOutput {
  uint64_t seq_id = 0;
  std::vector<int32_t> tokens;  // <= draft_tokens (fewer near max_position)
};

struct StepOutput {
  std::vector<SeqOutput> seqs;  // same order as the input batch
  // When the pass is over. A device that computes (cpu, rbln) returns when it is and leaves
  // this at its default (already past). A device that models time (sim, time_factor > 0)
  // returns at once with the modelled end here; its caller answers no earlier: the executor
  // on a timer (holding no thread), a direct caller with wait_ready().
  std::chrono::steady_clock::time_point ready_at{};
};

// One sequence of a pass, as the checks every backend makes see it.
struct SeqCheck {
  uint64_t seq_id = 0;
  std::span<const int32_t> tokens;
  uint32_t start_pos = 0;
  std::span<const uint32_t> block_table;
};
// The checks of Device::prefill/decode's contract for sequence `index` of a pass: tokens not
// empty and inside the vocabulary, positions within max_position, a block table covering
// them with ids < blocks_total. invalid, prefixed "`what`: seq INDEX (id ID)", naming the value.
Status check_seq(const std::string& what, size_t index, const SeqCheck& seq,
                 const ModelConfig& model, const KvLayout& layout);

// Every imported block id of a pass < blocks_total; invalid, prefixed `what`, naming the
// sequence and the id.
Status check_imported(const std::string& what, size_t index, uint64_t seq_id,
                      std::span<const uint32_t> imported, const KvLayout& layout);

// The checks of copy_blocks_out/in: ids < blocks_total and `bytes` == blocks x block_bytes.
// invalid, prefixed `what`.
Status check_block_copy(std::span<const uint32_t> blocks, uint64_t bytes, const KvLayout& layout,
                        const char* what);

// Anonymous page-aligned memory for a KV pool (or its host staging); zero-filled by the kernel.
class PoolMemory {
 public:
  // failed when the memory cannot be mapped, naming `who` and the size.
  static Result<std::unique_ptr<PoolMemory>> allocate(uint64_t bytes, const std::string& who);
  ~PoolMemory();
  PoolMemory(const PoolMemory&) = delete;
  PoolMemory& operator=(const PoolMemory&) = delete;
  std::byte* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }

 private:
  PoolMemory(std::byte* base, uint64_t bytes) : base_(base), bytes_(bytes) {}
  std::byte* base_;
  uint64_t bytes_;
};

// Sleeps the calling thread until out.ready_at (returns at once when it has passed).
void wait_ready(const StepOutput& out);

// Backend-specific knobs of the sim device (defined by the sim backend; keys are documented
// in devices/sim/). Ignored by other kinds.
using SimParams = std::map<std::string, double>;

// sim only: the chat format's markup, as ids of the served model's tokenizer (the executor
// fills it from the tokenizer and [model] chat_format; all empty for the plain format).
// The sim device writes reasoning_open, then reasoning, then reasoning_close once
// reasoning_share of its output is written, then text; it never completes a `banned`
// sequence (tool-call markers: a client must not run a call the simulator made up), nor
// the reasoning markers outside those places.
struct SimMarkup {
  std::vector<int32_t> reasoning_open;   // empty when the prompt opens reasoning (minimax-m2)
  std::vector<int32_t> reasoning_close;  // empty: the format has no reasoning
  std::vector<std::vector<int32_t>> banned;
  friend bool operator==(const SimMarkup&, const SimMarkup&) = default;
};

// rbln only: where the runtime and the compiled model are, and what the manifest expects of
// the compiled model (devices/rbln/rbln_artifact.hpp checks it).
struct RblnSpec {
  std::string library;    // librbln_runtime.so to dlopen
  std::string artifacts;  // the compiled model directory; empty: from the compile cache
  // The compile cache (devices/rbln/rbln_compile.hpp): the compiler command, its cache, and the
  // shapes asked of it.
  std::string compiler;
  std::string cache_dir;
  uint32_t prefill_chunk = 128;
  uint32_t kv_element_bytes = 2;
  // The compile cache's split of device_ids: pipeline stages (an executor of prefill instances
  // only) with their layers (empty: equal), or data-parallel ranks (an executor of decode).
  uint32_t pipeline_stages = 1;
  std::vector<uint32_t> stage_layers;
  uint32_t data_parallel = 1;
  std::vector<uint32_t> device_ids;  // the instance's devices; runtimes open on the first
  std::string model_name;
  std::vector<std::string> served_names;
  uint32_t max_model_tokens = 0;
  uint32_t decode_seqs_max = 0;     // 0: the executor serves no decode instance
  // The executor's decode instance speculates with up to this many drafts per sequence
  // ([speculative] draft_tokens_max; 0: it does not): the verify graphs must take 1 + it.
  uint32_t draft_tokens_max = 0;
  uint32_t run_timeout_ms = 60000;  // one graph run's wait bound
  // KV in device memory (rbln_malloc) rather than the host pool: the graphs take the device
  // buffer, and the host pool becomes its registered staging copy (devices/rbln/rbln_device.hpp).
  bool kv_on_device = false;
  // With kv_on_device: others read this pool by RMA (the executor serves a prefill instance),
  // so every pass's writes are staged back to the host pool. false: nothing reads the host
  // pool but copy_blocks_out, which stages its blocks itself.
  bool pool_read_remotely = true;
};

struct DeviceSpec {
  config::DeviceKind kind = config::DeviceKind::cpu;
  std::string model_path;     // cpu: llama2.c .bin file or HF directory
  uint32_t block_tokens = 16;
  uint32_t blocks_total = 0;  // 0: derive from kv_bytes_max
  uint64_t kv_bytes_max = 0;  // used when blocks_total == 0; one of the two must be set
  uint32_t threads = 0;       // compute threads; 0 = all cores
  uint64_t seed = 0;
  SimParams sim;
  SimMarkup sim_markup;
  // sim: the clock a modelled pass's ready_at is measured on (the executor passes its actor
  // clock, virtual under CAF's test coordinator); empty = std::chrono::steady_clock::now.
  std::function<std::chrono::steady_clock::time_point()> clock;
  // cpu: an EAGLE-3 draft head directory (devices/cpu/eagle3.hpp) for this target; empty:
  // none. Other kinds refuse one (unimplemented).
  std::string draft_model_path;
  RblnSpec rbln;
};

class Device {
 public:
  virtual ~Device() = default;
  Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual const ModelConfig& model_config() const = 0;
  virtual const KvLayout& kv_layout() const = 0;
  virtual MemoryRegion kv_region() = 0;  // valid for the Device's lifetime

  // Errors (invalid): empty batch, empty tokens, token id outside [0, vocab_size), block id
  // >= blocks_total, block table too short, start_pos + tokens beyond max_position.
  // On error nothing was computed, but KV of earlier sequences in the batch is NOT rolled
  // back (only validation errors are possible, and they are checked before any compute).
  virtual Result<StepOutput> prefill(std::span<const PrefillSeq> batch) = 0;
  virtual Result<StepOutput> decode(std::span<const DecodeSeq> batch) = 0;

  // Copies whole blocks out of / into the pool, in the order given: dst/src hold
  // blocks.size() * block_bytes() bytes. Errors (invalid): block id out of range, size
  // mismatch.
  virtual Status copy_blocks_out(std::span<const uint32_t> blocks, std::span<std::byte> dst) = 0;
  virtual Status copy_blocks_in(std::span<const uint32_t> blocks,
                                std::span<const std::byte> src) = 0;

  // Non-empty when the device takes no more work, and why (rbln: a run that never completed,
  // whose buffers the runtime may still write). Every later pass fails; the executor tells its
  // shell, which reports the instance not ready until the node restarts.
  virtual std::string lost() const { return ""; }

  // What the device runs, for operators (`tandem shell executors`): rbln: the compiled
  // directory, its compiler, graphs and where the KV lives. "" when there is nothing beyond
  // its kind and KV pool.
  virtual std::string describe() const { return ""; }

  // A draft model is loaded (see DraftSeq).
  virtual bool has_draft_model() const { return false; }
  // The next drafts, in batch order. `forget`: sequences that ended; the draft model's state
  // for them (its KV) is released first. Errors: unimplemented (no draft model); invalid (a
  // sequence that was not in the last decode pass, emitted empty or longer than its rows,
  // draft_tokens 0, a token outside the vocabulary). Nothing is drafted on error.
  virtual Result<std::vector<DraftOutput>> draft(std::span<const DraftSeq> batch,
                                                 std::span<const uint64_t> forget);
};

// True when a device of this kind holds the calling thread for the length of a pass (cpu,
// rbln): its executor gets a thread of its own. False for sim, whose passes cost only host
// work (the modelled time is StepOutput::ready_at): its executor runs on the node's shared
// CAF workers and saves the two thread wake-ups per step.
bool holds_thread(config::DeviceKind kind);

// Builds a device of spec.kind. Errors: not_found (model path missing), invalid (bad model
// file, bad spec), unimplemented (kind not built in). Throws nothing.
Result<std::unique_ptr<Device>> make_device(const DeviceSpec& spec);

}  // namespace tandem::devices
