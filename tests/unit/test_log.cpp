#include <doctest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <sstream>
#include <string>

#include "runtime/obs/log.hpp"

using tandem::ErrorKind;

TEST_CASE("node logger puts the node name on every line and honours the level") {
  std::ostringstream captured;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(captured);
  auto logger = tandem::obs::make_node_logger("node-a", "info", sink);
  REQUIRE(logger.ok());
  (*logger)->debug("hidden {}", 1);
  (*logger)->info("fabric listening on {}", "127.0.0.1:7100");
  (*logger)->error("bad thing");
  std::string text = captured.str();
  CHECK(text.find("hidden") == std::string::npos);
  std::istringstream lines(text);
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) {
    ++count;
    // "2026-11-30 04:50:01.123 [node-a] info: ..." : date, time with millis, name, level.
    REQUIRE(line.size() > 24);
    CHECK(line[4] == '-');
    CHECK(line[10] == ' ');
    CHECK(line[19] == '.');
    CHECK(line.substr(23, 9) == " [node-a]");
  }
  CHECK(count == 2);
  CHECK(text.find("[node-a] info: fabric listening on 127.0.0.1:7100\n") != std::string::npos);
  CHECK(text.find("[node-a] error: bad thing\n") != std::string::npos);
}

TEST_CASE("log levels parse from manifest strings; bad ones are errors") {
  CHECK(tandem::obs::parse_log_level("trace").value() == spdlog::level::trace);
  CHECK(tandem::obs::parse_log_level("warn").value() == spdlog::level::warn);
  CHECK(tandem::obs::parse_log_level("error").value() == spdlog::level::err);
  auto bad = tandem::obs::parse_log_level("verbose");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().kind == ErrorKind::invalid);
  CHECK(bad.error().message.find("'verbose'") != std::string::npos);
  CHECK_FALSE(tandem::obs::make_node_logger("n", "INFO").ok());
  CHECK_FALSE(tandem::obs::make_node_logger("", "info").ok());
  // A '%' in the name is literal, not a pattern flag.
  std::ostringstream captured;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(captured);
  auto logger = tandem::obs::make_node_logger("a%v", "info", sink).value();
  logger->info("x");
  CHECK(captured.str().find("[a%v] info: x\n") != std::string::npos);
}

TEST_CASE("a message cannot end its line: control characters are escaped") {
  std::ostringstream captured;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(captured);
  auto logger = tandem::obs::make_node_logger("node-a", "info", sink);
  REQUIRE(logger.ok());
  // A peer's not-ready reason that tries to forge a second log line.
  (*logger)->warn("decode not ready: {}",
                  "oom\n2026-12-07 00:00:00.000 [node-a] error: FORGED\r\x1b[2J\tend");
  std::string text = captured.str();
  CHECK(std::count(text.begin(), text.end(), '\n') == 1);
  CHECK(text.find("oom\\n2026-12-07 00:00:00.000 [node-a] error: FORGED\\r\\x1b[2J\\tend\n") !=
        std::string::npos);
  (*logger)->info("caf\xc3\xa9 stays UTF-8");
  CHECK(captured.str().find("caf\xc3\xa9 stays UTF-8") != std::string::npos);
}
