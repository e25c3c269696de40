// `tandem bench tier2`: the tier-2 store's write and read throughput beside fio's on the same
// directory, block size and total bytes, in the same run.
//
// For each block size (default 1 MiB and 4 MiB; one KV block of stories15M at 16 tokens is
// 216 KiB, one of MiniMax-M2.7 at 4096 tokens ~500 MB, split per layer group in practice):
//   tandem write   Tier2Store::put of `total / block` distinct blocks from an aligned buffer
//                  into a fresh store (O_DIRECT when accepted; each put = pwrite + fdatasync
//                  + a synced RocksDB write), host cache off;
//   tandem read    Tier2Store::get of every block, in a shuffled order, into an aligned
//                  buffer (pread straight into it + XXH3-128 verification);
//   fio            the same bytes with one synchronous job (ioengine=psync, iodepth=1,
//                  direct=1, bs=block): rw=write with fdatasync=1 (one flush per block, the
//                  store's durability contract; the store does two), rw=write without sync
//                  (the device's raw rate, for reference), and rw=randread.
// Prints MB/s for each and the ratio tandem / fio (goal >= 0.85 against the fio run with the
// same durability), plus the file system type and the I/O mode the store got.
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
