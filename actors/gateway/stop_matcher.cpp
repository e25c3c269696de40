#include "actors/gateway/stop_matcher.hpp"

#include <algorithm>

#include "runtime/base/assert.hpp"

namespace tandem::gateway {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const auto& s : stops_) {
    RT_ASSERT(!s.empty(), "stop strings are validated non-empty");
    hold_bytes_ = std::max(hold_bytes_, s.size() - 1);
  }
}

StopMatcher::Out StopMatcher::feed(const std::string& chunk) {
  Out out;
  if (matched_) return out;
  pending_ += chunk;
  size_t first = std::string::npos;
  std::string which;
  for (const auto& s : stops_) {
    size_t at = pending_.find(s);
    if (at < first) first = at, which = s;
  }
  if (first != std::string::npos) {
    out.text = pending_.substr(0, first);
    out.matched = which;
    pending_.clear();
    matched_ = true;
    return out;
  }
  if (pending_.size() > hold_bytes_) {
    size_t emit = pending_.size() - hold_bytes_;
    // Never split a UTF-8 character: back up to a lead byte.
    while (emit > 0 && (static_cast<unsigned char>(pending_[emit]) & 0xC0) == 0x80) --emit;
    out.text = pending_.substr(0, emit);
    pending_.erase(0, emit);
  }
  RT_ASSERT(pending_.size() <= hold_bytes_ + 4, pending_.size());
  return out;
}

std::string StopMatcher::flush() {
  std::string rest;
  rest.swap(pending_);
  return matched_ ? std::string() : rest;
}

}  // namespace tandem::gateway
