#include "runtime/obs/log.hpp"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

namespace tandem::obs {

namespace {

// %* : the message with control characters escaped, so no text in a message (a peer's
// reason, a client's field) can end the line and forge the next one.
class EscapedPayload final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    static const char* hex = "0123456789abcdef";
    for (char c : std::string_view(msg.payload.data(), msg.payload.size())) {
      auto u = static_cast<unsigned char>(c);
      if (u >= 0x20 && u != 0x7f) {
        dest.push_back(c);
        continue;
      }
      const char* named = c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : nullptr;
      if (named != nullptr) {
        dest.append(named, named + 2);
        continue;
      }
      const char esc[4] = {'\\', 'x', hex[u >> 4], hex[u & 15]};
      dest.append(esc, esc + 4);
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<EscapedPayload>();
  }
};

}  // namespace

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
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<EscapedPayload>('*').set_pattern("%Y-%m-%d %H:%M:%S.%e [" + escaped +
                                                       "] %l: %*");
  logger->set_formatter(std::move(formatter));
  logger->set_level(*parsed);
  logger->flush_on(spdlog::level::warn);
  RT_ASSERT(logger->level() == *parsed);
  return logger;
}

}  // namespace tandem::obs
