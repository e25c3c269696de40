// Gateway operations against a real one-node cluster on the sim device:
// - /health is 503 (with the reason) while no decode instance can serve because its
//   executor failed to create its device, and a chat request then gets a 503 error body;
//   a healthy cluster answers 200;
// - admission that tells the truth (issue 12): with decode limits smaller than the
//   gateway's, more concurrent streaming and non-streaming requests than the cluster holds
//   each get 200 with a whole answer or 429/503 with Retry-After before any body byte, and
//   no stream carries decode's "waiting queue full";
// - a prompt of megabytes gets the context-length 400 (capped tokenizing);
// - SIGTERM of the node ends every open stream with its API's error event and terminator;
// - admission: with requests_max = C and queue_max = Q, C + Q concurrent streams all
//   complete, request C + Q + 1 gets 429 (OpenAI and Anthropic shapes, Retry-After), the
//   waiting gauge follows the queue, a waiting client that disconnects leaves the queue, and
//   a request that waits longer than queue_timeout_ms gets 503.
#include <doctest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "tests/support/http_client.hpp"
#include "tests/support/metric_check.hpp"
#include "tests/support/process.hpp"

using namespace tandem::testing;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

constexpr uint32_t kRunningMax = 2;  // gateway.requests_max (C)
constexpr uint32_t kQueueMax = 2;    // gateway.queue_max (Q)

// A one-node cluster (gateway, router, prefill, decode on the sim device). `sim` and
// `gateway` are extra lines for those sections.
class SimNode {
 public:
  // `extra`: more sections (e.g. "[router]\n..."); `prefill_device`: the prefill executor's;
  // `decode_kv_blocks`: the decode executor's KV pool (at least 128: one full context).
  SimNode(const std::string& tag, const std::string& sim, const std::string& gateway,
          const std::string& extra = "", const std::string& prefill_device = "sim",
          bool test_hooks = false, uint32_t decode_kv_blocks = 1024)
      : dir_(make_temp_dir(tag)), http_port_(free_port()) {
    std::string t = "[cluster]\nname = \"" + tag + "\"\n[logging]\nlevel = \"warn\"\n"
                    "[model]\nname = \"stories15M\"\npath = \"" + source_root() +
                    "/models/stories15M\"\nblock_tokens = 16\nmax_model_tokens = 2048\n"
                    "chat_format = \"plain\"\n[sim]\nvocab = 32000\nbos_id = 1\neos_id = 2\n"
                    "max_position = 2048\noutput_tokens_sigma = 0\noutput_tokens_mean = 16384\n"
                    "output_tokens_max = 16384\n" + sim + "\n[gateway]\n" + gateway + "\n" +
                    extra + "\n";
    t += "[[node]]\nname = \"local\"\nhost = \"127.0.0.1\"\nfabric_port = " +
         std::to_string(free_port()) + "\nadmin_port = " + std::to_string(free_port()) +
         "\nhttp_port = " + std::to_string(http_port_) + "\n";
    for (const char* inst :
         {"role = \"gateway\"\nname = \"gateway\"\n", "role = \"router\"\nname = \"router\"\n",
          "role = \"prefill\"\nname = \"prefill\"\nexecutor = \"ep\"\n",
          "role = \"decode\"\nname = \"decode\"\nexecutor = \"ed\"\n"}) {
      t += std::string("[[node.instance]]\n") + inst;
    }
    t += "[[node.instance]]\nrole = \"executor\"\nname = \"ed\"\ndevice = \"sim\"\n"
         "devices = [1]\nkv_blocks = " + std::to_string(decode_kv_blocks) + "\n";
    t += "[[node.instance]]\nrole = \"executor\"\nname = \"ep\"\ndevice = \"" + prefill_device +
         "\"\ndevices = [0]\nkv_blocks = 1024\n";
    write_file(dir_ + "/cluster.toml", t);
    std::vector<std::string> argv = {tandem_bin(), "node", "--manifest", dir_ + "/cluster.toml",
                                     "--node", "local"};
    if (test_hooks) argv.push_back("--test-hooks");
    child_ = std::make_unique<Child>(argv, dir_ + "/node.log");
  }
  // SIGTERM, as a supervisor stops a node; the destructor waits for the exit.
  void terminate() { child_->signal(SIGTERM); }
  ~SimNode() {
    if (child_->running()) child_->signal(SIGTERM);
    child_->wait(5000ms);
    child_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  uint16_t port() const { return http_port_; }
  std::string manifest_path() const { return dir_ + "/cluster.toml"; }
  std::string log() const { return child_->log(); }
  bool running() { return child_->running(); }

 private:
  std::string dir_;
  uint16_t http_port_;
  std::unique_ptr<Child> child_;
};

std::string chat(int max_tokens, bool stream) {
  return R"({"model":"stories15M","messages":[{"role":"user","content":"Once upon a time"}],)"
         R"("max_tokens":)" + std::to_string(max_tokens) +
         (stream ? R"(,"stream":true})" : "}");
}

// A completion over fixed token ids (greedy): the sim device then runs it to max_tokens.
std::string completion(int max_tokens) {
  return R"({"model":"stories15M","prompt":[100,200,300,400,500,600,700,800],"temperature":0,)"
         R"("stream":true,"max_tokens":)" + std::to_string(max_tokens) + "}";
}

std::string anthropic(int max_tokens) {
  return R"({"model":"stories15M","max_tokens":)" + std::to_string(max_tokens) +
         R"(,"messages":[{"role":"user","content":"Once upon a time"}]})";
}

bool is_healthy(uint16_t port) { return http::get(port, "/health", 1000ms).status == 200; }

// Instance `instance`'s gauge `name` from the node's /metrics; the test fails (REQUIRE) when
// that does not answer, so a dead node never reads as 0.
double gauge(uint16_t port, const std::string& name, const std::string& instance = "gateway") {
  return required_metric(port, "local", name, "instance=\"" + instance + "\"");
}

// Waits until the gauge `name` of `instance` equals `value`.
bool gauge_becomes(uint16_t port, const std::string& name, double value,
                   std::chrono::milliseconds timeout, const std::string& instance = "gateway") {
  return eventually(timeout, [&] { return gauge(port, name, instance) == value; });
}

// A streaming request sent without reading its answer yet (it may wait in the queue).
struct Pending {
  http::Connection conn;
  bool sent = false;
  Pending(uint16_t port, const std::string& body, const std::string& path = "/v1/completions") {
    sent = conn.connect_to(port) && conn.send_all(http::request_text("POST", path, body));
  }
  // Reads the whole response; returns status and body.
  http::Response finish(std::chrono::milliseconds timeout) {
    http::Response r;
    auto deadline = http::Clock::now() + timeout;
    if (!conn.read_head(&r, deadline)) {
      r.error = conn.error();
      return r;
    }
    while (conn.read_body_some(&r.body, deadline)) {
    }
    if (!conn.body_done()) r.error = conn.error();
    return r;
  }
};

std::string error_message(const http::Response& r) {
  json body = json::parse(r.body, nullptr, false);
  if (!body.is_object() || !body.contains("error") || !body["error"].is_object()) return "";
  return body["error"].value("message", "");
}

}  // namespace

