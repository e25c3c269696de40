// `tandem bench KIND`: dispatches to the benchmarks in bench/.
#include <cstdio>
#include <cstring>

#include "bench/device_bench.hpp"
#include "bench/transport_bench.hpp"
#include "tools/commands.hpp"

namespace tandem::tools {

int cmd_bench(cli::Args args) {
  struct Entry {
    const char* name;
    int (*run)(cli::Args);
  };
  static constexpr Entry entries[] = {
      {"device", bench::run_device_bench},
      {"transport", bench::run_transport_bench},
  };
  if (!args.empty()) {
    for (const auto& e : entries) {
      if (std::strcmp(args[0], e.name) == 0) return e.run(args.subspan(1));
    }
  }
  std::fprintf(stderr, "usage: tandem bench KIND [flags]\nkinds:");
  for (const auto& e : entries) std::fprintf(stderr, " %s", e.name);
  std::fprintf(stderr, "\n");
  return 2;
}

}  // namespace tandem::tools
