// tandem/base: comparing secrets (API keys, tokens) without leaking where they differ.
#pragma once

#include <cstddef>
#include <string_view>

namespace tandem::base {

// True when a == b. The time depends only on the lengths, never on where the bytes differ:
// every byte of `secret` is visited whatever `given` holds.
inline bool equal_constant_time(std::string_view given, std::string_view secret) {
  volatile unsigned char diff = given.size() == secret.size() ? 0 : 1;
  for (size_t i = 0; i < secret.size(); ++i) {
    unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff = diff | (g ^ static_cast<unsigned char>(secret[i]));
  }
  return diff == 0;
}

}  // namespace tandem::base