TEST_CASE("gateway_ops: a decode executor without a device makes /health 503 with the reason") {
  // kv_scale 2 is outside the sim device's [1/128, 1]: both executors fail to create it.
  SimNode node("gwops-broken", "time_factor = 0\nkv_scale = 2", "");
  // Polled from the node's first answer on, as fast as it answers: no decode instance is ever
  // ready, so no answer may be 200, not even one before the gateway actor first ran (that
  // 200 happened: agents' POSTs after it got "decode has not reported ready yet").
  http::Response health;
  std::vector<std::string> not_503;
  bool reported = eventually(60s, [&] {
    health = http::get(node.port(), "/health", 1000ms);
    if (health.ok() && health.status != 503) not_503.push_back(health.body);
    return health.ok() && health.body.find("executor failed") != std::string::npos;
  }, 1ms);
  INFO("node log:\n" << node.log());
  INFO("last /health: " << health.status << " " << health.body << " " << health.error);
  REQUIRE(reported);
  CHECK_MESSAGE(not_503.empty(), "answers other than 503: ", not_503.size(), ", first: ",
                not_503.empty() ? "" : not_503.front());
  CHECK(health.status == 503);
  json body = json::parse(health.body, nullptr, false);
  REQUIRE(body.is_object());
  CHECK(body.value("status", "") == "unavailable");
  std::string reason = body.value("reason", "");
  CHECK(reason.find("no decode instance is ready: decode@local executor failed: ") == 0);
  CHECK(reason.find("kv_scale") != std::string::npos);
  // A chat request is refused with the same reason in an OpenAI error body.
  auto chat_reply = http::post(node.port(), "/v1/chat/completions", chat(4, false), 10s);
  INFO("chat: " << chat_reply.body);
  CHECK(chat_reply.status == 503);
  CHECK(error_message(chat_reply).find("decode@local executor failed") != std::string::npos);
  CHECK(node.running());  // a failed executor does not take the node down
}

