// tandem/devices/sim: the pure model behind the `sim` device. No threads, clocks or I/O.
//
// Three things, each a pure function so the device, the tests and the cluster simulator
// share them (formulas: docs/sim-device.md):
//   - timing: how long one serving instance (npu_count Rebel100s running MiniMax-M2.7)
//     takes for a prefill pass or a decode step of a given batch shape;
//   - tokens: which token a sequence produces next, from (seed, its own context);
//   - KV contents: the bytes a KV row holds, from the context hash at its position.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "devices/device.hpp"
#include "runtime/base/result.hpp"

namespace tandem::devices::sim {

enum class ParallelMode { pp, dp_ep };  // pipeline stages | data parallel + expert parallel

// Every knob of the sim device. Defaults are DESIGN.md's facts (Rebel100, MiniMax-M2.7).
// Map keys (DeviceSpec::sim, later the manifest) are the field names; `dp_ep` is 0 or 1.
struct SimParams {
  uint32_t npu_count = 4;
  ParallelMode parallel = ParallelMode::pp;
  double peak_flops = 2e15;            // per NPU, fp8 dense, FLOP/s
  double hbm_bytes_per_s = 4.8e12;     // per NPU
  double hbm_bytes = 144e9;            // per NPU
  double active_params = 10e9;         // per token
  double total_params = 229e9;
  double weight_bytes_per_param = 1;   // fp8
  uint32_t layers = 62;
  uint32_t heads = 48;                 // query heads (attention FLOPs)
  uint32_t kv_heads = 8;
  uint32_t head_dim = 128;
  double kv_bytes_per_token = 126976;  // 62 layers * 8 kv heads * 128 * 2 (K, V) * 1 byte
  double prefill_mfu = 0.4;            // achieved / peak FLOP/s, (0, 1]
  double decode_hbm_efficiency = 0.7;  // achieved / peak HBM bandwidth, (0, 1]
  double step_overhead_us = 100;       // fixed cost per prefill pass or decode step
  uint32_t prefill_chunk_tokens = 512; // pp: prefill moves through the stages in chunks
  double kv_memory_fraction = 0.9;     // of HBM left after weights that holds KV, (0, 1]
  double time_factor = 0;              // device sleeps modelled time * this; 0 = no sleep
  double kv_scale = 1;                 // pool row bytes = real row bytes * scale, [1/128, 1]
  double copy_probability = 0.5;       // [0, 1]: next token continues a copied span
  double output_tokens_mean = 1000;    // output length (incl. eos), tokens
  double output_tokens_sigma = 0.5;    // lognormal sigma; 0 = every output is the mean
  uint32_t output_tokens_max = 16384;
  // [0, 1]: with a reasoning format (SimMarkup), the share of an output's tokens (before eos)
  // written as reasoning before the closing marker; 1 = the output never leaves reasoning.
  double reasoning_share = 0.3;
  uint32_t vocab = 200064;
  int32_t bos_id = 200019;
  int32_t eos_id = 200020;
  uint32_t max_position = 204800;

