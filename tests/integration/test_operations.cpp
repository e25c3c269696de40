// Operating a cluster (issue 16) with real `tandem node` processes on loopback serving
// stories15M on the cpu device: drain and undrain from the admin shell under steady load,
// a rolling restart by SIGTERM under load, and `tandem up` restarting a node killed with -9.
// The load is `tandem bench serve` (the bench client), whose JSON result counts failures.
#include <doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/support/http_client.hpp"
#include "tests/support/process.hpp"
#include "tests/support/serve_cluster.hpp"
#include "tests/support/tandem_node.hpp"

using namespace tandem::testing;
using namespace std::chrono_literals;
using json = nlohmann::json;
namespace http = tandem::testing::http;

namespace {

// `tandem bench serve` against the cluster for `duration_s`, in the background; result() waits
// for it and reads its JSON.
class BenchLoad {
 public:
  BenchLoad(const ServeCluster& c, int concurrency, int duration_s, int retries)
      : json_path_(c.dir() + "/bench.json"), log_path_(c.dir() + "/bench.log") {
    child_ = std::make_unique<Child>(
        std::vector<std::string>{tandem_bin(),
                                 "bench",
                                 "serve",
                                 "--target",
                                 "127.0.0.1:" + std::to_string(c.http_port()),
                                 "--model",
                                 "stories15M",
                                 "--workload",
                                 "random",
                                 "--vocab",
                                 "32000",
                                 "--input-tokens",
                                 "24",
                                 "--output-tokens",
                                 "24",
                                 "--requests",
                                 "100000",
                                 "--concurrency",
                                 std::to_string(concurrency),
                                 "--duration",
                                 std::to_string(duration_s),
                                 "--timeout",
                                 "60",
                                 "--retries",
                                 std::to_string(retries),
                                 "--json",
                                 json_path_,
                                 "--no-progress"},
        log_path_);
  }
  json result() {
    int status = child_->wait(180s);
    REQUIRE_MESSAGE(status >= 0, "bench serve did not end: ", read_file(log_path_));
    REQUIRE_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), read_file(log_path_));
    json j = json::parse(read_file(json_path_), nullptr, false);
    REQUIRE_MESSAGE(!j.is_discarded(), read_file(log_path_));
    return j;
  }
  std::string log() const { return read_file(log_path_); }

 private:
  std::string json_path_, log_path_;
  std::unique_ptr<Child> child_;
};

// The picks the front node's router made of `target` ("node/role/instance").
double picks(ServeCluster& c, const std::string& target) {
  return c.metric("front", "tandem_router_instance_picks_total", "target=\"" + target + "\"");
}

}  // namespace