TEST_CASE("gateway_ops: admission queue, 429, disconnects and queue timeouts") {
  // time_factor 10: a decode step of the modelled Rebel100 takes ~8 ms, so a stream of
  // 30 tokens is in flight for a quarter of a second and one of 2000 tokens for ~16 s.
  std::string which;
  SUBCASE("C + Q streams succeed, C + Q + 1 gets 429 in both API shapes") { which = "429"; }
  SUBCASE("a waiting client that disconnects leaves the queue; a long wait gets 503") {
    which = "503";
  }
  REQUIRE(!which.empty());
  // The queue timeout: 3 s where it is what is checked, else long enough not to matter.
  const std::string queue_timeout_ms = which == "503" ? "3000" : "60000";
  SimNode node("gwops-admit", "time_factor = 10\nkv_scale = 0.0078125",
               "requests_max = " + std::to_string(kRunningMax) + "\nqueue_max = " +
                   std::to_string(kQueueMax) + "\nqueue_timeout_ms = " + queue_timeout_ms);
  bool healthy = eventually(60s, [&] { return is_healthy(node.port()); });
  INFO("node log:\n" << node.log());
  REQUIRE(healthy);

  if (which == "429") {
    // The C running streams are long (1500 tokens, ~12 s) so that the Q behind them are still
    // waiting when the refused requests arrive, however slow the machine; each state is
    // waited for, not assumed after a delay.
    std::vector<std::unique_ptr<Pending>> streams;
    for (uint32_t i = 0; i < kRunningMax; ++i) {
      streams.push_back(std::make_unique<Pending>(node.port(), completion(1500)));
      REQUIRE(streams.back()->sent);
    }
    REQUIRE(gauge_becomes(node.port(), "tandem:num_requests_running", kRunningMax, 20s));
    for (uint32_t i = 0; i < kQueueMax; ++i) {
      streams.push_back(std::make_unique<Pending>(node.port(), completion(40)));
      REQUIRE(streams.back()->sent);
    }
    REQUIRE(gauge_becomes(node.port(), "tandem:num_requests_waiting", kQueueMax, 20s));
    CHECK(gauge(node.port(), "tandem:num_requests_running") == kRunningMax);
    auto refused = http::post(node.port(), "/v1/chat/completions", chat(4, true), 10s);
    CHECK(refused.status == 429);
    CHECK(refused.headers.find("Retry-After: 1") != std::string::npos);
    json openai = json::parse(refused.body, nullptr, false);
    REQUIRE(openai.is_object());
    CHECK(openai["error"].value("type", "") == "rate_limit_error");
    CHECK(openai["error"].value("code", "") == "rate_limit_exceeded");
    CHECK(openai["error"].value("message", "").find("too many requests") == 0);
    auto refused_msg = http::post(node.port(), "/v1/messages", anthropic(4), 10s);
    CHECK(refused_msg.status == 429);
    CHECK(refused_msg.headers.find("Retry-After: 1") != std::string::npos);
    json claude = json::parse(refused_msg.body, nullptr, false);
    REQUIRE(claude.is_object());
    CHECK(claude.value("type", "") == "error");
    CHECK(claude["error"].value("type", "") == "rate_limit_error");
    for (auto& s : streams) {
      auto r = s->finish(90s);
      INFO(r.error << " " << r.body.substr(r.body.size() > 600 ? r.body.size() - 600 : 0));
      CHECK(r.status == 200);
      CHECK(r.body.find("data: [DONE]") != std::string::npos);
      CHECK(r.body.find("\"finish_reason\":\"length\"") != std::string::npos);
    }
    CHECK(gauge_becomes(node.port(), "tandem:num_requests_waiting", 0, 10s));
  } else {
    std::vector<std::unique_ptr<Pending>> running;
    for (uint32_t i = 0; i < kRunningMax; ++i) {
      running.push_back(std::make_unique<Pending>(node.port(), completion(2000)));
    }
    REQUIRE(gauge_becomes(node.port(), "tandem:num_requests_running", kRunningMax, 20s));
    {
      Pending waiting(node.port(), completion(4));
      REQUIRE(gauge_becomes(node.port(), "tandem:num_requests_waiting", 1, 20s));
    }  // closes its socket while queued
    CHECK(gauge_becomes(node.port(), "tandem:num_requests_waiting", 0, 10s));
    CHECK(gauge(node.port(), "tandem:num_requests_running") == kRunningMax);
    // Now one that stays: it is refused after queue_timeout_ms (3 s) with 503 + Retry-After.
    auto start = http::Clock::now();
    auto late = http::post(node.port(), "/v1/chat/completions", chat(4, false), 20s);
    auto waited = http::Clock::now() - start;
    CHECK(late.status == 503);
    CHECK(late.headers.find("Retry-After: 1") != std::string::npos);
    CHECK(error_message(late).find("queue_timeout_ms") != std::string::npos);
    CHECK(waited >= 2900ms);
    CHECK(gauge(node.port(), "tandem:num_requests_waiting") == 0);
    for (auto& r : running) r->conn.close();  // the long streams are cancelled
    CHECK(gauge_becomes(node.port(), "tandem:num_requests_running", 0, 10s));
  }
}

