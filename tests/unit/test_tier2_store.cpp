// The tier-2 block store (kvstore/tier2): durable before visible, every read verified, every
// failure a miss, restarts (clean and SIGKILLed), pins, eviction, faults, config errors.
#include <doctest.h>
#include <fcntl.h>
#include <rocksdb/db.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kvstore/tier2/faulty_block_file.hpp"
#include "kvstore/tier2/tier2_store.hpp"

using tandem::ErrorKind;
using tandem::kv::BlockHash;
using namespace tandem::kv::tier2;

namespace {

// A fresh directory under /tmp (a real disk on the build host; see docs/benchmarks.md),
// removed with everything in it at the end of the test.
struct TempDir {
  std::string path;
  TempDir() {
    std::string pattern = "/tmp/tandem-tier2-XXXXXX";
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

BlockHash hash_of(uint64_t n) {
  BlockHash h;
  for (size_t i = 0; i < h.bytes.size(); i += 8) {
    uint64_t v = mix(n * 4 + i / 8);
    std::memcpy(h.bytes.data() + i, &v, 8);
  }
  return h;
}

// A block's content is a function of its hash, so anyone can check what a store serves.
std::vector<uint8_t> content_of(const BlockHash& h, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  uint64_t state = h.prefix64();
  for (size_t i = 0; i < bytes; i += 8) {
    state = mix(state);
    std::memcpy(out.data() + i, &state, std::min<size_t>(8, bytes - i));
  }
  return out;
}

constexpr uint64_t block_bytes = 8192;  // two 4096-byte units: a torn write can keep one

Tier2Config config_for(const std::string& dir, uint32_t slots, uint64_t block = block_bytes) {
  Tier2Config c;
  c.directory = dir;
  c.block_bytes = block;
  c.capacity_bytes = slots * round_up_bytes(block, io_alignment_bytes);
  c.fingerprint = make_fingerprint({"test-model", "bf16", 16, 2, 2, 64, ""});
  c.pins_max = 8;
  c.writes_inflight_max = 4;
  return c;
}

std::unique_ptr<Tier2Store> open_ok(const Tier2Config& c, Tier2OpenHooks hooks = {}) {
  auto store = Tier2Store::open(c, std::move(hooks));
  if (!store) FAIL("open: ", store.error().describe());
  (*store)->check_invariants();
  return std::move(*store);
}

// Opens with the data file wrapped in a FaultyBlockFile; *faults points at the wrapper.
std::unique_ptr<Tier2Store> open_faulty(const Tier2Config& c, FaultyBlockFile** faults,
                                        uint64_t seed = 1, FaultRates rates = {}) {
  Tier2OpenHooks hooks;
  hooks.wrap_file = [faults, seed, rates](std::unique_ptr<BlockFile> inner) {
    auto wrapped = std::make_unique<FaultyBlockFile>(std::move(inner), seed, rates);
    *faults = wrapped.get();
    return std::unique_ptr<BlockFile>(std::move(wrapped));
  };
  return open_ok(c, std::move(hooks));
}

void put_ok(Tier2Store& s, uint64_t n, size_t bytes = block_bytes) {
  auto r = s.put(hash_of(n), content_of(hash_of(n), bytes));
  if (!r) FAIL("put ", n, ": ", r.error().describe());
  CHECK(*r == PutOutcome::stored);
}

// true: served and equal to content_of; false: a miss. A served wrong block fails the test.
bool get_checked(Tier2Store& s, const BlockHash& h, size_t bytes = block_bytes) {
  std::vector<uint8_t> out(block_bytes, 0xaa);
  auto r = s.get(h, out);
  if (!r) {
    CHECK(r.error().kind == ErrorKind::not_found);
    CHECK(std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == 0; }));
    return false;
  }
  REQUIRE(*r == bytes);
  out.resize(bytes);
  REQUIRE(out == content_of(h, bytes));
  return true;
}

uint64_t misses(const Tier2Store& s, Tier2Miss reason) {
  return s.stats().misses_count[static_cast<size_t>(reason)];
}

bool has_event(std::vector<Tier2Event> events, Tier2EventKind kind) {
  return std::any_of(events.begin(), events.end(),
                     [kind](const Tier2Event& e) { return e.kind == kind; });
}

std::unique_ptr<rocksdb::DB> open_index_directly(const std::string& dir) {
  rocksdb::DB* raw = nullptr;
  rocksdb::Options options;
  REQUIRE(rocksdb::DB::Open(options, dir + "/index", &raw).ok());
  return std::unique_ptr<rocksdb::DB>(raw);
}

}  // namespace

TEST_CASE("put then get round-trips the bytes; an unknown block is an absent miss") {
  TempDir dir;
  auto s = open_ok(config_for(dir.path, 8));
  for (uint64_t n = 0; n < 3; ++n) put_ok(*s, n);
  put_ok(*s, 3, 100);  // shorter than block_bytes: length is kept
  for (uint64_t n = 0; n < 3; ++n) CHECK(get_checked(*s, hash_of(n)));
  CHECK(get_checked(*s, hash_of(3), 100));
  CHECK(s->contains(hash_of(0)));
  CHECK_FALSE(s->contains(hash_of(99)));
  CHECK_FALSE(get_checked(*s, hash_of(99)));
  CHECK(s->last_miss() == Tier2Miss::absent);
  auto st = s->stats();
  CHECK(st.puts_count == 4);
  CHECK(st.hits_count == 4);
  CHECK(misses(*s, Tier2Miss::absent) == 1);
  CHECK(st.blocks_used_count == 4);
  CHECK(st.blocks_capacity_count == 8);
  CHECK(st.written_bytes == 3 * block_bytes + 4096);  // slot-rounded: 100 bytes write 4096
  // A duplicate put writes nothing; an empty or oversized block is invalid.
  CHECK(*s->put(hash_of(0), content_of(hash_of(0), block_bytes)) == PutOutcome::duplicate);
  CHECK(s->stats().puts_duplicate_count == 1);
  CHECK(s->put(hash_of(5), {}).error().kind == ErrorKind::invalid);
  std::vector<uint8_t> big(block_bytes + 1);
  CHECK(s->put(hash_of(5), big).error().kind == ErrorKind::invalid);
  std::vector<uint8_t> small(10);
  CHECK(s->get(hash_of(0), small).error().kind == ErrorKind::invalid);
  CHECK(s->stats().written_bytes == 3 * block_bytes + 4096);
  MESSAGE("data file I/O mode: ", to_string(s->io_mode()));
  s->check_invariants();
}

