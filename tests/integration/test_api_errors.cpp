// Invalid requests against a real `tandem node` (stories15M, free loopback ports) over a
// plain socket: each gets the right HTTP status and an error body of its API's shape —
// OpenAI {"error": {message, type, param, code}} or Anthropic {"type": "error",
// "error": {type, message}}. The node runs with API keys, a small body limit and
// requests_max = 1, so 401, 413 and 429 are reachable too.
#include <doctest.h>

#include <nlohmann/json.hpp>

#include "tests/support/tandem_node.hpp"
#include "tests/unit/http_test_client.hpp"

using namespace tandem::testing;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

constexpr int kBodyBytesMax = 4096;
const std::string kOpenAiAuth = "Authorization: Bearer sk-test\r\n";
const std::string kAnthropicAuth = "x-api-key: sk-test\r\nanthropic-version: 2023-06-01\r\n";

enum class Shape { openai, anthropic };

struct Case {
  std::string name;
  std::string method;
  std::string path;
  std::string body;
  int status;
  std::vector<std::string> mentions;  // substrings the error message must contain
  std::string headers = "";           // "" = the API's valid key
};

Shape shape_of(const std::string& path) {
  return path.rfind("/v1/messages", 0) == 0 ? Shape::anthropic : Shape::openai;
}

TandemNode& node() {
  // One node for the whole file (started on first use, stopped at exit).
  static TandemNode shared("api_keys = [\"sk-test\"]\nbody_bytes_max = " +
                               std::to_string(kBodyBytesMax) + "\nrequests_max = 1\nqueue_max = 0",
                           "api-errors");
  static bool healthy = shared.wait_healthy(60s);
  REQUIRE_MESSAGE(healthy, ("GET /health never answered 200; node log:\n" + shared.log()));
  return shared;
}

http_test::Reply send(const Case& c) {
  std::string headers = c.headers;
  if (headers.empty()) {
    headers = shape_of(c.path) == Shape::anthropic ? kAnthropicAuth : kOpenAiAuth;
  }
  if (!c.body.empty()) headers += "Content-Type: application/json\r\n";
  http_test::Client client(node().http_port());
  return client.request(c.method, c.path, c.body, headers);
}

// Checks the error body's shape; returns its message.
std::string check_error_body(Shape shape, const http_test::Reply& reply) {
  CHECK(reply.has_header("application/json"));
  json body = json::parse(reply.body, nullptr, false);
  REQUIRE_MESSAGE(body.is_object(), ("error body is not a JSON object: " + reply.body));
  if (shape == Shape::anthropic) {
    CHECK(body.value("type", "") == "error");
    REQUIRE(body.contains("error"));
    REQUIRE(body["error"].is_object());
    CHECK(body["error"].value("type", "").size() > 0);
    CHECK(body.size() == 2);
    return body["error"].value("message", "");
  }
  REQUIRE(body.contains("error"));
  const json& e = body["error"];
  REQUIRE(e.is_object());
  CHECK(e.value("type", "").size() > 0);
  CHECK(e.contains("param"));
  CHECK(e.contains("code"));
  CHECK(e["param"].is_null() == !e["param"].is_string());
  return e.value("message", "");
}

void check_case(const Case& c) {
  INFO("case: ", c.name, " (", c.method, " ", c.path, ")");
  http_test::Reply reply = send(c);
  INFO("reply ", reply.status, ": ", reply.body);
  CHECK(reply.status == c.status);
  std::string message = check_error_body(shape_of(c.path), reply);
  CHECK(!message.empty());
  for (const auto& m : c.mentions) CHECK_MESSAGE(message.find(m) != std::string::npos, m);
}

std::string chat(const std::string& fields) {
  return R"({"model":"stories15M","messages":[{"role":"user","content":"hi"}])" +
         (fields.empty() ? "" : "," + fields) + "}";
}
// A prompt of ~400 tokens: more than the node's 256-token context.
std::string long_chat() {
  std::string words;
  for (int i = 0; i < 100; ++i) words += "Once upon a time ";
  return R"({"model":"stories15M","messages":[{"role":"user","content":")" + words + R"("}]})";
}
std::string anthropic(const std::string& fields) {
  return R"({"model":"stories15M","messages":[{"role":"user","content":"hi"}])" +
         (fields.empty() ? "" : "," + fields) + "}";
}

