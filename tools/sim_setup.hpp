// `tandem sim`'s command line -> the simulator's config and workload. Shared by `tandem sim`
// (tools/cmd_sim.cpp) and the sim back-end of `tandem bench sweep` (bench/sweep_cli.cpp), so a
// sweep point runs exactly what `tandem sim` with the same flags runs.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "tools/cli.hpp"
#include "tools/sim/cluster_sim.hpp"
#include "tools/workload/workload.hpp"

namespace tandem::tools {

// Every flag of `tandem sim` (see --help).
cli::Flags sim_flags();

struct SimRun {
  sim::ClusterSimConfig config;
  std::vector<workload::Request> requests;
};

// Builds the cluster config (flags or --manifest) and the workload (generated from `seed`, or
// --trace) from parsed sim_flags(). Bad input: prints what and where to stderr, prefixed
// "tandem sim: ", and returns nullopt. Reads the manifest / trace file (I/O).
std::optional<SimRun> prepare_sim(const cli::Flags& flags, uint64_t seed);

}  // namespace tandem::tools
