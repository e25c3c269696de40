// Fault plans for the cluster simulator (issue 12): `tandem sim --faults SPEC`.
//
// SPEC is a comma-separated list of terms (times: a number followed by ms or s):
//   crash:NODE@T[+D]          NODE's process dies at T (its KV, queues and sequences are
//                             lost); it restarts empty after D (no +D: it stays down)
//   partition:A/B@T+D         no message or KV read between nodes A and B for D
//   loss:A/B=P@T+D            each message / KV block read between A and B is lost with
//                             probability P in [0, 1]
//   delay:A/B=MS@T+D          each message / KV transfer between A and B takes MS ms longer
//   slow:NODExF@T+D           NODE's executor steps take F (>= 1) times longer
//   hang:NODE@T+D             NODE's executor makes no progress for D (steps resume after)
//   ioerr:NODE=P@T+D          each tier-2 disk read on NODE (a prefill instance's node: its
//                             kv-offload) fails with probability P: a miss
//   torn:NODE=P@T+D           each tier-2 block written on NODE is torn with probability P:
//                             indexed, but fails its checksum when read
//   random:KIND=RATE[/s]      KIND (crash, partition, loss, delay, slow, hang, ioerr, torn) faults at
//                             RATE per simulated second over the whole cluster, at seeded
//                             times, on seeded nodes (a link: an instance and any other
//                             node), with seeded durations (0.2-8 s) and values
// NODE: gateway, router, prefill-N, decode-N (instance-N in aggregated mode; decode-N is
// accepted there too). Only instances crash, slow down or hang; links join any two nodes.
// Errors name the bad term. Pure: no I/O, no clock; expansion is a function of the seed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/result.hpp"

namespace tandem::sim {

enum class FaultKind : uint8_t { crash, partition, loss, delay, slow, hang, ioerr, torn };
inline constexpr int fault_kinds_count = 8;
std::string_view to_string(FaultKind kind);

struct Fault {
  FaultKind kind = FaultKind::crash;
  std::string a, b;     // node names (b: link faults only)
  double at_ms = 0;     // >= 0
  double for_ms = -1;   // > 0; crash only: < 0 = never restarts
  double value = 0;     // loss, ioerr, torn: probability; delay: ms; slow: factor
};

struct FaultPlan {
  std::vector<Fault> faults;    // explicit terms, in SPEC order
  double random_per_s[fault_kinds_count] = {};  // by FaultKind
  bool has_random() const;
};

// Errors: invalid, naming the term ("--faults: term 3 'crash:decode-9@1s': ...").
Result<FaultPlan> parse_faults(std::string_view spec);

// The plan's random terms drawn over [0, duration_ms) from `seed` and appended to its
// explicit faults; result sorted by (at_ms, SPEC order). `instances`: the names of the
// nodes that may crash, slow down or hang; `nodes`: every node (links join two of them).
std::vector<Fault> expand_faults(const FaultPlan& plan, const std::vector<std::string>& instances,
                                 const std::vector<std::string>& nodes, double duration_ms,
                                 uint64_t seed);

// The canonical term of one fault ("crash:decode-1@30000ms+10000ms"); parse_faults of the
// joined terms gives the same faults back.
std::string describe(const Fault& fault);
std::string describe(const std::vector<Fault>& faults);  // comma-joined, "" when none

}  // namespace tandem::sim