std::vector<Case> openai_cases() {
  const std::string c = "/v1/chat/completions";
  return {
      {"malformed JSON", "POST", c, R"({"model":"stories15M","messages":[)", 400, {}},
      {"body is not an object", "POST", c, R"([1,2,3])", 400, {}},
      {"messages is a string", "POST", c, R"({"model":"stories15M","messages":"hi"})", 400,
       {"messages"}},
      {"temperature is a string", "POST", c, chat(R"("temperature":"hot")"), 400,
       {"temperature"}},
      {"temperature out of range", "POST", c, chat(R"("temperature":3.5)"), 400, {"temperature"}},
      {"top_p 0", "POST", c, chat(R"("top_p":0)"), 400, {"top_p"}},
      {"n = 2", "POST", c, chat(R"("n":2)"), 400, {"n must be 1"}},
      {"unknown model", "POST", c,
       R"({"model":"gpt-9","messages":[{"role":"user","content":"hi"}]})", 404, {"gpt-9"}},
      {"missing messages", "POST", c, R"({"model":"stories15M"})", 400, {"messages"}},
      {"empty messages", "POST", c, R"({"model":"stories15M","messages":[]})", 400,
       {"messages"}},
      {"bad role", "POST", c,
       R"({"model":"stories15M","messages":[{"role":"wizard","content":"hi"}]})", 400,
       {"wizard"}},
      {"max_tokens beyond context", "POST", c, chat(R"("max_tokens":100000)"), 400,
       {"256", "100000"}},
      {"max_tokens 0", "POST", c, chat(R"("max_tokens":0)"), 400, {"max_tokens"}},
      {"prompt beyond context", "POST", c, long_chat(), 400,
       {"maximum context length is 256 tokens", "the prompt has "}},
      {"tools with the plain chat format", "POST", c,
       chat(R"("tools":[{"type":"function","function":{"name":"f","parameters":{}}}])"), 400,
       {"chat format is plain", "[model] chat_format"}},
      {"responses tools with the plain chat format", "POST", "/v1/responses",
       R"({"model":"stories15M","input":"hi","tools":[{"type":"function","name":"f",)"
       R"("parameters":{}}]})", 400, {"chat format is plain", "[model] chat_format"}},
      {"max_tokens is a string", "POST", c, chat(R"("max_tokens":"ten")"), 400, {"max_tokens"}},
      {"stream is a number", "POST", c, chat(R"("stream":1)"), 400, {"stream"}},
      {"token id beyond the vocabulary", "POST", "/v1/completions",
       R"({"model":"stories15M","prompt":[1,99999999]})", 400, {"99999999", "vocabulary"}},
      {"negative token id", "POST", "/v1/completions",
       R"({"model":"stories15M","prompt":[1,-5]})", 400, {"prompt[1]", "non-negative"}},
      {"completions max_tokens beyond context", "POST", "/v1/completions",
       R"({"model":"stories15M","prompt":"Once","max_tokens":300})", 400, {"256", "300"}},
      {"responses previous_response_id", "POST", "/v1/responses",
       R"({"model":"stories15M","input":"hi","previous_response_id":"resp_1"})", 400,
       {"previous_response_id"}},
      {"responses input is a number", "POST", "/v1/responses",
       R"({"model":"stories15M","input":42})", 400, {"input"}},
      {"wrong method", "GET", c, "", 405, {"GET"}},
      {"unknown path (POST)", "POST", "/v1/nothing", chat(""), 404, {"/v1/nothing"}},
      {"unknown path (GET)", "GET", "/v1/nothing", "", 404, {"/v1/nothing"}},
      {"no API key", "POST", c, chat(""), 401, {"API key"}, "X-None: 1\r\n"},
      {"wrong API key", "POST", c, chat(""), 401, {"API key"},
       "Authorization: Bearer sk-wrong\r\n"},
  };
}

std::vector<Case> anthropic_cases() {
  const std::string m = "/v1/messages";
  return {
      {"anthropic malformed JSON", "POST", m, R"({"model":)", 400, {}},
      {"anthropic without max_tokens", "POST", m, anthropic(""), 400, {"max_tokens"}},
      {"anthropic bad role", "POST", m,
       R"({"model":"stories15M","max_tokens":8,"messages":[{"role":"tool","content":"hi"}]})",
       400, {"tool"}},
      {"anthropic empty messages", "POST", m,
       R"({"model":"stories15M","max_tokens":8,"messages":[]})", 400, {"messages"}},
      {"anthropic unknown model", "POST", m,
       R"({"model":"claude-x","max_tokens":8,"messages":[{"role":"user","content":"hi"}]})",
       404, {"claude-x"}},
      {"anthropic max_tokens beyond context", "POST", m, anthropic(R"("max_tokens":5000)"), 400,
       {"256", "5000"}},
      {"anthropic temperature out of range", "POST", m,
       anthropic(R"("max_tokens":8,"temperature":1.5)"), 400, {"temperature"}},
      {"count_tokens without messages", "POST", "/v1/messages/count_tokens",
       R"({"model":"stories15M"})", 400, {"messages"}},
      {"count_tokens unknown model", "POST", "/v1/messages/count_tokens",
       R"({"model":"claude-x","messages":[{"role":"user","content":"hi"}]})", 404,
       {"claude-x", "'stories15M'"}},
      {"anthropic wrong method", "GET", m, "", 405, {"GET"}},
      {"anthropic wrong API key", "POST", m, anthropic(R"("max_tokens":8)"), 401, {"API key"},
       "x-api-key: sk-wrong\r\n"},
  };
}

}  // namespace

TEST_CASE("api_errors: OpenAI-shaped errors for Chat, Completions and Responses") {
  auto cases = openai_cases();
  CHECK(cases.size() >= 20);
  for (const auto& c : cases) check_case(c);
  CHECK_MESSAGE(node().running(), ("the node died; log:\n" + node().log()));
}

