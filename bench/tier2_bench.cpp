#include "bench/tier2_bench.hpp"

#include <sys/statfs.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kvstore/tier2/tier2_store.hpp"

namespace tandem::bench {
namespace {

namespace fs = std::filesystem;
namespace t2 = kv::tier2;
using Clock = std::chrono::steady_clock;

std::string fs_type_name(const std::string& dir) {
  struct statfs st {};
  if (::statfs(dir.c_str(), &st) != 0) return "unknown";
  switch (static_cast<uint64_t>(st.f_type)) {
    case 0xEF53:
      return "ext2/3/4";
    case 0x01021994:
      return "tmpfs";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x794c7630:
      return "overlayfs";
    default:
      break;
  }
  char hex[32];
  std::snprintf(hex, sizeof(hex), "0x%llx", static_cast<unsigned long long>(st.f_type));
  return hex;
}

kv::BlockHash bench_hash(uint64_t n) {
  kv::BlockHash h;
  uint64_t x = n * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < h.bytes.size(); i += 8) {
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    std::memcpy(h.bytes.data() + i, &x, 8);
  }
  return h;
}

struct StoreRun {
  double write_s = 0;  // all blocks put
  double read_s = 0;   // all blocks read back (0: not measured)
  std::string io_mode;
  std::string error;  // empty when every phase ran
};

t2::AlignedBuffer random_block(uint64_t block_bytes) {
  t2::AlignedBuffer buffer(block_bytes);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i < buffer.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(buffer.data() + i, &v, 8);
  }
  return buffer;
}

// Reads every block back in a shuffled order into an aligned buffer (the zero-copy path).
std::string read_all(t2::Tier2Store& store, uint64_t block_bytes, uint64_t blocks,
                     t2::AlignedBuffer& buffer) {
  std::vector<uint64_t> order(blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(2));
  for (uint64_t n : order) {
    auto got = store.get(bench_hash(n), buffer.span());
    uint64_t stamp = 0;
    std::memcpy(&stamp, buffer.data(), sizeof(stamp));
    if (!got) return got.error().describe();
    if (*got != block_bytes || stamp != n) return "wrong block read back";
  }
  return "";
}

// A fresh store in `dir`: `blocks` distinct blocks put `batch` at a time (put for 1,
// put_batch above), a WAL sync every `commits_per_sync` commits, then, with `read`, every
// block read back.
StoreRun run_store(const std::string& dir, uint64_t block_bytes, uint64_t blocks, uint32_t batch,
                   uint32_t commits_per_sync, bool read) {
  StoreRun run;
  t2::Tier2Config c;
  c.directory = dir;
  c.block_bytes = block_bytes;
  c.capacity_bytes = blocks * t2::round_up_bytes(block_bytes, t2::io_alignment_bytes);
  c.fingerprint = t2::make_fingerprint({"bench", "bf16", 0, 0, 0, 0, ""});
  c.puts_batch_max = batch;
  c.index_commits_per_sync = commits_per_sync;
  auto store = t2::Tier2Store::open(c);
  if (!store) return StoreRun{0, 0, "", store.error().describe()};
  run.io_mode = std::string(t2::to_string((*store)->io_mode()));
  // One buffer per block of a batch, each stamped with its block number: distinct blocks.
  std::vector<t2::AlignedBuffer> buffers;
  for (uint32_t i = 0; i < batch; ++i) buffers.push_back(random_block(block_bytes));
  std::vector<t2::PutItem> items;
  auto start = Clock::now();
  for (uint64_t n = 0; n < blocks && run.error.empty(); n += batch) {
    items.clear();
    for (uint64_t k = n; k < std::min(blocks, n + batch); ++k) {
      t2::AlignedBuffer& b = buffers[k - n];
      std::memcpy(b.data(), &k, sizeof(k));
      items.push_back({bench_hash(k), b.span().first(block_bytes)});
    }
    for (auto& put : (*store)->put_batch(items)) {
      if (!put) run.error = put.error().describe();
      if (put && *put != t2::PutOutcome::stored) run.error = "duplicate put";
    }
  }
  run.write_s = std::chrono::duration<double>(Clock::now() - start).count();
  if (!run.error.empty() || !read) return run;
  start = Clock::now();
  run.error = read_all(**store, block_bytes, blocks, buffers[0]);
  run.read_s = std::chrono::duration<double>(Clock::now() - start).count();
  return run;
}

