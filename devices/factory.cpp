// make_device(): the one place that knows every backend.
#include "devices/cpu/cpu_device.hpp"
#include "devices/device.hpp"
#include "devices/rbln/rbln_device.hpp"
#include "devices/sim/sim_device.hpp"

namespace tandem::devices {

Result<std::unique_ptr<Device>> make_device(const DeviceSpec& spec) {
  switch (spec.kind) {
    case config::DeviceKind::cpu:
      return cpu::make_cpu_device(spec);
    case config::DeviceKind::sim:
      if (!spec.draft_model_path.empty()) {
        return make_error(ErrorKind::unimplemented,
                          "sim device: a draft model (" + spec.draft_model_path +
                              ") is not supported; EAGLE-3 needs device \"cpu\"");
      }
      return sim::make_sim_device(spec);
    case config::DeviceKind::rbln:
      if (!spec.draft_model_path.empty()) {
        return make_error(ErrorKind::unimplemented,
                          "rbln device: a draft model (" + spec.draft_model_path +
                              ") is not supported; EAGLE-3 needs device \"cpu\"");
      }
      return rbln::make_rbln_device(spec);
  }
  return make_error(ErrorKind::invalid, "unknown device kind");
}

}  // namespace tandem::devices