TEST_CASE("api_errors: Anthropic-shaped errors for Messages and count_tokens") {
  for (const auto& c : anthropic_cases()) check_case(c);
  CHECK_MESSAGE(node().running(), ("the node died; log:\n" + node().log()));
}

TEST_CASE("api_errors: a body over [gateway] body_bytes_max gets 413 in each API's shape") {
  std::string filler(kBodyBytesMax + 100, 'a');
  check_case({"chat body too large", "POST", "/v1/chat/completions",
              R"({"model":"stories15M","messages":[{"role":"user","content":")" + filler +
                  R"("}]})",
              413, {std::to_string(kBodyBytesMax)}});
  check_case({"messages body too large", "POST", "/v1/messages",
              R"({"model":"stories15M","max_tokens":8,"messages":[{"role":"user","content":")" +
                  filler + R"("}]})",
              413, {std::to_string(kBodyBytesMax)}});
}

TEST_CASE("api_errors: valid requests still work after the errors") {
  http_test::Client client(node().http_port());
  auto reply = client.request("POST", "/v1/chat/completions", chat(R"("max_tokens":4)"),
                              kOpenAiAuth + "Content-Type: application/json\r\n");
  INFO(reply.body);
  REQUIRE(reply.status == 200);
  json body = json::parse(reply.body, nullptr, false);
  REQUIRE(body.is_object());
  CHECK(body["choices"][0]["message"]["content"].is_string());
}

TEST_CASE("api_errors: requests_max = 1 and queue_max = 0 answer 429 while a stream is in flight") {
  // The first stream asks for nearly the whole context and is read slowly (not at all until
  // the second request was refused), so it is still in flight.
  std::string slow = chat(R"("max_tokens":230,"stream":true)");
  std::string headers = kOpenAiAuth + "Content-Type: application/json\r\n";
  http_test::Client first(node().http_port(), 4096);
  first.send("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers +
             "Content-Length: " + std::to_string(slow.size()) + "\r\n\r\n" + slow);
  http_test::Reply head = first.read_head();
  REQUIRE(head.status == 200);
  for (const std::string& path : {std::string("/v1/chat/completions"),
                                  std::string("/v1/messages")}) {
    bool is_messages = path == "/v1/messages";
    check_case({"second request while one is in flight", "POST", path,
                is_messages ? anthropic(R"("max_tokens":8)") : chat(R"("max_tokens":8)"), 429,
                {"too many requests"}});
  }
  // Drain the first stream: it completes normally.
  std::string all;
  for (;;) {
    std::string chunk = first.read_chunk(30000);
    if (chunk.empty()) break;
    all += chunk;
  }
  CHECK(all.find("data: [DONE]") != std::string::npos);
  // Once it finished, a new request is admitted again.
  REQUIRE(eventually(5000ms, [] {
    http_test::Client again(node().http_port());
    auto r = again.request("POST", "/v1/chat/completions", chat(R"("max_tokens":2)"),
                           kOpenAiAuth + "Content-Type: application/json\r\n");
    return r.status == 200;
  }));
}

TEST_CASE("api_errors: [gateway] header_timeout_ms, body_timeout_ms, connections_per_client_max") {
  // A node of its own: the keys reach the HTTP server (408s name them; the third connection
  // from 127.0.0.1 is refused, /health on it still answered).
  TandemNode slow("header_timeout_ms = 300\nbody_timeout_ms = 400\nconnections_per_client_max = 2",
                  "api-slow-clients");
  REQUIRE_MESSAGE(slow.wait_healthy(60s), ("GET /health never answered 200; log:\n" + slow.log()));
  {
    http_test::Client client(slow.http_port());
    client.send("POST /v1/messages HTTP/1.1\r\nHost: x\r\n");
    auto reply = client.read_response();
    CHECK(reply.status == 408);
    CHECK(check_error_body(Shape::anthropic, reply).find("300 ms (header_timeout_ms)") !=
          std::string::npos);
    CHECK(client.closed_by_peer());
  }
  {
    http_test::Client client(slow.http_port());
    client.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{");
    auto reply = client.read_response();
    CHECK(reply.status == 408);
    CHECK(check_error_body(Shape::openai, reply).find("400 ms (body_timeout_ms)") !=
          std::string::npos);
    CHECK(client.closed_by_peer());
  }
  http_test::Client a(slow.http_port());
  http_test::Client b(slow.http_port());
  a.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  b.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(a.read_response().status == 200);
  CHECK(b.read_response().status == 200);
  {
    http_test::Client third(slow.http_port());
    auto refused = third.request("POST", "/v1/chat/completions", chat(R"("max_tokens":2)"),
                                 "Content-Type: application/json\r\n");
    CHECK(refused.status == 503);
    CHECK(refused.has_header("Retry-After: 1"));
    CHECK(check_error_body(Shape::openai, refused).find("connections_per_client_max 2") !=
          std::string::npos);
    CHECK(third.closed_by_peer());
  }
  http_test::Client health(slow.http_port());
  CHECK(health.request("GET", "/health").status == 200);
  CHECK(health.closed_by_peer());
  CHECK_MESSAGE(slow.running(), ("the node died; log:\n" + slow.log()));
}
