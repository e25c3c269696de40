// DecodeHealth: which decode instances can serve (the gateway's /health and admission).
#include <doctest.h>

#include "actors/gateway/decode_health.hpp"

using tandem::gateway::DecodeHealth;

TEST_CASE("decode_health: no decode instance is never healthy") {
  DecodeHealth h("n0", {});
  CHECK_FALSE(h.healthy());
  CHECK(h.reason() == "the cluster has no decode instance");
}

TEST_CASE("decode_health: a local instance is healthy only once it reported ready") {
  DecodeHealth h("n0", {{"n0", "decode"}});
  CHECK_FALSE(h.healthy());
  CHECK(h.reason() ==
        "no decode instance is ready: decode@n0 has not reported ready yet (starting)");
  h.report("n0/decode/decode", true, "");
  CHECK(h.healthy());
  CHECK(h.reason().empty());
  CHECK(h.instance_ready("n0/decode/decode"));
  CHECK_FALSE(h.instance_ready("n0/decode/other"));
}

TEST_CASE("decode_health: a failed executor's reason reaches the 503 text") {
  DecodeHealth h("n0", {{"n0", "decode"}});
  h.report("n0/decode/decode", false, "executor failed: sim: kv_scale 2 is outside [1/128, 1]");
  CHECK_FALSE(h.healthy());
  CHECK(h.reason() == "no decode instance is ready: decode@n0 executor failed: sim: kv_scale 2 "
                      "is outside [1/128, 1]");
  // An empty reason still says something; a huge one is cut.
  h.report("n0/decode/decode", false, "");
  CHECK(h.reason().find("decode@n0 not ready (no reason given)") != std::string::npos);
  h.report("n0/decode/decode", false, std::string(10000, 'x'));
  CHECK(h.reason().size() < DecodeHealth::reason_bytes_max + 100);
}

TEST_CASE("decode_health: remote instances need their node up AND a ready report") {
  DecodeHealth h("gw", {{"n1", "d1"}, {"n2", "d2"}});
  h.report("n1/decode/d1", true, "");
  CHECK_FALSE(h.healthy());  // n1 not heard from yet
  CHECK(h.reason() == "no decode instance is ready: d1@n1 node is down; d2@n2 node is down");
  h.node_up("n1", true);
  CHECK(h.healthy());
  h.node_up("n2", true);
  h.report("n2/decode/d2", false, "executor failed: boom");
  CHECK(h.healthy());  // d1 still serves
  h.node_up("n1", false);
  CHECK_FALSE(h.healthy());
  CHECK(h.reason() ==
        "no decode instance is ready: d1@n1 node is down; d2@n2 executor failed: boom");
  // A restarted node must report ready again.
  h.node_up("n1", true);
  CHECK(h.healthy());
  h.node_restarted("n1");
  CHECK_FALSE(h.healthy());
  h.report("n1/decode/d1", true, "");
  CHECK(h.healthy());
}

TEST_CASE("decode_health: reports of unknown or non-decode instances are ignored") {
  DecodeHealth h("n0", {{"n0", "decode"}});
  h.report("n0/prefill/decode", true, "");
  h.report("n9/decode/decode", true, "");
  h.node_up("n9", true);  // unknown node: ignored
  CHECK_FALSE(h.healthy());
}

TEST_CASE("decode_health: ready_count counts the instances that can serve") {
  DecodeHealth h("n0", {{"n0", "decode"}, {"n1", "decode"}});
  CHECK(h.ready_count() == 0);
  h.report("n0/decode/decode", true, "");
  CHECK(h.ready_count() == 1);
  h.report("n1/decode/decode", true, "");
  h.node_up("n1", true);
  CHECK(h.ready_count() == 2);
  h.node_up("n1", false);
  CHECK(h.ready_count() == 1);
}
