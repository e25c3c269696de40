#include "bench/hash_bench.hpp"

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "kvstore/hashing.hpp"

namespace tandem::bench {
namespace {

const kv::HashKey bench_key{"tandem-bench-secret", "minimax-m2.7", ""};

std::vector<kv::TokenId> make_tokens(uint32_t count) {
  std::vector<kv::TokenId> tokens(count);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (auto& t : tokens) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<kv::TokenId>((state >> 33) % 200064);  // MiniMax-M2 vocabulary size
  }
  return tokens;
}

size_t message_bytes(uint32_t block_tokens) {
  return 32 + 4 + 4 * size_t{block_tokens} + 4 + bench_key.model.size() + 4 + bench_key.salt.size();
}

struct TandemRun {
  double run_ms = 0;  // one pass over all tokens
  size_t blocks_count = 0;
};

Result<TandemRun> measure_tandem(const std::vector<kv::TokenId>& tokens, uint32_t block_tokens,
                                 double seconds_min) {
  auto hasher = kv::BlockHasher::create(bench_key, block_tokens);
  if (!hasher) return hasher.error();
  std::vector<kv::BlockHash> out;
  out.reserve(tokens.size() / block_tokens);
  using clock = std::chrono::steady_clock;
  auto start = clock::now();
  uint64_t runs = 0;
  double elapsed_s = 0;
  do {
    out.clear();
    hasher->reset();
    hasher->append(tokens, out);
    ++runs;
    elapsed_s = std::chrono::duration<double>(clock::now() - start).count();
  } while (elapsed_s < seconds_min);
  return TandemRun{elapsed_s * 1000.0 / static_cast<double>(runs), out.size()};
}

Result<std::string> run_child(const std::string& command) {
  std::FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return make_error(ErrorKind::failed, "cannot start: " + command);
  std::string output;
  std::array<char, 4096> buffer;
  size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) {
    output.append(buffer.data(), n);
  }
  int status = pclose(pipe);
  if (status != 0) {
    return make_error(ErrorKind::failed,
                      "`" + command + "` exited with status " + std::to_string(status));
  }
  return output;
}

// Bytes per second that `openssl speed` reports for `algorithm` on messages of `bytes`.
Result<double> openssl_rate(const HashBenchOptions& options, const std::string& selector,
                            const std::string& algorithm, size_t bytes) {
  std::string command = options.openssl_program + " speed -elapsed -mr -seconds " +
                        std::to_string(options.openssl_seconds) + " -bytes " +
                        std::to_string(bytes) + " " + selector + " 2>&1";
  auto output = run_child(command);
  if (!output) return output.error();
  return parse_openssl_speed_mr(*output, algorithm);
}

}  // namespace

Result<double> parse_openssl_speed_mr(std::string_view output, std::string_view algorithm) {
  std::string marker = "+F:";
  std::string suffix = ":" + std::string(algorithm) + ":";
  std::optional<double> rate;
  size_t line_start = 0;
  while (line_start < output.size()) {
    size_t line_end = output.find('\n', line_start);
    if (line_end == std::string_view::npos) line_end = output.size();
    std::string_view line = output.substr(line_start, line_end - line_start);
    line_start = line_end + 1;
    if (line.substr(0, marker.size()) != marker) continue;
    size_t at = line.find(suffix);
    if (at == std::string_view::npos) continue;
    std::string value(line.substr(at + suffix.size()));
    char* end = nullptr;
    double v = std::strtod(value.c_str(), &end);
    if (end == value.c_str() || !(v > 0)) {
      return make_error(ErrorKind::invalid,
                        "openssl speed: bad rate in line '" + std::string(line) + "'");
    }
    rate = v;
  }
  if (!rate) {
    return make_error(ErrorKind::invalid, "openssl speed: no '+F:...:" + std::string(algorithm) +
                                              ":' line in its output");
  }
  return *rate;
}

int run_hash_bench(const HashBenchOptions& options) {
  if (options.tokens_count == 0 || options.block_tokens_list.empty() || options.seconds_min < 0 ||
      options.openssl_seconds == 0) {
    std::fprintf(stderr, "bench hash: tokens, block sizes and seconds must be positive\n");
    return 2;
  }
  auto tokens = make_tokens(options.tokens_count);
  std::printf(
      "hash bench: %u tokens, HMAC-SHA-256 (OpenSSL EVP_MAC), baseline `openssl speed "
      "-elapsed` in the same run; goal ratio to -hmac <= 1.2\n",
      options.tokens_count);
  std::printf("%12s %8s %9s %12s %14s %7s %15s %7s\n", "block_tokens", "blocks", "msg_bytes",
              "tandem_ms", "openssl_hmac_ms", "ratio", "openssl_sha_ms", "ratio");
  int rc = 0;
  for (uint32_t block_tokens : options.block_tokens_list) {
    auto run = measure_tandem(tokens, block_tokens, options.seconds_min);
    if (!run) {
      std::fprintf(stderr, "bench hash: %s\n", run.error().describe().c_str());
      return 2;
    }
    size_t bytes = message_bytes(block_tokens);
    double total_bytes = static_cast<double>(bytes * run->blocks_count);
    double hmac_ms = -1, sha_ms = -1;
    if (options.run_openssl) {
      auto hmac = openssl_rate(options, "-hmac sha256", "hmac(sha256)", bytes);
      auto sha = openssl_rate(options, "-evp sha256", "sha256", bytes);
      if (hmac) hmac_ms = total_bytes / *hmac * 1000.0;
      if (sha) sha_ms = total_bytes / *sha * 1000.0;
      for (const auto* r : {&hmac, &sha}) {
        if (!r->ok()) {
          std::fprintf(stderr, "bench hash: %s\n", r->error().describe().c_str());
          rc = 1;
        }
      }
    }
    auto ratio = [&](double base) { return base > 0 ? run->run_ms / base : 0.0; };
    std::printf("%12u %8zu %9zu %12.3f %14.3f %7.2f %15.3f %7.2f\n", block_tokens,
                run->blocks_count, bytes, run->run_ms, hmac_ms, ratio(hmac_ms), sha_ms,
                ratio(sha_ms));
  }
  return rc;
}

}  // namespace tandem::bench
