#include "devices/sim/sim_model.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <sstream>

namespace tandem::devices::sim {
namespace {

Error bad(const std::string& name, double value, const char* range) {
  std::ostringstream out;
  out << "sim: " << name << " = " << value << " is outside " << range;
  return make_error(ErrorKind::invalid, out.str());
}

bool fraction(double v) { return std::isfinite(v) && v > 0.0 && v <= 1.0; }
bool positive(double v) { return std::isfinite(v) && v > 0.0; }

double unit_from(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

void store_le(std::byte* dst, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) dst[i] = static_cast<std::byte>((value >> (8 * i)) & 0xff);
}

// One field of the map: its name and how to store the parsed value into the params.
struct Field {
  const char* name;
  bool integer;
  std::function<void(SimParams&, double)> set;
};

std::vector<Field> fields() {
  auto u32 = [](uint32_t SimParams::*m) {
    return [m](SimParams& p, double v) { p.*m = static_cast<uint32_t>(v); };
  };
  auto f64 = [](double SimParams::*m) { return [m](SimParams& p, double v) { p.*m = v; }; };
  auto i32 = [](int32_t SimParams::*m) {
    return [m](SimParams& p, double v) { p.*m = static_cast<int32_t>(v); };
  };
  return {
      {"npu_count", true, u32(&SimParams::npu_count)},
      {"dp_ep", true,
       [](SimParams& p, double v) {
         p.parallel = v != 0 ? ParallelMode::dp_ep : ParallelMode::pp;
       }},
      {"peak_flops", false, f64(&SimParams::peak_flops)},
      {"hbm_bytes_per_s", false, f64(&SimParams::hbm_bytes_per_s)},
      {"hbm_bytes", false, f64(&SimParams::hbm_bytes)},
      {"active_params", false, f64(&SimParams::active_params)},
      {"total_params", false, f64(&SimParams::total_params)},
      {"weight_bytes_per_param", false, f64(&SimParams::weight_bytes_per_param)},
      {"layers", true, u32(&SimParams::layers)},
      {"heads", true, u32(&SimParams::heads)},
      {"kv_heads", true, u32(&SimParams::kv_heads)},
      {"head_dim", true, u32(&SimParams::head_dim)},
      {"kv_bytes_per_token", false, f64(&SimParams::kv_bytes_per_token)},
      {"prefill_mfu", false, f64(&SimParams::prefill_mfu)},
      {"decode_hbm_efficiency", false, f64(&SimParams::decode_hbm_efficiency)},
      {"step_overhead_us", false, f64(&SimParams::step_overhead_us)},
      {"prefill_chunk_tokens", true, u32(&SimParams::prefill_chunk_tokens)},
      {"kv_memory_fraction", false, f64(&SimParams::kv_memory_fraction)},
      {"time_factor", false, f64(&SimParams::time_factor)},
      {"kv_scale", false, f64(&SimParams::kv_scale)},
      {"copy_probability", false, f64(&SimParams::copy_probability)},
      {"output_tokens_mean", false, f64(&SimParams::output_tokens_mean)},
      {"output_tokens_sigma", false, f64(&SimParams::output_tokens_sigma)},
      {"output_tokens_max", true, u32(&SimParams::output_tokens_max)},
      {"reasoning_share", false, f64(&SimParams::reasoning_share)},
      {"vocab", true, u32(&SimParams::vocab)},
      {"bos_id", true, i32(&SimParams::bos_id)},
      {"eos_id", true, i32(&SimParams::eos_id)},
      {"max_position", true, u32(&SimParams::max_position)},
  };
}

}  // namespace

Status SimParams::validate() const {
  if (npu_count < 1 || npu_count > 1024) return bad("npu_count", npu_count, "[1, 1024]");
  if (!positive(peak_flops)) return bad("peak_flops", peak_flops, "(0, inf)");
  if (!positive(hbm_bytes_per_s)) return bad("hbm_bytes_per_s", hbm_bytes_per_s, "(0, inf)");
  if (!positive(hbm_bytes)) return bad("hbm_bytes", hbm_bytes, "(0, inf)");
  if (!positive(active_params)) return bad("active_params", active_params, "(0, inf)");
  if (!positive(total_params) || total_params < active_params) {
    return bad("total_params", total_params, "[active_params, inf)");
  }
  if (!positive(weight_bytes_per_param)) {
    return bad("weight_bytes_per_param", weight_bytes_per_param, "(0, inf)");
  }
  if (layers < 1) return bad("layers", layers, "[1, inf)");
  if (heads < 1) return bad("heads", heads, "[1, inf)");
  if (kv_heads < 1 || heads % kv_heads != 0) {
    return bad("kv_heads", kv_heads, "the divisors of heads");
  }
  if (head_dim < 1) return bad("head_dim", head_dim, "[1, inf)");
  if (!positive(kv_bytes_per_token)) {
    return bad("kv_bytes_per_token", kv_bytes_per_token, "(0, inf)");
  }
  if (!fraction(prefill_mfu)) return bad("prefill_mfu", prefill_mfu, "(0, 1]");
  if (!fraction(decode_hbm_efficiency)) {
    return bad("decode_hbm_efficiency", decode_hbm_efficiency, "(0, 1]");
  }
  if (!std::isfinite(step_overhead_us) || step_overhead_us < 0) {
    return bad("step_overhead_us", step_overhead_us, "[0, inf)");
  }
  if (prefill_chunk_tokens < 1) {
    return bad("prefill_chunk_tokens", prefill_chunk_tokens, "[1, inf)");
  }
  if (!fraction(kv_memory_fraction)) {
    return bad("kv_memory_fraction", kv_memory_fraction, "(0, 1]");
  }
  if (!std::isfinite(time_factor) || time_factor < 0 || time_factor > 1000) {
    return bad("time_factor", time_factor, "[0, 1000]");
  }
  if (!std::isfinite(kv_scale) || kv_scale < 1.0 / 128 || kv_scale > 1) {
    return bad("kv_scale", kv_scale, "[1/128, 1]");
  }
  if (!std::isfinite(copy_probability) || copy_probability < 0 || copy_probability > 1) {
    return bad("copy_probability", copy_probability, "[0, 1]");
  }
  if (!std::isfinite(output_tokens_mean) || output_tokens_mean < 1) {
    return bad("output_tokens_mean", output_tokens_mean, "[1, inf)");
  }
  if (!std::isfinite(output_tokens_sigma) || output_tokens_sigma < 0 || output_tokens_sigma > 4) {
    return bad("output_tokens_sigma", output_tokens_sigma, "[0, 4]");
  }
  if (output_tokens_max < 1) return bad("output_tokens_max", output_tokens_max, "[1, inf)");
  if (!std::isfinite(reasoning_share) || reasoning_share < 0 || reasoning_share > 1) {
    return bad("reasoning_share", reasoning_share, "[0, 1]");
  }
  if (vocab < 2) return bad("vocab", vocab, "[2, inf)");
  if (bos_id < 0 || static_cast<uint32_t>(bos_id) >= vocab) {
    return bad("bos_id", bos_id, "[0, vocab)");
  }
  if (eos_id < 0 || static_cast<uint32_t>(eos_id) >= vocab) {
    return bad("eos_id", eos_id, "[0, vocab)");
  }
  if (max_position < 2) return bad("max_position", max_position, "[2, inf)");
  return {};
}

Result<SimParams> params_from_map(const devices::SimParams& map) {
  SimParams params;
  const std::vector<Field> known = fields();
  for (const auto& [key, value] : map) {
    const std::string& name = key;  // clang 14 cannot capture a structured binding
    auto it = std::find_if(known.begin(), known.end(),
                           [&name](const Field& f) { return name == f.name; });
    if (it == known.end()) {
      return make_error(ErrorKind::invalid, "sim: unknown parameter '" + key + "'");
    }
    bool integral = value == std::floor(value) && value >= -2147483648.0 && value <= 4294967295.0;
    if (!std::isfinite(value) || (it->integer && !integral)) {
      return bad(key, value, "the integers");
    }
    if (it->integer && value < 0 && key != "bos_id" && key != "eos_id") {
      return bad(key, value, "[0, inf)");
    }
    it->set(params, value);
  }
  if (Status s = params.validate(); !s) return s.error();
  return params;
}

// ---- timing -------------------------------------------------------------------------

double pass_flops(const SimParams& p, SeqShape seq) {
  RT_ASSERT(seq.new_tokens > 0, "pass_flops: no new tokens");
  double n = seq.new_tokens, c = seq.context_tokens;
  double weights = 2.0 * p.active_params * n;
  double attention = 4.0 * p.layers * p.heads * p.head_dim * (n * c + n * (n + 1) / 2);
  RT_ASSERT(weights > 0 && attention > 0, "pass_flops: params must be valid");
  return weights + attention;
}

namespace {

struct BatchCost {
  double flops = 0;
  double kv_bytes = 0;
  double chunks = 0;
};

BatchCost batch_cost(const SimParams& p, std::span<const SeqShape> batch) {
  RT_ASSERT(!batch.empty(), "sim timing: empty batch");
  BatchCost cost;
  for (const SeqShape& s : batch) {
    RT_ASSERT(s.new_tokens > 0, "sim timing: a sequence with no new tokens");
    cost.flops += pass_flops(p, s);
    cost.kv_bytes += p.kv_bytes_per_token * (static_cast<double>(s.context_tokens) + s.new_tokens);
    cost.chunks += std::ceil(static_cast<double>(s.new_tokens) / p.prefill_chunk_tokens);
  }
  RT_ASSERT(cost.flops > 0 && cost.chunks >= 1, "sim timing: no work");
  return cost;
}

// Roofline on `npus` NPUs working together.
double roofline_s(const SimParams& p, double flops, double bytes, double npus) {
  double compute = flops / (p.peak_flops * npus * p.prefill_mfu);
  double memory = bytes / (p.hbm_bytes_per_s * npus * p.decode_hbm_efficiency);
  return std::max(compute, memory);
}

}  // namespace

double prefill_time_s(const SimParams& p, std::span<const SeqShape> batch) {
  BatchCost c = batch_cost(p, batch);
  double weight_bytes = p.active_params * p.weight_bytes_per_param;
  double n = p.npu_count, overhead = p.step_overhead_us * 1e-6;
  double t;
  if (p.parallel == ParallelMode::dp_ep) {
    t = roofline_s(p, c.flops, weight_bytes + c.kv_bytes, n);
  } else {
    // Pipeline: the C chunks flow through N stages; one NPU alone would take t1.
    double t1 = roofline_s(p, c.flops, weight_bytes * c.chunks + c.kv_bytes, 1);
    t = t1 * (c.chunks + n - 1) / (c.chunks * n);
  }
  RT_ASSERT(t > 0 && std::isfinite(t), "prefill time", t);
  return t + overhead;
}

double decode_step_time_s(const SimParams& p, std::span<const SeqShape> batch) {
  BatchCost c = batch_cost(p, batch);
  double weight_bytes = p.active_params * p.weight_bytes_per_param;
  // pp: the step's batch crosses the stages one after another (one NPU busy at a time);
  // dp_ep: the batch and the experts spread over all NPUs.
  double npus = p.parallel == ParallelMode::dp_ep ? p.npu_count : 1.0;
  double t = roofline_s(p, c.flops, weight_bytes + c.kv_bytes, npus);
  RT_ASSERT(t > 0 && std::isfinite(t), "decode time", t);
  return t + p.step_overhead_us * 1e-6;
}

double kv_capacity_tokens(const SimParams& p) {
  double free_bytes = p.hbm_bytes * p.npu_count - p.total_params * p.weight_bytes_per_param;
  return std::max(0.0, free_bytes * p.kv_memory_fraction / p.kv_bytes_per_token);
}

// ---- tokens -------------------------------------------------------------------------

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t context_hash(uint64_t prev_hash, int32_t token, uint32_t position) {
  uint64_t tp = (static_cast<uint64_t>(static_cast<uint32_t>(token)) << 32) | position;
  return mix64(prev_hash ^ mix64(tp));
}

uint32_t output_length_tokens(const SimParams& p, uint64_t seed, uint64_t prompt_hash) {
  RT_ASSERT(p.output_tokens_mean >= 1 && p.output_tokens_max >= 1, "output length params");
  double length = p.output_tokens_mean;
  if (p.output_tokens_sigma > 0) {
    uint64_t h = mix64(seed ^ mix64(prompt_hash ^ 0x6c656e677468ULL));
    double u1 = std::max(unit_from(h), 0x1.0p-53), u2 = unit_from(mix64(h));
    double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);  // Box-Muller
    double sigma = p.output_tokens_sigma;
    double mu = std::log(p.output_tokens_mean) - sigma * sigma / 2;  // so E[length] = mean
    length = std::exp(mu + sigma * z);
  }
  RT_ASSERT(std::isfinite(length), "output length", length);
  return static_cast<uint32_t>(std::clamp(std::round(length), 1.0, double(p.output_tokens_max)));
}

