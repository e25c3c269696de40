// tandem/obs: per-node loggers (spdlog).
//
// Every line a node logger writes carries the node's name:
//   2026-11-30 04:50:01.123 [node-a] info: fabric listening on 127.0.0.1:7100
// Lines go to stderr; `tandem up` prefixes and forwards them. Library code never installs a
// global default logger: main makes the logger and passes it down (a shared_ptr, since
// spdlog's API takes one; the logger is thread-safe).
#pragma once

#include <spdlog/common.h>
#include <spdlog/logger.h>

#include <memory>
#include <string>
#include <string_view>

#include "runtime/base/result.hpp"

namespace tandem::obs {

// Parses a manifest level: trace | debug | info | warn | error (exact, lower case).
// Error (invalid) otherwise, naming the bad value and the accepted ones.
Result<spdlog::level::level_enum> parse_log_level(std::string_view text);

// A logger named `node_name`, writing to stderr at `level` (a manifest level string).
// Errors: invalid level (see parse_log_level); empty node name (invalid).
// The logger is not registered in spdlog's global registry.
Result<std::shared_ptr<spdlog::logger>> make_node_logger(std::string_view node_name,
                                                         std::string_view level);

// Same, writing to the given sink (tests use an ostream sink).
Result<std::shared_ptr<spdlog::logger>> make_node_logger(std::string_view node_name,
                                                         std::string_view level,
                                                         spdlog::sink_ptr sink);

}  // namespace tandem::obs
