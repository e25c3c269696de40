// Who may send which message to an actor of which role: the cluster's protocol as one table,
// checked by the Bridge for every frame that arrives over the fabric, so that no handler sees
// a message its role never gets from that sender (a client's GenerateRequest straight to
// decode, a prefill's RouteReply to a gateway). Handlers check finer rules themselves (the
// router a gateway asked, the decode instance serving an attempt).
//
// Clients (the admin shell, tools) may send only Hello, Ping and AdminRequest; nodes' actors
// send what their role sends. Roles are the manifest's ("gateway", "kv-offload", ...) and
// "node" for a node's own actor.
#pragma once

#include <string_view>

#include "messages/envelope.capnp.h"

namespace tandem::messages {

bool sender_allowed(wire::Envelope::Body::Which kind, std::string_view from_role,
                    std::string_view to_role, bool from_client);

}  // namespace tandem::messages
