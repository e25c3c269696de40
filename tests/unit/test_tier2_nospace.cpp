// Tier 2 on a disk that fills up, on a real file system of a chosen size (a tmpfs this test
// mounts; it needs root, else it exits 77 and meson reports it skipped): the start check
// counts the index's own room, and a store whose index ran out of space takes blocks again
// once there is room, without a restart.
#include <sys/mount.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kvstore/tier2/tier2_store.hpp"

using namespace tandem::kv::tier2;
using tandem::kv::BlockHash;

namespace {

int failures = 0;
#define EXPECT(cond, ...)                                                        \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "%s:%d: FAILED: %s ", __FILE__, __LINE__, #cond);     \
      std::fprintf(stderr, __VA_ARGS__);                                         \
      std::fprintf(stderr, "\n");                                                \
      ++failures;                                                                \
    }                                                                            \
  } while (false)

struct Tmpfs {
  std::string path;
  bool mounted = false;
  explicit Tmpfs(uint64_t bytes) {
    std::string pattern = "/tmp/tandem-nospace-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) return;
    path = pattern;
    std::string options = "size=" + std::to_string(bytes);
    mounted = ::mount("tmpfs", path.c_str(), "tmpfs", 0, options.c_str()) == 0;
  }
  ~Tmpfs() {
    if (mounted) ::umount2(path.c_str(), MNT_DETACH);
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

BlockHash hash_of(uint64_t n) {
  BlockHash h{};
  uint64_t x = n;
  for (size_t i = 0; i < h.bytes.size(); ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    h.bytes[i] = static_cast<uint8_t>(x >> 56);
  }
  return h;
}

constexpr uint64_t block_bytes = 4096;

Tier2Config config_for(const std::string& dir, uint64_t capacity) {
  Tier2Config c;
  c.directory = dir;
  c.block_bytes = block_bytes;
  c.capacity_bytes = capacity;
  c.fingerprint = make_fingerprint({"test-model", "bf16", 16, 2, 2, 64, ""});
  c.index_commits_per_sync = 1;
  return c;
}

// Fills the file system but `keep` bytes with a file; returns its path.
std::string fill(const std::string& dir, uint64_t keep) {
  std::string path = dir + "/filler";
  auto space = std::filesystem::space(dir);
  uint64_t bytes = space.available > keep ? space.available - keep : 0;
  std::ofstream out(path, std::ios::binary);
  std::vector<char> chunk(1 << 20, 'x');
  while (bytes > 0) {
    uint64_t n = std::min<uint64_t>(bytes, chunk.size());
    out.write(chunk.data(), static_cast<std::streamsize>(n));
    if (!out) break;
    bytes -= n;
  }
  return path;
}

}  // namespace

int main() {
  if (::geteuid() != 0) {
    std::printf("SKIP: mounting a tmpfs of a set size needs root\n");
    return 77;
  }
  {
    // 8 MiB of blocks on a 20 MiB disk: the data file fits, the index would not.
    Tmpfs small(20ull << 20);
    if (!small.mounted) {
      std::printf("SKIP: cannot mount a tmpfs here (%s)\n", std::strerror(errno));
      return 77;
    }
    auto refused = Tier2Store::open(config_for(small.path, 8ull << 20));
    EXPECT(!refused.ok(), "an 8 MiB store on a 20 MiB disk opened");
    if (!refused.ok()) {
      EXPECT(refused.error().message.find("for the index") != std::string::npos, "%s",
             refused.error().message.c_str());
    }
  }
  {
    // Room for the data file and the index; then the disk fills up under the index.
    Tmpfs disk((8ull << 20) + index_reserve_bytes + (16ull << 20));
    EXPECT(disk.mounted, "mount");
    auto store = Tier2Store::open(config_for(disk.path, 8ull << 20));
    EXPECT(store.ok(), "%s", store.ok() ? "" : store.error().describe().c_str());
    if (!store.ok()) return 1;
    std::vector<uint8_t> data(block_bytes, 0x5a);
    EXPECT((*store)->put(hash_of(0), data).ok(), "a put with room");
    std::string filler = fill(disk.path, 0);
    uint64_t failed = 0, n = 1;
    for (; n < 400000 && failed == 0; ++n) {
      data[0] = static_cast<uint8_t>(n);
      if (!(*store)->put(hash_of(n), data).ok()) ++failed;
    }
    EXPECT(failed > 0, "the index never ran out of space (%llu puts)", (unsigned long long)n);
    // Room again: the next puts are stored, with no restart.
    std::filesystem::remove(filler);
    uint64_t stored = 0;
    for (uint64_t k = 0; k < 20; ++k) {
      data[0] = static_cast<uint8_t>(k);
      auto r = (*store)->put(hash_of(100000 + k), data);
      if (r.ok() && *r == PutOutcome::stored) ++stored;
    }
    EXPECT(stored == 20, "after space returned, %llu of 20 puts stored",
           (unsigned long long)stored);
    std::vector<uint8_t> out(block_bytes);
    auto got = (*store)->get(hash_of(100019), out);
    EXPECT(got.ok() && out[0] == 19, "a block stored after recovery is served");
  }
  std::printf("%s (%d failures)\n", failures == 0 ? "OK" : "FAILED", failures);
  return failures == 0 ? 0 : 1;
}