TEST_CASE("gateway_ops: a healthy sim cluster answers /health 200 and serves") {
  SimNode node("gwops-ok", "time_factor = 0\nkv_scale = 0.0078125", "");
  bool healthy = eventually(60s, [&] { return is_healthy(node.port()); });
  INFO("node log:\n" << node.log());
  REQUIRE(healthy);
  CHECK(http::get(node.port(), "/health").body == R"({"status":"ok"})");
  auto reply = http::post(node.port(), "/v1/chat/completions", chat(4, false), 20s);
  CHECK(reply.status == 200);
}

TEST_CASE("gateway_ops: the router skips a prefill instance whose executor has no device") {
  // The prefill executor asks for the rbln device with a compiled directory that does not
  // exist, so it has no device; decode runs on the sim device. P/D is forced
  // (disaggregate_tokens_min = 1), so a router that counted the broken prefill instance would
  // pick it.
  SimNode node("gwops-noprefill", "time_factor = 0\nkv_scale = 0.0078125", "",
               "[router]\ndisaggregate_tokens_min = 1\n[rbln]\nartifacts = \"/nonexistent/compiled\"",
               "rbln");
  bool healthy = eventually(60s, [&] { return is_healthy(node.port()); });
  INFO("node log:\n" << node.log());
  REQUIRE(healthy);  // a broken prefill instance does not make the gateway unhealthy
  for (int i = 0; i < 3; ++i) {
    std::string body = R"({"model":"stories15M","prompt":[)" + std::to_string(100 + i) +
                       R"(,200,300,400,500,600,700,800,900,1000,1100,1200,1300,1400,1500,)"
                       R"(1600,1700,1800,1900,2000],"temperature":0,"max_tokens":4})";
    auto reply = http::post(node.port(), "/v1/completions", body, 20s);
    INFO(reply.body);
    CHECK(reply.status == 200);
  }
  auto metrics = http::get(node.port(), "/metrics");
  REQUIRE_MESSAGE((metrics.ok() && metrics.status == 200), metrics.status, " ", metrics.error);
  CHECK(http::metric_sum(metrics.body, "tandem_router_picks_total", "kind=\"decode_only\"") == 3);
  CHECK(http::metric_sum(metrics.body, "tandem_router_picks_total", "kind=\"disaggregated\"") == 0);
  CHECK(node.log().find("router: local/prefill/prefill is not ready: executor failed") !=
        std::string::npos);
  // `tandem shell executors`: the prefill executor failed, why; the decode executor is ready and
  // has run the three requests' passes (in time, not in count: a pass holds several tokens).
  auto shown =
      run({tandem_bin(), "shell", "--manifest", node.manifest_path(), "-c", "executors"}, 30s);
  CHECK(shown.exit_code == 0);
  const std::string ep = table_row(shown.output, "local/ep"),
                    ed = table_row(shown.output, "local/ed");
  CHECK_MESSAGE(ep.find("rbln    0        failed ") != std::string::npos, shown.output);
  CHECK_MESSAGE(ep.find("executor ep: ") != std::string::npos, ep);
  CHECK_MESSAGE(ep.find("/nonexistent/compiled") != std::string::npos, ep);
  CHECK_MESSAGE(ed.find("sim     1        ready ") != std::string::npos, shown.output);
  CHECK_MESSAGE(ed.find("KV pool 1024 blocks x ") != std::string::npos, ed);
  CHECK(ed.find(" 0       0       0 ") == std::string::npos);  // it ran passes
}

