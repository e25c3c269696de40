#include "kvstore/tier2/aligned_buffer.hpp"

#include <cstdlib>
#include <cstring>

#include "runtime/base/assert.hpp"

namespace tandem::kv::tier2 {

void AlignedBuffer::Free::operator()(uint8_t* p) const {
  std::free(p);
}

AlignedBuffer::AlignedBuffer(size_t size_bytes)
    : size_bytes_(static_cast<size_t>(round_up_bytes(size_bytes, io_alignment_bytes))) {
  RT_ASSERT(size_bytes_ >= size_bytes, "AlignedBuffer size overflow", size_bytes);
  if (size_bytes_ == 0) return;
  void* p = std::aligned_alloc(io_alignment_bytes, size_bytes_);
  RT_ASSERT(p != nullptr, "AlignedBuffer: out of memory for", size_bytes_, "bytes");
  std::memset(p, 0, size_bytes_);
  bytes_.reset(static_cast<uint8_t*>(p));
  RT_ASSERT(is_io_aligned(bytes_.get(), size_bytes_), "aligned_alloc returned an unaligned block");
}

}  // namespace tandem::kv::tier2
