#include "devices/rbln/rbln_api.hpp"

#include <dlfcn.h>

#include <utility>

#include "runtime/base/assert.hpp"

namespace tandem::devices::rbln {
namespace {

std::string dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown error";
}

}  // namespace

const std::vector<std::string>& rbln_required_symbols() {
  static const std::vector<std::string> names = {
      "rbln_create_model",    "rbln_destroy_model",  "rbln_create_async_runtime",
      "rbln_destroy_runtime", "rbln_get_num_inputs", "rbln_get_num_outputs",
      "rbln_async_run",       "rbln_async_wait",     "rbln_get_last_error_msg"};
  return names;
}

RblnApi::~RblnApi() {
  if (handle_) dlclose(handle_);
}

Result<std::shared_ptr<const RblnApi>> RblnApi::load(const std::string& path) {
  auto api = std::make_shared<RblnApi>();
  api->path = path;
  dlerror();
  api->handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!api->handle_) {
    return make_error(ErrorKind::failed, "cannot load " + path + ": " + dl_error());
  }
  auto resolve = [&](const char* name, auto& slot) -> Status {
    dlerror();
    void* sym = dlsym(api->handle_, name);
    if (!sym) {
      return make_error(ErrorKind::failed,
                        path + " has no symbol " + name + " (dlsym: " + dl_error() + ")");
    }
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(sym);
    return {};
  };
  for (Status s :
       {resolve("rbln_create_model", api->create_model),
        resolve("rbln_destroy_model", api->destroy_model),
        resolve("rbln_create_async_runtime", api->create_async_runtime),
        resolve("rbln_destroy_runtime", api->destroy_runtime),
        resolve("rbln_get_num_inputs", api->num_inputs),
        resolve("rbln_get_num_outputs", api->num_outputs),
        resolve("rbln_async_run", api->async_run), resolve("rbln_async_wait", api->async_wait),
        resolve("rbln_get_last_error_msg", api->last_error_msg)}) {
    if (!s.ok()) return s.error();
  }
  // Optional: the device-memory header's calls (host staging for KV) are probed, not required.
  dlerror();
  api->device_count = reinterpret_cast<DeviceCount>(dlsym(api->handle_, "rbln_get_device_count"));
  api->malloc_device = reinterpret_cast<Malloc>(dlsym(api->handle_, "rbln_malloc"));
  api->free_device = reinterpret_cast<Free>(dlsym(api->handle_, "rbln_free"));
  api->memcpy_device = reinterpret_cast<Memcpy>(dlsym(api->handle_, "rbln_memcpy"));
  RT_ASSERT(api->create_model && api->async_wait && api->last_error_msg, path);
  return std::shared_ptr<const RblnApi>(std::move(api));
}

Status RblnApi::require_device_memory() const {
  const char* missing = !malloc_device   ? "rbln_malloc"
                        : !free_device   ? "rbln_free"
                        : !memcpy_device ? "rbln_memcpy"
                                         : nullptr;
  if (!missing) return {};
  return make_error(ErrorKind::failed, path + " has no symbol " + missing +
                                           ": [rbln] kv_memory = \"device\" needs the runtime's "
                                           "device-memory calls (rbln_malloc, rbln_free, "
                                           "rbln_memcpy)");
}

std::string RblnApi::last_error() const {
  const char* m = last_error_msg ? last_error_msg() : nullptr;
  return m ? m : "";
}

RblnRuntime::RblnRuntime(std::shared_ptr<const RblnApi> api, RBLNModel* model, RBLNRuntime* runtime)
    : api_(std::move(api)), model_(model), runtime_(runtime) {
  inputs_ = api_->num_inputs(runtime_);
  outputs_ = api_->num_outputs(runtime_);
}

RblnRuntime::RblnRuntime(RblnRuntime&& other) noexcept
    : api_(std::move(other.api_)),
      model_(std::exchange(other.model_, nullptr)),
      runtime_(std::exchange(other.runtime_, nullptr)),
      inputs_(other.inputs_),
      outputs_(other.outputs_) {}

RblnRuntime::~RblnRuntime() {
  if (runtime_) api_->destroy_runtime(runtime_);
  if (model_) api_->destroy_model(model_);
}

Result<RblnRuntime> RblnRuntime::open(std::shared_ptr<const RblnApi> api,
                                      const std::string& model_dir, const std::string& name,
                                      int device_id) {
  RT_ASSERT(api != nullptr);
  RBLNModel* model = api->create_model(model_dir.c_str());
  if (!model) {
    return make_error(ErrorKind::failed,
                      "rbln_create_model(" + model_dir + ") failed: " + api->last_error());
  }
  RBLNRuntime* rt = api->create_async_runtime(model, name.c_str(), device_id, 0);
  if (!rt) {
    std::string why = api->last_error();
    api->destroy_model(model);
    return make_error(ErrorKind::failed, "rbln_create_async_runtime(" + name + ", device " +
                                             std::to_string(device_id) + ") failed: " + why);
  }
  RblnRuntime out(std::move(api), model, rt);
  if (out.inputs_ < 0 || out.outputs_ < 0) {
    return make_error(
        ErrorKind::failed,
        "the runtime of " + model_dir + " reports no inputs or outputs: " + out.api_->last_error());
  }
  return out;
}

Result<int64_t> RblnRuntime::submit(const std::vector<void*>& inputs,
                                    const std::vector<void*>& outputs) {
  RT_ASSERT(static_cast<int>(inputs.size()) == inputs_, inputs.size(), inputs_);
  RT_ASSERT(static_cast<int>(outputs.size()) == outputs_, outputs.size(), outputs_);
  int64_t id = api_->async_run(runtime_, const_cast<void**>(inputs.data()),
                               const_cast<void**>(outputs.data()));
  if (id < 0) return make_error(ErrorKind::failed, "rbln_async_run failed: " + api_->last_error());
  return id;
}

Status RblnRuntime::wait(int64_t request, std::chrono::milliseconds timeout) {
  auto started = std::chrono::steady_clock::now();
  int rc = api_->async_wait(runtime_, request, timeout.count());
  if (rc == 0) return {};
  std::string why = api_->last_error();
  bool out_of_time = std::chrono::steady_clock::now() - started >= timeout;
  return make_error(out_of_time ? ErrorKind::timed_out : ErrorKind::failed,
                    "rbln_async_wait(request " + std::to_string(request) + ", " +
                        std::to_string(timeout.count()) + " ms) returned " + std::to_string(rc) +
                        ": " + (why.empty() ? "no message" : why));
}

}  // namespace tandem::devices::rbln