TEST_CASE("gateway_ops: long prompts are prepared by their own preparers, with the same result") {
  // Bodies over 1 KiB go to the long-prompt preparers (threads of their own); shorter ones to
  // the preparer on the workers. Either way: the same token counts, generation, streaming and
  // errors.
  SimNode node("gwops-long", "time_factor = 0\nkv_scale = 0.0078125",
               "preparers = 1\nlong_prompt_preparers = 1\nlong_prompt_bytes = 1024");
  REQUIRE_MESSAGE(eventually(60s, [&] { return is_healthy(node.port()); }), node.log());
  auto prepared = [&](const char* pool) {
    std::string metrics = http::get(node.port(), "/metrics").body;
    std::string key = "tandem:gateway_requests_prepared_total{instance=\"gateway\",pool=\"" +
                      std::string(pool) + "\"} ";
    size_t at = metrics.find(key);
    return at == std::string::npos ? -1.0 : std::stod(metrics.substr(at + key.size()));
  };
  double workers0 = prepared("workers"), threads0 = prepared("threads");
  CHECK(workers0 >= 0);
  CHECK(threads0 == 0);
  std::string words;
  for (int i = 0; i < 400; ++i) words += "the little dog ran ";
  auto messages = [](const std::string& text) {
    return json{{"model", "stories15M"},
                {"max_tokens", 3},
                {"messages", json::array({{{"role", "user"}, {"content", text}}})}};
  };
  for (const std::string& text : {std::string("Once upon a time"), words}) {
    json body = messages(text);
    CAPTURE(body.dump().size());
    auto counted = http::post(node.port(), "/v1/messages/count_tokens", body.dump(), 20s);
    REQUIRE(counted.status == 200);
    int64_t count = json::parse(counted.body)["input_tokens"].get<int64_t>();
    auto answer = http::post(node.port(), "/v1/messages", body.dump(), 20s);
    REQUIRE_MESSAGE(answer.status == 200, answer.body);
    json a = json::parse(answer.body);
    CHECK(a["usage"]["input_tokens"].get<int64_t>() == count);
    CHECK(a["usage"]["output_tokens"].get<int64_t>() == 3);
    body["stream"] = true;
    auto streamed = http::post(node.port(), "/v1/messages", body.dump(), 20s);
    CHECK(streamed.status == 200);
    CHECK(streamed.body.find("event: message_stop") != std::string::npos);
  }
  CHECK(words.size() > 1024);
  CHECK(prepared("workers") == workers0 + 3);  // the short text's count, answer, stream
  CHECK(prepared("threads") == threads0 + 3);  // the long one's
  // A malformed long body is answered by its preparer with the API's error.
  auto bad = http::post(node.port(), "/v1/messages", "{\"model\":\"stories15M\",\"x\":\"" + words,
                        20s);
  CHECK(bad.status == 400);
  CHECK(bad.body.find("invalid_request_error") != std::string::npos);
  CHECK(prepared("threads") == threads0 + 4);
  CHECK(node.running());
}

