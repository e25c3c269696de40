// tandem/base: the dependency-free bottom layer. Cores may use it.
//
// RT_ASSERT(cond, ctx...) is for bugs: invariants, internal pre- and postconditions.
// It stays on in release builds; on failure it prints the condition, file:line and the
// context values to stderr, then aborts. Never use it on wire or user input: return an
// Error for that (see result.hpp).
#pragma once

#include <sstream>
#include <string>

namespace tandem::base {

[[noreturn]] void assert_fail(const char* cond, const char* file, int line, const std::string& ctx);

template <class... Args>
std::string assert_context(const Args&... args) {
  if constexpr (sizeof...(Args) == 0) {
    return {};
  } else {
    std::ostringstream out;
    ((out << args << ' '), ...);
    return out.str();
  }
}

}  // namespace tandem::base

#define RT_ASSERT(cond, ...)                                                                  \
  do {                                                                                        \
    if (!(cond)) [[unlikely]] {                                                               \
      ::tandem::base::assert_fail(#cond, __FILE__, __LINE__,                                  \
                                  ::tandem::base::assert_context(__VA_ARGS__));               \
    }                                                                                         \
  } while (false)
