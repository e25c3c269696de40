// The gateway's retry decision for a request whose decode instance failed (issue 12): a pure
// function, shared by the gateway shell (gateway_actor.cpp on_failure) and the cluster
// simulator (tools/sim), so the simulator checks the policy the nodes run.
//
// Rule: a failure of kind disconnected, failed, timed_out or unimplemented (a dead decode
// node, a decode error, no progress, an instance that cannot serve the request: no device, or
// its device lost) is routed again while no token has reached the client and the request has
// retries left; anything else ends the request with an explicit error: 400 (invalid), 503
// (overloaded, or unimplemented: the service is unavailable, not broken; clients retry later)
// or 500.
// Pure: no clocks, no I/O.
#pragma once

#include <cstdint>
#include <string_view>

#include "runtime/base/result.hpp"

namespace tandem::gateway {

inline constexpr uint32_t retries_max = 2;  // routing attempts after the first

struct RetryDecision {
  bool retry = false;           // true: route again (the caller spends one retry)
  int http_status = 500;        // when !retry: the answer's status
  std::string_view type = "api_error";  // when !retry: the error body's type
};

inline bool retryable(ErrorKind kind) {
  return kind == ErrorKind::disconnected || kind == ErrorKind::failed ||
         kind == ErrorKind::timed_out || kind == ErrorKind::unimplemented;
}

// `tokens_sent`: output tokens already streamed to the client for this request.
inline RetryDecision decide_retry(ErrorKind kind, uint32_t tokens_sent, uint32_t retries_left) {
  if (tokens_sent == 0 && retries_left > 0 && retryable(kind)) return {true, 0, ""};
  if (kind == ErrorKind::invalid) return {false, 400, "invalid_request_error"};
  if (kind == ErrorKind::overloaded || kind == ErrorKind::unimplemented) {
    return {false, 503, "overloaded_error"};
  }
  return {false, 500, "api_error"};
}

}  // namespace tandem::gateway
