// The prefill instance's actor shell around PrefillScheduler (prefill_scheduler.hpp).
//
// Wire: PrefillRequest (from a decode instance) -> PrefillResult (first token + descriptors
// of the prompt's KV blocks in the executor's registered pool) or Error. The blocks stay
// pinned until KvPullDone or hold_timeout_ms. Cancel releases at any stage.
// Local: runs each planned step on its executor (exec_run), samples first tokens.
#pragma once

#include <caf/all.hpp>

#include "actors/common/shell.hpp"

namespace tandem::actors {

caf::actor spawn_prefill(caf::actor_system& system, const ShellContext& ctx,
                         const config::Instance& instance, caf::actor executor);

}  // namespace tandem::actors
