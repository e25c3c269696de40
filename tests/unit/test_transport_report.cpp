// The pure part of `tandem bench transport`: fi_pingpong output parsing, percentiles, table.
#include <doctest.h>

#include "bench/transport_report.hpp"

using namespace tandem;
using namespace tandem::bench;

TEST_CASE("fi_pingpong sizes and counts in its own notation") {
  CHECK(parse_pingpong_size("64").value() == 64);
  CHECK(parse_pingpong_size("4k").value() == 4096);
  CHECK(parse_pingpong_size("1.5m").value() == (3u << 20) / 2);
  CHECK(parse_pingpong_size("16m").value() == 16u << 20);
  CHECK(parse_pingpong_size("1g").value() == 1u << 30);
  CHECK_FALSE(parse_pingpong_size("").ok());
  CHECK_FALSE(parse_pingpong_size("k").ok());
  CHECK_FALSE(parse_pingpong_size("12x").ok());
  CHECK_FALSE(parse_pingpong_size("-3").ok());
  // The #sent column uses decimal suffixes.
  CHECK(parse_pingpong_count("500").value() == 500);
  CHECK(parse_pingpong_count("1k").value() == 1000);
  CHECK(parse_pingpong_count("2m").value() == 2000000);
  CHECK_FALSE(parse_pingpong_count("1g").ok());
}

TEST_CASE("a real fi_pingpong client output parses; usec/xfer is half a round trip") {
  const char* output =
      "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n"
      "64      1k      =1k      125k       12.95s      0.01    6476.51       0.00\n";
  auto row = parse_pingpong_output(output);
  REQUIRE(row.ok());
  CHECK(row->size_bytes == 64);
  CHECK(row->iterations_count == 1000);
  CHECK(row->mb_per_s == doctest::Approx(0.01));
  CHECK(row->usec_per_xfer == doctest::Approx(6476.51));
  CHECK(row->round_trip_us() == doctest::Approx(12953.02));
}

TEST_CASE("large sizes and partial acks parse") {
  auto row = parse_pingpong_output(
      "noise before\n"
      "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n"
      "16m     5       +2       160m        2.57s     65.22  257235.20       0.00\n");
  REQUIRE(row.ok());
  CHECK(row->size_bytes == 16u << 20);
  CHECK(row->mb_per_s == doctest::Approx(65.22));
}

TEST_CASE("fi_pingpong output without a result is an error that says why") {
  auto none = parse_pingpong_output("fi_getinfo(): pingpong.c:1029, ret=-61 (No data available)\n");
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().kind == ErrorKind::invalid);
  CHECK(none.error().message.find("no fi_pingpong result header") != std::string::npos);

  auto header_only = parse_pingpong_output(
      "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n");
  REQUIRE_FALSE(header_only.ok());
  CHECK(header_only.error().message.find("no row") != std::string::npos);

  auto garbled = parse_pingpong_output(
      "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n"
      "64      1k      =1k      125k       12.95s      zero    6476.51       0.00\n");
  REQUIRE_FALSE(garbled.ok());
  CHECK(garbled.error().message.find("zero") != std::string::npos);
}

TEST_CASE("percentile by nearest rank") {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);  // unsorted on purpose
  CHECK(percentile(v, 0.5) == 50);
  CHECK(percentile(v, 0.99) == 99);
  CHECK(percentile(v, 1.0) == 100);
  CHECK(percentile(v, 0.0) == 1);
  CHECK(percentile({7.0}, 0.99) == 7);
}

TEST_CASE("the table shows ratios tandem/other and '-' for what was not measured") {
  std::vector<ReportRow> rows = {
      {"round trip 64 B p50", "us", 30.0, 20.0, 60.0},
      {"RMA read 1 MiB", "MB/s", 900.0, 1000.0, std::nullopt},
  };
  std::string table = render_table(rows);
  CHECK(table.find("tandem/raw") != std::string::npos);
  CHECK(table.find("1.50x") != std::string::npos);  // 30 / 20
  CHECK(table.find("0.50x") != std::string::npos);  // 30 / 60
  CHECK(table.find("0.90x") != std::string::npos);  // 900 / 1000
  auto last_line = table.substr(table.rfind("RMA read 1 MiB"));
  CHECK(last_line.find(" - ") != std::string::npos);
}

TEST_CASE("JSON carries every row, nulls for absent values, and escapes text") {
  std::vector<ReportRow> rows = {{"round trip \"64 B\"", "us", 30.0, std::nullopt, 60.0}};
  std::string json = render_json(rows, "2 CPUs", {"note\nwith newline"});
  CHECK(json.find("\"metric\": \"round trip \\\"64 B\\\"\"") != std::string::npos);
  CHECK(json.find("\"raw\": null") != std::string::npos);
  CHECK(json.find("\"fi_pingpong\": 60") != std::string::npos);
  CHECK(json.find("\\u000a") != std::string::npos);
  CHECK(json.find("\"machine\": \"2 CPUs\"") != std::string::npos);
}