NextToken next_token(const SimParams& p, uint64_t seed, std::span<const int32_t> context,
                     std::span<const uint64_t> context_hashes, uint32_t prompt_tokens) {
  RT_ASSERT(!context.empty() && context.size() == context_hashes.size(), "next_token context");
  RT_ASSERT(prompt_tokens >= 1 && prompt_tokens <= context.size(), "prompt_tokens",
            prompt_tokens, context.size());
  const size_t n = context.size();
  NextToken out;
  uint32_t generated = static_cast<uint32_t>(n - prompt_tokens);  // before this one
  if (generated + 1 >= output_length_tokens(p, seed, context_hashes[prompt_tokens - 1])) {
    out.token = p.eos_id;
    out.end = true;
    return out;
  }
  uint64_t h = mix64(seed ^ context_hashes[n - 1]);
  if (n >= 2 && unit_from(h) < p.copy_probability) {
    // Continue the span after the latest earlier occurrence of the last token; with none,
    // start a span at a position picked from the context.
    size_t j = n - 1;
    while (j > 0 && context[j - 1] != context[n - 1]) --j;
    size_t from = j > 0 ? j : static_cast<size_t>(mix64(h) % (n - 1));
    out.token = context[from];
    out.copied = true;
  } else {
    out.token = static_cast<int32_t>(mix64(h ^ 0x72616e64ULL) % p.vocab);
  }
  // Neither eos nor bos comes from a copy or a draw: eos only ends the output (rule 1),
  // and decode treats bos as a stop token (llama2.c models end a story with it).
  for (int i = 0; i < 2 && (out.token == p.eos_id || out.token == p.bos_id); ++i) {
    out.token = static_cast<int32_t>((out.token + 1) % p.vocab);
  }
  RT_ASSERT(out.token >= 0 && static_cast<uint32_t>(out.token) < p.vocab, "token range");
  return out;
}

