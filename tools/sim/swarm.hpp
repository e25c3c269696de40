// The simulator's swarm (issue 12): one seed -> one random case (cluster shape incl.
// aggregated mode, block size, limits, workload, fault mix and failure timeouts), run with
// every invariant checked. `tandem sim --swarm K --seed S` runs seeds S .. S+K-1;
// `tandem sim --swarm-case --seed N` replays seed N's case. Pure: no I/O, no clock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/sim/cluster_sim.hpp"
#include "tools/workload/workload.hpp"

namespace tandem::sim {

struct SwarmCase {
  ClusterSimConfig config;
  std::vector<workload::Request> requests;
  std::string shape;  // one line: "pd 2p+3d block 64 kv 512 ..."
};

// Same seed, same case.
Result<SwarmCase> make_swarm_case(uint64_t seed);

// One line for a run of the case: "seed N: SHAPE | sent .. | ok" or "... | VIOLATION ...".
std::string swarm_line(uint64_t seed, const SwarmCase& c, const ClusterSimResult& r);

}  // namespace tandem::sim
