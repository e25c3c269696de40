// `tandem bench hash`: block hashing throughput beside `openssl speed` in the same run.
//
// For each block size it hashes `tokens_count` tokens with a reused BlockHasher (as the
// gateway does), repeating until `seconds_min` of wall time has passed, and reports the time
// per run. In the same run it starts `openssl speed -elapsed -mr` as a child process twice per
// block size, with -bytes set to the exact message the hasher MACs per block
// (parent 32 + header 4 + 4 x block_tokens + extras):
//   -hmac sha256   the same keyed hash on the same message sizes (the goal's baseline);
//   -evp sha256    the bare digest on those sizes (what the HMAC construction adds on top).
// Both rates are converted to the time for the same number of blocks and printed with the
// ratio tandem / openssl. Goal: ratio to `-hmac sha256` <= 1.2.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/result.hpp"

namespace tandem::bench {

struct HashBenchOptions {
  uint32_t tokens_count = 200000;
  std::vector<uint32_t> block_tokens_list{16, 4096};
  double seconds_min = 0.5;      // wall time spent on each tandem measurement
  uint32_t openssl_seconds = 1;  // `openssl speed -seconds`
  bool run_openssl = true;       // false: tandem numbers only
  std::string openssl_program = "openssl";
};

// Prints a table to stdout. Returns 0 when every measurement ran, 1 when the openssl child
// failed or could not be parsed (tandem numbers are still printed), 2 on bad options.
int run_hash_bench(const HashBenchOptions& options);

// Parses `openssl speed -mr` output: the rate of the last "+F:<n>:<algorithm>:<bytes/s>" line
// for `algorithm` (e.g. "hmac(sha256)" or "sha256"), in bytes per second.
// Errors: invalid when no such line is present or its value is not a positive number.
Result<double> parse_openssl_speed_mr(std::string_view output, std::string_view algorithm);

}  // namespace tandem::bench
