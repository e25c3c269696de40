// The RBLN runtime conformance fake (tests only): a shared library exporting the C symbols
// devices/rbln/rbln_api.hpp loads, with the semantics that header relies on: NULL from a failed
// creation and the reason in rbln_get_last_error_msg(), request ids from rbln_async_run, and
// rbln_async_wait with a timeout. A "compiled model" is a directory holding fake_model.json:
//   {"inputs": N, "outputs": M, "bytes": B, "devices": D, "delay_ms": T,
//    "fail_run": false, "never_completes": false}
// A run writes, for every output j and byte i: (sum of input bytes i + j + 1) mod 256, after
// delay_ms on a thread of its own. A path ending in ".rbln" is instead a graph of a compiled
// model directory, computed by Tandem's cpu transformer (fake_graph.hpp).
// Device memory (the optional calls rbln_malloc, rbln_free, rbln_memcpy, rbln_get_device_count):
// host memory handed out as "device" buffers, filled with 0xA5 (so nothing relies on zeroes);
// rbln_memcpy checks its device side lies inside one live allocation. With the environment
// variable RBLN_FAKE_FAIL_MEMCPY_AFTER=N, every rbln_memcpy after the first N fails.
// Built three times: whole, without rbln_async_wait (RBLN_FAKE_WITHOUT_ASYNC_WAIT) and without the
// device-memory calls (RBLN_FAKE_WITHOUT_DEVICE_MEMORY), for the missing-symbol paths.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/rbln_fake/fake_graph.hpp"

namespace {

thread_local std::string last_error;

struct Config {
  int inputs = 1, outputs = 1, devices = 1;
  size_t bytes = 16;
  int delay_ms = 0;
  bool fail_run = false, never_completes = false;
};

std::atomic<int64_t> graph_runs_in_flight{0}, graph_runs_in_flight_max{0};

struct Job {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string error;  // a graph run that failed
  std::thread worker;
};

}  // namespace

extern "C" {

// The C API hands out raw handles that its caller destroys with the matching call, so the fake
// allocates them with new and frees them in rbln_destroy_*: the one place new/delete appear.
struct RBLNModel {
  Config config;
  std::shared_ptr<tandem::rbln_fake::FakeGraph> graph;  // a .rbln graph; null: byte mode
};

struct RBLNRuntime {
  Config config;
  int device_id = 0;
  std::atomic<bool> destroying{false};  // a run waiting for its collective round gives up
  std::shared_ptr<tandem::rbln_fake::FakeGraph> graph;
  std::mutex mu;
  int64_t next_id = 0;
  std::map<int64_t, std::shared_ptr<Job>> jobs;
};

// Not in the RBLN API: the most graph runs submitted and not yet complete at once, across every
// runtime of the process since the last reset (a test reads it with dlsym to see a pipelined
// prefill keep its stages busy together).
int64_t rbln_fake_graph_runs_in_flight_max(int reset) {
  int64_t seen = graph_runs_in_flight_max.load();
  if (reset) graph_runs_in_flight_max = 0;
  return seen;
}

const char* rbln_get_last_error_msg() {
  return last_error.c_str();
}

RBLNModel* rbln_create_model(const char* path) {
  if (path == nullptr) {
    last_error = "rbln_create_model: path is NULL";
    return nullptr;
  }
  std::string p(path);
  if (p.size() > 5 && p.compare(p.size() - 5, 5, ".rbln") == 0) {
    std::string error;
    auto graph = tandem::rbln_fake::open_fake_graph(p, error);
    if (!graph) {
      last_error = error;
      return nullptr;
    }
    auto* m = new RBLNModel;
    m->config.inputs = graph->inputs();
    m->config.outputs = 1;
    m->config.devices = 16;  // a host with 16 NPUs: executors may name devices 0..15
    m->graph = std::move(graph);
    last_error.clear();
    return m;
  }
  std::ifstream in(p + "/fake_model.json");
  if (!in) {
    last_error = std::string("no compiled model at ") + path + " (fake_model.json is missing)";
    return nullptr;
  }
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    last_error = std::string(path) + "/fake_model.json is not a JSON object";
    return nullptr;
  }
  auto* m = new RBLNModel;
  m->config.inputs = j.value("inputs", 1);
  m->config.outputs = j.value("outputs", 1);
  m->config.bytes = j.value("bytes", size_t{16});
  m->config.devices = j.value("devices", 1);
  m->config.delay_ms = j.value("delay_ms", 0);
  m->config.fail_run = j.value("fail_run", false);
  m->config.never_completes = j.value("never_completes", false);
  last_error.clear();
  return m;
}

