// Stop strings over streamed text: holds back just enough text that a stop string split
// across chunks is still caught, and never emits text at or after the first match.
// Pure; one per request.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tandem::gateway {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  struct Out {
    std::string text;                    // safe to emit now
    std::optional<std::string> matched;  // the stop string hit (text is everything before it)
  };
  Out feed(const std::string& chunk);
  std::string flush();  // end of stream: the held-back tail

 private:
  std::vector<std::string> stops_;
  size_t hold_bytes_ = 0;  // longest stop - 1
  std::string pending_;
  bool matched_ = false;
};

}  // namespace tandem::gateway
