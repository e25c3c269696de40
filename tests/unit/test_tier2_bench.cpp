// `tandem bench tier2`'s parser of fio's JSON output.
#include <doctest.h>

#include "bench/tier2_bench.hpp"

using tandem::ErrorKind;
using tandem::bench::parse_fio_bw_bytes;

TEST_CASE("parse_fio_bw_bytes sums a direction's bw_bytes over jobs") {
  // The shape of fio 3.33's --output-format=json (trimmed).
  const char* two_jobs = R"({"fio version": "fio-3.33", "jobs": [
    {"jobname": "a", "read": {"io_bytes": 0, "bw_bytes": 0}, "write": {"bw_bytes": 1000000}},
    {"jobname": "b", "read": {"bw_bytes": 0}, "write": {"bw_bytes": 500000}}]})";
  auto w = parse_fio_bw_bytes(two_jobs, "write");
  REQUIRE(w.ok());
  CHECK(*w == doctest::Approx(1500000));
  CHECK(parse_fio_bw_bytes(two_jobs, "read").error().kind == ErrorKind::invalid);  // 0
  CHECK_FALSE(parse_fio_bw_bytes("fio: no such file", "write").ok());
  CHECK_FALSE(parse_fio_bw_bytes(R"({"jobs": []})", "write").ok());
  CHECK_FALSE(parse_fio_bw_bytes(R"({"jobs": [{"write": {}}]})", "write").ok());
}