TEST_CASE("a block is visible only once put_commit returns; abort frees the slot") {
  TempDir dir;
  auto s = open_ok(config_for(dir.path, 2));
  BlockHash h = hash_of(1);
  auto start = s->put_begin(h);
  REQUIRE(start.ok());
  REQUIRE(start->outcome == PutOutcome::stored);
  REQUIRE(start->buffer.size() >= block_bytes);
  CHECK_FALSE(s->contains(h));
  CHECK_FALSE(get_checked(*s, h));
  auto again = s->put_begin(h);  // a second writer of the same block has nothing to do
  REQUIRE(again.ok());
  CHECK(again->outcome == PutOutcome::duplicate);
  CHECK(*s->put(h, content_of(h, block_bytes)) == PutOutcome::duplicate);
  auto bytes = content_of(h, block_bytes);
  std::memcpy(start->buffer.data(), bytes.data(), bytes.size());
  CHECK(s->stats().writes_inflight_count == 1);
  s->check_invariants();
  REQUIRE(*s->put_commit(start->id, block_bytes) == PutOutcome::stored);
  CHECK(s->contains(h));
  CHECK(get_checked(*s, h));
  CHECK(s->put_commit(start->id, block_bytes).error().kind == ErrorKind::invalid);
  CHECK(s->put_abort(start->id).error().kind == ErrorKind::invalid);

  auto aborted = s->put_begin(hash_of(2));
  REQUIRE(aborted.ok());
  REQUIRE(s->put_abort(aborted->id).ok());
  CHECK_FALSE(s->contains(hash_of(2)));
  put_ok(*s, 3);  // takes the slot the abort freed: nothing is evicted
  CHECK(s->stats().evictions_count == 0);
  CHECK(s->contains(hash_of(1)));
  s->check_invariants();
}

TEST_CASE("put_batch: one group commit; a failed flush fails every block of the batch") {
  TempDir dir;
  FaultyBlockFile* faults = nullptr;
  auto s = open_faulty(config_for(dir.path, 8), &faults);
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<PutItem> items;
  for (uint64_t n : {1, 2, 3, 2}) bytes.push_back(content_of(hash_of(n), block_bytes));
  for (size_t i = 0; i < bytes.size(); ++i)
    items.push_back({hash_of(i == 3 ? 2 : i + 1), bytes[i]});
  auto results = s->put_batch(items);
  REQUIRE(results.size() == 4);
  for (size_t i = 0; i < 3; ++i) CHECK(*results[i] == PutOutcome::stored);
  CHECK(*results[3] == PutOutcome::duplicate);  // the same block twice in one batch
  for (uint64_t n : {1, 2, 3}) CHECK(get_checked(*s, hash_of(n)));
  std::vector<std::vector<uint8_t>> more;
  std::vector<PutItem> next;
  for (uint64_t n : {4, 5, 1}) more.push_back(content_of(hash_of(n), block_bytes));
  for (size_t i = 0; i < more.size(); ++i)
    next.push_back({hash_of(std::vector<uint64_t>{4, 5, 1}[i]), more[i]});
  faults->arm(FaultKind::sync_eio);
  results = s->put_batch(next);
  CHECK(results[0].error().kind == ErrorKind::failed);
  CHECK(results[1].error().kind == ErrorKind::failed);
  CHECK(*results[2] == PutOutcome::duplicate);
  CHECK_FALSE(s->contains(hash_of(4)));
  CHECK_FALSE(s->contains(hash_of(5)));
  CHECK(s->stats().puts_dropped_io_count == 2);
  CHECK(s->stats().puts_count == 3);
  CHECK(s->stats().blocks_used_count == 3);
  s->check_invariants();
  results = s->put_batch(next);
  CHECK(*results[0] == PutOutcome::stored);
  CHECK(get_checked(*s, hash_of(5)));
}

TEST_CASE("writes in flight are bounded by writes_inflight_max") {
  TempDir dir;
  auto c = config_for(dir.path, 8);
  c.writes_inflight_max = 2;
  auto s = open_ok(c);
  auto a = s->put_begin(hash_of(1));
  auto b = s->put_begin(hash_of(2));
  REQUIRE((a.ok() && b.ok()));
  auto third = s->put_begin(hash_of(3));
  REQUIRE_FALSE(third.ok());
  CHECK(third.error().kind == ErrorKind::overloaded);
  CHECK(s->stats().puts_dropped_full_count == 1);
  REQUIRE(s->put_abort(a->id).ok());
  CHECK(s->put_begin(hash_of(3)).ok());
  s->check_invariants();
}

TEST_CASE("when full, the least recently used block is evicted first") {
  TempDir dir;
  auto s = open_ok(config_for(dir.path, 4));
  for (uint64_t n = 0; n < 4; ++n) put_ok(*s, n);
  CHECK(get_checked(*s, hash_of(0)));  // 0 is now the most recently used
  put_ok(*s, 4);
  CHECK_FALSE(s->contains(hash_of(1)));
  CHECK(s->contains(hash_of(0)));
  put_ok(*s, 5);
  CHECK_FALSE(s->contains(hash_of(2)));
  CHECK(*s->put(hash_of(3), content_of(hash_of(3), block_bytes)) == PutOutcome::duplicate);
  put_ok(*s, 6);  // the duplicate put above was a use of 3: 0 goes before it
  CHECK_FALSE(s->contains(hash_of(0)));
  CHECK(s->contains(hash_of(3)));
  CHECK(s->stats().evictions_count == 3);
  CHECK(s->stats().blocks_used_count == 4);
  for (uint64_t n : {3, 4, 5, 6}) CHECK(get_checked(*s, hash_of(n)));
  // The router's precise events learn each eviction, in order, once.
  bool overflowed = true;
  CHECK(s->drain_removed(&overflowed) ==
        std::vector<BlockHash>{hash_of(1), hash_of(2), hash_of(0)});
  CHECK_FALSE(overflowed);
  CHECK(s->drain_removed(&overflowed).empty());
  s->check_invariants();
}

