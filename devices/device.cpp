#include "devices/device.hpp"

#include <sys/mman.h>

#include <cstring>
#include <string>
#include <thread>

#include "runtime/base/assert.hpp"

namespace tandem::devices {

std::string_view to_string(Arch arch) {
  switch (arch) {
    case Arch::llama: return "llama";
    case Arch::minimax_m2: return "minimax_m2";
  }
  return "?";
}

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::f8_e4m3: return "F8_E4M3";
  }
  return "?";
}

uint32_t dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::f8_e4m3: return 1;
  }
  RT_ASSERT(false, "unknown dtype", static_cast<int>(dtype));
  return 0;
}

bool holds_thread(config::DeviceKind kind) { return kind != config::DeviceKind::sim; }

Status check_seq(const std::string& what, size_t index, const SeqCheck& s, const ModelConfig& c,
                 const KvLayout& layout) {
  std::string where =
      what + ": seq " + std::to_string(index) + " (id " + std::to_string(s.seq_id) + ")";
  if (s.tokens.empty()) return make_error(ErrorKind::invalid, where + ": no tokens");
  for (int32_t t : s.tokens) {
    if (t < 0 || static_cast<uint32_t>(t) >= c.vocab_size) {
      return make_error(ErrorKind::invalid, where + ": token id " + std::to_string(t) +
                                                " outside [0, " + std::to_string(c.vocab_size) +
                                                ")");
    }
  }
  uint64_t end_pos = uint64_t{s.start_pos} + s.tokens.size();
  if (end_pos > c.max_position) {
    return make_error(ErrorKind::invalid, where + ": positions up to " + std::to_string(end_pos) +
                                              " exceed max_position " +
                                              std::to_string(c.max_position));
  }
  uint64_t blocks_needed = (end_pos + layout.block_tokens - 1) / layout.block_tokens;
  if (s.block_table.size() < blocks_needed) {
    return make_error(ErrorKind::invalid,
                      where + ": block table has " + std::to_string(s.block_table.size()) +
                          " blocks, positions up to " + std::to_string(end_pos) + " need " +
                          std::to_string(blocks_needed));
  }
  for (uint32_t b : s.block_table) {
    if (b >= layout.blocks_total) {
      return make_error(ErrorKind::invalid, where + ": block id " + std::to_string(b) +
                                                " >= blocks_total " +
                                                std::to_string(layout.blocks_total));
    }
  }
  return {};
}

Status check_imported(const std::string& what, size_t index, uint64_t seq_id,
                      std::span<const uint32_t> imported, const KvLayout& layout) {
  for (uint32_t b : imported) {
    if (b >= layout.blocks_total) {
      return make_error(ErrorKind::invalid, what + ": seq " + std::to_string(index) + " (id " +
                                                std::to_string(seq_id) + ") imports block " +
                                                std::to_string(b) + " >= blocks_total " +
                                                std::to_string(layout.blocks_total));
    }
  }
  return {};
}

Status check_block_copy(std::span<const uint32_t> blocks, uint64_t bytes, const KvLayout& layout,
                        const char* what) {
  for (uint32_t b : blocks) {
    if (b >= layout.blocks_total) {
      return make_error(ErrorKind::invalid, std::string(what) + ": block id " + std::to_string(b) +
                                                " >= blocks_total " +
                                                std::to_string(layout.blocks_total));
    }
  }
  if (bytes != blocks.size() * layout.block_bytes()) {
    return make_error(ErrorKind::invalid, std::string(what) + ": buffer has " +
                                              std::to_string(bytes) + " bytes, " +
                                              std::to_string(blocks.size()) + " blocks need " +
                                              std::to_string(blocks.size() * layout.block_bytes()));
  }
  return {};
}

Result<std::unique_ptr<PoolMemory>> PoolMemory::allocate(uint64_t bytes, const std::string& who) {
  void* addr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (addr == MAP_FAILED) {
    return make_error(ErrorKind::failed,
                      who + ": cannot allocate a KV pool of " + std::to_string(bytes) + " bytes");
  }
  return std::unique_ptr<PoolMemory>(new PoolMemory(static_cast<std::byte*>(addr), bytes));
}

PoolMemory::~PoolMemory() {
  munmap(base_, bytes_);
}

void wait_ready(const StepOutput& out) { std::this_thread::sleep_until(out.ready_at); }

Result<std::vector<DraftOutput>> Device::draft(std::span<const DraftSeq>,
                                               std::span<const uint64_t>) {
  return make_error(ErrorKind::unimplemented, "this device has no draft model");
}

namespace {
Error bad(const std::string& what) { return make_error(ErrorKind::invalid, "model config: " + what); }
}  // namespace

