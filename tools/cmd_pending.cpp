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

int cmd_check(cli::Args) { return pending("check"); }
int cmd_node(cli::Args) { return pending("node"); }
int cmd_up(cli::Args) { return pending("up"); }
int cmd_shell(cli::Args) { return pending("shell"); }
int cmd_bench(cli::Args) { return pending("bench"); }
int cmd_generate(cli::Args) { return pending("generate"); }

}  // namespace tandem::tools
