// CAF message types of the node runtime. Node-to-node traffic never uses CAF's own
// serialization: actors receive InboundFrame (a validated Cap'n Proto envelope) and send
// through the Bridge.
#pragma once

#include <caf/all.hpp>

#include <memory>
#include <optional>

#include "messages/envelope.hpp"
#include "runtime/fabric/secure_channel.hpp"
#include "runtime/node/diagnostics.hpp"
#include "runtime/node/membership.hpp"

namespace tandem::runtime {

// Load of one serving instance: sent by prefill/decode shells to their node actor every
// tick; the node actor puts it into its heartbeats and forwards every report (local, or
// heard in a peer's heartbeat) to its subscribers (the router).
struct InstanceLoadReport {
  std::string instance;  // full actor name, "node/role/instance"
  uint32_t waiting = 0;
  uint32_t running = 0;
  uint64_t kv_blocks_used = 0;
  uint64_t kv_blocks_total = 0;
  // False while the instance cannot serve: its executor is still creating the device, or
  // failed to. The router skips not-ready instances; the gateway's /health counts ready
  // decode instances only.
  bool ready = true;
  std::string not_ready_reason;  // set when !ready, e.g. "executor failed: <why>"
  // Prefill: its tier-2 cost rule reads from its node's / another node's tier 2.
  bool tier2_local_reads = true;
  bool tier2_remote_reads = true;
  std::optional<uint64_t> pending_tokens;  // prefill: prompt tokens still to compute
  std::optional<uint64_t> kv_blocks_free;  // blocks on the free list
  // Its node drains it: routers do not pick it (the node actor stamps this on the reports it
  // passes on; the instance itself does not know).
  bool draining = false;
};

// One received envelope for this actor. The actor converts it inside its handler and never
// keeps readers past the handler.
// `from` is the authenticated peer it came from (its envelope's source node is checked to be
// that peer's name); null for a frame from an actor on this node.
struct InboundFrame {
  std::shared_ptr<messages::Frame> frame;
  std::shared_ptr<const PeerIdentity> from;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, InboundFrame&) {
  return f(caf::meta::type_name("tandem.InboundFrame"));  // never crosses CAF's network layer
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, MembershipEvent& x) {
  return f(caf::meta::type_name("tandem.MembershipEvent"), x.kind, x.node);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RmaReadDone& x) {
  return f(caf::meta::type_name("tandem.RmaReadDone"), x.token, x.ok, x.error);
}

}  // namespace tandem::runtime

CAF_BEGIN_TYPE_ID_BLOCK(tandem, caf::first_custom_type_id)
CAF_ADD_TYPE_ID(tandem, (tandem::runtime::InboundFrame))
CAF_ADD_TYPE_ID(tandem, (tandem::runtime::MembershipEvent))
CAF_ADD_TYPE_ID(tandem, (tandem::runtime::RmaReadDone))
CAF_END_TYPE_ID_BLOCK(tandem)

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::runtime::InstanceLoadReport)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::runtime::LocalAdmin)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tandem::runtime::AdminResult)

namespace tandem::runtime::atoms {
using tick = caf::atom_constant<caf::atom("tick")>;
using subscribe = caf::atom_constant<caf::atom("subscribe")>;
// (drain, bool on) to the node actor: drain (or undrain) every local prefill and decode
// instance; answered with the requests they still hold (waiting + running, last reports).
using drain = caf::atom_constant<caf::atom("drain")>;
// TEST HOOK (stall, uint32_t ms) to an executor: its next pass answers `ms` later than it
// would (a hung device step, for the step timeout's tests).
using stall = caf::atom_constant<caf::atom("stall")>;
}  // namespace tandem::runtime::atoms
