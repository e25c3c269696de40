// Heap buffers for O_DIRECT I/O: address and size multiples of io_alignment_bytes (4096, the
// largest logical sector size of current NVMe and of the page size). Pure memory, no I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace tandem::kv::tier2 {

inline constexpr uint32_t io_alignment_bytes = 4096;

constexpr uint64_t round_up_bytes(uint64_t bytes, uint64_t alignment_bytes) {
  return (bytes + alignment_bytes - 1) / alignment_bytes * alignment_bytes;
}

inline bool is_io_aligned(const void* p, size_t size_bytes) {
  return reinterpret_cast<uintptr_t>(p) % io_alignment_bytes == 0 &&
         size_bytes % io_alignment_bytes == 0;
}

// Zero-filled at allocation. Move-only; the bytes never move while the buffer lives.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // size_bytes is rounded up to io_alignment_bytes. Aborts (RT_ASSERT) if allocation fails.
  // Cost: aligned_alloc + memset (the first touch of every page).
  explicit AlignedBuffer(size_t size_bytes);

  uint8_t* data() { return bytes_.get(); }
  const uint8_t* data() const { return bytes_.get(); }
  size_t size() const { return size_bytes_; }
  std::span<uint8_t> span() { return {bytes_.get(), size_bytes_}; }
  std::span<const uint8_t> span() const { return {bytes_.get(), size_bytes_}; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, Free> bytes_;
  size_t size_bytes_ = 0;
};

}  // namespace tandem::kv::tier2
