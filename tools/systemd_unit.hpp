// `tandem systemd`: a systemd service unit per node, so a bare-metal host runs its node the way
// it runs any daemon: restarted on failure, SIGTERM to stop (the node drains first: the stop
// timeout covers [supervisor] drain_timeout_ms), the memory-lock limit RDMA registration needs,
// logs in the journal. Pure: text in, text out.
#pragma once

#include <string>

#include "config/manifest.hpp"
#include "runtime/base/result.hpp"

namespace tandem::tools {

// The unit's file name: "tandem-<cluster>-<node>.service".
std::string systemd_unit_name(const config::Manifest& manifest, const std::string& node);

// The unit for `node`, running `tandem_bin` with the manifest at `manifest_path` (both
// absolute; asserted). Error: not_found naming the nodes the manifest has.
Result<std::string> systemd_unit(const config::Manifest& manifest, const std::string& node,
                                 const std::string& tandem_bin, const std::string& manifest_path);

}  // namespace tandem::tools
