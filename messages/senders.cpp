#include "messages/senders.hpp"

#include <initializer_list>

namespace tandem::messages {

namespace {

using Kind = wire::Envelope::Body::Which;

template <class T>
bool one_of(T value, std::initializer_list<T> set) {
  for (const T& v : set) {
    if (v == value) return true;
  }
  return false;
}

bool one_of(std::string_view role, std::initializer_list<std::string_view> roles) {
  return one_of<std::string_view>(role, roles);
}

// What an actor of role `to` accepts from a node's actor of role `from`.
bool node_may_send(Kind kind, std::string_view from, std::string_view to) {
  // Any serving actor may answer a message it could not handle with an Error for its id
  // (HandlerGuard); the receiver checks it against the request it names.
  if (kind == Kind::PING || kind == Kind::PONG) return true;
  if (kind == Kind::ERROR) return to != "node";
  if (to == "node") {
    return one_of(kind, {Kind::HELLO, Kind::HELLO_ACK, Kind::HEARTBEAT, Kind::ADMIN_REQUEST,
                         Kind::ADMIN_REPLY}) &&
           from == "node";
  }
  if (to == "gateway") {
    if (kind == Kind::ROUTE_REPLY) return from == "router";
    return one_of(kind, {Kind::TOKEN_CHUNK, Kind::FINISH, Kind::STEP_EVENTS}) && from == "decode";
  }
  if (to == "router") {
    if (kind == Kind::ROUTE_REQUEST) return from == "gateway";
    return kind == Kind::KV_EVENTS && one_of(from, {"prefill", "decode", "kv-offload"});
  }
  if (kind == Kind::KV_RESYNC) return from == "router" && one_of(to, {"prefill", "decode",
                                                                      "kv-offload"});
  if (to == "decode") {
    if (one_of(kind, {Kind::GENERATE_REQUEST, Kind::CANCEL})) return from == "gateway";
    return kind == Kind::PREFILL_RESULT && from == "prefill";
  }
  if (to == "prefill") {
    if (one_of(kind, {Kind::PREFILL_REQUEST, Kind::CANCEL})) return from == "decode";
    if (kind == Kind::KV_PULL_DONE) return from == "decode";
    return one_of(kind, {Kind::OFFLOAD_LOOKUP_REPLY, Kind::OFFLOAD_STORE_DONE}) &&
           from == "kv-offload";
  }
  if (to == "kv-offload") {
    return one_of(kind, {Kind::OFFLOAD_STORE, Kind::OFFLOAD_LOOKUP, Kind::KV_PULL_DONE}) &&
           from == "prefill";
  }
  return false;
}

}  // namespace

bool sender_allowed(Kind kind, std::string_view from_role, std::string_view to_role,
                    bool from_client) {
  if (from_client) {
    if (kind == Kind::PING) return true;
    return to_role == "node" && (kind == Kind::HELLO || kind == Kind::ADMIN_REQUEST);
  }
  return node_may_send(kind, from_role, to_role);
}

}  // namespace tandem::messages