namespace {

// `candidate` after `context` would end `sequence`.
bool completes(std::span<const int32_t> sequence, std::span<const int32_t> context,
               int32_t candidate) {
  RT_ASSERT(!sequence.empty(), "empty marker sequence");
  if (sequence.back() != candidate || sequence.size() - 1 > context.size()) return false;
  return std::equal(sequence.begin(), sequence.end() - 1,
                    context.end() - static_cast<ptrdiff_t>(sequence.size() - 1));
}

bool forbidden(const SimParams& p, const SimMarkup& markup, std::span<const int32_t> context,
               int32_t candidate) {
  if (candidate == p.eos_id || candidate == p.bos_id) return true;
  for (const auto& sequence : markup.banned) {
    if (completes(sequence, context, candidate)) return true;
  }
  for (const auto* marker : {&markup.reasoning_open, &markup.reasoning_close}) {
    if (!marker->empty() && completes(*marker, context, candidate)) return true;
  }
  return false;
}

NextToken marker_token(int32_t token) {
  NextToken out;
  out.token = token;
  return out;
}

}  // namespace

NextToken next_output_token(const SimParams& p, uint64_t seed, const SimMarkup& markup,
                            std::span<const int32_t> context,
                            std::span<const uint64_t> context_hashes, uint32_t prompt_tokens) {
  NextToken out = next_token(p, seed, context, context_hashes, prompt_tokens);
  if (out.end) return out;
  const auto generated = static_cast<uint32_t>(context.size() - prompt_tokens);
  const auto& open = markup.reasoning_open;
  const auto& close = markup.reasoning_close;
  if (!close.empty()) {
    uint32_t length = output_length_tokens(p, seed, context_hashes[prompt_tokens - 1]);
    RT_ASSERT(length >= 1 && generated + 1 < length, "eos is handled by next_token");
    auto reasoning = static_cast<uint32_t>(std::round(p.reasoning_share * (length - 1)));
    auto close_at = static_cast<uint32_t>(open.size()) + reasoning;
    if (generated < open.size()) return marker_token(open[generated]);
    if (generated >= close_at && generated - close_at < close.size()) {
      return marker_token(close[generated - close_at]);
    }
  }
  for (uint32_t tries = 0; tries < p.vocab && forbidden(p, markup, context, out.token); ++tries) {
    out.token = static_cast<int32_t>((static_cast<uint32_t>(out.token) + 1) % p.vocab);
    out.copied = false;
  }
  RT_ASSERT(!forbidden(p, markup, context, out.token), "no allowed token", out.token);
  return out;
}

