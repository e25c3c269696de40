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
  double write_s = 0;
  double read_s = 0;
  std::string io_mode;
  std::string error;  // empty when both phases ran
};

// Writes `blocks` distinct blocks, then reads them all back in a shuffled order.
StoreRun run_store(const std::string& dir, uint64_t block_bytes, uint64_t blocks) {
  StoreRun run;
  t2::Tier2Config c;
  c.directory = dir;
  c.block_bytes = block_bytes;
  c.capacity_bytes = blocks * t2::round_up_bytes(block_bytes, t2::io_alignment_bytes);
  c.fingerprint = t2::make_fingerprint({"bench", "bf16", 0, 0, 0, 0, ""});
  auto store = t2::Tier2Store::open(c);
  if (!store) return StoreRun{0, 0, "", store.error().describe()};
  run.io_mode = std::string(t2::to_string((*store)->io_mode()));
  t2::AlignedBuffer buffer(block_bytes);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i < buffer.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(buffer.data() + i, &v, 8);
  }
  auto start = Clock::now();
  for (uint64_t n = 0; n < blocks; ++n) {
    std::memcpy(buffer.data(), &n, sizeof(n));  // every block distinct
    auto put = (*store)->put(bench_hash(n), buffer.span().first(block_bytes));
    if (!put || *put != t2::PutOutcome::stored) {
      run.error = put ? "duplicate put" : put.error().describe();
      return run;
    }
  }
  run.write_s = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<uint64_t> order(blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  start = Clock::now();
  for (uint64_t n : order) {
    auto got = (*store)->get(bench_hash(n), buffer.span());
    uint64_t stamp = 0;
    std::memcpy(&stamp, buffer.data(), sizeof(stamp));
    if (!got || *got != block_bytes || stamp != n) {
      run.error = got ? "wrong block read back" : got.error().describe();
      return run;
    }
  }
  run.read_s = std::chrono::duration<double>(Clock::now() - start).count();
  return run;
}

