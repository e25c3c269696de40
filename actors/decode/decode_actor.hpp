// The decode instance's actor shell around DecodeScheduler (decode_scheduler.hpp).
//
// Wire in:  GenerateRequest (gateway), PrefillResult / Error (prefill), Cancel (gateway).
// Wire out: PrefillRequest + KvPullDone + Cancel (prefill), TokenChunk / Finish / Error
//           (the request's replyTo gateway).
// The KV of a disaggregated prompt is pulled with one-sided RMA reads from the prefill
// instance's registered pool straight into this instance's pool. A prefill that fails, times
// out (decode.prefill_timeout_ms) or whose node goes down makes this instance prefill locally.
#pragma once

#include <caf/all.hpp>

#include "actors/common/shell.hpp"

namespace tandem::actors {

caf::actor spawn_decode(caf::actor_system& system, const ShellContext& ctx,
                        const config::Instance& instance, caf::actor executor);

}  // namespace tandem::actors
