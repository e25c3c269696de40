#include "devices/sim/sim_device.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <unordered_set>

namespace tandem::devices::sim {
namespace {

Error invalid(std::string message) { return make_error(ErrorKind::invalid, "sim: " + message); }

uint64_t load_le(const std::byte* src, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(src[i]) << (8 * i);
  return v;
}

ModelConfig minimax_shape(const SimParams& p) {
  ModelConfig m;
  m.arch = Arch::minimax_m2;
  m.vocab_size = p.vocab;
  m.hidden = 3072;
  m.layers = p.layers;
  m.heads = p.heads;
  m.kv_heads = p.kv_heads;
  m.head_dim = p.head_dim;
  m.intermediate = 1536;
  m.rope_theta = 5e6f;
  m.rotary_dim = std::min(64u, p.head_dim - p.head_dim % 2);
  m.rms_eps = 1e-6f;
  m.qk_norm = true;
  m.experts = 256;
  m.experts_per_token = 8;
  m.moe_intermediate = 1536;
  m.router_bias = true;
  m.max_position = p.max_position;
  m.bos_id = p.bos_id;
  m.eos_id = p.eos_id;
  m.weight_dtype = DType::f8_e4m3;
  return m;
}

}  // namespace

Result<std::unique_ptr<PageBuffer>> PageBuffer::create(uint64_t length_bytes) {
  if (length_bytes == 0) return invalid("KV pool of 0 bytes");
  void* p = mmap(nullptr, length_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return make_error(ErrorKind::failed, "sim: mmap of " + std::to_string(length_bytes) +
                                             " bytes for the KV pool: " + std::strerror(errno));
  }
  return std::make_unique<PageBuffer>(Key{}, static_cast<std::byte*>(p), length_bytes);
}

PageBuffer::~PageBuffer() { munmap(base_, length_bytes_); }

Result<std::unique_ptr<SimDevice>> SimDevice::create(const DeviceSpec& spec) {
  if (spec.kind != config::DeviceKind::sim) return invalid("DeviceSpec.kind is not sim");
  auto params = params_from_map(spec.sim);
  if (!params) return params.error();
  if (spec.block_tokens == 0) return invalid("block_tokens = 0 is outside [1, inf)");
  KvLayout layout = sim_kv_layout(*params, spec.block_tokens, 0);
  uint64_t blocks = spec.blocks_total;
  if (blocks == 0) blocks = spec.kv_bytes_max / layout.block_bytes();
  if (blocks == 0) {
    return invalid("no KV pool size: set blocks_total, or kv_bytes_max >= one block (" +
                   std::to_string(layout.block_bytes()) + " bytes)");
  }
  double capacity = kv_capacity_tokens(*params);
  if (static_cast<double>(blocks) * spec.block_tokens > capacity || blocks > UINT32_MAX) {
    return invalid("a pool of " + std::to_string(blocks) + " blocks of " +
                   std::to_string(spec.block_tokens) + " tokens exceeds the modelled HBM (" +
                   std::to_string(static_cast<uint64_t>(capacity)) + " KV tokens)");
  }
  if (Status st = validate_markup(*params, spec.sim_markup); !st) return st.error();
  layout.blocks_total = static_cast<uint32_t>(blocks);
  auto pool = PageBuffer::create(layout.pool_bytes());
  if (!pool) return pool.error();
  auto device = std::make_unique<SimDevice>(Key{}, *params, spec.seed, spec.sim_markup, layout,
                                            std::move(pool).value());
  device->clock_ = spec.clock;
  return device;
}

SimDevice::SimDevice(Key, SimParams params, uint64_t seed, SimMarkup markup, KvLayout layout,
                     std::unique_ptr<PageBuffer> pool)
    : params_(std::move(params)), seed_(seed), markup_(std::move(markup)),
      model_(minimax_shape(params_)), layout_(layout), pool_(std::move(pool)) {
  RT_ASSERT(params_.validate().ok(), "SimDevice: params must be valid");
  RT_ASSERT(validate_markup(params_, markup_).ok(), "SimDevice: markup must be valid");
  RT_ASSERT(pool_ && pool_->size() == layout_.pool_bytes(), "SimDevice: pool size");
  RT_ASSERT(model_.validate().ok(), "SimDevice: model shape",
            model_.validate().ok() ? "" : model_.validate().error().message);
  for (uint32_t l = 0; l < layout_.layers; ++l) {
    for (KvPart part : {KvPart::k, KvPart::v}) row_salts_.push_back(row_salt(l, part));
  }
}

Status SimDevice::validate_batch(std::span<const Pass> batch) const {
  if (batch.empty()) return invalid("empty batch");
  // Seq ids must be distinct: sorted copy first (one allocation), the set only to name one.
  std::vector<uint64_t> sorted_ids;
  sorted_ids.reserve(batch.size());
  for (const Pass& p : batch) sorted_ids.push_back(p.seq_id);
  std::sort(sorted_ids.begin(), sorted_ids.end());
  bool repeated = std::adjacent_find(sorted_ids.begin(), sorted_ids.end()) != sorted_ids.end();
  std::unordered_set<uint64_t> ids;
  for (size_t b = 0; b < batch.size(); ++b) {
    const Pass& p = batch[b];
    auto where = [&] {
      return "batch[" + std::to_string(b) + "] (seq " + std::to_string(p.seq_id) + ")";
    };
    if (repeated && !ids.insert(p.seq_id).second) {
      return invalid(where() + ": seq_id appears twice");
    }
    if (p.tokens.empty()) return invalid(where() + ": no tokens");
    for (size_t i = 0; i < p.tokens.size(); ++i) {
      if (p.tokens[i] < 0 || static_cast<uint32_t>(p.tokens[i]) >= params_.vocab) {
        return invalid(where() + ": tokens[" + std::to_string(i) + "] = " +
                       std::to_string(p.tokens[i]) + " is outside [0, " +
                       std::to_string(params_.vocab) + ")");
      }
    }
    uint64_t end = uint64_t{p.start_pos} + p.tokens.size();
    if (end > params_.max_position) {
      return invalid(where() + ": positions up to " + std::to_string(end) +
                     " exceed max_position " + std::to_string(params_.max_position));
    }
    uint64_t blocks_needed = (end + layout_.block_tokens - 1) / layout_.block_tokens;
    if (p.block_table.size() < blocks_needed) {
      return invalid(where() + ": block table has " + std::to_string(p.block_table.size()) +
                     " blocks, " + std::to_string(blocks_needed) + " needed");
    }
    for (size_t i = 0; i < blocks_needed; ++i) {
      if (p.block_table[i] >= layout_.blocks_total) {
        return invalid(where() + ": block_table[" + std::to_string(i) + "] = " +
                       std::to_string(p.block_table[i]) + " is outside [0, " +
                       std::to_string(layout_.blocks_total) + ")");
      }
    }
  }
  return {};
}

Status SimDevice::rebuild_context(const Pass& pass, SeqState& state) const {
  state.tokens.clear();
  state.hashes.clear();
  uint64_t h = context_hash_root;
  for (uint32_t pos = 0; pos < pass.start_pos; ++pos) {
    uint32_t block = pass.block_table[pos / layout_.block_tokens];
    uint32_t slot = pos % layout_.block_tokens;
    const std::byte* k = pool_->data() + layout_.slot_offset_bytes(block, 0, KvPart::k, slot);
    const std::byte* v = pool_->data() + layout_.slot_offset_bytes(block, 0, KvPart::v, slot);
    auto token = static_cast<int32_t>(load_le(k, 4));
    h = context_hash(h, token, pos);
    if (load_le(k + 4, 4) != pos || load_le(v, 8) != h) {
      return make_error(ErrorKind::failed,
                        "sim: seq " + std::to_string(pass.seq_id) + ": KV at position " +
                            std::to_string(pos) + " (block " + std::to_string(block) +
                            ") is not this context's (never written, or overwritten)");
    }
    state.tokens.push_back(token);
    state.hashes.push_back(h);
  }
  RT_ASSERT(state.tokens.size() == pass.start_pos, "rebuilt context size");
  return {};
}

Result<SimDevice::SeqState*> SimDevice::load_context(const Pass& pass) {
  auto it = seqs_.find(pass.seq_id);
  if (it == seqs_.end()) {
    evict_if_full();
    it = seqs_.emplace(pass.seq_id, SeqState{}).first;
  }
  SeqState& state = it->second;
  state.last_used = pass_count_;
  uint32_t s = pass.start_pos;
  bool cached = s == 0 || state.tokens.size() >= s;
  if (cached && s > 0) {
    // The cache is trusted only while the pool still holds what it says at position s - 1.
    uint32_t block = pass.block_table[(s - 1) / layout_.block_tokens];
    uint32_t slot = (s - 1) % layout_.block_tokens;
    const std::byte* k = pool_->data() + layout_.slot_offset_bytes(block, 0, KvPart::k, slot);
    const std::byte* v = pool_->data() + layout_.slot_offset_bytes(block, 0, KvPart::v, slot);
    cached = static_cast<int32_t>(load_le(k, 4)) == state.tokens[s - 1] &&
             load_le(k + 4, 4) == s - 1 && load_le(v, 8) == state.hashes[s - 1];
  }
  if (cached) {
    state.tokens.resize(s);
    state.hashes.resize(s);
  } else {
    state.prompt_tokens = 0;  // output length counts from this pass
    if (Status st = rebuild_context(pass, state); !st) {
      seqs_.erase(it);
      return st.error();
    }
  }
  if (s == 0) state.prompt_tokens = 0;
  return &state;
}

void SimDevice::write_token(const Pass& pass, SeqState& state, uint32_t index_in_pass) {
  uint32_t pos = pass.start_pos + index_in_pass;
  RT_ASSERT(state.tokens.size() == pos, "write_token out of order", state.tokens.size(), pos);
  int32_t token = pass.tokens[index_in_pass];
  uint64_t prev = pos == 0 ? context_hash_root : state.hashes.back();
  uint64_t h = context_hash(prev, token, pos);
  state.tokens.push_back(token);
  state.hashes.push_back(h);
  uint32_t block = pass.block_table[pos / layout_.block_tokens];
  uint32_t slot = pos % layout_.block_tokens;
  // Rows of one position: (layer, part) i lies i part_bytes after (layer 0, K).
  std::byte* first = pool_->data() + layout_.slot_offset_bytes(block, 0, KvPart::k, slot);
  uint64_t stride = layout_.part_bytes();
  uint64_t row_bytes = stride / layout_.block_tokens;
  for (uint32_t l = 0; l < layout_.layers; ++l) {
    for (KvPart part : {KvPart::k, KvPart::v}) {
      uint32_t i = l * 2 + static_cast<uint32_t>(part);
      fill_row_salted(std::span(first + i * stride, row_bytes), h, token, pos, l, part,
                      row_salts_[i]);
    }
  }
}

Result<StepOutput> SimDevice::run(std::span<const Pass> batch, bool is_prefill) {
  auto started = clock_ ? clock_() : std::chrono::steady_clock::now();
  if (Status st = validate_batch(batch); !st) return st.error();
  ++pass_count_;
  std::vector<SeqState*> states;
  for (const Pass& pass : batch) {
    auto state = load_context(pass);
    if (!state) return state.error();
    states.push_back(*state);
  }
  StepOutput out;
  for (size_t b = 0; b < batch.size(); ++b) {
    const Pass& pass = batch[b];
    SeqState& state = *states[b];
    SeqOutput seq{.seq_id = pass.seq_id};
    if (!is_prefill && (state.prompt_tokens == 0 || state.prompt_tokens > pass.start_pos)) {
      state.prompt_tokens = std::max(1u, pass.start_pos);
    }
    for (uint32_t i = 0; i < pass.tokens.size(); ++i) {
      write_token(pass, state, i);
      if (is_prefill) continue;
      uint32_t prompt = std::min<uint32_t>(state.prompt_tokens, state.tokens.size());
      seq.tokens.push_back(
          next_output_token(params_, seed_, markup_, state.tokens, state.hashes, prompt).token);
    }
    if (is_prefill) {
      state.prompt_tokens = static_cast<uint32_t>(state.tokens.size());
      seq.tokens.push_back(next_output_token(params_, seed_, markup_, state.tokens, state.hashes,
                                             state.prompt_tokens)
                               .token);
    }
    seq.rows_count = static_cast<uint32_t>(seq.tokens.size());
    RT_ASSERT(seq.rows_count == (is_prefill ? 1u : pass.tokens.size()), "rows_count");
    out.seqs.push_back(std::move(seq));
  }
  out.ready_at = model_time(batch, is_prefill, started);
  return out;
}

std::chrono::steady_clock::time_point SimDevice::model_time(
    std::span<const Pass> batch, bool is_prefill, std::chrono::steady_clock::time_point started) {
  std::vector<SeqShape> shapes;
  for (const Pass& p : batch) {
    shapes.push_back({p.start_pos, static_cast<uint32_t>(p.tokens.size())});
  }
  last_pass_s_ = is_prefill ? prefill_time_s(params_, shapes) : decode_step_time_s(params_, shapes);
  total_s_ += last_pass_s_;
  if (params_.time_factor <= 0) return {};
  // The modelled device runs one pass at a time: a pass asked for before the previous one's
  // end starts at that end. The host work of this pass counts toward its time.
  auto begin = std::max(started, busy_until_);
  auto wall = std::chrono::duration<double>(last_pass_s_ * params_.time_factor);
  busy_until_ = begin + std::chrono::duration_cast<std::chrono::steady_clock::duration>(wall);
  return busy_until_;
}

void SimDevice::evict_if_full() {
  if (seqs_.size() < seqs_max) return;
  auto oldest = std::min_element(seqs_.begin(), seqs_.end(), [](const auto& a, const auto& b) {
    return a.second.last_used < b.second.last_used;
  });
  RT_ASSERT(oldest->second.last_used < pass_count_, "evicting a sequence of this pass");
  seqs_.erase(oldest);
  RT_ASSERT(seqs_.size() < seqs_max, "evict_if_full");
}

Result<StepOutput> SimDevice::prefill(std::span<const PrefillSeq> batch) {
  std::vector<Pass> passes;
  for (const auto& s : batch) passes.push_back({s.seq_id, s.block_table, s.start_pos, s.tokens});
  // Nothing is written unless the whole pass is valid.
  if (Status st = check_copies(batch, layout_); !st) return st.error();
  if (std::any_of(batch.begin(), batch.end(), [](const auto& s) { return !s.copies.empty(); })) {
    if (Status st = validate_batch(passes); !st) return st.error();
    apply_copies(batch, layout_, kv_region());
  }
  return run(passes, true);
}

Result<StepOutput> SimDevice::decode(std::span<const DecodeSeq> batch) {
  std::vector<Pass> passes;
  for (const auto& s : batch) passes.push_back({s.seq_id, s.block_table, s.start_pos, s.tokens});
  return run(passes, false);
}

namespace {

Status check_copy(const KvLayout& layout, std::span<const uint32_t> blocks, uint64_t bytes) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i] >= layout.blocks_total) {
      return invalid("copy: blocks[" + std::to_string(i) + "] = " + std::to_string(blocks[i]) +
                     " is outside [0, " + std::to_string(layout.blocks_total) + ")");
    }
  }
  if (bytes != blocks.size() * layout.block_bytes()) {
    return invalid("copy: buffer holds " + std::to_string(bytes) + " bytes, " +
                   std::to_string(blocks.size()) + " blocks need " +
                   std::to_string(blocks.size() * layout.block_bytes()));
  }
  return {};
}

}  // namespace

Status SimDevice::copy_blocks_out(std::span<const uint32_t> blocks, std::span<std::byte> dst) {
  if (Status st = check_copy(layout_, blocks, dst.size()); !st) return st;
  uint64_t bb = layout_.block_bytes();
  for (size_t i = 0; i < blocks.size(); ++i) {
    std::memcpy(dst.data() + i * bb, pool_->data() + blocks[i] * bb, bb);
  }
  return {};
}

Status SimDevice::copy_blocks_in(std::span<const uint32_t> blocks,
                                 std::span<const std::byte> src) {
  if (Status st = check_copy(layout_, blocks, src.size()); !st) return st;
  uint64_t bb = layout_.block_bytes();
  for (size_t i = 0; i < blocks.size(); ++i) {
    std::memcpy(pool_->data() + blocks[i] * bb, src.data() + i * bb, bb);
  }
  return {};
}

Result<std::unique_ptr<Device>> make_sim_device(const DeviceSpec& spec) {
  auto device = SimDevice::create(spec);
  if (!device) return device.error();
  return std::unique_ptr<Device>(std::move(device).value());
}

}  // namespace tandem::devices::sim
