// The RBLN runtime binding (devices/rbln/rbln_api.hpp) against the conformance fake
// (tests/rbln_fake/): loading and its errors, model and runtime creation and their errors, async
// runs with real data, a failing run, a wait that times out, a run that never completes.
#include <doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "devices/rbln/rbln_api.hpp"

using namespace tandem;
using namespace tandem::devices::rbln;
using namespace std::chrono_literals;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  REQUIRE_MESSAGE(v != nullptr, name, " is not set (meson sets it)");
  return v;
}

// A fake compiled-model directory with `config` as its fake_model.json.
std::string model_dir(const std::string& tag, const std::string& config) {
  auto dir = std::filesystem::temp_directory_path() /
             ("tandem-rbln-" + tag + "-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "fake_model.json") << config;
  return dir.string();
}

}  // namespace

TEST_CASE("rbln api: a missing library or symbol is one error naming it and the path") {
  auto none = RblnApi::load("/nonexistent/librbln_runtime.so");
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().message.find("cannot load /nonexistent/librbln_runtime.so: ") == 0);
  std::string partial = env("RBLN_FAKE_LIB_NO_WAIT");
  auto missing = RblnApi::load(partial);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message.find(partial + " has no symbol rbln_async_wait (dlsym: ") == 0);
  auto whole = RblnApi::load(env("RBLN_FAKE_LIB"));
  REQUIRE_MESSAGE(whole.ok(), whole.error().describe());
  // Optional: the device-memory calls are probed; the whole fake has them, one build lacks them.
  CHECK((*whole)->require_device_memory().ok());
  CHECK(bool((*whole)->device_count));
  auto no_memory = RblnApi::load(env("RBLN_FAKE_LIB_NO_MEMORY"));
  REQUIRE_MESSAGE(no_memory.ok(), no_memory.error().describe());
  CHECK_FALSE(bool((*no_memory)->device_count));
  Status needed = (*no_memory)->require_device_memory();
  REQUIRE_FALSE(needed.ok());
  CHECK(needed.error().message.find(env("RBLN_FAKE_LIB_NO_MEMORY") +
                                    " has no symbol rbln_malloc") == 0);
  CHECK(rbln_required_symbols().size() == 9);
}

TEST_CASE("rbln api: model and runtime creation errors carry the library's message") {
  auto api = *RblnApi::load(env("RBLN_FAKE_LIB"));
  auto no_model = RblnRuntime::open(api, "/nonexistent/model", "decoder_batch_1", 0);
  REQUIRE_FALSE(no_model.ok());
  CHECK(no_model.error().message ==
        "rbln_create_model(/nonexistent/model) failed: no compiled model at /nonexistent/model "
        "(fake_model.json is missing)");
  std::string dir = model_dir("dev", R"({"devices": 2})");
  auto no_device = RblnRuntime::open(api, dir, "prefill", 5);
  REQUIRE_FALSE(no_device.ok());
  CHECK(no_device.error().message ==
        "rbln_create_async_runtime(prefill, device 5) failed: no device 5 (this host has 2)");
  std::filesystem::remove_all(dir);
}

TEST_CASE("rbln api: async runs move real data; failures and timeouts are errors") {
  auto api = *RblnApi::load(env("RBLN_FAKE_LIB"));
  std::string dir = model_dir("run", R"({"inputs": 2, "outputs": 2, "bytes": 64, "delay_ms": 20})");
  auto rt = RblnRuntime::open(api, dir, "decoder_batch_4", 0);
  REQUIRE_MESSAGE(rt.ok(), rt.error().describe());
  CHECK(rt->inputs_count() == 2);
  CHECK(rt->outputs_count() == 2);
  std::vector<uint8_t> a(64), b(64), x(64), y(64);
  for (size_t i = 0; i < 64; ++i) a[i] = static_cast<uint8_t>(i), b[i] = 100;
  auto id = rt->submit({a.data(), b.data()}, {x.data(), y.data()});
  REQUIRE(id.ok());
  auto second = rt->submit({a.data(), b.data()}, {x.data(), y.data()});
  REQUIRE(second.ok());
  CHECK(*second != *id);  // distinct request ids
  REQUIRE(rt->wait(*id, 5000ms).ok());
  REQUIRE(rt->wait(*second, 5000ms).ok());
  for (size_t i = 0; i < 64; ++i) {
    CHECK(x[i] == static_cast<uint8_t>(i + 100 + 1));
    CHECK(y[i] == static_cast<uint8_t>(i + 100 + 2));
  }
  auto unknown = rt->wait(12345, 10ms);
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().kind == ErrorKind::failed);
  CHECK(unknown.error().message.find("no request 12345") != std::string::npos);
  std::filesystem::remove_all(dir);

  std::string slow = model_dir("slow", R"({"delay_ms": 400})");
  auto late = RblnRuntime::open(api, slow, "decoder_batch_1", 0);
  REQUIRE(late.ok());
  uint8_t in[16] = {}, out[16] = {};
  auto run = late->submit({in}, {out});
  REQUIRE(run.ok());
  auto early = late->wait(*run, 20ms);
  REQUIRE_FALSE(early.ok());
  CHECK(early.error().kind == ErrorKind::timed_out);
  CHECK(early.error().message.find("did not complete within 20 ms") != std::string::npos);
  CHECK(late->wait(*run, 5000ms).ok());  // the same run completes later
  std::filesystem::remove_all(slow);

  std::string failing = model_dir("fail", R"({"fail_run": true})");
  auto bad = RblnRuntime::open(api, failing, "prefill", 0);
  REQUIRE(bad.ok());
  auto refused = bad->submit({in}, {out});
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message ==
        "rbln_async_run failed: the device failed the run (fake: fail_run)");
  std::filesystem::remove_all(failing);

  std::string hung = model_dir("hung", R"({"never_completes": true})");
  auto stuck = RblnRuntime::open(api, hung, "prefill", 0);
  REQUIRE(stuck.ok());
  auto never = stuck->submit({in}, {out});
  REQUIRE(never.ok());
  auto waited = stuck->wait(*never, 50ms);
  CHECK(waited.error().kind == ErrorKind::timed_out);
  std::filesystem::remove_all(hung);
}