// Runs one fio job on `file`; returns its JSON text (written to `json_path`, so that fio's
// warnings stay out). fdatasync_every: 0 = never, else an fdatasync after every that many
// writes.
Result<std::string> run_fio(const std::string& fio, const std::string& file,
                            const std::string& json_path, const std::string& rw,
                            uint64_t block_bytes, uint64_t total_bytes, uint32_t fdatasync_every) {
  std::ostringstream cmd;
  cmd << fio << " --name=tier2-" << rw << " --filename=" << file << " --rw=" << rw
      << " --bs=" << block_bytes << " --size=" << total_bytes
      << " --direct=1 --ioengine=psync --iodepth=1 --numjobs=1 --fallocate=posix";
  if (fdatasync_every > 0) cmd << " --fdatasync=" << fdatasync_every;
  cmd << " --output-format=json --output=" << json_path << " > /dev/null 2>&1";
  int status = std::system(cmd.str().c_str());
  if (status != 0) {
    return make_error(ErrorKind::failed, "`" + cmd.str() + "` exited with status " +
                                             std::to_string(WEXITSTATUS(status)));
  }
  std::ifstream in(json_path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Bytes per second of one fio job. A write job starts from a fresh file, as the store does.
Result<double> fio_rate(const std::string& fio, const std::string& file,
                        const std::string& json_path, const std::string& rw, uint64_t block_bytes,
                        uint64_t total_bytes, uint32_t fdatasync_every) {
  std::error_code ec;
  if (rw == "write") fs::remove(file, ec);
  auto text = run_fio(fio, file, json_path, rw, block_bytes, total_bytes, fdatasync_every);
  if (!text) return text.error();
  return parse_fio_bw_bytes(*text, rw == "randread" ? "read" : "write");
}

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// One measured pair: MB/s of tandem and of its fio baseline, per round.
struct Row {
  std::string phase;
  std::vector<double> tandem_mb_s, fio_mb_s;
};

// Medians of each side, and the median of the per-round ratios (each round's store and fio
// phases ran minutes apart at most, so their ratio is steadier than the ratio of medians).
void print_row(uint64_t block_mib, uint64_t blocks, const Row& r) {
  std::vector<double> ratios;
  for (size_t i = 0; i < r.tandem_mb_s.size() && i < r.fio_mb_s.size(); ++i) {
    ratios.push_back(r.fio_mb_s[i] > 0 ? r.tandem_mb_s[i] / r.fio_mb_s[i] : 0);
  }
  std::printf("%4llu %-38s %6llu %11.1f %11.1f %6.2f  ", static_cast<unsigned long long>(block_mib),
              r.phase.c_str(), static_cast<unsigned long long>(blocks), median(r.tandem_mb_s),
              median(r.fio_mb_s), median(ratios));
  for (double ratio : ratios) std::printf(" %.2f", ratio);
  std::printf("\n");
}

struct Options {
  std::string dir;
  std::string fio = "fio";
  std::vector<uint64_t> block_mib;
  uint64_t total_mib = 1024;
  uint32_t batch = 8;
  uint32_t rounds = 3;
  bool run_fio = true;
};

// The rows: a store configuration each, against a fio job.
//   0  put, WAL synced per put (the default: 2 flushes per block)   fio fdatasync=1
//   1  put, WAL synced per `batch` puts (1 flush per block)          fio fdatasync=1
//   2  put_batch of `batch` (2 flushes per batch)                    fio fdatasync=batch
//   3  as 2                                                          fio without sync
//   4  get in random order (after 0's writes)     fio randread of the store's data file
std::vector<Row> make_rows(uint32_t batch) {
  std::string b = std::to_string(batch);
  return {{"write: put | fio fdatasync=1", {}, {}},
          {"write: put, WAL sync/" + b + " | fdatasync=1", {}, {}},
          {"write: put_batch " + b + " | fdatasync=" + b, {}, {}},
          {"write: put_batch " + b + " | no sync", {}, {}},
          {"read: get, random | randread same file", {}, {}}};
}

// One round: each store phase right beside its fio baseline, so both see the same load of
// this shared disk. Fresh files for every write phase; fio's random read reads the data file
// the store has just read (same file, same extents: only the code differs).
std::string run_round(const Options& o, uint64_t block_bytes, uint64_t blocks,
                      std::vector<Row>& rows, std::string* io_mode) {
  std::string store_dir = o.dir + "/store", fio_dir = o.dir + "/fio";
  std::string json = fio_dir + "/fio.json";
  double mb = static_cast<double>(blocks * block_bytes) / 1e6;
  uint64_t total = blocks * block_bytes;
  std::error_code ec;
  fs::create_directories(fio_dir);
  std::string error;
  auto store = [&](uint32_t batch, uint32_t commits_per_sync, std::vector<size_t> write_rows,
                   bool read) {
    fs::remove_all(store_dir, ec);
    fs::create_directories(store_dir);
    StoreRun run = run_store(store_dir, block_bytes, blocks, batch, commits_per_sync, read);
    if (!run.error.empty()) error = "store: " + run.error;
    *io_mode = run.io_mode;
    for (size_t row : write_rows) rows[row].tandem_mb_s.push_back(mb / run.write_s);
    if (read) rows[4].tandem_mb_s.push_back(mb / run.read_s);
  };
  auto fio = [&](const std::string& file, const char* rw, uint32_t sync_every,
                 std::vector<size_t> fio_rows) {
    if (!o.run_fio || !error.empty()) return;
    auto rate = fio_rate(o.fio, file, json, rw, block_bytes, total, sync_every);
    if (!rate) error = "fio: " + rate.error().describe();
    for (size_t row : fio_rows) rows[row].fio_mb_s.push_back(rate ? *rate / 1e6 : 0);
  };
  std::string fio_file = fio_dir + "/fio.data";
  store(1, 1, {0}, true);
  fio(store_dir + "/tier2.data", "randread", 0, {4});
  fio(fio_file, "write", 1, {0});
  store(1, o.batch, {1}, false);
  fio(fio_file, "write", 1, {1});
  store(o.batch, 1, {2, 3}, false);
  fio(fio_file, "write", o.batch, {2});
  fio(fio_file, "write", 0, {3});
  fs::remove_all(store_dir, ec);
  fs::remove_all(fio_dir, ec);
  return error;
}

// One block size: `rounds` rounds; medians. Returns 1 on failure.
int bench_block_size(const Options& o, uint64_t block_mib) {
  uint64_t block_bytes = block_mib << 20;
  uint64_t blocks = std::max<uint64_t>(o.batch, (o.total_mib << 20) / block_bytes);
  std::vector<Row> rows = make_rows(o.batch);
  std::string io_mode;
  for (uint32_t round = 0; round < o.rounds; ++round) {
    std::string error = run_round(o, block_bytes, blocks, rows, &io_mode);
    if (!error.empty()) {
      std::fprintf(stderr, "bench tier2: %s\n", error.c_str());
      return 1;
    }
  }
  std::printf("# %llu MiB blocks: store I/O mode %s\n", static_cast<unsigned long long>(block_mib),
              io_mode.c_str());
  for (const Row& r : rows) print_row(block_mib, blocks, r);
  return 0;
}

// MB/s of XXH3-128 over one block (the store's per-read and per-write verification cost).
double checksum_mb_s(uint64_t block_bytes) {
  t2::AlignedBuffer buffer = random_block(block_bytes);
  t2::FingerprintDigest digest;
  uint64_t runs = 0, acc = 0;
  auto start = Clock::now();
  double elapsed = 0;
  do {
    acc += t2::block_checksum(digest, bench_hash(runs), runs, buffer.span()).low;
    ++runs;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < 0.3);
  if (acc == 42) std::printf(" ");  // keeps the loop
  return static_cast<double>(runs * block_bytes) / 1e6 / elapsed;
}

std::vector<uint64_t> parse_list(const std::string& text) {
  std::vector<uint64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    unsigned long long v = std::strtoull(item.c_str(), &end, 10);
    if (end == item.c_str() || *end != '\0' || v == 0 || v > 1024) return {};
    out.push_back(v);
  }
  return out;
}

}  // namespace