TEST_CASE("gateway_ops: overload is refused before the stream starts, with Retry-After") {
  // Decode holds 1 sequence + 1 waiting; the gateway's requests_max stays 1024, so its
  // running limit must come from decode (2), with 2 more waiting at the gateway.
  SimNode node("gwops-over", "time_factor = 10\nkv_scale = 0.0078125",
               "queue_max = 2\nqueue_timeout_ms = 60000",
               "[decode]\nseqs_max = 1\nwaiting_max = 1\n");
  REQUIRE_MESSAGE(eventually(60s, [&] { return is_healthy(node.port()); }), node.log());
  constexpr int kEach = 6;  // streaming and non-streaming: 12 requests for 4 places
  // Each request holds decode ~1.6 s (200 tokens): all 12 arrive while the 4 places are
  // taken, however slowly they are sent.
  constexpr int kTokens = 200;
  std::vector<std::unique_ptr<Pending>> streams, wholes;
  for (int i = 0; i < kEach; ++i) {
    streams.push_back(std::make_unique<Pending>(node.port(), completion(kTokens)));
    wholes.push_back(
        std::make_unique<Pending>(node.port(), chat(kTokens, false), "/v1/chat/completions"));
    REQUIRE(streams.back()->sent);
    REQUIRE(wholes.back()->sent);
  }
  int served = 0, refused = 0;
  auto check = [&](Pending& p, bool stream) {
    http::Response r = p.finish(120s);
    INFO("stream " << stream << ": " << r.status << " " << r.error << "\n" << r.headers << "\n"
                   << r.body.substr(0, 600));
    CHECK(r.error.empty());
    CHECK(r.body.find("waiting queue full") == std::string::npos);
    if (r.status == 200) {
      ++served;
      if (stream) {
        CHECK(r.body.find("\"error\"") == std::string::npos);
        CHECK(r.body.find("\"finish_reason\":\"length\"") != std::string::npos);
        CHECK(r.body.rfind("data: [DONE]") != std::string::npos);
      } else {
        json body = json::parse(r.body, nullptr, false);
        REQUIRE(body.is_object());
        CHECK(body["choices"][0].value("finish_reason", "") == "length");
        CHECK(body["usage"].value("completion_tokens", 0) == kTokens);
      }
    } else {
      ++refused;
      CHECK((r.status == 429 || r.status == 503));
      CHECK(r.headers.find("Retry-After: 1") != std::string::npos);
      CHECK(r.headers.find("text/event-stream") == std::string::npos);  // no stream began
      json body = json::parse(r.body, nullptr, false);
      REQUIRE(body.is_object());
      CHECK(body["error"].value("type", "") != "");
    }
  };
  for (int i = 0; i < kEach; ++i) {
    check(*streams[i], true);
    check(*wholes[i], false);
  }
  CHECK(served >= 4);   // 2 running + 2 waiting fit
  CHECK(refused >= 1);  // and the rest did not
  CHECK(served + refused == 2 * kEach);
  CHECK(node.running());
}

// A completion of `max_tokens` over a prompt of `count` token ids from `first` on (each
// prompt its own ids: no prefix shared in the KV cache).
std::string long_completion(int first, int count, int max_tokens, bool stream) {
  json body = {{"model", "stories15M"}, {"temperature", 0}, {"max_tokens", max_tokens},
               {"stream", stream}};
  json ids = json::array();
  for (int i = 0; i < count; ++i) ids.push_back(first + i);
  body["prompt"] = ids;
  return body.dump();
}

TEST_CASE("gateway_ops: decode refusing a request the gateway admitted (its waiting queue "
          "full) is a 429 with Retry-After before any byte of the stream; the node serves on") {
  // The gateway admits up to seqs_max + waiting_max = 3 requests for the one decode instance.
  // Decode's KV pool (128 blocks of 16 tokens: one full context, the least allowed) holds one
  // prompt of 1900 tokens: while request A runs (140 tokens, ~5 s at time_factor 40), B, as
  // long, waits at decode for blocks, and C, which the gateway admits (3 fit), is refused by
  // decode: "waiting queue full". The gateway answers it 429, as it answers its own refusals.
  SimNode node("gwops-late", "time_factor = 40\nkv_scale = 0.0078125", "queue_timeout_ms = 60000",
               "[decode]\nseqs_max = 2\nwaiting_max = 1\n", "sim", false, 128);
  REQUIRE_MESSAGE(eventually(60s, [&] { return is_healthy(node.port()); }), node.log());
  INFO("node log:\n" << node.log());
  Pending a(node.port(), long_completion(1000, 1900, 140, true));
  REQUIRE(a.sent);
  REQUIRE(gauge_becomes(node.port(), "tandem:num_requests_running", 1, 30s, "decode"));
  Pending b(node.port(), long_completion(5000, 1900, 8, false));
  REQUIRE(b.sent);
  REQUIRE(gauge_becomes(node.port(), "tandem:num_requests_waiting", 1, 30s, "decode"));
  CHECK(gauge(node.port(), "tandem:num_requests_running", "decode") == 1);
  // C, streaming and not: each admitted by the gateway (2 of its 3 places are taken), refused
  // by decode, and answered before the stream starts.
  for (bool stream : {true, false}) {
    CAPTURE(stream);
    auto c = http::post(node.port(), "/v1/completions", long_completion(9000, 8, 4, stream),
                        30s);
    INFO(c.status << " " << c.error << "\n" << c.headers << "\n" << c.body);
    CHECK(c.status == 429);
    CHECK(c.headers.find("Retry-After: 1") != std::string::npos);
    CHECK(c.headers.find("text/event-stream") == std::string::npos);
    json e = json::parse(c.body, nullptr, false);
    REQUIRE(e.is_object());
    REQUIRE(e.contains("error"));
    CHECK(e["error"].value("type", "") == "rate_limit_error");
    CHECK(e["error"].value("code", "") == "rate_limit_exceeded");
    const std::string message = e["error"].value("message", "");
    CHECK(message.find("no decode instance can take it now (") == 0);
    CHECK(message.find("waiting queue full (1)") != std::string::npos);
    CHECK(message.find("retry later") != std::string::npos);
  }
  // B was still waiting at decode all along (so C met a full queue, not a finished A).
  CHECK(gauge(node.port(), "tandem:num_requests_waiting", "decode") == 1);
  // A and B are served whole, and so is a request after them: the node serves on.
  http::Response ra = a.finish(120s), rb = b.finish(120s);
  CHECK_MESSAGE(ra.status == 200, ra.error, " ", ra.body.substr(0, 400));
  CHECK(ra.body.find("\"finish_reason\":\"length\"") != std::string::npos);
  CHECK(ra.body.rfind("data: [DONE]") != std::string::npos);
  CHECK_MESSAGE(rb.status == 200, rb.error, " ", rb.body.substr(0, 400));
  json whole = json::parse(rb.body, nullptr, false);
  REQUIRE(whole.is_object());
  CHECK(whole["usage"].value("completion_tokens", 0) == 8);
  auto after = http::post(node.port(), "/v1/completions", long_completion(9000, 8, 4, false), 30s);
  CHECK_MESSAGE(after.status == 200, after.body);
  CHECK(gauge_becomes(node.port(), "tandem:num_requests_running", 0, 10s));
  CHECK(node.running());
}

