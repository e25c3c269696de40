// Subcommands whose work has not landed yet. Each owner removes its entry when it lands.
#include <cstdio>

#include "tools/commands.hpp"

namespace tandem::tools {
namespace {
int pending(const char* name) {
  std::fprintf(stderr, "tandem %s: not available in this build yet\n", name);
  return 1;
}
}  // namespace

int cmd_model(cli::Args) { return pending("model"); }

}  // namespace tandem::tools
