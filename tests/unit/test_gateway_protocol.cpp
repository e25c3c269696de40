// The gateway actor against stand-ins for the router and decode, in one process over a real
// bridge: what it accepts from decode. Tokens come only from the decode instance the request
// is on (a late chunk from another instance is ignored), and a chunk that arrives after a
// gap fails the request instead of streaming text with a hole.
#include <doctest.h>

#include <algorithm>

#include <caf/all.hpp>

#include <chrono>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/gateway_harness.hpp"

using namespace tandem;
using namespace std::chrono_literals;
namespace http = tandem::testing::http;

using Harness = testing::GatewayHarness;
using testing::Chunk;

namespace {

// The completion answers exactly `legit` (Completions continue the prompt's last token,
// "time" = 931).
void check_answer(Harness& h, const http::Response& r, const std::vector<int32_t>& legit) {
  REQUIRE_MESSAGE(r.ok(), r.error);
  CHECK(r.status == 200);
  auto body = nlohmann::json::parse(r.body, nullptr, false);
  REQUIRE_FALSE(body.is_discarded());
  CHECK(body["choices"][0]["text"] == h.text_of(legit, 931));
  CHECK(body["usage"]["completion_tokens"] == legit.size());
}

void check_lost(const http::Response& r) {
  REQUIRE_MESSAGE(r.ok(), r.error);
  CHECK(r.status == 503);  // an overload of the path from decode, retried: not a server fault
  CHECK(r.body.find("lost") != std::string::npos);
  CHECK(r.body.find("overloaded_error") != std::string::npos);
}

}  // namespace

TEST_CASE("gateway: tokens from another decode instance are ignored") {
  Harness h;
  std::vector<int32_t> legit = {263, 2217, 7826}, impostor = {1128};
  check_answer(h, h.complete({{"a/decode/old", 0, impostor}, {"a/decode/dec", 0, legit}}, 3),
               legit);
}

TEST_CASE("gateway: a chunk after a gap fails the request; so does a short finish") {
  Harness h;
  check_lost(h.complete({{"a/decode/dec", 0, {263}}, {"a/decode/dec", 2, {7826}}}, 3));
  auto short_finish = h.complete({{"a/decode/dec", 0, {263, 2217}}}, 3);
  REQUIRE_MESSAGE(short_finish.ok(), short_finish.error);
  CHECK(short_finish.status == 503);
}

TEST_CASE("gateway: StepEvents frames (decode's batched chunks and finish) answer the same, "
          "with the same checks") {
  Harness h;
  std::vector<int32_t> legit = {263, 2217, 7826}, impostor = {1128};
  check_answer(h,
               h.complete({{"a/decode/dec", 0, {263}}, {"a/decode/old", 0, impostor},
                           {"a/decode/dec", 1, {2217, 7826}}},
                          3, true),
               legit);
  check_lost(h.complete({{"a/decode/dec", 0, {263}}, {"a/decode/dec", 2, {7826}}}, 3, true));
}

TEST_CASE("gateway: only the router it asked answers a route, once; others' errors are dropped") {
  Harness h;
  std::vector<int32_t> legit = {263, 2217, 7826};
  testing::DecodeScript script{{{"a/decode/dec", 0, legit}}, 3, wire::FinishReason::LENGTH,
                               false, true};
  auto out = h.post("/v1/completions",
                    R"({"model":"stories15M","prompt":"Once upon a time","max_tokens":8})",
                    script);
  check_answer(h, out.response, legit);
}