TEST_CASE("gateway_ops: a prompt of megabytes gets the context-length 400") {
  SimNode node("gwops-huge", "time_factor = 0\nkv_scale = 0.0078125", "");
  REQUIRE_MESSAGE(eventually(60s, [&] { return is_healthy(node.port()); }), node.log());
  std::string text;
  for (int i = 0; text.size() < (6u << 20); ++i) {
    text += "Once upon a time there was a little cat number " + std::to_string(i) + ".\n";
  }
  json chat_body = {{"model", "stories15M"},
                    {"max_tokens", 16},
                    {"messages", json::array({{{"role", "user"}, {"content", text}}})}};
  json completion_body = {{"model", "stories15M"}, {"prompt", text}};
  for (const auto& one :
       {std::pair{std::string("/v1/chat/completions"), chat_body},
        std::pair{std::string("/v1/completions"), completion_body},
        std::pair{std::string("/v1/messages"), chat_body}}) {
    // Not a structured binding: clang 14 cannot capture one in doctest's macro lambdas.
    const std::string& path = one.first;
    const json& body = one.second;
    CAPTURE(path);
    auto reply = http::post(node.port(), path, body.dump(), 120s);
    INFO(reply.error << " " << reply.body);
    CHECK(reply.status == 400);
    json e = json::parse(reply.body, nullptr, false);
    REQUIRE(e.is_object());
    std::string message = e["error"].value("message", "");
    CHECK(message.find("maximum context length is 2048 tokens") != std::string::npos);
    CHECK(message.find("more than") != std::string::npos);  // tokenizing stopped early
    if (path != "/v1/messages") {
      CHECK(e["error"].value("code", "") == "context_length_exceeded");
      CHECK(e["error"].value("param", "") == "max_tokens");
    } else {
      CHECK(e.value("type", "") == "error");
      CHECK(e["error"].value("type", "") == "invalid_request_error");
    }
  }
  // The same text within the budget is still counted in full.
  auto counted = http::post(node.port(), "/v1/messages/count_tokens",
                            json{{"model", "stories15M"},
                                 {"messages", json::array({{{"role", "user"},
                                                            {"content", text.substr(0, 4000)}}})}}
                                .dump(),
                            20s);
  CHECK(counted.status == 200);
  CHECK(node.running());
}

