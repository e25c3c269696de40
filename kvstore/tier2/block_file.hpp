// The tier-2 store's data file: a seam between the store and the operating system.
//
// One preallocated file of fixed size holds every slot; the store computes offsets
// (slot_index x slot_bytes) and calls pread/pwrite/sync_data. Two implementations:
//   PosixBlockFile   (this header) the real file: posix_fallocate'd, O_DIRECT when the file
//                    system accepts it, else buffered I/O (every put still fdatasyncs);
//   FaultyBlockFile  (faulty_block_file.hpp) wraps another and injects faults, for tests.
//
// Threads: a BlockFile is owned by one Tier2Store and called from the thread that owns the
// store (the kv-offload actor, which runs detached because these calls block on the disk).
// Not thread-safe.
//
// O_DIRECT rules (asserted by PosixBlockFile in direct mode): buffer address, length and
// offset are multiples of alignment_bytes() (4096). Use AlignedBuffer for buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kvstore/tier2/aligned_buffer.hpp"
#include "runtime/base/result.hpp"

namespace tandem::kv::tier2 {

enum class IoMode {
  direct,    // O_DIRECT: bypasses the page cache; data is on the device after pwrite returns
             // except for the device's volatile cache, which sync_data() flushes
  buffered,  // the page cache; durable only after sync_data()
};
std::string_view to_string(IoMode mode);  // "direct", "buffered"

class BlockFile {
 public:
  virtual ~BlockFile() = default;

  // Writes data at offset_bytes; returns the bytes written (== data.size() unless the file
  // system or a fault cut it short). Errors: failed (the message carries errno's text, e.g.
  // "EIO" or "ENOSPC"). Cost: one or more pwrite(2) calls, blocking on the device.
  virtual Result<size_t> pwrite(std::span<const uint8_t> data, uint64_t offset_bytes) = 0;
  // Reads into out from offset_bytes; returns the bytes read (fewer at end of file or on a
  // short read). Errors: failed. Cost: pread(2), blocking on the device.
  virtual Result<size_t> pread(std::span<uint8_t> out, uint64_t offset_bytes) = 0;
  // fdatasync(2): everything written so far survives a crash or power loss once it returns.
  // Errors: failed. Cost: a device cache flush (and a journal commit if extents changed).
  virtual Status sync_data() = 0;

  virtual uint64_t size_bytes() const = 0;
  virtual uint32_t alignment_bytes() const = 0;  // of buffers, lengths and offsets
  virtual IoMode io_mode() const = 0;
};

enum class IoModeRequest {
  direct_if_supported,  // probe O_DIRECT at open; fall back to buffered (io_mode() says which)
  buffered,             // never O_DIRECT (e.g. to compare, or for a file system known to lie)
};

class PosixBlockFile final : public BlockFile {
 public:
  // Opens or creates `path` and makes it exactly size_bytes long: posix_fallocate(2) when it
  // is shorter (the blocks are reserved now, so a later pwrite cannot hit ENOSPC on a normal
  // file system), ftruncate(2) when longer; then fsyncs the file and its directory so the
  // size survives a crash. With direct_if_supported it opens with O_DIRECT and probes one
  // aligned pread; if open or the probe fails with EINVAL it reopens without O_DIRECT.
  // Preconditions (asserted): size_bytes > 0 and a multiple of io_alignment_bytes.
  // Errors: failed, naming the path and errno (ENOSPC from posix_fallocate, EACCES, ...).
  // Cost: one fallocate of the missing extent (fast on ext4/xfs: extents, not zeros).
  static Result<std::unique_ptr<PosixBlockFile>> open(const std::string& path, uint64_t size_bytes,
                                                      IoModeRequest mode);
  ~PosixBlockFile() override;
  PosixBlockFile(const PosixBlockFile&) = delete;
  PosixBlockFile& operator=(const PosixBlockFile&) = delete;

  Result<size_t> pwrite(std::span<const uint8_t> data, uint64_t offset_bytes) override;
  Result<size_t> pread(std::span<uint8_t> out, uint64_t offset_bytes) override;
  Status sync_data() override;
  uint64_t size_bytes() const override { return size_bytes_; }
  uint32_t alignment_bytes() const override { return io_alignment_bytes; }
  IoMode io_mode() const override { return mode_; }

 private:
  PosixBlockFile(int fd, std::string path, uint64_t size_bytes, IoMode mode);
  void check_direct_args(const void* data, size_t length_bytes, uint64_t offset_bytes) const;

  int fd_ = -1;
  std::string path_;
  uint64_t size_bytes_ = 0;
  IoMode mode_ = IoMode::buffered;
};

}  // namespace tandem::kv::tier2