TEST_CASE("pinned blocks and writes in flight are never evicted; no victim is overloaded") {
  TempDir dir;
  auto s = open_ok(config_for(dir.path, 2));
  put_ok(*s, 1);
  put_ok(*s, 2);
  auto pin = s->pin(hash_of(1));  // 1 is the LRU-oldest, but pinned
  REQUIRE(pin.ok());
  auto writing = s->put_begin(hash_of(3));
  REQUIRE(writing.ok());
  CHECK_FALSE(s->contains(hash_of(2)));  // the only evictable block went
  CHECK(s->contains(hash_of(1)));
  auto full = s->put(hash_of(4), content_of(hash_of(4), block_bytes));
  REQUIRE_FALSE(full.ok());
  CHECK(full.error().kind == ErrorKind::overloaded);
  CHECK(s->stats().puts_dropped_full_count == 1);
  CHECK_FALSE(s->contains(hash_of(4)));
  CHECK(std::vector<uint8_t>(pin->bytes.begin(), pin->bytes.end()) ==
        content_of(hash_of(1), block_bytes));
  CHECK(s->stats().blocks_pinned_count == 1);
  s->check_invariants();
  REQUIRE(s->unpin(pin->id).ok());
  put_ok(*s, 4);  // now 1 can go; the write in flight still cannot
  CHECK_FALSE(s->contains(hash_of(1)));
  auto bytes = content_of(hash_of(3), block_bytes);
  std::memcpy(writing->buffer.data(), bytes.data(), bytes.size());
  REQUIRE(s->put_commit(writing->id, block_bytes).ok());
  CHECK(get_checked(*s, hash_of(3)));
  CHECK(get_checked(*s, hash_of(4)));
  s->check_invariants();
}

TEST_CASE("pins are bounded by pins_max; unknown pins are an error value") {
  TempDir dir;
  auto c = config_for(dir.path, 4);
  c.pins_max = 2;
  auto s = open_ok(c);
  put_ok(*s, 1);
  auto a = s->pin(hash_of(1));
  auto b = s->pin(hash_of(1));  // the same block twice
  REQUIRE((a.ok() && b.ok()));
  CHECK(a->id != b->id);
  auto c3 = s->pin(hash_of(1));
  REQUIRE_FALSE(c3.ok());
  CHECK(c3.error().kind == ErrorKind::overloaded);
  CHECK(s->unpin(12345).error().kind == ErrorKind::invalid);
  REQUIRE(s->unpin(a->id).ok());
  CHECK(s->unpin(a->id).error().kind == ErrorKind::invalid);  // released twice
  CHECK(s->stats().blocks_pinned_count == 1);                 // b still holds it
  CHECK_FALSE(s->pin(hash_of(7)).ok());
  CHECK(s->last_miss() == Tier2Miss::absent);
  REQUIRE(s->unpin(b->id).ok());
  CHECK(s->stats().blocks_pinned_count == 0);
  CHECK(s->pin(hash_of(1)).ok());
  s->check_invariants();
}

TEST_CASE("another fingerprint never matches, is kept unserved and is evicted first") {
  TempDir dir;
  auto a = config_for(dir.path, 2);
  auto b = a;
  b.fingerprint = make_fingerprint({"test-model", "fp8", 16, 2, 2, 64, ""});
  BlockHash h = hash_of(1);
  { put_ok(*open_ok(a), 1); }
  {
    auto s = open_ok(b);
    CHECK_FALSE(s->contains(h));
    CHECK_FALSE(get_checked(*s, h));
    CHECK(misses(*s, Tier2Miss::absent) == 1);
    CHECK_FALSE(s->pin(h).ok());
    CHECK(s->stats().blocks_foreign_count == 1);
    CHECK(s->stats().blocks_used_count == 0);
    CHECK(s->blocks().empty());
    put_ok(*s, 2);  // the free slot
    // Same hash, same bytes, other fingerprint: a separate block.
    CHECK(*s->put(h, content_of(h, block_bytes)) == PutOutcome::stored);
    CHECK(s->stats().evictions_foreign_count == 1);  // the foreign block went, not ours
    CHECK(s->contains(hash_of(2)));
  }
  {
    auto s = open_ok(a);  // a's block was evicted by b; b's two are foreign to a
    CHECK_FALSE(s->contains(h));
    CHECK(s->stats().blocks_foreign_count == 2);
  }
  // block_bytes is part of the identity: same text, other block size, no match.
  auto c = a;
  c.block_bytes = block_bytes - 100;  // same slot size, so the layout is unchanged
  {
    auto s = open_ok(c);
    CHECK_FALSE(s->contains(hash_of(2)));
    CHECK(s->stats().blocks_foreign_count == 2);
  }
  auto s = open_ok(b);
  CHECK(get_checked(*s, h));
  CHECK(get_checked(*s, hash_of(2)));
}

TEST_CASE("restart: every block reads back, and the LRU order survives") {
  TempDir dir;
  auto c = config_for(dir.path, 24);
  {
    auto s = open_ok(c);
    for (uint64_t n = 0; n < 20; ++n) put_ok(*s, n);
  }
  {
    auto s = open_ok(c);
    CHECK(s->stats().blocks_used_count == 20);
    auto listed = s->blocks();
    std::set<BlockHash> listed_set(listed.begin(), listed.end());
    for (uint64_t n = 0; n < 20; ++n) {
      CHECK(listed_set.contains(hash_of(n)));
      CHECK(get_checked(*s, hash_of(n)));
    }
    CHECK(s->stats().hits_count == 20);
  }
  TempDir dir2;
  auto small = config_for(dir2.path, 4);
  {
    auto s = open_ok(small);
    for (uint64_t n = 0; n < 4; ++n) put_ok(*s, n);
    CHECK(get_checked(*s, hash_of(0)));  // 1 is now the oldest
  }
  auto s = open_ok(small);
  put_ok(*s, 9);
  CHECK_FALSE(s->contains(hash_of(1)));
  CHECK(s->contains(hash_of(0)));
}

TEST_CASE("slots no index entry references are free after a restart") {
  TempDir dir;
  auto c = config_for(dir.path, 4);
  FingerprintDigest digest;
  {
    auto s = open_ok(c);
    for (uint64_t n = 0; n < 3; ++n) put_ok(*s, n);
    digest = s->fingerprint_digest();
  }
  {
    // A crash between the data write and the index write leaves data with no entry.
    auto db = open_index_directly(dir.path);
    rocksdb::WriteOptions sync;
    sync.sync = true;
    REQUIRE(db->Delete(sync, encode_block_key(digest, hash_of(1))).ok());
  }
  auto s = open_ok(c);
  CHECK(s->stats().blocks_used_count == 2);
  CHECK_FALSE(s->contains(hash_of(1)));
  put_ok(*s, 10);
  put_ok(*s, 11);  // the never-used slot and the reclaimed one
  CHECK(s->stats().evictions_count == 0);
  for (uint64_t n : {0, 2, 10, 11}) CHECK(get_checked(*s, hash_of(n)));
  s->check_invariants();
}

