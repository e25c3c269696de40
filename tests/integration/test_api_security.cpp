// The API as a web page and another tenant see it (issue 38), against a real `tandem node`:
// a cross-site POST (text/plain, no Content-Type) is refused, a rebinding Host is refused, CORS
// only for the origins the manifest names, /metrics behind api_keys, and one API key's
// prompts never hit another's prefix cache unless the manifest shares it. And the admin
// port's token switch.
#include <doctest.h>

#include <nlohmann/json.hpp>

#include "tests/support/tandem_node.hpp"
#include "tests/unit/http_test_client.hpp"

using namespace tandem::testing;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

const std::string kCount = "/v1/messages/count_tokens";
const std::string kCountBody =
    R"({"model":"stories15M","messages":[{"role":"user","content":"hi"}]})";

// A request with its own Host line and headers (Content-Length added).
http_test::Reply raw(TandemNode& n, const std::string& method, const std::string& path,
                     const std::string& host, const std::string& headers,
                     const std::string& body = "") {
  http_test::Client client(n.http_port());
  std::string text = method + " " + path + " HTTP/1.1\r\nHost: " + host + "\r\n" + headers +
                     "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  client.send(text);
  return client.read_response(method == "HEAD");
}

TandemNode& keyed() {
  static TandemNode node("api_keys = [\"sk-a\", \"sk-b\"]", "api-security");
  static bool healthy = node.wait_healthy(60s);
  REQUIRE_MESSAGE(healthy, node.log());
  return node;
}

const std::string kJson = "Content-Type: application/json\r\n";
const std::string kKeyA = "x-api-key: sk-a\r\nanthropic-version: 2023-06-01\r\n";

