// `tandem bench tier2`: the tier-2 store's write and read throughput beside fio's on the same
// directory, block size and total bytes, in the same run.
//
// For each block size (default 1 MiB and 4 MiB; one KV block of stories15M at 16 tokens is
// 216 KiB, one of MiniMax-M2.7 at 4096 tokens ~500 MB, split per layer group in practice) and
// each of --rounds rounds, on fresh files, each store phase right before its fio job:
//   put           Tier2Store::put of `total / block` distinct blocks from an aligned buffer
//                 (O_DIRECT when accepted; pwrite + fdatasync + a synced RocksDB write: two
//                 device flushes per block), host cache off      | fio --fdatasync=1
//   get           every block read back in a shuffled order into an aligned buffer (pread
//                 straight into it + XXH3-128 verification)      | fio --rw=randread of
//                                                      the store's own tier2.data file
//   put, WAL/N    put with index_commits_per_sync = N (one flush per block)
//                                                                | fio --fdatasync=1
//   put_batch N   N blocks per group commit (two flushes per N)  | fio --fdatasync=N
//                 and, for reference, against fio with no sync at all (the device's rate).
// fio: one synchronous job (ioengine=psync, iodepth=1, direct=1, bs=block, same total,
// fallocate=posix, a fresh file per write job), JSON output parsed. Prints the medians of
// each side's MB/s and the median of the per-round ratios tandem / fio (goal >= 0.85; each
// fio job makes its blocks durable as often as the paired store phase promises: every block,
// or every N-th), plus the file system type and the store's I/O mode.
#pragma once

#include <string_view>

#include "runtime/base/result.hpp"
#include "tools/cli.hpp"

namespace tandem::bench {

int run_tier2_bench(cli::Args args);

// fio --output-format=json: the sum over jobs of jobs[i].<direction>.bw_bytes (bytes per
// second); direction is "read" or "write". Errors: invalid when the text is not fio JSON or
// the sum is not positive.
Result<double> parse_fio_bw_bytes(std::string_view json_text, std::string_view direction);

}  // namespace tandem::bench