Result<double> parse_fio_bw_bytes(std::string_view json_text, std::string_view direction) {
  auto doc = nlohmann::json::parse(json_text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("jobs") || !doc["jobs"].is_array() ||
      doc["jobs"].empty()) {
    return make_error(ErrorKind::invalid, "fio: output is not fio JSON (no \"jobs\" array)");
  }
  double total = 0;
  for (const auto& job : doc["jobs"]) {
    const auto* dir = job.contains(direction) ? &job[std::string(direction)] : nullptr;
    if (dir == nullptr || !dir->contains("bw_bytes") || !(*dir)["bw_bytes"].is_number()) {
      return make_error(ErrorKind::invalid,
                        "fio: a job has no " + std::string(direction) + ".bw_bytes");
    }
    total += (*dir)["bw_bytes"].get<double>();
  }
  if (!(total > 0)) {
    return make_error(ErrorKind::invalid, "fio: " + std::string(direction) + " bw_bytes is 0");
  }
  return total;
}

int run_tier2_bench(cli::Args args) {
  cli::Flags f("tandem bench tier2 [--dir DIR] [--block-mib LIST] [--total-mib N] [--batch N]",
               "Writes then reads the same bytes through the tier-2 store (O_DIRECT when the\n"
               "file system accepts it) and with fio on the same directory (psync, iodepth 1,\n"
               "direct=1, same block size and total), and prints MB/s and tandem / fio\n"
               "(medians of --rounds rounds; the per-round ratios follow).");
  f.flag("dir", "DIR", "directory on the disk to measure (not tmpfs)", "/var/tmp/tandem-tier2")
      .flag("block-mib", "LIST", "block sizes in MiB, comma-separated", "1,4")
      .flag("total-mib", "N", "bytes written and read per block size and round, MiB", "512")
      .flag("batch", "N", "blocks per put_batch group commit (and fio --fdatasync=N)", "8")
      .flag("rounds", "N", "rounds per block size (store then fio in each)", "3")
      .flag("fio", "PATH", "the fio program", "fio")
      .flag("no-fio", "", "skip the fio baseline");
  int code = 0;
  if (!f.parse(args, &code)) return code;
  Options o;
  o.dir = f.get("dir");
  o.fio = f.get("fio");
  o.block_mib = parse_list(f.get("block-mib"));
  auto total = f.get_int("total-mib");
  auto batch = f.get_int("batch");
  auto rounds = f.get_int("rounds");
  o.run_fio = !f.has("no-fio");
  if (o.block_mib.empty() || !total || *total < 1 || *total > (1 << 20) || !batch || *batch < 2 ||
      *batch > 4096 || !rounds || *rounds < 1 || *rounds > 100) {
    std::fprintf(stderr,
                 "bench tier2: --block-mib lists sizes in 1..1024, --total-mib > 0, --batch "
                 "2..4096, --rounds 1..100\n");
    return 2;
  }
  o.total_mib = static_cast<uint64_t>(*total);
  o.batch = static_cast<uint32_t>(*batch);
  o.rounds = static_cast<uint32_t>(*rounds);
  std::error_code ec;
  fs::create_directories(o.dir, ec);
  std::printf(
      "tier2 bench: %s (%s), %llu MiB per phase, %u rounds, host cache off; fio psync "
      "iodepth=1 direct=1; XXH3-128 %.0f MB/s; goal tandem/fio >= 0.85\n",
      o.dir.c_str(), fs_type_name(o.dir).c_str(), static_cast<unsigned long long>(o.total_mib),
      o.rounds, checksum_mb_s(1 << 20));
  std::printf("%4s %-38s %6s %11s %11s %6s   %s\n", "MiB", "phase | fio job", "blocks",
              "tandem_MB/s", "fio_MB/s", "ratio", "per round");
  int rc = 0;
  for (uint64_t mib : o.block_mib) rc = std::max(rc, bench_block_size(o, mib));
  return rc;
}

}  // namespace tandem::bench
