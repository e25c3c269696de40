#include "runtime/obs/log.hpp"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

namespace tandem::obs {

Result<spdlog::level::level_enum> parse_log_level(std::string_view text) {
  using spdlog::level::level_enum;
  if (text == "trace") return level_enum::trace;
  if (text == "debug") return level_enum::debug;
  if (text == "info") return level_enum::info;
  if (text == "warn") return level_enum::warn;
  if (text == "error") return level_enum::err;
  return make_error(ErrorKind::invalid, "logging.level: '" + std::string(text) +
                                            "' is not a level (trace, debug, info, warn, error)");
}

Result<std::shared_ptr<spdlog::logger>> make_node_logger(std::string_view node_name,
                                                         std::string_view level) {
  return make_node_logger(node_name, level, std::make_shared<spdlog::sinks::stderr_sink_mt>());
}

Result<std::shared_ptr<spdlog::logger>> make_node_logger(std::string_view node_name,
                                                         std::string_view level,
                                                         spdlog::sink_ptr sink) {
  RT_ASSERT(sink != nullptr, "make_node_logger needs a sink");
  if (node_name.empty()) return make_error(ErrorKind::invalid, "logger: empty node name");
  auto parsed = parse_log_level(level);
  if (!parsed) return parsed.error();
  // The name is part of the pattern: escape '%' so a name cannot inject pattern flags.
  std::string escaped;
  for (char c : node_name) {
    if (c == '%') escaped += '%';
    escaped += c;
  }
  auto logger = std::make_shared<spdlog::logger>(std::string(node_name), std::move(sink));
  logger->set_formatter(
      std::make_unique<spdlog::pattern_formatter>("%Y-%m-%d %H:%M:%S.%e [" + escaped + "] %l: %v"));
  logger->set_level(*parsed);
  logger->flush_on(spdlog::level::warn);
  RT_ASSERT(logger->level() == *parsed);
  return logger;
}

}  // namespace tandem::obs