void rbln_destroy_model(RBLNModel* model) {
  delete model;
}

RBLNRuntime* rbln_create_async_runtime(RBLNModel* model, const char* name, int device_id,
                                       int /*input_info_index*/) {
  if (model == nullptr) {
    last_error = "rbln_create_async_runtime: model is NULL";
    return nullptr;
  }
  if (device_id < 0 || device_id >= model->config.devices) {
    last_error = "no device " + std::to_string(device_id) + " (this host has " +
                 std::to_string(model->config.devices) + ")";
    return nullptr;
  }
  (void)name;
  auto* rt = new RBLNRuntime;
  rt->config = model->config;
  rt->device_id = device_id;
  rt->graph = model->graph;
  return rt;
}

void rbln_destroy_runtime(RBLNRuntime* rt) {
  if (rt == nullptr) return;
  rt->destroying = true;
  for (auto& [id, job] : rt->jobs) {
    if (job->worker.joinable()) job->worker.join();
  }
  delete rt;
}

int rbln_get_num_inputs(RBLNRuntime* rt) {
  return rt ? rt->config.inputs : -1;
}
int rbln_get_num_outputs(RBLNRuntime* rt) {
  return rt ? rt->config.outputs : -1;
}

int64_t rbln_async_run(RBLNRuntime* rt, void** inputs, void** outputs) {
  if (rt == nullptr || inputs == nullptr || outputs == nullptr) {
    last_error = "rbln_async_run: NULL runtime or buffers";
    return -1;
  }
  if (rt->config.fail_run) {
    last_error = "the device failed the run (fake: fail_run)";
    return -1;
  }
  auto job = std::make_shared<Job>();
  int64_t id = 0;
  {
    std::lock_guard lock(rt->mu);
    id = ++rt->next_id;
    rt->jobs[id] = job;
  }
  if (rt->config.never_completes || (rt->graph && rt->graph->hangs())) return id;
  if (rt->graph) {
    std::vector<void*> in(inputs, inputs + rt->config.inputs);
    const uint64_t round = rt->graph->submit(rt->device_id);
    int64_t now = ++graph_runs_in_flight;
    for (int64_t seen = graph_runs_in_flight_max.load();
         now > seen && !graph_runs_in_flight_max.compare_exchange_weak(seen, now);) {
    }
    job->worker = std::thread([rt, round, in, out = outputs[0], job] {
      std::string error = rt->graph->run(in, out, rt->device_id, round, rt->destroying);
      --graph_runs_in_flight;
      std::lock_guard lock(job->mu);
      job->error = std::move(error);
      job->done = true;
      job->cv.notify_all();
    });
    return id;
  }
  Config c = rt->config;
  std::vector<const uint8_t*> in;
  for (int k = 0; k < c.inputs; ++k) in.push_back(static_cast<const uint8_t*>(inputs[k]));
  std::vector<uint8_t*> out;
  for (int k = 0; k < c.outputs; ++k) out.push_back(static_cast<uint8_t*>(outputs[k]));
  job->worker = std::thread([c, in, out, job] {
    std::this_thread::sleep_for(std::chrono::milliseconds(c.delay_ms));
    for (int o = 0; o < c.outputs; ++o) {
      for (size_t i = 0; i < c.bytes; ++i) {
        unsigned sum = static_cast<unsigned>(o) + 1;
        for (const uint8_t* x : in) sum += x[i];
        out[static_cast<size_t>(o)][i] = static_cast<uint8_t>(sum & 0xff);
      }
    }
    std::lock_guard lock(job->mu);
    job->done = true;
    job->cv.notify_all();
  });
  return id;
}