// Runs one fio job; returns its JSON text (written to a file: fio's warnings stay out).
Result<std::string> run_fio(const std::string& fio, const std::string& dir, const std::string& rw,
                            uint64_t block_bytes, uint64_t total_bytes, bool fdatasync) {
  std::string out = dir + "/fio-" + rw + ".json";
  std::ostringstream cmd;
  cmd << fio << " --name=tier2-" << rw << " --directory=" << dir
      << " --filename=fio.data --rw=" << rw << " --bs=" << block_bytes << " --size=" << total_bytes
      << " --direct=1 --ioengine=psync --iodepth=1 --numjobs=1"
      << " --fallocate=posix" << (fdatasync ? " --fdatasync=1" : "")
      << " --output-format=json --output=" << out << " > /dev/null 2>&1";
  int status = std::system(cmd.str().c_str());
  if (status != 0) {
    return make_error(ErrorKind::failed, "`" + cmd.str() + "` exited with status " +
                                             std::to_string(WEXITSTATUS(status)));
  }
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Result<double> fio_rate(const std::string& fio, const std::string& dir, const std::string& rw,
                        uint64_t block_bytes, uint64_t total_bytes, bool fdatasync) {
  std::error_code ec;
  if (rw == "write") fs::remove(dir + "/fio.data", ec);  // a fresh file, as the store's is
  auto text = run_fio(fio, dir, rw, block_bytes, total_bytes, fdatasync);
  if (!text) return text.error();
  return parse_fio_bw_bytes(*text, rw == "randread" ? "read" : "write");
}

struct Row {
  std::string phase;
  double tandem_mb_s = 0;
  double fio_mb_s = -1;  // -1: not run or failed
};

void print_row(uint64_t block_bytes, uint64_t blocks, const Row& r) {
  double ratio = r.fio_mb_s > 0 ? r.tandem_mb_s / r.fio_mb_s : 0;
  std::printf("%8.2f %-22s %7llu %12.1f %12.1f %7.2f\n", block_bytes / 1048576.0, r.phase.c_str(),
              static_cast<unsigned long long>(blocks), r.tandem_mb_s, r.fio_mb_s, ratio);
}

struct Options {
  std::string dir;
  std::string fio = "fio";
  std::vector<uint64_t> block_mib;
  uint64_t total_mib = 1024;
  bool run_fio = true;
};

// One block size: the store, then fio on a fresh directory beside it. Returns 1 on failure.
int bench_block_size(const Options& o, uint64_t block_mib) {
  uint64_t block_bytes = block_mib << 20;
  uint64_t blocks = std::max<uint64_t>(1, (o.total_mib << 20) / block_bytes);
  uint64_t total_bytes = blocks * block_bytes;
  std::string store_dir = o.dir + "/store-" + std::to_string(block_mib) + "m";
  std::string fio_dir = o.dir + "/fio-" + std::to_string(block_mib) + "m";
  std::error_code ec;
  fs::remove_all(store_dir, ec);
  fs::remove_all(fio_dir, ec);
  fs::create_directories(store_dir);
  fs::create_directories(fio_dir);
  StoreRun run = run_store(store_dir, block_bytes, blocks);
  fs::remove_all(store_dir, ec);
  if (!run.error.empty()) {
    std::fprintf(stderr, "bench tier2: store: %s\n", run.error.c_str());
    return 1;
  }
  std::printf("# block %llu MiB: store I/O mode %s\n", static_cast<unsigned long long>(block_mib),
              run.io_mode.c_str());
  double mb = static_cast<double>(total_bytes) / 1e6;
  Row write{"write (synced)", mb / run.write_s}, raw{"write vs fio no-sync", mb / run.write_s};
  Row read{"read (random order)", mb / run.read_s};
  int rc = 0;
  if (o.run_fio) {
    auto synced = fio_rate(o.fio, fio_dir, "write", block_bytes, total_bytes, true);
    auto unsynced = fio_rate(o.fio, fio_dir, "write", block_bytes, total_bytes, false);
    auto rand = fio_rate(o.fio, fio_dir, "randread", block_bytes, total_bytes, false);
    for (auto [row, rate] : {std::pair{&write, &synced}, {&raw, &unsynced}, {&read, &rand}}) {
      if (*rate) row->fio_mb_s = **rate / 1e6;
      if (!*rate) std::fprintf(stderr, "bench tier2: fio: %s\n", rate->error().describe().c_str());
      if (!*rate) rc = 1;
    }
  }
  fs::remove_all(fio_dir, ec);
  for (const Row* r : {&write, &raw, &read}) print_row(block_bytes, blocks, *r);
  return rc;
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
  cli::Flags f("tandem bench tier2 [--dir DIR] [--block-mib LIST] [--total-mib N] [--no-fio]",
               "Writes then reads the same bytes through the tier-2 store (O_DIRECT when the\n"
               "file system accepts it) and with fio on the same directory (psync, iodepth 1,\n"
               "direct=1, same block size and total), and prints MB/s and tandem / fio.");
  f.flag("dir", "DIR", "directory on the disk to measure (not tmpfs)", "/var/tmp/tandem-tier2")
      .flag("block-mib", "LIST", "block sizes in MiB, comma-separated", "1,4")
      .flag("total-mib", "N", "bytes written and read per block size, MiB", "1024")
      .flag("fio", "PATH", "the fio program", "fio")
      .flag("no-fio", "", "skip the fio baseline");
  int code = 0;
  if (!f.parse(args, &code)) return code;
  Options o;
  o.dir = f.get("dir");
  o.fio = f.get("fio");
  o.block_mib = parse_list(f.get("block-mib"));
  auto total = f.get_int("total-mib");
  o.run_fio = !f.has("no-fio");
  if (o.block_mib.empty() || !total || *total < 1 || *total > (1 << 20)) {
    std::fprintf(stderr, "bench tier2: --block-mib must list sizes in 1..1024, --total-mib > 0\n");
    return 2;
  }
  o.total_mib = static_cast<uint64_t>(*total);
  std::error_code ec;
  fs::create_directories(o.dir, ec);
  std::printf(
      "tier2 bench: %s (%s), %llu MiB per block size, host cache off; fio psync "
      "iodepth=1 direct=1; goal tandem/fio >= 0.85\n",
      o.dir.c_str(), fs_type_name(o.dir).c_str(), static_cast<unsigned long long>(o.total_mib));
  std::printf("%8s %-22s %7s %12s %12s %7s\n", "MiB", "phase", "blocks", "tandem_MB/s", "fio_MB/s",
              "ratio");
  int rc = 0;
  for (uint64_t mib : o.block_mib) rc = std::max(rc, bench_block_size(o, mib));
  return rc;
}

}  // namespace tandem::bench