// cached_tokens of a Completions answer for `prompt` with `key`.
int cached_tokens(TandemNode& n, const std::string& key, const std::string& prompt) {
  json body = {{"model", "stories15M"}, {"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}};
  auto r = raw(n, "POST", "/v1/completions", "127.0.0.1",
               kJson + "Authorization: Bearer " + key + "\r\n", body.dump());
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto j = json::parse(r.body);
  return j["usage"]["prompt_tokens_details"].value("cached_tokens", -1);
}

// A prompt of about 70 tokens (four 16-token blocks), unique to this run and `tag`.
std::string long_prompt(const std::string& tag) {
  std::string p = "Story " + tag + ":";
  for (int i = 0; i < 12; ++i) p += " The little dog ran to the park.";
  return p;
}

}  // namespace

TEST_CASE("api_security: only JSON bodies are taken (a web page's text/plain or form is 415)") {
  TandemNode& n = keyed();
  for (const std::string& type :
       {std::string("Content-Type: text/plain\r\n"),
        std::string("Content-Type: application/x-www-form-urlencoded\r\n"),
        std::string("Content-Type: multipart/form-data; boundary=x\r\n"), std::string()}) {
    auto r = raw(n, "POST", kCount, "127.0.0.1", type + kKeyA, kCountBody);
    INFO(type, " -> ", r.status, " ", r.body);
    CHECK(r.status == 415);
    CHECK(r.body.find("Content-Type") != std::string::npos);
    CHECK(r.body.find("\"type\":\"error\"") != std::string::npos);  // the API's own shape
  }
  auto ok = raw(n, "POST", kCount, "127.0.0.1",
                "Content-Type: application/json; charset=utf-8\r\n" + kKeyA, kCountBody);
  CHECK_MESSAGE(ok.status == 200, ok.body);
}

TEST_CASE("api_security: a Host that is not this node's is refused (DNS rebinding)") {
  TandemNode& n = keyed();
  auto port = std::to_string(n.http_port());
  auto evil = raw(n, "POST", kCount, "evil.example:" + port, kJson + kKeyA, kCountBody);
  CHECK(evil.status == 400);
  CHECK(evil.body.find("evil.example") != std::string::npos);
  CHECK(evil.body.find("allowed_hosts") != std::string::npos);
  for (const std::string& host : {"127.0.0.1:" + port, "localhost:" + port, std::string("[::1]"),
                                  std::string("10.1.2.3")}) {
    auto r = raw(n, "POST", kCount, host, kJson + kKeyA, kCountBody);
    CHECK_MESSAGE(r.status == 200, host, ": ", r.body);
  }
  // Health checks answer whatever the Host.
  auto health = raw(n, "GET", "/health", "lb.internal", "");
  CHECK(health.status == 200);
}

TEST_CASE("api_security: no CORS unless the manifest names the origin") {
  TandemNode& n = keyed();
  auto r = raw(n, "POST", kCount, "127.0.0.1", kJson + kKeyA + "Origin: https://evil.example\r\n",
               kCountBody);
  CHECK(r.status == 200);
  CHECK_FALSE(r.has_header("Access-Control-Allow-Origin"));
  auto preflight = raw(n, "OPTIONS", kCount, "127.0.0.1",
                       "Origin: https://evil.example\r\nAccess-Control-Request-Method: POST\r\n");
  CHECK(preflight.status != 204);
  CHECK_FALSE(preflight.has_header("Access-Control-Allow-Origin"));

  TandemNode cors("cors_origins = [\"https://app.example\"]", "api-cors");
  REQUIRE_MESSAGE(cors.wait_healthy(60s), cors.log());
  auto allowed = raw(cors, "OPTIONS", kCount, "127.0.0.1",
                     "Origin: https://app.example\r\nAccess-Control-Request-Method: POST\r\n"
                     "Access-Control-Request-Headers: content-type, x-api-key\r\n");
  CHECK(allowed.status == 204);
  CHECK(allowed.has_header("Access-Control-Allow-Origin: https://app.example"));
  CHECK(allowed.has_header("Access-Control-Allow-Headers: content-type, x-api-key"));
  auto post = raw(cors, "POST", kCount, "127.0.0.1", kJson + "Origin: https://app.example\r\n",
                  kCountBody);
  CHECK(post.status == 200);
  CHECK(post.has_header("Access-Control-Allow-Origin: https://app.example"));
  auto other = raw(cors, "POST", kCount, "127.0.0.1", kJson + "Origin: https://evil.example\r\n",
                   kCountBody);
  CHECK_FALSE(other.has_header("Access-Control-Allow-Origin"));
}

TEST_CASE("api_security: /metrics on the API port asks for an API key when api_keys is set") {
  TandemNode& n = keyed();
  CHECK(raw(n, "GET", "/metrics", "127.0.0.1", "").status == 401);
  auto r = raw(n, "GET", "/metrics", "127.0.0.1", "Authorization: Bearer sk-b\r\n");
  CHECK(r.status == 200);
  CHECK(r.body.find("tandem:") != std::string::npos);
}

TEST_CASE("api_security: one key's prompts do not hit another key's prefix cache") {
  TandemNode& n = keyed();
  std::string prompt = long_prompt("tenants-" + std::to_string(::getpid()));
  CHECK(cached_tokens(n, "sk-a", prompt) == 0);
  CHECK(cached_tokens(n, "sk-a", prompt) > 0);   // the same tenant reuses its blocks
  CHECK(cached_tokens(n, "sk-b", prompt) == 0);  // another tenant does not see them
  CHECK(cached_tokens(n, "sk-b", prompt) > 0);

  TandemNode shared("api_keys = [\"sk-a\", \"sk-b\"]\nshare_prefix_cache_across_keys = true",
                    "api-shared");
  REQUIRE_MESSAGE(shared.wait_healthy(60s), shared.log());
  std::string p2 = long_prompt("shared-" + std::to_string(::getpid()));
  CHECK(cached_tokens(shared, "sk-a", p2) == 0);
  CHECK(cached_tokens(shared, "sk-b", p2) > 0);  // shared on purpose
}

TEST_CASE("api_security: the admin port's token switch") {
  std::string dir = make_temp_dir("admin-token");
  auto made = run({tandem_bin(), "keygen", dir + "/admin.token"}, 10000ms);
  REQUIRE_MESSAGE(made.exit_code == 0, made.output);
  std::string token = read_file(dir + "/admin.token");
  while (!token.empty() && token.back() == '\n') token.pop_back();
  TandemNode n("[admin]\ntoken_file = \"" + dir + "/admin.token\"\nhttp_token_required = true",
               "admin-token");
  REQUIRE_MESSAGE(n.wait_healthy(60s), n.log());
  uint16_t admin = n.admin_port();
  CHECK(http_get_status(admin, "/metrics") == 401);
  CHECK(http_get_status(admin, "/health") == 401);
  http_test::Client c(admin);
  c.send("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + token +
         "\r\n\r\n");
  auto r = c.read_response();
  CHECK(r.status == 200);
  CHECK(r.body.find("tandem_fabric_frames_sent_total") != std::string::npos);
  http_test::Client wrong(admin);
  wrong.send("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + token +
             "x\r\n\r\n");
  CHECK(wrong.read_response().status == 401);
  std::filesystem::remove_all(dir);
}
