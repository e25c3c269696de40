#include "kvstore/tier2/block_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace tandem::kv::tier2 {
namespace {

Error errno_error(std::string_view what, const std::string& path, int err) {
  return make_error(ErrorKind::failed, std::string(what) + " " + path + ": " + std::strerror(err) +
                                           " (errno " + std::to_string(err) + ")");
}

Status fsync_directory_of(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_error("open directory", dir, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return errno_error("fsync directory", dir, err);
  return {};
}

// Makes the open file exactly size_bytes long (reserving its blocks) and durable.
Status size_file(int fd, const std::string& path, uint64_t size_bytes) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno_error("fstat", path, errno);
  auto current_bytes = static_cast<uint64_t>(st.st_size);
  if (current_bytes > size_bytes && ::ftruncate(fd, static_cast<off_t>(size_bytes)) != 0) {
    return errno_error("ftruncate", path, errno);
  }
  // Also on an existing file of the right size: fills holes (a sparse copy, a crash during an
  // earlier fallocate) so later writes cannot run out of space.
  int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(size_bytes));
  if (rc != 0) return errno_error("posix_fallocate", path, rc);
  if (::fsync(fd) != 0) return errno_error("fsync", path, errno);
  return fsync_directory_of(path);
}

// One aligned pread at offset 0: some file systems accept O_DIRECT at open and refuse the I/O.
bool direct_read_works(int fd) {
  AlignedBuffer probe(io_alignment_bytes);
  ssize_t n = ::pread(fd, probe.data(), probe.size(), 0);
  return n >= 0 || errno != EINVAL;
}

}  // namespace

std::string_view to_string(IoMode mode) {
  return mode == IoMode::direct ? "direct" : "buffered";
}

PosixBlockFile::PosixBlockFile(int fd, std::string path, uint64_t size_bytes, IoMode mode)
    : fd_(fd), path_(std::move(path)), size_bytes_(size_bytes), mode_(mode) {}

PosixBlockFile::~PosixBlockFile() {
  if (fd_ >= 0) ::close(fd_);
}

Result<std::unique_ptr<PosixBlockFile>> PosixBlockFile::open(const std::string& path,
                                                             uint64_t size_bytes,
                                                             IoModeRequest mode) {
  RT_ASSERT(size_bytes > 0, "PosixBlockFile::open: size 0", path);
  RT_ASSERT(size_bytes % io_alignment_bytes == 0, "unaligned data file size", size_bytes);
  int flags = O_RDWR | O_CREAT | O_CLOEXEC;
  int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) return errno_error("open", path, errno);
  if (Status sized = size_file(fd, path, size_bytes); !sized) {
    ::close(fd);
    return sized.error();
  }
  IoMode io_mode = IoMode::buffered;
  if (mode == IoModeRequest::direct_if_supported) {
    int direct_fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
    if (direct_fd >= 0 && direct_read_works(direct_fd)) {
      ::close(fd);
      fd = direct_fd;
      io_mode = IoMode::direct;
    } else if (direct_fd >= 0) {
      ::close(direct_fd);
    } else if (errno != EINVAL) {
      int err = errno;
      ::close(fd);
      return errno_error("open O_DIRECT", path, err);
    }
  }
  return std::unique_ptr<PosixBlockFile>(new PosixBlockFile(fd, path, size_bytes, io_mode));
}

void PosixBlockFile::check_direct_args(const void* data, size_t length_bytes,
                                       uint64_t offset_bytes) const {
  if (mode_ != IoMode::direct) return;
  RT_ASSERT(reinterpret_cast<uintptr_t>(data) % io_alignment_bytes == 0, "unaligned buffer");
  RT_ASSERT(length_bytes % io_alignment_bytes == 0, "unaligned length", length_bytes);
  RT_ASSERT(offset_bytes % io_alignment_bytes == 0, "unaligned offset", offset_bytes);
}

Result<size_t> PosixBlockFile::pwrite(std::span<const uint8_t> data, uint64_t offset_bytes) {
  RT_ASSERT(fd_ >= 0, "pwrite on a closed file", path_);
  RT_ASSERT(offset_bytes + data.size() <= size_bytes_, "pwrite past the end", offset_bytes);
  check_direct_args(data.data(), data.size(), offset_bytes);
  size_t done_bytes = 0;
  while (done_bytes < data.size()) {
    ssize_t n = ::pwrite(fd_, data.data() + done_bytes, data.size() - done_bytes,
                         static_cast<off_t>(offset_bytes + done_bytes));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_error("pwrite", path_, errno);
    if (n == 0) break;
    done_bytes += static_cast<size_t>(n);
  }
  return done_bytes;
}

Result<size_t> PosixBlockFile::pread(std::span<uint8_t> out, uint64_t offset_bytes) {
  RT_ASSERT(fd_ >= 0, "pread on a closed file", path_);
  RT_ASSERT(offset_bytes + out.size() <= size_bytes_, "pread past the end", offset_bytes);
  check_direct_args(out.data(), out.size(), offset_bytes);
  size_t done_bytes = 0;
  while (done_bytes < out.size()) {
    ssize_t n = ::pread(fd_, out.data() + done_bytes, out.size() - done_bytes,
                        static_cast<off_t>(offset_bytes + done_bytes));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_error("pread", path_, errno);
    if (n == 0) break;  // end of file
    done_bytes += static_cast<size_t>(n);
  }
  return done_bytes;
}

Status PosixBlockFile::sync_data() {
  RT_ASSERT(fd_ >= 0, "sync on a closed file", path_);
  int rc = 0;
  do {
    rc = ::fdatasync(fd_);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return errno_error("fdatasync", path_, errno);
  return {};
}

}  // namespace tandem::kv::tier2