namespace {

// The child of the kill test: puts blocks forever (more than fit, so slots are reused),
// reporting each completed put's number on `fd`.
[[noreturn]] void put_forever(const Tier2Config& c, uint64_t first, int fd) {
  auto s = Tier2Store::open(c);
  if (!s) ::_exit(3);
  for (uint64_t n = first;; ++n) {
    auto r = (*s)->put(hash_of(n), content_of(hash_of(n), block_bytes));
    if (!r) ::_exit(4);
    if (::write(fd, &n, sizeof(n)) != sizeof(n)) ::_exit(5);
  }
}

constexpr const char* child_env = "TANDEM_TIER2_WRITER";  // "dir|first|fd|commits_per_sync"

Tier2Config writer_config(const std::string& dir, uint32_t commits_per_sync) {
  auto c = config_for(dir, 12);
  c.host_cache_bytes = 0;
  c.index_commits_per_sync = commits_per_sync;
  return c;
}

// The writer runs in a fresh process (this test binary, exec'd with child_env set), not in a
// fork of the test process: that one has RocksDB's background threads, which a fork drops.
// Runs before doctest's main when the variable is set, and never returns then.
const bool writer_process = [] {
  const char* spec = std::getenv(child_env);
  if (spec == nullptr) return false;
  std::string text(spec);
  size_t a = text.find('|'), b = text.find('|', a + 1), c = text.find('|', b + 1);
  if (a == std::string::npos || b == std::string::npos || c == std::string::npos) ::_exit(2);
  uint64_t first = std::stoull(text.substr(a + 1, b - a - 1));
  int fd = std::stoi(text.substr(b + 1, c - b - 1));
  auto commits = static_cast<uint32_t>(std::stoul(text.substr(c + 1)));
  put_forever(writer_config(text.substr(0, a), commits), first, fd);
}();

// Starts the writer on `dir`, reporting on `fd` (inherited: the pipe is not close-on-exec).
pid_t spawn_writer(const std::string& dir, uint64_t first, int fd, uint32_t commits_per_sync) {
  std::string var = std::string(child_env) + "=" + dir + "|" + std::to_string(first) + "|" +
                    std::to_string(fd) + "|" + std::to_string(commits_per_sync);
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  env.push_back(var.data());
  env.push_back(nullptr);
  std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  char* argv[] = {exe.data(), nullptr};
  pid_t pid = -1;
  if (::posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, env.data()) != 0) return -1;
  return pid;
}

}  // namespace

TEST_CASE("a store left by a SIGKILLed writer serves every block correctly or not at all") {
  CHECK_FALSE(writer_process);
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    CAPTURE(seed);
    TempDir dir;
    uint32_t commits_per_sync = seed <= 3 ? 1 : 8;  // a WAL sync per put, or per 8 puts
    auto c = writer_config(dir.path, commits_per_sync);
    uint64_t first = seed * 1000000;
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    pid_t child = spawn_writer(dir.path, first, fds[1], commits_per_sync);
    REQUIRE(child > 0);
    ::close(fds[1]);
    // Let the child get going (it has completed puts, so slots are in use and a kill can
    // land anywhere in the put cycle), then kill it after a random further delay.
    std::vector<uint64_t> done;
    uint64_t n = 0;
    while (done.size() < 3 && ::read(fds[0], &n, sizeof(n)) == sizeof(n)) done.push_back(n);
    REQUIRE(done.size() == 3);  // else the child exited before its third put
    std::mt19937_64 rng(seed);
    auto wait_ms = std::uniform_int_distribution<int>(0, 400)(rng);
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
    ::kill(child, SIGKILL);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFSIGNALED(status));  // killed mid-loop, not exited on an error
    while (::read(fds[0], &n, sizeof(n)) == sizeof(n)) done.push_back(n);
    ::close(fds[0]);
    MESSAGE("seed ", seed, ": killed ", wait_ms, " ms after 3 puts, ", done.size(),
            " puts returned");

    auto s = open_ok(c);
    uint64_t served = 0, missed = 0;
    for (const BlockHash& h : s->blocks()) (get_checked(*s, h) ? served : missed) += 1;
    CHECK(missed == 0);  // durable before visible: no entry without its complete bytes
    // Every put that returned is durable; only the LRU-oldest may have been evicted by the
    // put in flight at the kill, so the last slots - 1 completed puts are all there.
    size_t must_have = std::min<size_t>(done.size(), c.capacity_bytes / block_bytes - 1);
    for (size_t i = done.size() - must_have; i < done.size(); ++i) {
      CHECK(get_checked(*s, hash_of(done[i])));
    }
    VerifyReport report = s->verify();
    CHECK(report.checked_count == report.ok_count);
    CHECK(served + missed <= 12);
    s->check_invariants();
  }
}

TEST_CASE("injected read faults are misses by reason; the entry is dropped, never served") {
  struct Case {
    FaultKind fault;
    Tier2Miss reason;
    Tier2EventKind event;
  };
  for (Case k :
       {Case{FaultKind::short_read, Tier2Miss::short_read, Tier2EventKind::miss_short_read},
        Case{FaultKind::read_eio, Tier2Miss::io_error, Tier2EventKind::miss_io_error},
        Case{FaultKind::bit_flip, Tier2Miss::checksum, Tier2EventKind::miss_checksum}}) {
    CAPTURE(to_string(k.fault));
    TempDir dir;
    FaultyBlockFile* faults = nullptr;
    auto s = open_faulty(config_for(dir.path, 4), &faults);
    put_ok(*s, 1);
    put_ok(*s, 2);
    faults->arm(k.fault);
    CHECK_FALSE(get_checked(*s, hash_of(1)));
    CHECK(faults->injected_count(k.fault) == 1);
    CHECK(s->last_miss() == k.reason);
    CHECK(misses(*s, k.reason) == 1);
    CHECK(s->stats().corrupt_dropped_count == 1);
    CHECK_FALSE(s->contains(hash_of(1)));
    CHECK(s->stats().blocks_used_count == 1);
    bool overflowed = true;
    CHECK(s->drain_removed(&overflowed) == std::vector<BlockHash>{hash_of(1)});  // and told
    CHECK_FALSE(overflowed);
    auto events = s->drain_events();
    CHECK(has_event(events, k.event));
    for (const auto& e : events) CHECK(e.detail.find("slot") != std::string::npos);
    CHECK_FALSE(get_checked(*s, hash_of(1)));  // now simply absent
    CHECK(misses(*s, Tier2Miss::absent) == 1);
    CHECK(get_checked(*s, hash_of(2)));  // the one-shot fault is spent
    faults->arm(k.fault);
    CHECK_FALSE(s->pin(hash_of(2)).ok());  // a pin reads and checks the same way
    CHECK(misses(*s, k.reason) == 2);
    put_ok(*s, 3);
    CHECK(s->stats().evictions_count == 0);  // the dropped slots were freed
    s->check_invariants();
  }
}