TEST_CASE(
    "operations: drain under steady load fails no request, empties the instance, and "
    "undrain brings it back into picks" *
    doctest::timeout(300)) {
  ServeCluster c(Layout::two_decode, 100000);  // decode-only picks over two decode instances
  REQUIRE_MESSAGE(c.wait_ready(60000ms), c.logs());
  const std::string target = "decode/decode/decode";
  BenchLoad load(c, 4, 16, 0);  // no retries: nothing may be refused
  REQUIRE(eventually(10000ms, [&] { return picks(c, target) > 0; }));

  RunResult drained = c.shell("drain decode 60");
  INFO(drained.output);
  INFO(c.logs());
  CHECK(drained.exit_code == 0);
  CHECK(drained.output.find("drained every prefill and decode instance on node decode: empty "
                            "after") != std::string::npos);
  RunResult listed = c.shell("instances decode");
  CHECK(listed.output.find("draining") != std::string::npos);
  // The one-screen status shows it, as text and as JSON for scripts.
  RunResult status = c.shell("status");
  CHECK(status.output.find("cluster serve-it: 4/4 nodes up") != std::string::npos);
  CHECK(status.output.find("draining") != std::string::npos);
  RunResult status_json = run(
      {tandem_bin(), "shell", "--manifest", c.manifest_path(), "--json", "-c", "status"}, 30000ms);
  json sj = json::parse(status_json.output, nullptr, false);
  REQUIRE_MESSAGE(!sj.is_discarded(), status_json.output);
  CHECK(sj["nodes_up"] == 4);
  bool seen_draining = false;
  for (const auto& inst : sj["instances"]) {
    if (inst["name"] == target) seen_draining = inst["state"] == "draining";
  }
  CHECK(seen_draining);
  REQUIRE(sj["gateways"].size() == 1);
  CHECK(sj["gateways"][0]["first_tokens_1m"].get<double>() > 0);
  CHECK(sj["gateways"][0]["ttft_p50_s"].is_number());
  CHECK(c.metric("front", "tandem_router_instance_eligible", "target=\"" + target + "\"") == 0);
  CHECK(c.metric("decode", "tandem:num_requests_running") == 0);
  // While drained, the router sends it nothing; the other decode instance takes the load.
  double before = picks(c, target);
  double other_before = picks(c, "decode2/decode/decode2");
  std::this_thread::sleep_for(2000ms);
  CHECK(picks(c, target) == before);
  CHECK(picks(c, "decode2/decode/decode2") > other_before);

  RunResult undrained = c.shell("undrain decode");
  CHECK_MESSAGE(undrained.exit_code == 0, undrained.output);
  CHECK(undrained.output.find("serving") != std::string::npos);
  CHECK(eventually(10000ms, [&] { return picks(c, target) > before; }));

  json r = load.result();
  INFO(load.log());
  CHECK(r["summary"]["failed_count"] == 0);
  CHECK(r["summary"]["succeeded_count"].get<int>() >= 8);

  // Bad targets are named.
  RunResult bad = c.shell("drain nosuch");
  CHECK(bad.exit_code != 0);
  CHECK(bad.output.find("no node and no prefill or decode instance is named 'nosuch'") !=
        std::string::npos);
  RunResult bad_deadline = c.shell("drain decode soon");
  CHECK(bad_deadline.exit_code != 0);
  CHECK(bad_deadline.output.find("DEADLINE_S must be a number of seconds") != std::string::npos);
}

TEST_CASE(
    "operations: a drain that cannot empty in time says what still runs; requests lists "
    "a stream and cancel ends it" *
    doctest::timeout(180)) {
  // The sim device, slowed (time_factor 50: ~80 ms per token), so one stream outlasts the
  // drain's deadline and the shell's round trips.
  ServeCluster c(Layout::loopback3, 100000, 0, "", "", "", false, true,
                 "time_factor = 50\noutput_tokens_mean = 100000\noutput_tokens_max = 100000\n"
                 "output_tokens_sigma = 0\n");
  REQUIRE_MESSAGE(c.wait_ready(60000ms), c.logs());
  std::string streamed, stream_error;
  std::thread streaming([&] {
    http::SseStream s(c.http_port(), "/v1/completions",
                      completion_body("Once upon a time", 200, true).dump(), 60000ms);
    while (auto event = s.next(60000ms)) {
      if (*event == "[DONE]") break;
      if (event->find("\"error\"") != std::string::npos) stream_error = *event;
      streamed += *event;
    }
  });
  REQUIRE(
      eventually(10000ms, [&] { return c.metric("decode", "tandem:num_requests_running") > 0; }));
  RunResult r = c.shell("drain decode/decode/decode 0.3");
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("deadline (0 s) reached; still held") != std::string::npos);
  CHECK(r.output.find("decode/decode/decode: 0 waiting, 1 running") != std::string::npos);
  // Every decode instance is draining: a new request is refused with a retryable answer.
  auto refused = http::post(c.http_port(), "/v1/completions",
                            completion_body("Hello", 4, false).dump(), 10000ms);
  CHECK(refused.status == 429);
  CHECK(refused.body.find("draining") != std::string::npos);
  CHECK(c.shell("undrain decode").exit_code == 0);

  // requests lists the stream with its tokens so far; cancel ends it with an error event.
  std::string id;
  CHECK(eventually(20000ms, [&] {
    RunResult listed =
        run({tandem_bin(), "shell", "--manifest", c.manifest_path(), "--json", "-c", "requests"},
            30000ms);
    json j = json::parse(listed.output, nullptr, false);
    if (j.is_discarded() || !j.contains("rows")) return false;
    for (const auto& row : j["rows"]) {
      if (row["state"] == "decoding" && std::stoi(row["tokens"].get<std::string>()) > 0) {
        id = row["id"];
        CHECK(row["decode"] == "decode/decode/decode");
        return true;
      }
    }
    return false;
  }));
  RunResult on_decode = c.shell("requests decode");
  CHECK(on_decode.output.find(id) != std::string::npos);
  CHECK(c.shell("requests prefill").output.find("no request in flight on prefill") !=
        std::string::npos);
  RunResult cancelled = c.shell("cancel " + id);
  CHECK_MESSAGE(cancelled.exit_code == 0, cancelled.output);
  CHECK(cancelled.output.find("request " + id + " cancelled") != std::string::npos);
  streaming.join();
  CHECK(stream_error.find("cancelled by the cluster's operator") != std::string::npos);
  RunResult again = c.shell("cancel " + id);
  CHECK(again.exit_code != 0);
  CHECK(again.output.find("no request " + id) != std::string::npos);
  CHECK(c.shell("cancel x1").output.find("is not a request id") != std::string::npos);
  CHECK(eventually(10000ms, [&] { return complete(c.http_port(), "Hello", 4).error.empty(); }));
}

