// `tandem check MANIFEST`: validate a cluster manifest and print its summary.
#include <cstdio>
#include <variant>

#include "config/manifest.hpp"
#include "tools/commands.hpp"

namespace tandem::tools {

int cmd_check(cli::Args args) {
  cli::Flags flags(
      "tandem check MANIFEST",
      "Parses and validates a cluster manifest (TOML; every key is documented in\n"
      "docs/manifest.md). On success prints a one-screen summary (cluster, fabric, model,\n"
      "and a table of nodes with their addresses and instances by role) to stdout and exits\n"
      "0. Otherwise prints every problem found, one per line as\n"
      "`file:line:column: key: message`, to stderr and exits 1. A bad command line exits 2.");
  flags.positional("MANIFEST", "path of the cluster manifest, e.g. config/examples/local.toml");
  int exit_code = 0;
  if (!flags.parse(args, &exit_code)) return exit_code;
  auto loaded = config::load_manifest(flags.get("MANIFEST"));
  if (const auto* errors = std::get_if<config::ManifestErrors>(&loaded)) {
    for (const auto& issue : errors->issues) {
      std::fprintf(stderr, "%s\n", issue.describe().c_str());
    }
    return 1;
  }
  std::fputs(config::summarize(std::get<config::Manifest>(loaded)).c_str(), stdout);
  return 0;
}

}  // namespace tandem::tools
