// `tandem`: one program, git-style subcommands.
#include <cstdio>
#include <cstring>
#include <vector>

#include "tools/commands.hpp"

namespace {

const std::vector<tandem::cli::Command>& commands() {
  using namespace tandem::tools;
  static const std::vector<tandem::cli::Command> table = {
      {"up", "start every node of a manifest that lives on this host", cmd_up},
      {"node", "run one node of a cluster (what `up` starts)", cmd_node},
      {"check", "validate a cluster manifest and print a summary", cmd_check},
      {"shell", "admin shell: inspect and drive a running cluster", cmd_shell},
      {"generate", "run a model in-process and stream its text", cmd_generate},
      {"model", "model utilities (synth: write a small random model)", cmd_model},
      {"bench", "benchmarks (transport, device, ...)", cmd_bench},
      {"sim", "simulate a cluster under virtual time (real cores, sim timing)", cmd_sim},
      {"systemd", "write the systemd unit that runs one node on this host", cmd_systemd},
      {"keygen", "write a new cluster key or admin token (mode 0600)", cmd_keygen},
  };
  return table;
}

void print_help() {
  std::printf("usage: tandem COMMAND [ARGS...]\n\n");
  std::printf("Tandem serves a large model to coding agents on an accelerator cluster.\n\n");
  std::printf("commands:\n");
  for (const auto& c : commands()) {
    std::printf("  %-10s %.*s\n", std::string(c.name).c_str(), static_cast<int>(c.summary.size()),
                c.summary.data());
  }
  std::printf("\n`tandem COMMAND --help` documents each command's flags.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    print_help();
    return argc < 2 ? 2 : 0;
  }
  for (const auto& c : commands()) {
    if (c.name == argv[1]) return c.run(tandem::cli::Args(argv + 2, argc - 2));
  }
  std::fprintf(stderr, "tandem: unknown command '%s'\n\n", argv[1]);
  print_help();
  return 2;
}
