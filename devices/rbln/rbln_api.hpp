// The RBLN runtime's C API (rbln/rbln.h, librbln_runtime.so), loaded at run time with dlopen so
// Tandem builds and tests without the SDK. Every symbol the backend calls is resolved when the
// library is loaded: a missing library or symbol is one startup error naming it and the path
// tried. The calls and their semantics follow the public docs and Rebellions' own examples
// (../shared/RBLN-NOTES.md); none has run on a Rebel100 here (docs/STATUS.md: Unverified).
//
// Semantics relied on (the conformance fake, tests/rbln_fake/, implements exactly these):
//   - creation calls return NULL on failure, and rbln_get_last_error_msg() says why;
//   - the other calls return 0 (RBLNRetCode_SUCCESS) on success, anything else on failure,
//     with the last error message set;
//   - rbln_async_run(rt, inputs, outputs) queues a run on caller-owned buffers and returns a
//     request id (negative on failure); rbln_async_wait(rt, id, timeout_ms) returns 0 once that
//     run completed, non-zero when it failed or did not complete within timeout_ms.
// Thread-safety: the API object is immutable after load(); a runtime handle is used by one
// thread at a time (the executor's).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/base/result.hpp"

// The C API's opaque handles, at global scope as rbln/rbln.h declares them: a type declared
// inside our namespace would be a different type, and calling the library's functions through
// pointers naming it is undefined (clang's -fsanitize=function reports each call).
extern "C" {
struct RBLNModel;
struct RBLNRuntime;
}

namespace tandem::devices::rbln {

using ::RBLNModel;
using ::RBLNRuntime;

// The resolved entry points. Names are the C symbols'.
struct RblnApi {
  using CreateModel = RBLNModel* (*)(const char* path);
  using DestroyModel = void (*)(RBLNModel*);
  using CreateAsyncRuntime = RBLNRuntime* (*)(RBLNModel*, const char* name, int device_id,
                                              int input_info_index);
  using DestroyRuntime = void (*)(RBLNRuntime*);
  using GetCount = int (*)(RBLNRuntime*);
  using AsyncRun = int64_t (*)(RBLNRuntime*, void** inputs, void** outputs);
  using AsyncWait = int (*)(RBLNRuntime*, int64_t request_id, int64_t timeout_ms);
  using LastError = const char* (*)();
  // The device-memory header's calls (rebel/runtime/api/rbln_runtime_api.h, vendored in
  // RBLN-SW/torch-rbln; not the documented model API): RBLNRetCode results, 0 = success.
  using DeviceCount = int (*)(int* count);
  using Malloc = int (*)(int device_id, uint64_t size, void** device_ptr);
  using Free = int (*)(int device_id, void* device_ptr);
  // type: 0 host to device, 1 device to host, 2 device to device (RBLNMemcpyType).
  using Memcpy = int (*)(int device_id, void* dst, const void* src, uint64_t size, int type);

  CreateModel create_model = nullptr;
  DestroyModel destroy_model = nullptr;
  CreateAsyncRuntime create_async_runtime = nullptr;
  DestroyRuntime destroy_runtime = nullptr;
  GetCount num_inputs = nullptr;
  GetCount num_outputs = nullptr;
  AsyncRun async_run = nullptr;
  AsyncWait async_wait = nullptr;
  LastError last_error_msg = nullptr;
  // Optional (the device-memory header): probed with dlsym, null when the library lacks them.
  DeviceCount device_count = nullptr;
  Malloc malloc_device = nullptr;
  Free free_device = nullptr;
  Memcpy memcpy_device = nullptr;

  std::string path;  // the library loaded

  // dlopen(path) and resolve every required symbol. Errors (failed): "cannot load PATH: why"
  // or "PATH has no symbol NAME (dlsym: why)", naming the first missing one.
  static Result<std::shared_ptr<const RblnApi>> load(const std::string& path);
  // KV on the device (kv_memory = "device") needs rbln_malloc, rbln_free and rbln_memcpy.
  // failed naming the first one this library lacks, and the path.
  Status require_device_memory() const;
  // The library's last error message, "" when none.
  std::string last_error() const;

  RblnApi() = default;
  ~RblnApi();
  RblnApi(const RblnApi&) = delete;
  RblnApi& operator=(const RblnApi&) = delete;

 private:
  void* handle_ = nullptr;
};

// The symbols load() resolves (required ones, in order), for `tandem check` and docs.
const std::vector<std::string>& rbln_required_symbols();

// A compiled model and one asynchronous runtime on one device. Move-only; destroys both.
class RblnRuntime {
 public:
  // Errors (failed, naming the path or device and the library's message): the model cannot be
  // created from `model_dir`, or no runtime on `device_id`.
  static Result<RblnRuntime> open(std::shared_ptr<const RblnApi> api, const std::string& model_dir,
                                  const std::string& name, int device_id);
  RblnRuntime(RblnRuntime&& other) noexcept;
  RblnRuntime& operator=(RblnRuntime&&) = delete;
  RblnRuntime(const RblnRuntime&) = delete;
  ~RblnRuntime();

  int inputs_count() const { return inputs_; }
  int outputs_count() const { return outputs_; }
  // Queues one run; the buffers must stay valid until wait() returned for it. `inputs` and
  // `outputs` hold inputs_count() / outputs_count() pointers (asserted). Error: failed, with
  // the library's message.
  Result<int64_t> submit(const std::vector<void*>& inputs, const std::vector<void*>& outputs);
  // Waits up to `timeout` for the run `request`. Errors: timed_out when it did not complete in
  // time, failed (with the library's message) when it failed.
  Status wait(int64_t request, std::chrono::milliseconds timeout);

 private:
  RblnRuntime(std::shared_ptr<const RblnApi> api, RBLNModel* model, RBLNRuntime* runtime);
  std::shared_ptr<const RblnApi> api_;
  RBLNModel* model_ = nullptr;
  RBLNRuntime* runtime_ = nullptr;
  int inputs_ = 0, outputs_ = 0;
};

}  // namespace tandem::devices::rbln
