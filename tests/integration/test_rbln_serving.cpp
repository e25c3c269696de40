// device = "rbln" served end to end (issue 15): real `tandem node` processes whose executors load
// the RBLN runtime's conformance fake (tests/rbln_fake/; its graphs computed by the cpu
// transformer) and a compiled-model directory written for it. Greedy text equals the one-node
// cluster on device = "cpu" for 20 prompts, on one node and on loopback-3 with P/D (KV pulled by
// RMA out of the rbln executor's pool); a graph run that never completes ends its requests with
// errors, leaves the node serving /health and /metrics, and marks the instance not ready for
// good (its device is lost).
#include <doctest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "devices/rbln/rbln_compile.hpp"
#include "tests/support/fake_rbln_artifact.hpp"
#include "tests/support/http_client.hpp"
#include "tests/support/metric_check.hpp"
#include "tests/support/process.hpp"
#include "tests/support/serve_cluster.hpp"

using namespace tandem::testing;
using namespace std::chrono_literals;
namespace http = tandem::testing::http;

namespace {

constexpr int kTokens = 24;

std::string fake_lib() {
  const char* v = std::getenv("RBLN_FAKE_LIB");
  REQUIRE_MESSAGE(v != nullptr, "RBLN_FAKE_LIB is not set (meson sets it)");
  return v;
}

// A fresh fake compiled directory of stories15M for executors of kv_blocks 512 (+ the dummy),
// with `shape` applied (stages, ranks, verify graphs, fault switches).
std::string fake_compiled(const std::string& tag,
                          const std::function<void(FakeRblnArtifact&)>& shape = {}) {
  FakeRblnArtifact a;
  a.model_path = model_dir() + "/stories15M.bin";
  a.kv_blocks = 513;
  if (shape) shape(a);
  return write_fake_rbln_artifact(make_temp_dir("rbln-" + tag) + "/compiled", a);
}

// [rbln] for a fresh fake compiled directory (every executor's kv_blocks 512 + the dummy),
// and [decode] seqs_max within its largest bucket.
std::string rbln_toml(const std::string& tag, nlohmann::json extra = nlohmann::json::object()) {
  std::string dir = fake_compiled(tag, [&](FakeRblnArtifact& a) { a.extra = std::move(extra); });
  return "[rbln]\nlibrary = \"" + fake_lib() + "\"\nartifacts = \"" + dir +
         "\"\n[decode]\nseqs_max = 8\n";
}

// `tandem up` of `c`'s manifest (up to 3 restarts per node), its output in `log_path`. The
// record of device-lost restarts goes where a systemd unit's StateDirectory= would put it,
// c.dir()/state (not the shared /tmp/tandem-<uid>).
std::unique_ptr<Child> tandem_up(ServeCluster& c, const std::string& log_path) {
  const std::string state = c.dir() + "/state";
  ::setenv("STATE_DIRECTORY", state.c_str(), 1);
  auto up = std::make_unique<Child>(
      std::vector<std::string>{tandem_bin(), "up", c.manifest_path(), "--restarts", "3"}, log_path);
  ::unsetenv("STATE_DIRECTORY");
  return up;
}

// Decode pulled prefill's KV over the fabric, every pull succeeded, and nothing fell back to
// decode's own prefill.
void check_pd_pulled(ServeCluster& pd) {
  CHECK(pd.metric("decode", "tandem:kv_pulled_blocks_total") >= 1);
  CHECK(pd.metric("decode", "tandem:kv_pull_failures_total") == 0);
  CHECK(pd.metric("decode", "tandem:prefill_fallbacks_total") == 0);
}

std::vector<std::string> answers(ServeCluster& c) {
  std::vector<std::string> out;
  for (const std::string& p : story_prompts()) {
    Completion r = complete(c.http_port(), p, kTokens);
    REQUIRE_MESSAGE(r.error.empty(), p, ": ", r.error);
    out.push_back(r.text);
  }
  return out;
}

// The answers of a cluster on device cpu with the rbln clusters' [decode] seqs_max (fabric_toml
// may open further sections).
std::vector<std::string> cpu_answers(Layout layout, int disaggregate_tokens_min) {
  ServeCluster c(layout, disaggregate_tokens_min, 0, "[decode]\nseqs_max = 8\n");
  REQUIRE_MESSAGE(c.wait_ready(30000ms), c.logs());
  return answers(c);
}

// Each of `c`'s answers equals the cpu cluster's.
void check_same_text(ServeCluster& c, const std::vector<std::string>& cpu, const char* label) {
  std::vector<std::string> got = answers(c);
  REQUIRE(got.size() == cpu.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK_MESSAGE(got[i] == cpu[i], story_prompts()[i], "\n", label, ": [", got[i], "]\ncpu: [",
                  cpu[i], "]");
  }
}

}  // namespace

TEST_CASE(
    "rbln serving: greedy text equals device cpu's, one node and loopback-3 P/D, and P/D with the "
    "KV in device memory (staged through the host pool)" *
    doctest::timeout(600)) {
  const std::vector<std::string> cpu = cpu_answers(Layout::one_node, 32);
  {
    ServeCluster solo(Layout::one_node, 32, 0, "", "", "", false, true, "", rbln_toml("solo"));
    REQUIRE_MESSAGE(solo.wait_ready(60000ms), solo.logs());
    CHECK(solo.logs().find("rbln device") != std::string::npos);
    check_same_text(solo, cpu, "rbln");
  }
  {
    ServeCluster pd(Layout::loopback3, 1, 0, "", "", "", false, true, "", rbln_toml("pd"));
    REQUIRE_MESSAGE(pd.wait_ready(60000ms), pd.logs());
    double blocks0 = pd.metric("decode", "tandem:kv_pulled_blocks_total");
    check_same_text(pd, cpu, "rbln P/D");
    double blocks = pd.metric("decode", "tandem:kv_pulled_blocks_total") - blocks0;
    MESSAGE("P/D on rbln: ", blocks, " KV blocks pulled by RMA");
    CHECK(blocks >= 1);
    CHECK(pd.metric("decode", "tandem:kv_pull_failures_total") == 0);
    CHECK(pd.metric("decode", "tandem:prefill_fallbacks_total") == 0);
  }
  {
    // kv_memory = "device": the graphs compute on rbln_malloc'd buffers (the fake fills them with
    // 0xA5); prefill's writes reach its registered host pool by rbln_memcpy, decode pulls them by
    // RMA into its host pool and copies them in before its first pass reads them. A missing
    // stage in either direction changes the text.
    std::string toml = rbln_toml("pd-device");
    toml.replace(toml.find("\n[decode]"), 1, "\nkv_memory = \"device\"\n");
    ServeCluster pd(Layout::loopback3, 1, 0, "", "", "", false, true, "", toml);
    REQUIRE_MESSAGE(pd.wait_ready(60000ms), pd.logs());
    check_same_text(pd, cpu, "rbln P/D, device KV");
    check_pd_pulled(pd);
  }
}

