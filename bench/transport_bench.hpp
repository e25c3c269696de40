// `tandem bench transport`: Tandem's transport beside the provider's own figures, measured in
// one run on 127.0.0.1 (default provider tcp;ofi_rxm):
//   fi_pingpong  libfabric-bin's ping-pong (server + client child processes): 64 B round trip
//                and the send/recv ping-pong bandwidth for the RMA sizes;
//   raw          a minimal libfabric baseline in this program (transport_raw.hpp): busy-polled
//                send/recv round trips, a windowed message rate, back-to-back fi_read loops;
//   tandem       FabricEndpoint in two processes: envelope ping/pong round trips (p50/p99),
//                message rate with 64 outstanding, FabricEndpoint::read bandwidth;
//   node         ClusterClient::ping to a real `tandem node` (includes the CAF actor hop).
// Prints one table with the ratios; --json FILE saves it. Children are this same program
// re-executed with the internal --serve flag. Returns a process exit code.
#pragma once

#include "tools/cli.hpp"

namespace tandem::bench {

int run_transport_bench(cli::Args args);

}  // namespace tandem::bench