Status validate_markup(const SimParams& p, const SimMarkup& markup) {
  auto check_ids = [&p](const std::vector<int32_t>& ids, const std::string& what) -> Status {
    for (int32_t id : ids) {
      if (id < 0 || static_cast<uint32_t>(id) >= p.vocab) {
        return make_error(ErrorKind::invalid, "sim: " + what + " token " + std::to_string(id) +
                                                  " is outside [0, vocab " +
                                                  std::to_string(p.vocab) + ")");
      }
    }
    return {};
  };
  if (!markup.reasoning_open.empty() && markup.reasoning_close.empty()) {
    return make_error(ErrorKind::invalid, "sim: a reasoning opening marker without a closing one");
  }
  if (Status s = check_ids(markup.reasoning_open, "reasoning opening marker"); !s) return s;
  if (Status s = check_ids(markup.reasoning_close, "reasoning closing marker"); !s) return s;
  size_t single_count = 2;  // eos and bos are never drawn
  for (const auto& sequence : markup.banned) {
    if (sequence.empty()) return make_error(ErrorKind::invalid, "sim: an empty banned sequence");
    if (Status s = check_ids(sequence, "banned"); !s) return s;
    single_count += sequence.size() == 1 ? 1 : 0;
  }
  single_count += markup.reasoning_open.size() == 1 ? 1 : 0;
  single_count += markup.reasoning_close.size() == 1 ? 1 : 0;
  if (single_count >= p.vocab) {
    return make_error(ErrorKind::invalid, "sim: the banned tokens leave no token to draw");
  }
  return {};
}