TEST_CASE(
    "gateway_ops: SIGTERM ends every open stream with its API's error event once the "
    "drain's deadline has passed") {
  // The node drains first (docs/operations.md): streams that do not end within
  // drain_timeout_ms are then ended with their API's error event, never cut.
  SimNode node("gwops-term", "time_factor = 10\nkv_scale = 0.0078125", "",
               "[supervisor]\ndrain_timeout_ms = 300");
  REQUIRE_MESSAGE(eventually(60s, [&] { return is_healthy(node.port()); }), node.log());
  const std::string chat_body =
      R"({"model":"stories15M","messages":[{"role":"user","content":"Once upon a time"}],)"
      R"("max_tokens":1500,"stream":true})";
  const std::string responses_body =
      R"({"model":"stories15M","input":"Once upon a time","max_output_tokens":1500,)"
      R"("stream":true})";
  const std::string messages_body =
      R"({"model":"stories15M","max_tokens":1500,"stream":true,)"
      R"("messages":[{"role":"user","content":"Once upon a time"}]})";
  Pending chat_stream(node.port(), chat_body, "/v1/chat/completions");
  Pending responses_stream(node.port(), responses_body, "/v1/responses");
  Pending messages_stream(node.port(), messages_body, "/v1/messages");
  std::vector<std::pair<Pending*, http::Response>> open = {
      {&chat_stream, {}}, {&responses_stream, {}}, {&messages_stream, {}}};
  auto deadline = http::Clock::now() + 30s;
  for (auto& [p, r] : open) {
    REQUIRE(p->sent);
    REQUIRE(p->conn.read_head(&r, deadline));
    REQUIRE(r.status == 200);
    REQUIRE(p->conn.read_body_some(&r.body, deadline));  // the stream is under way
  }
  node.terminate();
  for (auto& one : open) {
    auto& p = one.first;  // clang 14: no structured binding in doctest's INFO lambda
    auto& r = one.second;
    while (p->conn.read_body_some(&r.body, deadline)) {
    }
    INFO(r.body.substr(r.body.size() > 800 ? r.body.size() - 800 : 0) << " " << p->conn.error());
    CHECK(p->conn.body_done());  // the chunked terminator arrived: not cut
    CHECK(r.body.find("shutting down") != std::string::npos);
  }
  const std::string& c = open[0].second.body;
  CHECK(c.find("data: {\"error\":") != std::string::npos);
  CHECK(c.size() >= 16);
  CHECK(c.substr(c.size() - 14) == "data: [DONE]\n\n");
  const std::string& resp = open[1].second.body;
  CHECK(resp.find("event: error\n") != std::string::npos);
  CHECK(resp.find("response.completed") == std::string::npos);
  const std::string& m = open[2].second.body;
  CHECK(m.find("event: error\n") != std::string::npos);
  CHECK(m.find("\"type\":\"overloaded_error\"") != std::string::npos);
  CHECK(m.find("message_stop") == std::string::npos);
}

TEST_CASE("gateway_ops: a crashed gateway actor ends its open streams with an error event") {
  SimNode node("gwops-crash", "time_factor = 10\nkv_scale = 0.0078125", "", "", "sim", true);
  REQUIRE_MESSAGE(eventually(60s, [&] { return is_healthy(node.port()); }), node.log());
  Pending stream(node.port(),
                 R"({"model":"stories15M","messages":[{"role":"user","content":"Once"}],)"
                 R"("max_tokens":1500,"stream":true})",
                 "/v1/chat/completions");
  http::Response r;
  auto deadline = http::Clock::now() + 30s;
  REQUIRE(stream.sent);
  REQUIRE(stream.conn.read_head(&r, deadline));
  REQUIRE(r.status == 200);
  REQUIRE(stream.conn.read_body_some(&r.body, deadline));
  RunResult shell = run({tandem_bin(), "shell", "--manifest", node.manifest_path(), "-c",
                         "debug-crash local local/gateway/gateway"},
                        20000ms);
  REQUIRE_MESSAGE(shell.exit_code == 0, shell.output);
  while (stream.conn.read_body_some(&r.body, deadline)) {
  }
  INFO(r.body.substr(r.body.size() > 800 ? r.body.size() - 800 : 0) << " " << stream.conn.error());
  CHECK(stream.conn.body_done());
  CHECK(r.body.find("data: {\"error\":") != std::string::npos);
  CHECK(r.body.find("the gateway actor stopped") != std::string::npos);
  CHECK(r.body.size() >= 14);
  CHECK(r.body.substr(r.body.size() - 14) == "data: [DONE]\n\n");
  CHECK(node.running());
}