  // invalid naming the field and its allowed range.
  Status validate() const;
};

// Builds params from DeviceSpec::sim (missing keys keep their defaults). Errors (invalid):
// an unknown key (named), a non-integer where an integer is needed, then validate()'s.
Result<SimParams> params_from_map(const devices::SimParams& map);

// ---- timing -------------------------------------------------------------------------
// One sequence in a pass: context_tokens already in KV, new_tokens computed now.
struct SeqShape {
  uint32_t context_tokens = 0;
  uint32_t new_tokens = 0;
};

// FLOPs of one sequence's pass: weights 2 * active_params * n, plus attention
// 4 * layers * heads * head_dim * (n * c + n (n + 1) / 2).
double pass_flops(const SimParams& params, SeqShape seq);
// Seconds for one prefill pass / one decode step of the batch (roofline + overhead; see
// docs/sim-device.md). Precondition (asserted): batch not empty, params valid.
double prefill_time_s(const SimParams& params, std::span<const SeqShape> batch);
double decode_step_time_s(const SimParams& params, std::span<const SeqShape> batch);
// KV tokens the instance's HBM holds after the weights.
double kv_capacity_tokens(const SimParams& params);

// ---- tokens -------------------------------------------------------------------------
uint64_t mix64(uint64_t x);  // splitmix64 finalizer
// Context hash chain: h(p) = context_hash(h(p - 1), token(p), p); h(-1) = context_hash_root.
inline constexpr uint64_t context_hash_root = 0x7a6e64656d73696dULL;
uint64_t context_hash(uint64_t prev_hash, int32_t token, uint32_t position);

struct NextToken {
  int32_t token = 0;
  bool copied = false;  // continued/started a span copied from the context
  bool end = false;     // token is eos: the output reached its length
};
// Output length (tokens, incl. eos) of a sequence whose prompt ends with hash prompt_hash.
uint32_t output_length_tokens(const SimParams& params, uint64_t seed, uint64_t prompt_hash);
// The token at position context.size(). context_hashes[i] = h(i) of context (same size).
// prompt_tokens: how many leading context tokens are prompt (>= 1, <= context.size()).
// Pure: same arguments -> same token. Cost: O(context) (a backward scan for the copy).
NextToken next_token(const SimParams& params, uint64_t seed, std::span<const int32_t> context,
                     std::span<const uint64_t> context_hashes, uint32_t prompt_tokens);

// next_token() inside a chat format's markup: the output starts with markup.reasoning_open,
// ends its reasoning with markup.reasoning_close after round(reasoning_share * (L - 1))
// further tokens (L = output_length_tokens, eos included), and is text after that. A drawn or
// copied token that would complete a banned sequence or a reasoning marker is replaced (the
// next id that does not, nor is eos or bos). Precondition (asserted): ids in markup are in
// [0, vocab) and single-token bans leave at least one other id. Same purity and cost as
// next_token, plus O(banned tokens).
NextToken next_output_token(const SimParams& params, uint64_t seed, const SimMarkup& markup,
                            std::span<const int32_t> context,
                            std::span<const uint64_t> context_hashes, uint32_t prompt_tokens);
// invalid naming the problem: an id outside [0, vocab), an empty banned sequence, an opening
// marker without a closing one, bans that leave no id to draw.
Status validate_markup(const SimParams& params, const SimMarkup& markup);

// ---- KV contents --------------------------------------------------------------------
// The pool's layout for these params: layers, kv_heads as modelled, element_bytes 1,
// head_dim = max(1, round(head_dim * kv_scale)) so a row is >= 8 bytes.
KvLayout sim_kv_layout(const SimParams& params, uint32_t block_tokens, uint32_t blocks_total);

// Fills one row (one position, one layer, K or V; layout.kv_heads * head_dim bytes) with a
// xorshift64* stream seeded by (hash, layer, part). Then stamps the row of layer 0: K starts
// with token (int32 LE) and position (uint32 LE), V with hash (uint64 LE), so the device
// reads a sequence's context back from its blocks (e.g. blocks pulled from another device).
void fill_row(std::span<std::byte> row, uint64_t hash, int32_t token, uint32_t position,
              uint32_t layer, KvPart part);
// The same bytes, with the (layer, part) part of the seed given: salt = row_salt(layer, part).
// For writers that fill every row of a position (the device precomputes the salts).
uint64_t row_salt(uint32_t layer, KvPart part);
void fill_row_salted(std::span<std::byte> row, uint64_t hash, int32_t token, uint32_t position,
                     uint32_t layer, KvPart part, uint64_t salt);
// What block `block_in_seq` of a sequence holds after its tokens were written: slots past the
// end of `tokens` are zero (a fresh pool). For tests: compare with copy_blocks_out bytes.
std::vector<std::byte> expected_block_bytes(const KvLayout& layout,
                                            std::span<const int32_t> tokens,
                                            uint32_t block_in_seq);

}  // namespace tandem::devices::sim
