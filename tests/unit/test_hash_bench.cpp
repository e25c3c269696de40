#include <doctest.h>

#include "bench/hash_bench.hpp"

using tandem::bench::parse_openssl_speed_mr;

TEST_CASE("openssl speed -mr output is parsed to bytes per second") {
  const char* sample =
      "+DT:hmac(sha256):1:116\n"
      "+R:455659:hmac(sha256):0.160000\n"
      "+H:116\n"
      "+F:9:hmac(sha256):330352775.00\n";
  auto rate = parse_openssl_speed_mr(sample, "hmac(sha256)");
  REQUIRE(rate.ok());
  CHECK(*rate == doctest::Approx(330352775.0));
  auto missing = parse_openssl_speed_mr(sample, "sha256");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message.find("sha256") != std::string::npos);
  auto bad = parse_openssl_speed_mr("+F:9:sha256:abc\n", "sha256");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("bad rate") != std::string::npos);
}

TEST_CASE("the bench runs end to end against the real openssl binary") {
  tandem::bench::HashBenchOptions options;
  options.tokens_count = 4096;
  options.block_tokens_list = {16};
  options.seconds_min = 0.01;
  options.openssl_seconds = 1;
  CHECK(tandem::bench::run_hash_bench(options) == 0);
  options.openssl_program = "/nonexistent/openssl";
  CHECK(tandem::bench::run_hash_bench(options) == 1);
  options.tokens_count = 0;
  CHECK(tandem::bench::run_hash_bench(options) == 2);
}
