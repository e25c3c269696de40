// Test support: splitting a server-sent-events body into its events.
#pragma once

#include <doctest.h>

#include <string>
#include <vector>

namespace tandem::testing {

struct SseEvent {
  std::string name;  // "" for data-only
  std::string data;
};

// Splits SSE text into events; every event must end with a blank line.
inline std::vector<SseEvent> split_sse(const std::string& text) {
  std::vector<SseEvent> events;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find("\n\n", pos);
    REQUIRE(end != std::string::npos);
    std::string block = text.substr(pos, end - pos);
    SseEvent e;
    if (block.rfind("event: ", 0) == 0) {
      size_t nl = block.find('\n');
      REQUIRE(nl != std::string::npos);
      e.name = block.substr(7, nl - 7);
      block = block.substr(nl + 1);
    }
    REQUIRE(block.rfind("data: ", 0) == 0);
    e.data = block.substr(6);
    events.push_back(e);
    pos = end + 2;
  }
  return events;
}

}  // namespace tandem::testing