TEST_CASE("injected write faults fail the put (or, torn, are caught on read)") {
  for (FaultKind fault : {FaultKind::write_eio, FaultKind::enospc, FaultKind::sync_eio}) {
    CAPTURE(to_string(fault));
    TempDir dir;
    FaultyBlockFile* faults = nullptr;
    auto s = open_faulty(config_for(dir.path, 1), &faults);
    faults->arm(fault);
    auto r = s->put(hash_of(1), content_of(hash_of(1), block_bytes));
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().kind == ErrorKind::failed);
    CHECK(s->stats().puts_dropped_io_count == 1);
    CHECK(s->stats().puts_count == 0);
    CHECK_FALSE(s->contains(hash_of(1)));
    CHECK(s->stats().blocks_used_count == 0);
    CHECK(has_event(s->drain_events(), Tier2EventKind::put_io_error));
    put_ok(*s, 2);  // the slot is free again
    CHECK(s->stats().evictions_count == 0);
    CHECK(get_checked(*s, hash_of(2)));
    s->check_invariants();
  }
  TempDir dir;
  FaultyBlockFile* faults = nullptr;
  auto c = config_for(dir.path, 2);
  c.host_cache_bytes = 0;  // else the put's own (good) bytes would be served from RAM
  auto s = open_faulty(c, &faults);
  faults->arm(FaultKind::torn_write);
  put_ok(*s, 1);  // the device lied: only a prefix landed
  CHECK(faults->injected_count(FaultKind::torn_write) == 1);
  CHECK_FALSE(get_checked(*s, hash_of(1)));
  CHECK(s->last_miss() == Tier2Miss::checksum);
  CHECK(s->stats().corrupt_dropped_count == 1);
  CHECK_FALSE(s->contains(hash_of(1)));
}

