// The router's actor shell around RouterCore (router_core.hpp): the Endpoint Picker.
//
// Wire: RouteRequest (gateway) -> RouteReply (decode instance, optional prefill instance,
// cached blocks estimate) or Error (no instance can take it: kind overloaded / not_found).
// It knows every prefill and decode instance from the manifest; membership events mark an
// instance's node down/up, load reports (heartbeats) update its load view.
#pragma once

#include <caf/all.hpp>

#include "actors/common/shell.hpp"

namespace tandem::actors {

caf::actor spawn_router(caf::actor_system& system, const ShellContext& ctx,
                        const config::Instance& instance);

}  // namespace tandem::actors