#ifndef RBLN_FAKE_WITHOUT_ASYNC_WAIT
int rbln_async_wait(RBLNRuntime* rt, int64_t request_id, int64_t timeout_ms) {
  if (rt == nullptr) {
    last_error = "rbln_async_wait: runtime is NULL";
    return 3;
  }
  std::shared_ptr<Job> job;
  {
    std::lock_guard lock(rt->mu);
    auto it = rt->jobs.find(request_id);
    if (it != rt->jobs.end()) job = it->second;
  }
  if (!job) {
    last_error = "no request " + std::to_string(request_id);
    return 3;
  }
  std::unique_lock lock(job->mu);
  if (!job->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return job->done; })) {
    last_error = "request " + std::to_string(request_id) + " did not complete within " +
                 std::to_string(timeout_ms) + " ms";
    return 2;
  }
  if (!job->error.empty()) {
    last_error = job->error;
    return 1;
  }
  return 0;
}
#endif

#ifndef RBLN_FAKE_WITHOUT_DEVICE_MEMORY
}  // extern "C"

namespace {

std::mutex allocations_mu;
std::map<uintptr_t, uint64_t> allocations;  // base -> size, the live "device" buffers
std::atomic<int64_t> memcpy_calls{0};
constexpr int kDevices = 16;                      // rbln_get_device_count's answer
std::atomic<uint64_t> memcpy_bytes[kDevices][3];  // per device and copy type, since the reset

// True when [p, p + size) lies in one live allocation.
bool on_device(const void* p, uint64_t size) {
  auto at = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(allocations_mu);
  auto it = allocations.upper_bound(at);
  if (it == allocations.begin()) return false;
  --it;
  return at + size <= it->first + it->second;
}

}  // namespace

extern "C" {

int rbln_get_device_count(int* count) {
  if (count == nullptr) return 2;
  *count = kDevices;
  return 0;
}

int rbln_malloc(int device_id, uint64_t size, void** device_ptr) {
  if (device_ptr == nullptr || size == 0 || device_id < 0 || device_id >= kDevices) {
    last_error = "rbln_malloc: bad arguments (device " + std::to_string(device_id) + ", " +
                 std::to_string(size) + " bytes)";
    return 2;
  }
  void* p = std::malloc(size);
  if (p == nullptr) {
    last_error = "rbln_malloc: out of device memory for " + std::to_string(size) + " bytes";
    return 1;
  }
  std::memset(p, 0xA5, size);
  std::lock_guard lock(allocations_mu);
  allocations[reinterpret_cast<uintptr_t>(p)] = size;
  *device_ptr = p;
  return 0;
}

int rbln_free(int /*device_id*/, void* device_ptr) {
  std::lock_guard lock(allocations_mu);
  auto it = allocations.find(reinterpret_cast<uintptr_t>(device_ptr));
  if (it == allocations.end()) {
    last_error = "rbln_free: not a device buffer";
    return 2;
  }
  allocations.erase(it);
  std::free(device_ptr);
  return 0;
}

// Not in the RBLN API: the bytes rbln_memcpy copied for `device_id` with `type` (0 host to
// device, 1 device to host, 2 device to device) since the last reset (a test reads it with dlsym
// to see which ranks a copy went to).
uint64_t rbln_fake_memcpy_bytes(int device_id, int type, int reset) {
  if (device_id < 0 || device_id >= kDevices || type < 0 || type > 2) return 0;
  return reset ? memcpy_bytes[device_id][type].exchange(0) : memcpy_bytes[device_id][type].load();
}

int rbln_memcpy(int device_id, void* dst, const void* src, uint64_t size, int type) {
  if (const char* after = std::getenv("RBLN_FAKE_FAIL_MEMCPY_AFTER")) {
    if (memcpy_calls.fetch_add(1) >= std::atoll(after)) {
      last_error = "the device faulted during a copy (fake: RBLN_FAKE_FAIL_MEMCPY_AFTER)";
      return 1;
    }
  }
  if (type < 0 || type > 2 || dst == nullptr || src == nullptr ||
      ((type == 0 || type == 2) && !on_device(dst, size)) ||
      ((type == 1 || type == 2) && !on_device(src, size))) {
    last_error = "rbln_memcpy: type " + std::to_string(type) + ", " + std::to_string(size) +
                 " bytes: the device side is not inside a device buffer";
    return 2;
  }
  std::memmove(dst, src, size);
  if (device_id >= 0 && device_id < kDevices) memcpy_bytes[device_id][type] += size;
  return 0;
}
#endif

}  // extern "C"