Status ModelConfig::validate() const {
  if (vocab_size == 0) return bad("vocab_size is 0");
  if (hidden == 0) return bad("hidden is 0");
  if (layers == 0) return bad("layers is 0");
  if (heads == 0) return bad("heads is 0");
  if (kv_heads == 0) return bad("kv_heads is 0");
  if (heads % kv_heads != 0) {
    return bad("heads (" + std::to_string(heads) + ") is not a multiple of kv_heads (" +
               std::to_string(kv_heads) + ")");
  }
  if (head_dim == 0) return bad("head_dim is 0");
  if (rotary_dim == 0 || rotary_dim > head_dim || rotary_dim % 2 != 0) {
    return bad("rotary_dim " + std::to_string(rotary_dim) + " must be even and in [2, head_dim=" +
               std::to_string(head_dim) + "]");
  }
  if (!(rope_theta > 0.0f)) return bad("rope_theta must be > 0");
  if (!(rms_eps > 0.0f)) return bad("rms_eps must be > 0");
  if (max_position == 0) return bad("max_position is 0");
  if (experts == 0 && intermediate == 0) return bad("intermediate is 0 (dense FFN)");
  if (experts > 0) {
    if (experts_per_token == 0 || experts_per_token > experts) {
      return bad("experts_per_token " + std::to_string(experts_per_token) +
                 " must be in [1, experts=" + std::to_string(experts) + "]");
    }
    if (moe_intermediate == 0) return bad("moe_intermediate is 0");
  }
  if (bos_id < 0 || static_cast<uint32_t>(bos_id) >= vocab_size) return bad("bos_id out of range");
  if (eos_id < 0 || static_cast<uint32_t>(eos_id) >= vocab_size) return bad("eos_id out of range");
  return {};
}

uint64_t KvLayout::part_bytes() const {
  return uint64_t{block_tokens} * kv_heads * head_dim * element_bytes;
}

uint64_t KvLayout::block_bytes() const { return uint64_t{layers} * 2 * part_bytes(); }

uint64_t KvLayout::pool_bytes() const { return uint64_t{blocks_total} * block_bytes(); }

uint64_t KvLayout::offset_bytes(uint32_t block, uint32_t layer, KvPart part) const {
  RT_ASSERT(block < blocks_total, "block", block, "blocks_total", blocks_total);
  RT_ASSERT(layer < layers, "layer", layer, "layers", layers);
  uint64_t index = uint64_t{layer} * 2 + static_cast<uint32_t>(part);
  if (order == KvOrder::layer_major) return (index * blocks_total + block) * part_bytes();
  return uint64_t{block} * block_bytes() + index * part_bytes();
}

uint64_t KvLayout::slot_offset_bytes(uint32_t block, uint32_t layer, KvPart part,
                                     uint32_t slot) const {
  RT_ASSERT(slot < block_tokens, "slot", slot, "block_tokens", block_tokens);
  RT_ASSERT(inner == KvInner::slot_head_dim, "slot rows are contiguous only in slot order");
  return offset_bytes(block, layer, part) +
         uint64_t{slot} * kv_heads * head_dim * element_bytes;
}

}  // namespace tandem::devices

namespace tandem::devices {

Status check_copies(std::span<const PrefillSeq> batch, const KvLayout& layout) {
  for (size_t i = 0; i < batch.size(); ++i) {
    for (const BlockCopy& c : batch[i].copies) {
      if (c.src >= layout.blocks_total || c.dst >= layout.blocks_total || c.src == c.dst) {
        return make_error(ErrorKind::invalid,
                          "prefill seq " + std::to_string(i) + " (id " +
                              std::to_string(batch[i].seq_id) + "): block copy " +
                              std::to_string(c.src) + " -> " + std::to_string(c.dst) +
                              " is not between two distinct blocks of [0, " +
                              std::to_string(layout.blocks_total) + ")");
      }
    }
  }
  return {};
}

void apply_copies(std::span<const PrefillSeq> batch, const KvLayout& layout,
                  MemoryRegion region) {
  const uint64_t bytes = layout.block_bytes();
  for (const PrefillSeq& s : batch) {
    for (const BlockCopy& c : s.copies) {
      RT_ASSERT(c.src < layout.blocks_total && c.dst < layout.blocks_total && c.src != c.dst);
      RT_ASSERT((uint64_t{c.src} + 1) * bytes <= region.length_bytes, c.src);
      RT_ASSERT((uint64_t{c.dst} + 1) * bytes <= region.length_bytes, c.dst);
      std::memcpy(region.base + uint64_t{c.dst} * bytes, region.base + uint64_t{c.src} * bytes,
                  bytes);
    }
  }
}

}  // namespace tandem::devices
