#include "runtime/base/assert.hpp"

#include <cstdio>
#include <cstdlib>

namespace tandem::base {

void assert_fail(const char* cond, const char* file, int line, const std::string& ctx) {
  std::fprintf(stderr, "ASSERTION FAILED: %s at %s:%d%s%s\n", cond, file, line,
               ctx.empty() ? "" : " context: ", ctx.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace tandem::base