TEST_CASE("verify() finds a block corrupted behind the store's back") {
  TempDir dir;
  auto c = config_for(dir.path, 8);
  c.host_cache_bytes = 8 * block_bytes;  // verify must read the disk, not the cache
  auto s = open_ok(c);
  for (uint64_t n = 0; n < 5; ++n) put_ok(*s, n);
  {
    int fd = ::open((dir.path + "/tier2.data").c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    uint8_t byte = 0;
    off_t at = 2 * block_bytes + 777;  // a byte of slot 2
    REQUIRE(::pread(fd, &byte, 1, at) == 1);
    byte ^= 0x10;
    REQUIRE(::pwrite(fd, &byte, 1, at) == 1);
    REQUIRE(::fsync(fd) == 0);
    ::close(fd);
  }
  for (uint64_t n = 0; n < 5; ++n) CHECK(get_checked(*s, hash_of(n)));  // cached: good bytes
  VerifyReport report = s->verify();
  CHECK(report.checked_count == 5);
  CHECK(report.ok_count == 4);
  CHECK(report.dropped_count[static_cast<size_t>(Tier2Miss::checksum)] == 1);
  CHECK(s->stats().blocks_used_count == 4);
  int gone = 0;
  for (uint64_t n = 0; n < 5; ++n) gone += s->contains(hash_of(n)) ? 0 : 1;
  CHECK(gone == 1);
  CHECK(s->verify().ok_count == 4);
  s->check_invariants();
}

TEST_CASE("a read corrupted on disk is a checksum miss, also after a restart") {
  TempDir dir;
  auto c = config_for(dir.path, 4);
  c.host_cache_bytes = 0;
  { put_ok(*open_ok(c), 1); }
  {
    int fd = ::open((dir.path + "/tier2.data").c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    uint8_t zero = 0;
    for (off_t at = 0; at < 16; ++at) REQUIRE(::pwrite(fd, &zero, 1, at) == 1);
    ::close(fd);
  }
  auto s = open_ok(c);
  CHECK(s->contains(hash_of(1)));  // the index alone cannot know
  CHECK_FALSE(get_checked(*s, hash_of(1)));
  CHECK(s->last_miss() == Tier2Miss::checksum);
  CHECK_FALSE(s->contains(hash_of(1)));
}

TEST_CASE("a seeded mix of every fault never serves a wrong block") {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    CAPTURE(seed);
    TempDir dir;
    auto c = config_for(dir.path, 6);
    c.host_cache_bytes = (seed % 2) * 2 * block_bytes;
    FaultRates rates;
    for (double& p : rates.probability) p = 0.04;
    FaultyBlockFile* faults = nullptr;
    auto s = open_faulty(c, &faults, seed, rates);
    std::mt19937_64 rng(seed);
    std::vector<PinId> pins;
    uint64_t served = 0;
    for (int step = 0; step < 400; ++step) {
      uint64_t n = rng() % 12;
      switch (rng() % 5) {
        case 0:
        case 1:
          (void)s->put(hash_of(n), content_of(hash_of(n), block_bytes));
          break;
        case 2:
          served += get_checked(*s, hash_of(n)) ? 1 : 0;
          break;
        case 3: {
          auto p = s->pin(hash_of(n));
          if (p && pins.size() < 4) {
            CHECK(std::vector<uint8_t>(p->bytes.begin(), p->bytes.end()) ==
                  content_of(hash_of(n), block_bytes));
            pins.push_back(p->id);
          } else if (p) {
            REQUIRE(s->unpin(p->id).ok());
          }
          break;
        }
        default:
          if (!pins.empty()) REQUIRE(s->unpin(pins.back()).ok());
          if (!pins.empty()) pins.pop_back();
      }
      s->check_invariants();
    }
    CHECK(faults->injected_total_count() > 0);
    CHECK(served > 0);
    auto st = s->stats();
    uint64_t miss_total = 0;
    for (uint64_t m : st.misses_count) miss_total += m;
    CHECK(miss_total > 0);
    CHECK(st.corrupt_dropped_count == miss_total - misses(*s, Tier2Miss::absent));
    faults->set_rates({});
    s->verify();
    for (const BlockHash& h : s->blocks()) CHECK(get_checked(*s, h));
  }
}

TEST_CASE("FaultyBlockFile: arm skips calls; a seed replays the same faults") {
  TempDir dir;
  auto open_inner = [&] {
    auto f = PosixBlockFile::open(dir.path + "/f", 8192, IoModeRequest::buffered);
    REQUIRE(f.ok());
    return std::unique_ptr<BlockFile>(std::move(*f));
  };
  FaultyBlockFile f(open_inner(), 7);
  AlignedBuffer buf(4096);
  f.arm(FaultKind::read_eio, 1);
  CHECK(f.pread(buf.span(), 0).ok());
  CHECK_FALSE(f.pread(buf.span(), 0).ok());
  CHECK(f.pread(buf.span(), 0).ok());
  f.arm(FaultKind::sync_eio);
  CHECK_FALSE(f.sync_data().ok());
  CHECK(f.sync_data().ok());
  auto run = [&](uint64_t seed) {
    FaultRates rates;
    rates[FaultKind::read_eio] = 0.3;
    FaultyBlockFile g(open_inner(), seed, rates);
    std::string pattern;
    for (int i = 0; i < 64; ++i) pattern += g.pread(buf.span(), 0).ok() ? '.' : 'x';
    return pattern;
  };
  CHECK(run(3) == run(3));
  CHECK(run(3) != run(4));
  CHECK(run(3).find('x') != std::string::npos);
}

TEST_CASE("bad config fails at open and names the key") {
  TempDir dir;
  auto expect = [](Tier2Config c, const std::string& key) {
    CAPTURE(key);
    auto s = Tier2Store::open(c);
    REQUIRE_FALSE(s.ok());
    CHECK(s.error().kind == ErrorKind::invalid);
    CHECK(s.error().message.rfind(key + ":", 0) == 0);
    MESSAGE(s.error().message);
  };
  auto good = config_for(dir.path, 4);
  auto c = good;
  c.directory = dir.path + "/missing";
  expect(c, "directory");
  c.directory = "";
  expect(c, "directory");
  c.directory = "/proc";  // exists, but nothing can be created in it (not even by root)
  expect(c, "directory");
  {
    std::string file = dir.path + "/plain-file";
    int fd = ::open(file.c_str(), O_CREAT | O_WRONLY, 0644);
    REQUIRE(fd >= 0);
    ::close(fd);
    c.directory = file;
    expect(c, "directory");
  }
  c = good;
  c.capacity_bytes = 0;
  expect(c, "capacity_bytes");
  c.capacity_bytes = 4096;  // one slot is 8192
  expect(c, "capacity_bytes");
  c = good;
  c.block_bytes = 1ull << 30;
  c.capacity_bytes = 1ull << 50;  // 1 PiB: beyond this file system's free space
  expect(c, "capacity_bytes");
  c = good;
  c.block_bytes = 0;
  expect(c, "block_bytes");
  c = good;
  c.fingerprint = "";
  expect(c, "fingerprint");
  c = good;
  c.pins_max = 0;
  expect(c, "pins_max");
  c = good;
  c.host_cache_bytes = 100;
  expect(c, "host_cache_bytes");
  c = good;
  c.writes_inflight_max = 0;
  expect(c, "writes_inflight_max");
  c = good;
  c.index_commits_per_sync = 0;
  expect(c, "index_commits_per_sync");
  c = good;
  c.puts_batch_max = 0;
  expect(c, "puts_batch_max");
  CHECK(open_ok(good)->stats().blocks_capacity_count == 4);
}

TEST_CASE("a newer format is refused; a foreign database is refused") {
  TempDir dir;
  auto c = config_for(dir.path, 4);
  { open_ok(c); }
  {
    auto db = open_index_directly(dir.path);
    REQUIRE(
        db->Put(rocksdb::WriteOptions(), meta_key("format"), encode_u64(format_version_current + 1))
            .ok());
  }
  auto s = Tier2Store::open(c);
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().kind == ErrorKind::unimplemented);
  CHECK(s.error().message.find("version " + std::to_string(format_version_current + 1)) !=
        std::string::npos);
  TempDir other;
  std::filesystem::create_directory(other.path + "/index");
  {
    rocksdb::DB* raw = nullptr;
    rocksdb::Options options;
    options.create_if_missing = true;
    REQUIRE(rocksdb::DB::Open(options, other.path + "/index", &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    REQUIRE(db->Put(rocksdb::WriteOptions(), "someone-else", "x").ok());
  }
  auto f = Tier2Store::open(config_for(other.path, 4));
  REQUIRE_FALSE(f.ok());
  CHECK(f.error().message.rfind("directory:", 0) == 0);
}

TEST_CASE("restart drops what the index cannot use: new slot size, shrunk capacity") {
  TempDir dir;
  auto c = config_for(dir.path, 6);
  {
    auto s = open_ok(c);
    for (uint64_t n = 0; n < 6; ++n) put_ok(*s, n);
  }
  auto shrunk = config_for(dir.path, 4);
  {
    auto s = open_ok(shrunk);
    CHECK(s->stats().blocks_used_count == 4);
    CHECK(s->stats().index_dropped_count == 2);
    CHECK(has_event(s->drain_events(), Tier2EventKind::index_slot_out_of_range));
    for (const BlockHash& h : s->blocks()) CHECK(get_checked(*s, h));
  }
  auto bigger_blocks = config_for(dir.path, 4, 2 * block_bytes);
  auto s = open_ok(bigger_blocks);
  CHECK(s->stats().blocks_used_count == 0);
  CHECK(s->stats().index_dropped_count == 4);
  CHECK(has_event(s->drain_events(), Tier2EventKind::layout_changed));
  put_ok(*s, 1, 2 * block_bytes);
}

TEST_CASE("restart resolves two entries claiming one slot and undecodable entries") {
  TempDir dir;
  auto c = config_for(dir.path, 4);
  FingerprintDigest digest;
  {
    auto s = open_ok(c);
    put_ok(*s, 1);
    put_ok(*s, 2);
    digest = s->fingerprint_digest();
  }
  {
    auto db = open_index_directly(dir.path);
    std::string value;
    REQUIRE(db->Get(rocksdb::ReadOptions(), encode_block_key(digest, hash_of(1)), &value).ok());
    auto entry = decode_index_entry(value);
    REQUIRE(entry.has_value());
    entry->meta.generation = 0;  // older than hash 1's own entry in the same slot
    REQUIRE(db->Put(rocksdb::WriteOptions(), encode_block_key(digest, hash_of(7)),
                    encode_index_entry(*entry))
                .ok());
    REQUIRE(db->Put(rocksdb::WriteOptions(), encode_block_key(digest, hash_of(8)), "junk").ok());
  }
  auto s = open_ok(c);
  CHECK(s->stats().index_dropped_count == 2);
  CHECK_FALSE(s->contains(hash_of(7)));
  CHECK_FALSE(s->contains(hash_of(8)));
  CHECK(get_checked(*s, hash_of(1)));
  CHECK(get_checked(*s, hash_of(2)));
  auto events = s->drain_events();
  CHECK(has_event(events, Tier2EventKind::index_slot_conflict));
  CHECK(has_event(events, Tier2EventKind::index_entry_invalid));
}

TEST_CASE("a digest recorded for another fingerprint text is a collision: entries dropped") {
  TempDir dir;
  auto c = config_for(dir.path, 4);
  FingerprintDigest digest;
  {
    auto s = open_ok(c);
    put_ok(*s, 1);
    digest = s->fingerprint_digest();
  }
  {
    auto db = open_index_directly(dir.path);
    REQUIRE(db->Put(rocksdb::WriteOptions(), fingerprint_key(digest), "model=other").ok());
  }
  auto s = open_ok(c);
  CHECK_FALSE(s->contains(hash_of(1)));
  CHECK(s->stats().index_dropped_count == 1);
  CHECK(has_event(s->drain_events(), Tier2EventKind::fingerprint_collision));
}

TEST_CASE("the host cache serves verified bytes and stays within host_cache_bytes") {
  TempDir dir;
  auto c = config_for(dir.path, 8);
  c.host_cache_bytes = 2 * block_bytes;
  FaultyBlockFile* faults = nullptr;
  auto s = open_faulty(c, &faults);
  for (uint64_t n = 0; n < 4; ++n) put_ok(*s, n);
  CHECK(s->stats().host_cache_used_bytes == 2 * block_bytes);
  faults->arm(FaultKind::read_eio);  // a cache hit does not read
  CHECK(get_checked(*s, hash_of(3)));
  CHECK(s->stats().cache_hits_count == 1);
  CHECK_FALSE(get_checked(*s, hash_of(0)));  // not cached: the armed fault hits it
  CHECK(s->last_miss() == Tier2Miss::io_error);
  CHECK_FALSE(s->contains(hash_of(0)));
  CHECK(get_checked(*s, hash_of(1)));  // read from disk, verified, cached
  CHECK(get_checked(*s, hash_of(1)));
  CHECK(s->stats().cache_hits_count == 2);
  CHECK(s->stats().host_cache_used_bytes <= c.host_cache_bytes);
  s->check_invariants();
}

TEST_CASE("a pinned block that fails verification stays readable by its pin, then frees") {
  TempDir dir;
  auto c = config_for(dir.path, 1);
  FaultyBlockFile* faults = nullptr;
  auto s = open_faulty(c, &faults);
  put_ok(*s, 1);
  auto pin = s->pin(hash_of(1));
  REQUIRE(pin.ok());
  faults->arm(FaultKind::bit_flip);
  VerifyReport report = s->verify();
  CHECK(report.dropped_count[static_cast<size_t>(Tier2Miss::checksum)] == 1);
  CHECK_FALSE(s->contains(hash_of(1)));
  CHECK(std::vector<uint8_t>(pin->bytes.begin(), pin->bytes.end()) ==
        content_of(hash_of(1), block_bytes));  // verified when pinned
  auto full = s->put(hash_of(2), content_of(hash_of(2), block_bytes));
  CHECK(full.error().kind == ErrorKind::overloaded);  // the doomed slot waits for its pin
  s->check_invariants();
  REQUIRE(s->unpin(pin->id).ok());
  put_ok(*s, 2);
  CHECK(s->stats().evictions_count == 0);
  s->check_invariants();
}

TEST_CASE("a read straight into an aligned buffer: verified, and zeroed when it fails") {
  TempDir dir;
  auto c = config_for(dir.path, 4);
  c.host_cache_bytes = 0;
  FaultyBlockFile* faults = nullptr;
  auto s = open_faulty(c, &faults);
  put_ok(*s, 1);
  put_ok(*s, 2);
  AlignedBuffer out(block_bytes);
  auto got = s->get(hash_of(1), out.span());
  REQUIRE(got.ok());
  CHECK(std::vector<uint8_t>(out.data(), out.data() + block_bytes) ==
        content_of(hash_of(1), block_bytes));
  faults->arm(FaultKind::bit_flip);  // the flipped bytes land in `out` itself
  CHECK_FALSE(s->get(hash_of(2), out.span()).ok());
  CHECK(std::all_of(out.data(), out.data() + out.size(), [](uint8_t b) { return b == 0; }));
  CHECK(s->last_miss() == Tier2Miss::checksum);
}

TEST_CASE("buffered I/O (no O_DIRECT) keeps every guarantee") {
  TempDir dir;
  auto c = config_for(dir.path, 3);
  c.io_mode = IoModeRequest::buffered;
  c.host_cache_bytes = 0;
  {
    FaultyBlockFile* faults = nullptr;
    auto s = open_faulty(c, &faults);
    CHECK(s->io_mode() == IoMode::buffered);
    put_ok(*s, 1);
    put_ok(*s, 2, 5000);  // not a multiple of 4096: written as is, no padding copy
    faults->arm(FaultKind::torn_write);
    put_ok(*s, 3);
    CHECK_FALSE(get_checked(*s, hash_of(3)));
    CHECK(s->last_miss() == Tier2Miss::checksum);
  }
  auto s = open_ok(c);
  CHECK(get_checked(*s, hash_of(1)));
  CHECK(get_checked(*s, hash_of(2), 5000));
  CHECK_FALSE(s->contains(hash_of(3)));
  CHECK(s->verify().ok_count == 2);
}

TEST_CASE("a deleted data file drops the index; a second open of a directory is refused") {
  TempDir dir;
  auto c = config_for(dir.path, 4);
  {
    auto s = open_ok(c);
    put_ok(*s, 1);
    auto twice = Tier2Store::open(c);  // RocksDB's LOCK: one store per directory
    REQUIRE_FALSE(twice.ok());
    CHECK(twice.error().kind == ErrorKind::failed);
    MESSAGE(twice.error().message);
  }
  std::filesystem::remove(dir.path + "/tier2.data");
  auto s = open_ok(c);
  CHECK_FALSE(s->contains(hash_of(1)));
  CHECK(s->stats().index_dropped_count == 1);
  CHECK(has_event(s->drain_events(), Tier2EventKind::data_file_missing));
  put_ok(*s, 2);
  CHECK(get_checked(*s, hash_of(2)));
}

TEST_CASE("index_commits_per_sync > 1: puts are visible at once and survive a clean close") {
  TempDir dir;
  auto c = config_for(dir.path, 8);
  c.index_commits_per_sync = 4;
  {
    auto s = open_ok(c);
    for (uint64_t n = 0; n < 6; ++n) put_ok(*s, n);  // one synced commit, two pending
    for (uint64_t n = 0; n < 6; ++n) CHECK(get_checked(*s, hash_of(n)));
    REQUIRE(s->flush().ok());  // syncs the WAL
  }
  auto s = open_ok(c);
  CHECK(s->stats().blocks_used_count == 6);
  for (uint64_t n = 0; n < 6; ++n) CHECK(get_checked(*s, hash_of(n)));
}

TEST_CASE("after a restart, another fingerprint's blocks are evicted before older own ones") {
  TempDir dir;
  auto a = config_for(dir.path, 2);
  auto b = a;
  b.fingerprint = make_fingerprint({"other-model", "bf16", 16, 2, 2, 64, ""});
  { put_ok(*open_ok(a), 1); }  // a's block: the oldest use of all
  { put_ok(*open_ok(b), 2); }  // b's block: used later
  auto s = open_ok(a);
  CHECK(s->stats().blocks_used_count == 1);
  CHECK(s->stats().blocks_foreign_count == 1);
  put_ok(*s, 3);  // full: the foreign block goes, though ours is older
  CHECK(s->stats().evictions_foreign_count == 1);
  CHECK(get_checked(*s, hash_of(1)));
  CHECK(get_checked(*s, hash_of(3)));
  s->check_invariants();
}

TEST_CASE("drop_all: every block goes, own and foreign, and none comes back after a restart") {
  TempDir dir;
  auto a = config_for(dir.path, 8);
  a.host_cache_bytes = 8 * block_bytes;  // cached copies must go too
  auto b = a;
  b.fingerprint = make_fingerprint({"other-model", "bf16", 16, 2, 2, 64, ""});
  { put_ok(*open_ok(b), 100); }  // a foreign block
  {
    auto s = open_ok(a);
    for (uint64_t n = 0; n < 5; ++n) put_ok(*s, n);
    for (uint64_t n = 0; n < 5; ++n) CHECK(get_checked(*s, hash_of(n)));  // now cached
    CHECK(s->stats().blocks_foreign_count == 1);
    bool overflowed = true;
    (void)s->drain_removed(&overflowed);
    auto report = s->drop_all();
    REQUIRE(report.ok());
    CHECK(report->dropped_count == 6);
    CHECK(report->pinned_count == 0);
    auto removed = s->drain_removed(&overflowed);  // for the routers: the own ones, once
    CHECK_FALSE(overflowed);
    CHECK(std::set<BlockHash>(removed.begin(), removed.end()) ==
          std::set<BlockHash>{hash_of(0), hash_of(1), hash_of(2), hash_of(3), hash_of(4)});
    CHECK(removed.size() == 5);
    CHECK(s->blocks().empty());
    CHECK(s->stats().blocks_used_count == 0);
    CHECK(s->stats().blocks_foreign_count == 0);
    CHECK(s->stats().host_cache_used_bytes == 0);
    for (uint64_t n = 0; n < 5; ++n) {
      CHECK_FALSE(s->contains(hash_of(n)));
      CHECK_FALSE(get_checked(*s, hash_of(n)));  // a miss, not the cached bytes
    }
    CHECK(misses(*s, Tier2Miss::absent) == 5);
    CHECK(s->verify().checked_count == 0);
    s->check_invariants();
    // Every slot is free again: a full store's worth of new blocks fits without evicting.
    for (uint64_t n = 10; n < 18; ++n) put_ok(*s, n);
    CHECK(s->stats().evictions_count == 0);
    REQUIRE(s->drop_all().ok());
    put_ok(*s, 20);  // a block stored after the drop is kept
  }
  {
    auto s = open_ok(a);
    CHECK(s->stats().blocks_used_count == 1);
    CHECK(s->stats().blocks_foreign_count == 0);
    CHECK(get_checked(*s, hash_of(20)));
    for (uint64_t n = 0; n < 18; ++n) CHECK_FALSE(s->contains(hash_of(n)));
    CHECK(s->stats().index_dropped_count == 0);  // gone from the index, not dropped at open
  }
  auto db = open_index_directly(dir.path);  // the index itself holds the one entry left
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  size_t entries = 0;
  for (it->Seek("B"); it->Valid() && it->key().starts_with("B"); it->Next()) ++entries;
  CHECK(entries == 1);
}

TEST_CASE("drop_all: a pinned block stays readable by its pin; its slot frees at the unpin") {
  TempDir dir;
  auto c = config_for(dir.path, 3);
  c.host_cache_bytes = 0;
  {
    auto s = open_ok(c);
    for (uint64_t n = 1; n <= 3; ++n) put_ok(*s, n);
    auto pin = s->pin(hash_of(2));
    REQUIRE(pin.ok());
    auto report = s->drop_all();
    REQUIRE(report.ok());
    CHECK(report->dropped_count == 3);
    CHECK(report->pinned_count == 1);
    CHECK_FALSE(s->contains(hash_of(2)));
    CHECK_FALSE(s->pin(hash_of(2)).ok());
    CHECK(std::vector<uint8_t>(pin->bytes.begin(), pin->bytes.end()) ==
          content_of(hash_of(2), block_bytes));  // the pin's bytes are still the block's
    CHECK(s->stats().blocks_pinned_count == 1);
    s->check_invariants();
    put_ok(*s, 4);  // the two free slots
    put_ok(*s, 5);
    put_ok(*s, 6);  // the pinned slot is not reused yet: 4 is evicted instead
    CHECK(s->stats().evictions_count == 1);
    CHECK_FALSE(s->contains(hash_of(4)));
    REQUIRE(s->unpin(pin->id).ok());
    CHECK(s->stats().blocks_pinned_count == 0);
    put_ok(*s, 7);  // now it is free: no eviction
    CHECK(s->stats().evictions_count == 1);
    s->check_invariants();
  }
  auto s = open_ok(c);
  CHECK(s->stats().blocks_used_count == 3);
  for (uint64_t n = 5; n <= 7; ++n) CHECK(get_checked(*s, hash_of(n)));
  for (uint64_t n = 1; n <= 4; ++n) CHECK_FALSE(s->contains(hash_of(n)));
}

TEST_CASE("drop_all: a write in flight is kept and becomes visible at its commit") {
  TempDir dir;
  auto c = config_for(dir.path, 4);
  {
    auto s = open_ok(c);
    put_ok(*s, 1);
    put_ok(*s, 2);
    auto writing = s->put_begin(hash_of(3));
    REQUIRE(writing.ok());
    auto report = s->drop_all();
    REQUIRE(report.ok());
    CHECK(report->dropped_count == 2);
    CHECK(s->stats().writes_inflight_count == 1);
    CHECK_FALSE(s->contains(hash_of(3)));  // not visible before its commit
    auto bytes = content_of(hash_of(3), block_bytes);
    std::memcpy(writing->buffer.data(), bytes.data(), bytes.size());
    REQUIRE(s->put_commit(writing->id, block_bytes).ok());
    CHECK(get_checked(*s, hash_of(3)));
    s->check_invariants();
  }
  auto s = open_ok(c);
  CHECK(s->stats().blocks_used_count == 1);
  CHECK(get_checked(*s, hash_of(3)));
  CHECK_FALSE(s->contains(hash_of(1)));
}