TEST_CASE(
    "rbln serving: loopback-3 P/D with a prefill pipelined over two devices, then with decode "
    "data-parallel over two (KV in device memory), gives device cpu's text" *
    doctest::timeout(600)) {
  const std::vector<std::string> cpu = cpu_answers(Layout::loopback3, 1);
  // The prefill executor: [rbln] prefill_artifacts, a PP2 directory (three layers per stage),
  // on devices [2, 3], each stage's KV in its own device buffer staged to the host pool that
  // decode pulls from; the decode executor: the one-graph directory of [rbln] artifacts.
  std::string pp_dir = fake_compiled("pp", [](FakeRblnArtifact& a) { a.stages = 2; });
  std::string toml =
      "# rbln executors: exec-p exec-d\n# devices exec-p: [2, 3]\n" + rbln_toml("pp-decode");
  toml.replace(toml.find("\n[decode]"), 1,
               "\nprefill_artifacts = \"" + pp_dir + "\"\nkv_memory = \"device\"\n");
  ServeCluster pd(Layout::loopback3, 1, 0, "", "", "", false, true, "", toml);
  REQUIRE_MESSAGE(pd.wait_ready(60000ms), pd.logs());
  check_same_text(pd, cpu, "rbln PP2 P/D");
  check_pd_pulled(pd);
  // `tandem check` reports the prefill executor's stages.
  auto check = run({tandem_bin(), "check", pd.manifest_path()}, 60000ms);
  CHECK_MESSAGE(check.output.find("pipeline stages 2 (layers 3, 3)") != std::string::npos,
                check.output);

  // Decode data-parallel over devices [0, 1] (two ranks in lockstep, each with its own device
  // KV: the pulled blocks are copied into both, each sequence computes on its rank's), prefill
  // the one-graph directory through prefill_artifacts.
  std::string dp_dir = fake_compiled("dp", [](FakeRblnArtifact& a) { a.ranks = 2; });
  std::string one = rbln_toml("dp-prefill");
  std::string one_dir = one.substr(one.find("artifacts = \"") + 13);
  one_dir = one_dir.substr(0, one_dir.find('"'));
  std::string dp_toml =
      "# rbln executors: exec-p exec-d\n# devices exec-d: [0, 1]\n[rbln]\nlibrary = \"" +
      fake_lib() + "\"\nartifacts = \"" + dp_dir + "\"\nprefill_artifacts = \"" + one_dir +
      "\"\nkv_memory = \"device\"\n[decode]\nseqs_max = 8\n";
  ServeCluster dpc(Layout::loopback3, 1, 0, "", "", "", false, true, "", dp_toml);
  REQUIRE_MESSAGE(dpc.wait_ready(60000ms), dpc.logs());
  check_same_text(dpc, cpu, "rbln DP2 decode");
  CHECK(dpc.metric("decode", "tandem:kv_pulled_blocks_total") >= 1);
  CHECK(dpc.metric("decode", "tandem:prefill_fallbacks_total") == 0);
  auto dp_check = run({tandem_bin(), "check", dpc.manifest_path()}, 60000ms);
  CHECK_MESSAGE(
      dp_check.output.find("buckets [1, 2, 4, 8], data parallel 2, devices 2") != std::string::npos,
      dp_check.output);
}

TEST_CASE(
    "rbln serving: a graph run that never completes ends its requests with errors; the "
    "node keeps answering" *
    doctest::timeout(300)) {
  ServeCluster c(Layout::one_node, 100000, 0, "", "", "", false, true, "",
                 rbln_toml("hang", {{"fake_hang_graph", "decoder_batch_1"}}) +
                     "[supervisor]\nexecutor_step_timeout_ms = 1000\ndevice_lost = \"stay\"\n");
  REQUIRE_MESSAGE(eventually(60000ms,
                             [&] {
                               auto h = http::get(c.http_port(), "/health", 1000ms);
                               return h.ok() && h.status == 200;
                             }),
                  c.logs());
  for (int i = 0; i < 2; ++i) {
    auto started = std::chrono::steady_clock::now();
    auto r = http::post(c.http_port(), "/v1/completions",
                        completion_body("Once upon a time", 8, false).dump(), 30000ms);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    MESSAGE("request ", i, ": status ", r.status, " after ", s, " s: ", r.body.substr(0, 300));
    REQUIRE(r.ok());
    // The service is unavailable, not broken: 503, which clients retry later (no other decode
    // instance can take it; the first request's step hung, the second is refused at once).
    CHECK(r.status == 503);
    CHECK(r.body.find("executor device lost: rbln decoder_batch_1") != std::string::npos);
    CHECK(s < 20.0);  // ended by the run's timeout, not by the client's
  }
  CHECK(c.node("solo").running());
  CHECK(http::get(c.admin_port("solo"), "/metrics", 3000ms).status == 200);
  // The device is lost for good (the runtime may still write what it was given): the instance
  // reports not ready with the reason, and stays so, instead of "serving again".
  CHECK_MESSAGE(eventually(10000ms,
                           [&] {
                             auto h = http::get(c.http_port(), "/health", 1000ms);
                             return h.status == 503 &&
                                    h.body.find("executor device lost: rbln decoder_batch_1") !=
                                        std::string::npos;
                           }),
                c.logs());
  std::this_thread::sleep_for(1500ms);
  auto still = http::get(c.http_port(), "/health", 1000ms);
  CHECK(still.status == 503);
  auto refused = http::post(c.http_port(), "/v1/completions",
                            completion_body("Once upon a time", 8, false).dump(), 30000ms);
  CHECK(refused.status == 503);
  CHECK(refused.body.find("device lost") != std::string::npos);
  // The node's own /health (the admin port, what a load balancer or systemd probe asks) says
  // which instance lost its device and that the node stays up ([supervisor] device_lost).
  auto admin = http::get(c.admin_port("solo"), "/health", 1000ms);
  CHECK(admin.status == 503);
  CHECK_MESSAGE(
      admin.body.find(": executor device lost: rbln decoder_batch_1") != std::string::npos,
      admin.body);
  CHECK_MESSAGE(admin.body.find("restart the node to reopen it ([supervisor] device_lost = "
                                "\"stay\")") != std::string::npos,
                admin.body);
  // `tandem shell executors`: the decode executor's device lost (its failed passes and the last
  // error), the prefill executor's ready, each with what it runs.
  auto shown = c.shell("executors");
  CHECK(shown.exit_code == 0);
  const std::string decode_row = table_row(shown.output, "solo/exec-d"),
                    prefill_row = table_row(shown.output, "solo/exec-p");
  CHECK_MESSAGE(decode_row.find(" lost ") != std::string::npos, shown.output);
  CHECK_MESSAGE(
      decode_row.find("lost: rbln decoder_batch_1 (1 rows) run 1 did not complete "
                      "within 1000 ms (restart the node); compiled ") != std::string::npos,
      decode_row);
  CHECK_MESSAGE(decode_row.find("last error: timed_out: rbln decoder_batch_1") != std::string::npos,
                decode_row);
  CHECK_MESSAGE(prefill_row.find(" ready ") != std::string::npos, shown.output);
  // And in the node's metrics, for alerts: lost and not ready, its failed pass counted.
  const std::string d = "device=\"rbln\",instance=\"exec-d\"",
                    p = "device=\"rbln\",instance=\"exec-p\"";
  CHECK(c.metric("solo", "tandem:executor_device_lost", d) == 1);
  CHECK(c.metric("solo", "tandem:executor_device_ready", d) == 0);
  CHECK(c.metric("solo", "tandem:executor_device_ready", p) == 1);
  CHECK(c.metric("solo", "tandem:executor_device_lost", p) == 0);
  CHECK(c.metric("solo", "tandem:executor_pass_failures_total", d) >= 1);
  CHECK(c.metric("solo", "tandem:executor_pass_seconds_count", d) >= 2);
  CHECK(c.metric("solo", "tandem:executor_pass_seconds_sum", d) >= 1.0);  // the 1 s timeout
  CHECK_MESSAGE(prefill_row.find("buckets [1, 2, 4, 8], devices 1, KV in host memory; KV pool 512 "
                                 "blocks") != std::string::npos,
                prefill_row);
  std::string log = c.logs();
  // The device's own wait or the decode shell's step watch (the same 1 s) ended it first; later
  // steps find the device poisoned.
  CHECK_MESSAGE((log.find("did not complete within 1000 ms") != std::string::npos ||
                 log.find("executor step timed out after 1000 ms") != std::string::npos),
                log);
}