// ---- KV contents --------------------------------------------------------------------

KvLayout sim_kv_layout(const SimParams& p, uint32_t block_tokens, uint32_t blocks_total) {
  KvLayout layout;
  layout.block_tokens = block_tokens;
  layout.blocks_total = blocks_total;
  layout.layers = p.layers;
  layout.kv_heads = p.kv_heads;
  layout.head_dim = std::max(1u, static_cast<uint32_t>(std::lround(p.head_dim * p.kv_scale)));
  layout.element_bytes = 1;
  if (layout.kv_heads * layout.head_dim < 8) layout.head_dim = (8 + p.kv_heads - 1) / p.kv_heads;
  RT_ASSERT(layout.kv_heads * layout.head_dim >= 8, "a sim KV row holds at least 8 bytes");
  return layout;
}

uint64_t row_salt(uint32_t layer, KvPart part) {
  return mix64((uint64_t{layer} << 1) | static_cast<uint32_t>(part));
}

void fill_row(std::span<std::byte> row, uint64_t hash, int32_t token, uint32_t position,
              uint32_t layer, KvPart part) {
  fill_row_salted(row, hash, token, position, layer, part, row_salt(layer, part));
}

void fill_row_salted(std::span<std::byte> row, uint64_t hash, int32_t token, uint32_t position,
                     uint32_t layer, KvPart part, uint64_t salt) {
  RT_ASSERT(row.size() >= 8, "sim KV row too small", row.size());
  uint64_t state = mix64(hash ^ salt);
  if (state == 0) state = 1;
  size_t i = 0;
  static_assert(std::endian::native == std::endian::little, "rows are little-endian");
  for (; i + 8 <= row.size(); i += 8) {
    state ^= state >> 12;  // xorshift64*
    state ^= state << 25;
    state ^= state >> 27;
    uint64_t word = state * 0x2545f4914f6cdd1dULL;
    std::memcpy(row.data() + i, &word, 8);
  }
  if (i < row.size()) std::memset(row.data() + i, 0xa5, row.size() - i);
  if (layer == 0 && part == KvPart::k) {
    store_le(row.data(), static_cast<uint32_t>(token), 4);
    store_le(row.data() + 4, position, 4);
  } else if (layer == 0) {
    store_le(row.data(), hash, 8);
  }
}

std::vector<std::byte> expected_block_bytes(const KvLayout& layout,
                                            std::span<const int32_t> tokens,
                                            uint32_t block_in_seq) {
  RT_ASSERT(layout.block_tokens > 0, "layout without block_tokens");
  std::vector<std::byte> block(layout.block_bytes(), std::byte{0});
  uint64_t row_bytes = uint64_t{layout.kv_heads} * layout.head_dim * layout.element_bytes;
  uint64_t h = context_hash_root;
  for (uint32_t pos = 0; pos < tokens.size(); ++pos) {
    h = context_hash(h, tokens[pos], pos);
    if (pos / layout.block_tokens != block_in_seq) continue;
    uint32_t slot = pos % layout.block_tokens;
    for (uint32_t l = 0; l < layout.layers; ++l) {
      for (KvPart part : {KvPart::k, KvPart::v}) {
        uint64_t off = layout.slot_offset_bytes(0, l, part, slot);
        fill_row(std::span(block).subspan(off, row_bytes), h, tokens[pos], pos, l, part);
      }
    }
  }
  return block;
}

}  // namespace tandem::devices::sim
