// HandlerGuard, the backstop at every shell handler's boundary: whatever a handler throws
// (std::exception, kj::Exception, anything) becomes that message's Error, is counted in
// tandem:handler_failures_total{role} and logged; a failed frame is answered with an Error
// for its correlation id to the actor that sent it (never to a node, never for an Error).
#include <doctest.h>

#include <caf/all.hpp>

#include <chrono>
#include <stdexcept>
#include <string>

#include "actors/common/shell.hpp"
#include "messages/convert.hpp"
#include "tests/support/local_bridge.hpp"
#include "tests/support/process.hpp"

using namespace tandem;
using namespace std::chrono_literals;

namespace {

const std::string manifest_text = R"([cluster]
name = "guard"
[model]
name = "tiny"
path = "models/tiny"
[[node]]
name = "a"
host = "127.0.0.1"
fabric_port = FABRIC_PORT
admin_port = 17200
http_port = 8000
  [[node.instance]]
  role = "gateway"
  name = "gw"
  [[node.instance]]
  role = "router"
  name = "rt"
  [[node.instance]]
  role = "decode"
  name = "dec"
  executor = "ex"
  [[node.instance]]
  role = "executor"
  name = "ex"
  device = "cpu"
  devices = [0]
)";

uint64_t failures(obs::Registry& registry, const std::string& role) {
  auto c = registry.counter("tandem:handler_failures_total", "", {{"role", role}});
  REQUIRE(c.ok());
  return (*c)->value();
}

}  // namespace

TEST_CASE("handler guard: every kind of exception becomes an Error, counted; success is ok") {
  std::string text = manifest_text;
  text.replace(text.find("FABRIC_PORT"), 11, std::to_string(testing::free_port()));
  config::Manifest manifest = testing::parse_manifest_or_fail(text);
  testing::LocalBridge local(manifest, "a");
  obs::Registry registry;
  actors::ShellContext ctx{&manifest, local.bridge.get(), local.log, &registry, {}};
  actors::HandlerGuard guard(ctx, "router");
  bool ran = false;
  CHECK(guard.run("a tick", [&ran] { ran = true; }).ok());
  CHECK(ran);
  CHECK(failures(registry, "router") == 0);

  Status failed = guard.run("routing", [] { throw std::out_of_range("number overflow"); });
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.error().kind == ErrorKind::failed);
  CHECK(failed.error().message == "internal error while routing: number overflow");
  failed = guard.run("routing", [] { KJ_FAIL_REQUIRE("bad capnp field"); });
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.error().message.find("bad capnp field") != std::string::npos);
  failed = guard.run("routing", [] { throw 42; });
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.error().message == "internal error while routing: an exception of unknown type");
  CHECK(failures(registry, "router") == 3);
  CHECK(guard.failures_count() == 3);
}

TEST_CASE("handler guard: a frame whose handler throws is answered with an Error to its sender") {
  std::string text = manifest_text;
  text.replace(text.find("FABRIC_PORT"), 11, std::to_string(testing::free_port()));
  config::Manifest manifest = testing::parse_manifest_or_fail(text);
  caf::actor_system_config cfg;
  caf::actor_system system{testing::tandem_actor_config(cfg)};
  testing::LocalBridge local(manifest, "a");
  caf::scoped_actor gateway{system}, router{system};
  messages::ActorName gw{"a", "gateway", "gw"}, rt{"a", "router", "rt"};
  local.bridge->register_actor(gw, caf::actor_cast<caf::actor>(gateway));
  local.bridge->register_actor(rt, caf::actor_cast<caf::actor>(router));
  local.bridge->set_ready();
  obs::Registry registry;
  actors::ShellContext ctx{&manifest, local.bridge.get(), local.log, &registry, {}};
  actors::HandlerGuard guard(ctx, "router");

  REQUIRE(local.bridge->send(gw, rt, 7, [](wire::Envelope::Builder b) {
    b.getBody().initRouteRequest().setRequestId(7);
  }).ok());
  bool handled = false;
  router->receive(
      [&](const runtime::InboundFrame& in) {
        guard.run_frame(rt, in, [] { throw std::runtime_error("boom"); });
        handled = true;
      },
      caf::after(2s) >> [] {});
  REQUIRE(handled);
  bool answered = false;
  gateway->receive(
      [&](const runtime::InboundFrame& in) {
        auto envelope = in.frame->envelope();
        REQUIRE(envelope.getBody().which() == wire::Envelope::Body::ERROR);
        auto e = envelope.getBody().getError();
        CHECK(e.getRequestId() == 7);
        CHECK(messages::from_wire(e.getKind()) == ErrorKind::failed);
        CHECK(std::string(e.getMessage().cStr()) ==
              "internal error while handling a message: boom");
        CHECK(messages::get_name(envelope.getSource()) == rt);
        answered = true;
      },
      caf::after(2s) >> [] {});
  CHECK(answered);
  CHECK(failures(registry, "router") == 1);

  // An Error frame that fails is not answered (no error loops); nor is a frame without id.
  REQUIRE(local.bridge->send(gw, rt, 8, [](wire::Envelope::Builder b) {
    b.getBody().initError().setRequestId(8);
  }).ok());
  REQUIRE(local.bridge->send(gw, rt, 0, [](wire::Envelope::Builder b) {
    b.getBody().initRouteRequest().setRequestId(0);
  }).ok());
  for (int i = 0; i < 2; ++i) {
    router->receive(
        [&](const runtime::InboundFrame& in) {
          guard.run_frame(rt, in, [] { throw std::runtime_error("again"); });
        },
        caf::after(2s) >> [] {});
  }
  bool more = false;
  gateway->receive([&](const runtime::InboundFrame&) { more = true; },
                   caf::after(300ms) >> [] {});
  CHECK_FALSE(more);
  CHECK(failures(registry, "router") == 3);
}