TEST_CASE(
    "rbln serving: a prefill instance whose device is lost ends the requests waiting for it at "
    "once; decode prefills them itself" *
    doctest::timeout(300)) {
  // P/D on loopback-3 with only the prefill executor on rbln, its prefill graph hanging: the
  // first request's step ends at the 1 s step timeout and loses the device. The two sent while
  // that step ran wait in prefill's queue; without their explicit end they would wait for
  // decode's 60 s prefill_timeout_ms, past these clients' 30 s.
  std::string toml = rbln_toml("lost-prefill", {{"fake_hang_graph", "prefill"}});
  toml.replace(toml.find("seqs_max = 8"), 12, "seqs_max = 8\nprefill_timeout_ms = 60000");
  ServeCluster c(Layout::loopback3, 1, 0, "", "", "", false, true, "",
                 "# rbln executors: exec-p\n" + toml +
                     "[supervisor]\nexecutor_step_timeout_ms = 1000\ndevice_lost = \"stay\"\n");
  // Ready, without wait_ready's warm-up request (it would lose the device first).
  REQUIRE_MESSAGE(eventually(60000ms,
                             [&] {
                               auto h = http::get(c.http_port(), "/health", 1000ms);
                               return h.status == 200 &&
                                      c.metric("front", "tandem_router_instance_eligible") == 2;
                             }),
                  c.logs());
  struct Answer {
    int status = 0;
    double seconds = 0;
    std::string body;
  };
  std::vector<Answer> answers(3);
  std::vector<std::thread> clients;
  for (int i = 0; i < 3; ++i) {
    if (i == 1) std::this_thread::sleep_for(300ms);  // the first one's step is running
    clients.emplace_back([&, i] {
      auto started = std::chrono::steady_clock::now();
      auto r = http::post(c.http_port(), "/v1/completions",
                          completion_body(story_prompts()[i], 8, false).dump(), 30000ms);
      answers[i] = {
          r.status,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
          r.body.substr(0, 300)};
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < 3; ++i) {
    MESSAGE("request ", i, ": ", answers[i].status, " after ", answers[i].seconds,
            " s: ", answers[i].body);
    CHECK_MESSAGE(answers[i].status == 200, c.logs());
    CHECK(answers[i].seconds < 20.0);
  }
  std::string log = c.logs();
  CHECK_MESSAGE(log.find("requests waiting for a prefill end with this error") != std::string::npos,
                log);
  CHECK(c.node("prefill").running());
  auto admin = http::get(c.admin_port("prefill"), "/health", 1000ms);
  CHECK(admin.status == 503);
  CHECK_MESSAGE(admin.body.find("executor device lost: rbln prefill") != std::string::npos,
                admin.body);
}

TEST_CASE(
    "rbln serving: [supervisor] device_lost = \"restart-node\" (the default): the node whose "
    "device is lost drains, exits 75, and `tandem up` starts it again with the device reopened" *
    doctest::timeout(300)) {
  // P/D on loopback-3, the prefill executor on rbln; its prefill graph hangs once (the fault the
  // new process does not meet again). The first request's prefill step ends at the 1 s step
  // timeout and loses the device; decode prefills that request itself.
  std::string once = make_temp_dir("rbln-once") + "/hung";
  std::string toml =
      rbln_toml("restart", {{"fake_hang_graph", "prefill"}, {"fake_hang_once_file", once}});
  ServeCluster c(Layout::loopback3, 1, 0, "", "", "", false, /*start_nodes=*/false, "",
                 "# rbln executors: exec-p\n" + toml +
                     "[supervisor]\nexecutor_step_timeout_ms = 1000\ndrain_timeout_ms = 5000\n");
  std::string log_path = c.dir() + "/up.log";
  auto up = tandem_up(c, log_path);
  auto pd_ready = [&] {
    auto h = http::get(c.http_port(), "/health", 1000ms);
    return h.status == 200 && c.metric("front", "tandem_router_instance_eligible") == 2 &&
           http::get(c.admin_port("prefill"), "/health", 1000ms).status == 200;
  };
  // Ready, without wait_ready's warm-up request (it would lose the device first).
  REQUIRE_MESSAGE(eventually(60000ms, pd_ready), read_file(log_path));
  Completion first = complete(c.http_port(), story_prompts()[0], 8);
  CHECK_MESSAGE(first.error.empty(), first.error);
  CHECK(std::filesystem::exists(once));
  CHECK_MESSAGE(
      eventually(30000ms,
                 [&] {
                   return read_file(log_path).find("node 'prefill' exited with status 75") !=
                          std::string::npos;
                 }),
      read_file(log_path));
  std::string log = read_file(log_path);
  CHECK_MESSAGE(log.find("restarting the node: prefill/prefill/prefill: executor device lost: "
                         "rbln prefill") != std::string::npos,
                log);
  CHECK(log.find("drained in") != std::string::npos);
  // Started again: its device opens, the router picks it, and P/D pulls from it once more.
  REQUIRE_MESSAGE(eventually(60000ms, pd_ready), read_file(log_path));
  double pulled = c.metric("decode", "tandem:kv_pulled_blocks_total");
  double fallbacks = c.metric("decode", "tandem:prefill_fallbacks_total");
  for (int i = 1; i < 4; ++i) {
    Completion r = complete(c.http_port(), story_prompts()[i], 8);
    CHECK_MESSAGE(r.error.empty(), r.error);
  }
  CHECK(c.metric("decode", "tandem:kv_pulled_blocks_total") > pulled);
  CHECK(c.metric("decode", "tandem:prefill_fallbacks_total") == fallbacks);
  up->signal(SIGTERM);
  int status = up->wait(60000ms);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
}

TEST_CASE(
    "rbln serving: a device lost for good restarts its node at most "
    "[supervisor] device_lost_restarts_max times; then the node stays up without it and says "
    "why" *
    doctest::timeout(300)) {
  // The prefill graph hangs on every run (no restart clears it). One device-lost restart is
  // allowed: the first loss restarts the node, the second keeps it up, its prefill instance not
  // ready, and decode prefills every request itself.
  std::string toml = rbln_toml("lost-for-good", {{"fake_hang_graph", "prefill"}});
  ServeCluster c(Layout::loopback3, 1, 0, "", "", "", false, /*start_nodes=*/false, "",
                 "# rbln executors: exec-p\n" + toml +
                     "[supervisor]\nexecutor_step_timeout_ms = 1000\ndrain_timeout_ms = 5000\n"
                     "device_lost_restarts_max = 1\n");
  std::string state = c.dir() + "/state";
  std::string log_path = c.dir() + "/up.log";
  auto up = tandem_up(c, log_path);
  auto pd_ready = [&] {
    auto h = http::get(c.http_port(), "/health", 1000ms);
    return h.status == 200 && c.metric("front", "tandem_router_instance_eligible") == 2 &&
           http::get(c.admin_port("prefill"), "/health", 1000ms).status == 200;
  };
  auto exits_75 = [&] {
    std::string log = read_file(log_path);
    size_t n = 0;
    for (size_t at = log.find("exited with status 75"); at != std::string::npos;
         at = log.find("exited with status 75", at + 1)) {
      ++n;
    }
    return n;
  };
  REQUIRE_MESSAGE(eventually(60000ms, pd_ready), read_file(log_path));
  Completion first = complete(c.http_port(), story_prompts()[0], 8);
  CHECK_MESSAGE(first.error.empty(), first.error);
  REQUIRE_MESSAGE(eventually(30000ms, [&] { return exits_75() == 1; }), read_file(log_path));
  // Restarted; the device hangs again on the next request, and this time the node stays up.
  REQUIRE_MESSAGE(eventually(60000ms, pd_ready), read_file(log_path));
  Completion second = complete(c.http_port(), story_prompts()[1], 8);
  CHECK_MESSAGE(second.error.empty(), second.error);
  const std::string kept =
      "the node restarted once within 3600000 ms for lost devices ([supervisor] "
      "device_lost_restarts_max = 1), so it stays up without this one";
  CHECK_MESSAGE(eventually(10000ms,
                           [&] {
                             auto h = http::get(c.admin_port("prefill"), "/health", 1000ms);
                             return h.status == 503 && h.body.find(kept) != std::string::npos;
                           }),
                http::get(c.admin_port("prefill"), "/health", 1000ms).body);
  CHECK(read_file(log_path).find(kept) != std::string::npos);
  // Still up, serving through decode's own prefill; no further restart.
  for (int i = 2; i < 4; ++i) {
    Completion r = complete(c.http_port(), story_prompts()[i], 8);
    CHECK_MESSAGE(r.error.empty(), r.error);
  }
  CHECK(exits_75() == 1);
  CHECK(http::get(c.admin_port("prefill"), "/metrics", 3000ms).status == 200);
  std::vector<std::string> records;
  for (const auto& e : std::filesystem::directory_iterator(state)) {
    // The cluster key `tandem up` made for this one-host manifest lives beside the records.
    if (e.path().extension() == ".key") continue;
    records.push_back(e.path().filename().string());
  }
  REQUIRE(records.size() == 1);
  CHECK_MESSAGE(records[0].rfind("serve-it-prefill-", 0) == 0, records[0]);
  up->signal(SIGTERM);
  int status = up->wait(60000ms);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
}

TEST_CASE(
    "rbln serving: a device that does not open within [supervisor] executor_open_timeout_ms "
    "leaves its instances not ready with that reason; the node keeps answering" *
    doctest::timeout(300)) {
  ServeCluster c(Layout::one_node, 100000, 0, "", "", "", false, true, "",
                 rbln_toml("slow-open", {{"fake_load_delay_ms", 4000}}) +
                     "[supervisor]\nexecutor_open_timeout_ms = 1000\n");
  auto said = [&] {
    auto h = http::get(c.http_port(), "/health", 1000ms);
    return h.status == 503 &&
           h.body.find("the executor did not open its device within 1000 ms") != std::string::npos;
  };
  REQUIRE_MESSAGE(eventually(30000ms, said), c.logs());
  auto r = http::post(c.http_port(), "/v1/completions",
                      completion_body("Once upon a time", 8, false).dump(), 30000ms);
  REQUIRE(r.ok());
  CHECK_MESSAGE(r.status == 503, r.body);
  // The device opens later (4 s; the executor logs it): its answer is dropped, the instances
  // stay not ready.
  CHECK_MESSAGE(eventually(60000ms,
                           [&] { return c.logs().find(" device, KV pool ") != std::string::npos; }),
                c.logs());
  CHECK_MESSAGE(said(), c.logs());
  CHECK(c.node("solo").running());
  CHECK(http::get(c.admin_port("solo"), "/metrics", 3000ms).status == 200);
  CHECK(c.logs().find("no device: the executor did not open its device within 1000 ms "
                      "([supervisor] executor_open_timeout_ms)") != std::string::npos);
}

TEST_CASE("rbln: `tandem check` probes the library, its symbols and the compiled directory") {
  std::string toml = rbln_toml("check");
  ServeCluster ok(Layout::one_node, 32, 0, "", "", "", false, false, "", toml);
  auto checked = run({tandem_bin(), "check", ok.manifest_path()}, 60000ms);
  CHECK_MESSAGE(checked.exit_code == 0, checked.output);
  CHECK_MESSAGE(
      checked.output.find("rbln      solo/exec-d: library " + fake_lib() +
                          " (9 symbols, device-memory calls present)") != std::string::npos,
      checked.output);
  CHECK(checked.output.find("model stories15M, compiler fake-0.1, block 16, max length 256, "
                            "chunk 64, buckets [1, 2, 4, 8], devices 1") != std::string::npos);

  // A missing library, and a manifest the compiled directory does not fit.
  std::string no_lib = toml;
  no_lib.replace(no_lib.find(fake_lib()), fake_lib().size(), "/nonexistent/librbln_runtime.so");
  ServeCluster missing(Layout::one_node, 32, 0, "", "", "", false, false, "", no_lib);
  auto refused = run({tandem_bin(), "check", missing.manifest_path()}, 60000ms);
  CHECK(refused.exit_code == 1);
  CHECK_MESSAGE(refused.output.find("rbln executor solo/exec-d: cannot load "
                                    "/nonexistent/librbln_runtime.so") != std::string::npos,
                refused.output);
  std::string wide_toml = toml;
  wide_toml.replace(wide_toml.find("seqs_max = 8"), 12, "seqs_max = 16");
  ServeCluster wide(Layout::one_node, 32, 0, "", "", "", false, false, "", wide_toml);
  auto mismatch = run({tandem_bin(), "check", wide.manifest_path()}, 60000ms);
  CHECK(mismatch.exit_code == 1);
  CHECK_MESSAGE(mismatch.output.find("largest decoder_batch_sizes bucket 8, manifest [decode] "
                                     "seqs_max 16") != std::string::npos,
                mismatch.output);
  // kv_memory = "device" needs the device-memory calls: with them the probe says so, without
  // them it names the first one missing.
  std::string device_kv = toml;
  device_kv.replace(device_kv.find("\n[decode]"), 1, "\nkv_memory = \"device\"\n");
  ServeCluster staged(Layout::one_node, 32, 0, "", "", "", false, false, "", device_kv);
  auto probed = run({tandem_bin(), "check", staged.manifest_path()}, 60000ms);
  CHECK_MESSAGE(probed.exit_code == 0, probed.output);
  CHECK_MESSAGE(
      probed.output.find("(9 symbols, device-memory calls present, KV in device memory)") !=
          std::string::npos,
      probed.output);
  const char* no_memory_lib = std::getenv("RBLN_FAKE_LIB_NO_MEMORY");
  REQUIRE(no_memory_lib != nullptr);
  device_kv.replace(device_kv.find(fake_lib()), fake_lib().size(), no_memory_lib);
  ServeCluster lacking(Layout::one_node, 32, 0, "", "", "", false, false, "", device_kv);
  auto lacks = run({tandem_bin(), "check", lacking.manifest_path()}, 60000ms);
  CHECK(lacks.exit_code == 1);
  CHECK_MESSAGE(lacks.output.find(std::string(no_memory_lib) + " has no symbol rbln_malloc") !=
                    std::string::npos,
                lacks.output);
}

// The stand-in compiler at DIR/rbln-compile: its version from DIR/version (the caller writes
// it; the tests edit it); each call logged to DIR/calls with its buckets, stages, stage layers,
// ranks and devices; it writes every graph those name, except decoder_batch_N when DIR/skip-N
// exists.
std::string write_stand_in_compiler(const std::string& dir) {
  std::string script = dir + "/rbln-compile";
  write_file(script,
             "#!/bin/sh\n"
             "if [ \"$1\" = --version ]; then echo \"$(cat " +
                 dir +
                 "/version)\"; exit 0; fi\n"
                 "out=''; buckets=''; stages=1; layers=''; ranks=1; devices=''; verify=''\n"
                 "while [ $# -gt 0 ]; do\n"
                 "  case \"$1\" in\n"
                 "    --out) out=\"$2\";; --buckets) buckets=\"$2\";;\n"
                 "    --pipeline-stages) stages=\"$2\";; --stage-layers) layers=\"$2\";;\n"
                 "    --data-parallel) ranks=\"$2\";; --devices) devices=\"$2\";;\n"
                 "    --verify-tokens) verify=\"$2\";;\n"
                 "  esac\n"
                 "  shift\n"
                 "done\n"
                 "[ -n \"$out\" ] && [ -d \"$out\" ] || { echo 'no --out directory' >&2; "
                 "exit 3; }\n"
                 "echo \"buckets $buckets stages $stages layers $layers ranks $ranks "
                 "devices $devices${verify:+ verify $verify}\" >> " +
                 dir +
                 "/calls\n"
                 "if [ \"$stages\" -gt 1 ]; then\n"
                 "  s=0; while [ $s -lt $stages ]; do\n"
                 "    echo 'fake graph' > \"$out/prefill_stage_$s.rbln\"; s=$((s + 1))\n"
                 "  done\n"
                 "  exit 0\n"
                 "fi\n"
                 "echo 'fake graph' > \"$out/prefill.rbln\"\n"
                 "for b in $(echo \"$buckets\" | tr , ' '); do\n"
                 "  [ -f " +
                 dir +
                 "/skip-$b ] || echo 'fake graph' > \"$out/decoder_batch_$b.rbln\"\n"
                 "  [ -z \"$verify\" ] || echo 'fake graph' > \"$out/verify_batch_$b.rbln\"\n"
                 "done\n");
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  return script;
}

// [rbln] for the compile cache: the fake runtime, `script` as the compiler, the cache in
// DIR/cache, with `rbln_keys` added; then [decode] seqs_max 8.
std::string compile_cache_toml(const std::string& dir, const std::string& script,
                               const std::string& rbln_keys = "") {
  return "[rbln]\nlibrary = \"" + fake_lib() + "\"\ncompiler = \"" + script + "\"\ncache_dir = \"" +
         dir + "/cache\"\nprefill_chunk = 64\nkv_element_bytes = 4\n" + rbln_keys +
         "[decode]\nseqs_max = 8\n";
}

// `tandem model compile --manifest M`, which must succeed; its output.
std::string model_compile(const std::string& manifest) {
  auto compiled = run({tandem_bin(), "model", "compile", "--manifest", manifest}, 120000ms);
  REQUIRE_MESSAGE(compiled.exit_code == 0, compiled.output);
  return compiled.output;
}

TEST_CASE(
    "rbln: `tandem model compile` fills the cache with a stand-in compiler; nodes use it "
    "and refuse what another compiler version built" *
    doctest::timeout(300)) {
  std::string dir = make_temp_dir("rbln-compile");
  std::string script = write_stand_in_compiler(dir);
  write_file(dir + "/version", "1.2.0\n");
  ServeCluster c(Layout::one_node, 32, 0, "", "", "", false, false, "",
                 compile_cache_toml(dir, script));
  const std::string first = model_compile(c.manifest_path());
  // The prefill executor serves no decode instance: prefill and decoder_batch_1; the decode
  // executor: prefill and buckets 1, 2, 4, 8 (up to [decode] seqs_max).
  CHECK_MESSAGE(first.find("solo/exec-p: compiled 2 graphs") != std::string::npos, first);
  CHECK(first.find("solo/exec-d: compiled 5 graphs") != std::string::npos);
  CHECK(first.find("into " + dir + "/cache/stories15M-") != std::string::npos);
  CHECK(first.find("/1.2.0\n") != std::string::npos);
  // One call per executor, all its graphs together (they share the device's KV cache).
  std::string calls = read_file(dir + "/calls");
  const std::string p_call = "buckets 1 stages 1 layers  ranks 1 devices 1\n",
                    d_call = "buckets 1,2,4,8 stages 1 layers  ranks 1 devices 1\n";
  CHECK_MESSAGE((calls == p_call + d_call || calls == d_call + p_call), calls);
  auto again = run({tandem_bin(), "model", "compile", "--manifest", c.manifest_path()}, 120000ms);
  CHECK(again.exit_code == 0);
  CHECK(again.output.find("solo/exec-p: cached") != std::string::npos);
  CHECK(again.output.find("solo/exec-d: cached") != std::string::npos);
  CHECK(read_file(dir + "/calls") == calls);  // nothing recompiled

  // The node serves from the cache.
  c.restart("solo");
  REQUIRE_MESSAGE(c.wait_ready(60000ms), c.logs());
  Completion r = complete(c.http_port(), story_prompts()[0], 8);
  CHECK_MESSAGE(r.error.empty(), r.error);
  CHECK(!r.text.empty());

  // Another compiler version: the cached graphs are refused, naming both versions.
  write_file(dir + "/version", "1.3.0\n");
  auto checked = run({tandem_bin(), "check", c.manifest_path()}, 60000ms);
  CHECK(checked.exit_code == 1);
  CHECK_MESSAGE(checked.output.find("holds graphs built by compiler 1.2.0, the installed "
                                    "compiler is 1.3.0") != std::string::npos,
                checked.output);
  // A compiler that exits 0 without a graph: named; nothing enters the cache.
  write_file(dir + "/version", "1.4.0\n");
  write_file(dir + "/skip-4", "");
  auto partial = run({tandem_bin(), "model", "compile", "--manifest", c.manifest_path()}, 60000ms);
  CHECK(partial.exit_code == 1);
  CHECK_MESSAGE(partial.output.find("rbln compile wrote no decoder_batch_4.rbln (the compiler "
                                    "exited 0)") != std::string::npos,
                partial.output);
  auto still = run({tandem_bin(), "check", c.manifest_path()}, 60000ms);
  CHECK(still.exit_code == 1);
  CHECK(still.output.find("the installed compiler is 1.4.0") != std::string::npos);
  // A compiler that fails says why.
  write_file(script,
             "#!/bin/sh\n[ \"$1\" = --version ] && { echo 9.9; exit 0; }\n"
             "echo 'out of licences' >&2; exit 4\n");
  auto failed = run({tandem_bin(), "model", "compile", "--manifest", c.manifest_path()}, 60000ms);
  CHECK(failed.exit_code == 1);
  CHECK_MESSAGE(
      failed.output.find("rbln compile failed (exit 4): out of licences") != std::string::npos,
      failed.output);
}

TEST_CASE(
    "rbln: `tandem model compile` compiles a pipelined prefill and a data-parallel decode; "
    "loopback-3 serves device cpu's text from them" *
    doctest::timeout(600)) {
  const std::vector<std::string> cpu = cpu_answers(Layout::loopback3, 1);
  std::string dir = make_temp_dir("rbln-compile-split");
  std::string script = write_stand_in_compiler(dir);
  write_file(dir + "/version", "2.0.0\n");
  // The prefill executor's devices [2, 3] as two stages of layers 2 and 4 (stories15M has 6);
  // the decode executor's [0, 1] as two data-parallel ranks; KV in device memory.
  std::string toml =
      "# rbln executors: exec-p exec-d\n# devices exec-p: [2, 3]\n# devices exec-d: [0, 1]\n" +
      compile_cache_toml(dir, script,
                         "kv_memory = \"device\"\nprefill_pipeline_stages = 2\n"
                         "prefill_stage_layers = [2, 4]\ndecode_data_parallel = 2\n");
  ServeCluster pd(Layout::loopback3, 1, 0, "", "", "", false, false, "", toml);
  const std::string compiled = model_compile(pd.manifest_path());
  CHECK_MESSAGE(compiled.find("prefill/exec-p: compiled 2 graphs for 2 pipeline stages of "
                              "1 device each") != std::string::npos,
                compiled);
  CHECK(compiled.find("decode/exec-d: compiled 5 graphs for 2 data-parallel ranks of 1 "
                      "device each") != std::string::npos);
  // The compiler was asked for the stages with their layers (no decode graph), and for one
  // rank's graph set with the rank count.
  std::string calls = read_file(dir + "/calls");
  CHECK_MESSAGE(calls.find("buckets  stages 2 layers 2,4 ranks 1 devices 1\n") != std::string::npos,
                calls);
  CHECK(calls.find("buckets 1,2,4,8 stages 1 layers  ranks 2 devices 1\n") != std::string::npos);
  // The nodes find those entries, and serve what device cpu serves.
  for (const std::string& name : pd.node_names()) pd.restart(name);
  REQUIRE_MESSAGE(pd.wait_ready(60000ms), pd.logs());
  check_same_text(pd, cpu, "rbln PP2 prefill + DP2 decode from the compile cache");
  check_pd_pulled(pd);
  auto check = run({tandem_bin(), "check", pd.manifest_path()}, 60000ms);
  CHECK_MESSAGE(check.output.find("pipeline stages 2 (layers 2, 4)") != std::string::npos,
                check.output);
  CHECK(check.output.find("data parallel 2, devices 2") != std::string::npos);
  // Another split of the same devices is another cache entry: nothing is found until compiled.
  std::string other = read_file(pd.manifest_path());
  other.replace(other.find("prefill_stage_layers = [2, 4]"), 29, "prefill_stage_layers = [3, 3]");
  write_file(pd.manifest_path(), other);
  auto stale = run({tandem_bin(), "check", pd.manifest_path()}, 60000ms);
  CHECK(stale.exit_code == 1);
  CHECK_MESSAGE(stale.output.find("nothing compiled for this executor") != std::string::npos,
                stale.output);
}

TEST_CASE(
    "rbln serving: speculative decoding verified by the verify graphs (compiled by `tandem model "
    "compile`, or a compiled directory with P/D) gives device cpu's text and accepts drafts" *
    doctest::timeout(600)) {
  const std::vector<std::string> cpu = cpu_answers(Layout::one_node, 32);
  auto accepted_drafts = [](ServeCluster& c, const std::string& node, const std::string& label) {
    double drafted = c.metric(node, "tandem:spec_decode_num_draft_tokens_total");
    double accepted = c.metric(node, "tandem:spec_decode_num_accepted_tokens_total");
    MESSAGE(label, ": ", drafted, " draft tokens verified on rbln, ", accepted, " accepted");
    CHECK(accepted > 0);
    CHECK(accepted <= drafted);
  };
  // One node, suffix decoding, the graphs from the compile cache: the decode executor's call
  // asks for verify graphs of [speculative] draft_tokens_max (3) + 1 tokens; the prefill
  // executor's does not.
  std::string dir = make_temp_dir("rbln-compile-verify");
  std::string script = write_stand_in_compiler(dir);
  write_file(dir + "/version", "3.0.0\n");
  std::string toml = compile_cache_toml(dir, script) +
                     "[speculative]\nmethod = \"suffix\"\ndraft_tokens_max = 3\n";
  {
    ServeCluster c(Layout::one_node, 32, 0, "", "", "", false, false, "", toml);
    const std::string compiled = model_compile(c.manifest_path());
    CHECK_MESSAGE(compiled.find("solo/exec-d: compiled 9 graphs (with verify graphs of 4 tokens "
                                "per sequence)") != std::string::npos,
                  compiled);
    std::string calls = read_file(dir + "/calls");
    CHECK_MESSAGE(calls.find("buckets 1,2,4,8 stages 1 layers  ranks 1 devices 1 verify 4\n") !=
                      std::string::npos,
                  calls);
    CHECK(calls.find("buckets 1 stages 1 layers  ranks 1 devices 1\n") != std::string::npos);
    c.restart("solo");
    REQUIRE_MESSAGE(c.wait_ready(60000ms), c.logs());
    check_same_text(c, cpu, "rbln, suffix speculation");
    accepted_drafts(c, "solo", "suffix, one node");
    auto check = run({tandem_bin(), "check", c.manifest_path()}, 60000ms);
    CHECK_MESSAGE(
        check.output.find("buckets [1, 2, 4, 8], verify graphs of 4 tokens") != std::string::npos,
        check.output);
    // More drafts than the cached verify graphs take: another cache entry, not found until it
    // is compiled.
    std::string more = read_file(c.manifest_path());
    more.replace(more.find("draft_tokens_max = 3"), 20, "draft_tokens_max = 5");
    write_file(c.manifest_path(), more);
    auto stale = run({tandem_bin(), "check", c.manifest_path()}, 60000ms);
    CHECK(stale.exit_code == 1);
    CHECK_MESSAGE(stale.output.find("nothing compiled for this executor") != std::string::npos,
                  stale.output);
  }
  // Loopback-3 P/D, n-gram drafts: the decode executor's compiled directory has verify graphs of
  // 5 tokens (draft_tokens_max 4); a directory without them is refused at start, naming both.
  std::string verify_dir =
      fake_compiled("verify", [](FakeRblnArtifact& a) { a.verify_tokens = 5; });
  std::string pd_toml = "[rbln]\nlibrary = \"" + fake_lib() + "\"\nartifacts = \"" + verify_dir +
                        "\"\n[decode]\nseqs_max = 8\n[speculative]\nmethod = \"ngram\"\n";
  {
    ServeCluster pd(Layout::loopback3, 1, 0, "", "", "", false, true, "", pd_toml);
    REQUIRE_MESSAGE(pd.wait_ready(60000ms), pd.logs());
    check_same_text(pd, cpu, "rbln P/D, ngram speculation");
    check_pd_pulled(pd);
    accepted_drafts(pd, "decode", "ngram, loopback-3 P/D");
  }
  std::string plain = rbln_toml("no-verify") + "[speculative]\nmethod = \"ngram\"\n";
  auto checked = run(
      {tandem_bin(), "check",
       ServeCluster(Layout::one_node, 32, 0, "", "", "", false, false, "", plain).manifest_path()},
      60000ms);
  CHECK(checked.exit_code == 1);
  CHECK_MESSAGE(checked.output.find("no verify graphs (verify_tokens absent), manifest "
                                    "[speculative] draft_tokens_max 4") != std::string::npos,
                checked.output);
}

TEST_CASE(
    "rbln: tools/rbln-compile maps the compiler protocol onto optimum-rbln (against stand-in "
    "packages: the real SDK is not here)") {
  namespace rb = tandem::devices::rbln;
  std::string dir = make_temp_dir("rbln-wrapper");
  auto synth =
      run({tandem_bin(), "model", "synth", "--arch", "llama", "--out", dir + "/hf"}, 120000ms);
  REQUIRE_MESSAGE(synth.exit_code == 0, synth.output);
  std::string wrapper = source_root() + "/tools/rbln-compile";
  std::string stubs = "PYTHONPATH=" + source_root() +
                      "/tests/rbln_fake/stub_python RBLN_STUB_LOG=" + dir + "/log.json ";
  rb::CompileRequest r;
  r.model_path = dir + "/hf";
  r.model_name = "synth";
  r.block_tokens = 16;
  r.max_seq_len = 256;
  r.prefill_chunk = 64;
  r.buckets = {1, 2, 4};
  r.kv_blocks = 65;
  r.kv_element_bytes = 2;

  // No RBLN compiler installed: --version says which package is missing.
  auto none = rb::compile(r, wrapper, dir + "/cache");
  REQUIRE_FALSE(none.ok());
  CHECK_MESSAGE(none.error().describe().find("the RBLN compiler is not installed (python package "
                                             "'rebel'") != std::string::npos,
                none.error().describe());

  // With the stand-ins: one from_pretrained for all graphs, with the protocol's values as
  // optimum-rbln's rbln_config keys; the graphs moved out of save_pretrained's directory.
  auto done = rb::compile(r, stubs + wrapper, dir + "/cache");
  REQUIRE_MESSAGE(done.ok(), done.error().describe());
  CHECK(done->graphs == 4);
  auto artifact = rb::load_artifact(done->dir);
  REQUIRE_MESSAGE(artifact.ok(), artifact.error().describe());
  CHECK(artifact->compiler_version == "0.0-stub");
  CHECK(artifact->buckets == std::vector<uint32_t>{1, 2, 4});
  CHECK(read_file(done->dir + "/decoder_batch_4.rbln") == "stub graph decoder_batch_4\n");
  auto log = nlohmann::json::parse(read_file(dir + "/log.json"));
  CHECK(log["model_id"] == dir + "/hf");
  CHECK(log["kwargs"]["export"] == true);
  CHECK(log["kwargs"]["rbln_create_runtimes"] == false);
  CHECK(log["kwargs"]["rbln_config"] == nlohmann::json{{"max_seq_len", 256},
                                                       {"kvcache_block_size", 16},
                                                       {"kvcache_num_blocks", 65},
                                                       {"prefill_chunk_size", 64},
                                                       {"batch_size", 4},
                                                       {"decoder_batch_sizes", {1, 2, 4}},
                                                       {"tensor_parallel_size", 1}});
  for (const auto& e : std::filesystem::directory_iterator(done->dir)) {
    CHECK_MESSAGE(e.path().filename().string().rfind(".rbln-compile", 0) != 0, e.path());
  }

  // What it refuses or reports, each through `tandem model compile`'s error.
  r.buckets = {1, 2, 8};
  auto fail = [&](const std::string& env, const rb::CompileRequest& req) {
    auto out = rb::compile(req, env + stubs + wrapper, dir + "/cache");
    REQUIRE_FALSE(out.ok());
    return out.error().describe();
  };
  CHECK(
      fail("RBLN_STUB_FAIL='no NPU named RBLN-CA25' ", r)
          .find(
              "exit 1): rbln-compile: optimum-rbln failed: RuntimeError: no NPU named RBLN-CA25") !=
      std::string::npos);
  CHECK(fail("RBLN_STUB_SKIP=decoder_batch_8 ", r)
            .find("optimum-rbln wrote no decoder_batch_8.rbln (it wrote: decoder_batch_1.rbln, "
                  "decoder_batch_2.rbln, prefill.rbln)") != std::string::npos);
  rb::CompileRequest wide = r;
  wide.kv_element_bytes = 4;
  CHECK(fail("", wide).find("--kv-element-bytes 4: optimum-rbln compiles 2-byte") !=
        std::string::npos);
  rb::CompileRequest bin = r;
  bin.model_path = model_dir() + "/stories15M.bin";
  CHECK(fail("", bin).find("a llama2.c checkpoint cannot be compiled") != std::string::npos);
  // A pipelined prefill: optimum-rbln has no stage export; the wrapper says what to do instead.
  rb::CompileRequest staged = r;
  staged.stages = 2;
  staged.buckets.clear();
  CHECK_MESSAGE(fail("", staged)
                        .find("--pipeline-stages 2: optimum-rbln publishes no export of "
                              "pipeline stages") != std::string::npos,
                fail("", staged));
  // Verify graphs (speculative decoding): no optimum-rbln export either.
  rb::CompileRequest verify = r;
  verify.verify_tokens = 5;
  CHECK_MESSAGE(fail("", verify)
                        .find("--verify-tokens 5: optimum-rbln publishes no export of a decode "
                              "graph taking several tokens per sequence") != std::string::npos,
                fail("", verify));
  // Stages that do not fit the model's two layers are refused before the compiler runs.
  rb::CompileRequest three = staged;
  three.stages = 3;
  CHECK(fail("", three).find("the model's 2 layers do not split evenly into [rbln] "
                             "prefill_pipeline_stages = 3") != std::string::npos);
  rb::CompileRequest listed = staged;
  listed.stage_layers = {1, 2};
  CHECK(fail("", listed)
            .find("[rbln] prefill_stage_layers [1,2] sum to 3 layers over 2 stages; "
                  "the model has 2 layers") != std::string::npos);
  // Data parallel: one rank's graph set, compiled on the rank's devices; the directory says
  // how many ranks open it.
  rb::CompileRequest ranked = r;
  ranked.buckets = {1, 2};
  ranked.ranks = 2;
  auto dp = rb::compile(ranked, stubs + wrapper, dir + "/cache");
  REQUIRE_MESSAGE(dp.ok(), dp.error().describe());
  CHECK(dp->dir != done->dir);
  auto dp_artifact = rb::load_artifact(dp->dir);
  REQUIRE_MESSAGE(dp_artifact.ok(), dp_artifact.error().describe());
  CHECK(dp_artifact->ranks == 2);
  CHECK(dp_artifact->devices == 1);
  CHECK(nlohmann::json::parse(
            read_file(dir + "/log.json"))["kwargs"]["rbln_config"]["tensor_parallel_size"] == 1);
}

TEST_CASE(
    "rbln serving, KV in device memory: a prompt evicted from prefill comes back from tier 2, same "
    "text" *
    doctest::timeout(300)) {
  // One node: prefill on rbln with kv_memory = "device" and 40 blocks (four 11-block prompts
  // evict the first), decode on cpu with 16 (the next prompt evicts it). Tier 2's RMA reads land
  // in prefill's host pool; the device computes on its own buffer, so the prompt's answer the
  // second time depends on prefill copying those blocks in before its pass.
  std::string dir = make_temp_dir("rbln-tier2");
  FakeRblnArtifact a;
  a.model_path = model_dir() + "/stories15M.bin";
  a.kv_blocks = 41;
  std::string compiled = write_fake_rbln_artifact(dir + "/compiled", a);
  uint16_t http_port = free_port(), admin_port = free_port(), fabric_port = free_port();
  auto inst = [](const std::string& role, const std::string& name, const std::string& extra) {
    return "[[node.instance]]\nrole = \"" + role + "\"\nname = \"" + name + "\"\n" + extra;
  };
  std::string manifest = dir + "/cluster.toml";
  write_file(manifest,
             "[cluster]\nname = \"rbln-tier2\"\n[fabric]\nprovider = \"tcp;ofi_rxm\"\n"
             "[model]\nname = \"stories15M\"\npath = \"" +
                 model_dir() +
                 "\"\nblock_tokens = 16\nmax_model_tokens = 256\nchat_format = \"plain\"\n"
                 "[router]\npolicy = \"prefix-aware\"\ndisaggregate_tokens_min = 1\n"
                 "[kv_offload]\nenabled = true\npath = \"" +
                 dir +
                 "/tier2\"\ncapacity_bytes = 67108864\nstaging_blocks = 32\n"
                 "[rbln]\nlibrary = \"" +
                 fake_lib() + "\"\nartifacts = \"" + compiled +
                 "\"\nkv_memory = \"device\"\n"
                 "[[node]]\nname = \"solo\"\nhost = \"127.0.0.1\"\nfabric_port = " +
                 std::to_string(fabric_port) + "\nadmin_port = " + std::to_string(admin_port) +
                 "\nhttp_port = " + std::to_string(http_port) + "\n" +
                 inst("gateway", "gateway", "") + inst("router", "router", "") +
                 inst("prefill", "prefill", "executor = \"exec-p\"\n") +
                 inst("decode", "decode", "executor = \"exec-d\"\n") +
                 inst("kv-offload", "kv-offload", "") +
                 inst("executor", "exec-p", "device = \"rbln\"\ndevices = [0]\nkv_blocks = 40\n") +
                 inst("executor", "exec-d", "device = \"cpu\"\ndevices = [1]\nkv_blocks = 16\n"));
  Child node({tandem_bin(), "node", "--manifest", manifest, "--node", "solo"}, dir + "/solo.log");
  // The test fails when /metrics does not answer (a dead node must not read as 0).
  auto metric = [&](const std::string& series) {
    return required_metric(admin_port, "solo", series);
  };
  bool ready = eventually(90s, [&] {
    // Polled from the start: a node that does not answer yet is not ready.
    if (http::scrape_metric(admin_port, "tandem_router_instance_eligible").value_or(-1) < 2) {
      return false;
    }
    return complete(http_port, "Warm", 1).error.empty();
  });
  REQUIRE_MESSAGE(ready, node.log());
  auto story = [](int seed) {
    static const char* vocab[] = {"the", "little", "dog",  "ran", "to",    "a",    "big",  "tree",
                                  "and", "saw",    "bird", "sky", "happy", "girl", "park", "sun"};
    std::string out = "Once upon a time";
    uint32_t x = static_cast<uint32_t>(seed) * 2654435761u + 7;
    for (int i = 0; i < 180; ++i) {
      x = x * 1664525u + 1013904223u;
      out += std::string(" ") + vocab[(x >> 16) % 16];
    }
    return out;
  };
  Completion first = complete(http_port, story(1), 16);
  REQUIRE_MESSAGE(first.error.empty(), first.error);
  const int full_blocks = first.usage["prompt_tokens"].get<int>() / 16;
  REQUIRE(full_blocks >= 8);
  REQUIRE_MESSAGE(
      eventually(10s, [&] { return metric("tandem:tier2_stored_blocks_total") >= full_blocks; }),
      node.log());
  for (int seed = 2; seed <= 5; ++seed) {
    Completion other = complete(http_port, story(seed), 16);
    REQUIRE_MESSAGE(other.error.empty(), other.error);
  }
  double loaded_before = metric("tandem:prefill_tier2_loaded_blocks_total");
  Completion again = complete(http_port, story(1), 16);
  REQUIRE_MESSAGE(again.error.empty(), again.error);
  INFO(node.log());
  CHECK(metric("tandem:prefill_tier2_loaded_blocks_total") - loaded_before == full_blocks);
  CHECK(again.text == first.text);
  node.signal(SIGTERM);
  node.wait(10000ms);
}