TEST_CASE(
    "operations: a rolling restart of every node of loopback-3 by SIGTERM under load "
    "fails no request" *
    doctest::timeout(600)) {
  ServeCluster c(Layout::loopback3, 1);
  REQUIRE_MESSAGE(c.wait_ready(60000ms), c.logs());
  // Retries as the official SDKs do: a request refused before it started (the front node's
  // gateway draining or restarting, no decode instance for a moment) is sent again.
  BenchLoad load(c, 3, 45, 30);
  std::this_thread::sleep_for(3000ms);
  for (const std::string node : {"prefill", "decode", "front"}) {
    INFO("restarting ", node);
    c.node(node).signal(SIGTERM);
    int status = c.node(node).wait(40000ms);
    REQUIRE_MESSAGE(status >= 0, c.logs());
    CHECK_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), c.logs());
    CHECK(c.node(node).log().find("drained in") != std::string::npos);
    c.restart(node);
    REQUIRE_MESSAGE(c.wait_ready(60000ms), c.logs());
    std::this_thread::sleep_for(2000ms);
  }
  json r = load.result();
  INFO(load.log());
  INFO(c.logs());
  CHECK(r["summary"]["failed_count"] == 0);
  CHECK(r["summary"]["succeeded_count"].get<int>() >= 10);
  MESSAGE("rolling restart: ", r["summary"]["succeeded_count"], " requests, retries ",
          r["retries"].dump());
}

TEST_CASE("operations: tandem up restarts a node killed with -9; the others never stop" *
          doctest::timeout(300)) {
  ServeCluster c(Layout::loopback3, 1, 0, "", "", "", false, /*start_nodes=*/false);
  std::string log_path = c.dir() + "/up.log";
  Child up({tandem_bin(), "up", c.manifest_path(), "--restarts", "3"}, log_path);
  REQUIRE_MESSAGE(c.wait_ready(60000ms), read_file(log_path));
  auto pid_of = [&](const std::string& node) {
    std::string cmd = "pgrep -f -- '" + c.manifest_path() + " --node " + node + "$'";
    FILE* p = popen(cmd.c_str(), "r");
    char buf[64] = {};
    std::string out = p && fgets(buf, sizeof buf, p) ? buf : "";
    if (p) pclose(p);
    return std::atoi(out.c_str());
  };
  int front = pid_of("front"), prefill = pid_of("prefill"), decode = pid_of("decode");
  REQUIRE(front > 0);
  REQUIRE(prefill > 0);
  REQUIRE(decode > 0);
  REQUIRE(kill(decode, SIGKILL) == 0);
  CHECK(eventually(20000ms, [&] {
    return read_file(log_path).find("node 'decode' restarted (pid ") != std::string::npos;
  }));
  INFO(read_file(log_path));
  CHECK(read_file(log_path).find("node 'decode' was killed by signal 9; restarting it in") !=
        std::string::npos);
  CHECK(eventually(60000ms,
                   [&] { return http_get_status(c.admin_port("decode"), "/health") == 200; }));
  CHECK(c.wait_ready(60000ms));
  CHECK(pid_of("decode") != decode);
  CHECK(pid_of("decode") > 0);
  CHECK(pid_of("front") == front);  // never stopped
  CHECK(pid_of("prefill") == prefill);
  up.signal(SIGTERM);
  int status = up.wait(60000ms);
  CHECK(status >= 0);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK(read_file(log_path).find("drained in") != std::string::npos);
}

