// The router's actor shell around RouterCore (router_core.hpp): the Endpoint Picker.
//
// Wire: RouteRequest (gateway) -> RouteReply (decode instance, optional prefill instance,
// cached blocks estimate) or Error (no instance can take it: kind overloaded / not_found).
// It knows every prefill and decode instance from the manifest; membership events mark an
// instance's node down/up, load reports (heartbeats) update its load view.
#pragma once

#include <caf/all.hpp>

#include "actors/common/shell.hpp"
#include "actors/router/router_core.hpp"

namespace tandem::actors {

// The manifest's [router] section (plus [model] block_tokens) as the core's config; the
// seed derives from the cluster name and instances_max is the manifest's prefill + decode
// instance count. Used by the
// router actor and by `tandem sim --manifest` (which overrides seed and block size).
router::RouterConfig router_config(const config::Manifest& manifest);
// The same with `router` in place of the manifest's [router] (live settings: router set).
router::RouterConfig router_config(const config::Manifest& manifest,
                                   const config::RouterSection& router);

caf::actor spawn_router(caf::actor_system& system, const ShellContext& ctx,
                        const config::Instance& instance);

}  // namespace tandem::actors
