// Every subcommand of `tandem`. Each is defined in tools/cmd_<name>.cpp.
#pragma once

#include "tools/cli.hpp"

namespace tandem::tools {

int cmd_check(cli::Args args);     // validate a manifest, print a summary
int cmd_node(cli::Args args);      // run one node of a cluster
int cmd_up(cli::Args args);        // start every local node of a manifest
int cmd_shell(cli::Args args);     // admin shell
int cmd_bench(cli::Args args);     // benchmarks
int cmd_generate(cli::Args args);  // run one model in-process
int cmd_model(cli::Args args);     // model utilities (synth)
int cmd_sim(cli::Args args);       // cluster simulator under virtual time
int cmd_systemd(cli::Args args);   // a node's systemd unit
int cmd_keygen(cli::Args args);    // a new cluster key or admin token

}  // namespace tandem::tools