TEST_CASE(
    "operations: router set changes picks on the live router; bad keys and values are "
    "refused naming the key and the allowed range" *
    doctest::timeout(300)) {
  ServeCluster c(Layout::two_decode, 100000);
  REQUIRE_MESSAGE(c.wait_ready(60000ms), c.logs());
  const std::string a = "decode/decode/decode", b = "decode2/decode/decode2";
  auto picks_of = [&] { return std::pair{picks(c, a), picks(c, b)}; };
  // Several KV blocks (16 tokens each) long, so the prefix index has something to match.
  const std::string prompt =
      "The little dog ran to the park and found a red ball under the big tree. He picked it up "
      "and ran back home to show his friend the cat, who was sleeping in the warm sun by the "
      "window. The cat opened one eye and";
  // prefix-aware: the same prompt, one at a time (a heartbeat apart, so the bounded load sees
  // the instance idle again), stays where its prefix is.
  auto before = picks_of();
  for (int i = 0; i < 6; ++i) {
    REQUIRE(complete(c.http_port(), prompt, 2).error.empty());
    std::this_thread::sleep_for(300ms);
  }
  auto affine = picks_of();
  double to_a = affine.first - before.first, to_b = affine.second - before.second;
  CHECK(to_a + to_b == 6);
  CHECK(std::max(to_a, to_b) >= 5);

  RunResult shown = c.shell("router show");
  CHECK_MESSAGE(shown.exit_code == 0, shown.output);
  CHECK(shown.output.find("policy = \"prefix-aware\"") != std::string::npos);
  RunResult set = c.shell("router set policy round-robin");
  INFO(set.output);
  CHECK(set.exit_code == 0);
  CHECK(set.output.find("front/router/router: policy = \"round-robin\" (was \"prefix-aware\")") !=
        std::string::npos);
  CHECK(set.output.find("the manifest is unchanged") != std::string::npos);
  for (int i = 0; i < 6; ++i) {
    REQUIRE(complete(c.http_port(), prompt, 2).error.empty());
  }
  auto spread = picks_of();
  CHECK(spread.first - affine.first == 3);
  CHECK(spread.second - affine.second == 3);
  CHECK(c.shell("router show").output.find("policy = \"round-robin\"") != std::string::npos);

  RunResult bad_value = c.shell("router set weight_queue -2");
  CHECK(bad_value.exit_code != 0);
  CHECK(bad_value.output.find("router.weight_queue") != std::string::npos);
  CHECK(bad_value.output.find("out of range 0..") != std::string::npos);  // the range
  RunResult bad_key = c.shell("router set weight_magic 1");
  CHECK(bad_key.exit_code != 0);
  CHECK(bad_key.output.find("router.weight_magic is not a router setting") != std::string::npos);
  RunResult fixed = c.shell("router set kv_index precise");
  CHECK_MESSAGE(fixed.exit_code != 0, fixed.output);
  CHECK_MESSAGE(fixed.output.find("fixed when a router starts") != std::string::npos, fixed.output);
  CHECK(c.shell("router show").output.find("weight_queue = 1.0") != std::string::npos);
}
