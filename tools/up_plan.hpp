// `tandem up`: which nodes of a manifest to start here, and the command line of each.
#pragma once

#include <string>
#include <vector>

#include "config/manifest.hpp"
#include "runtime/base/result.hpp"
#include "tools/launcher.hpp"
#include "tools/local_host.hpp"

namespace tandem::tools {

struct UpRequest {
  std::string manifest_path;      // passed to each child as --manifest
  std::string tandem_bin;         // the tandem binary each child runs
  std::vector<std::string> only;  // node names; empty = every local node
};

// One ChildSpec per selected node: `<tandem_bin> node --manifest M --node NAME`, in manifest
// order. Selection: the nodes whose host is this machine (is_local_host), restricted to
// `only` when given. Errors (invalid):
//   - a name in `only` is not a node of the manifest (names the known nodes);
//   - a name in `only` is a node on another host (names the host);
//   - nothing selected ("no node of MANIFEST is on this host (...)", listing node hosts).
Result<std::vector<ChildSpec>> plan_local_nodes(const config::Manifest& manifest,
                                                const UpRequest& request, const HostIdentity& self);

// Splits "a,b" and repeated values into names, dropping empty pieces.
std::vector<std::string> split_node_list(const std::vector<std::string>& values);

}  // namespace tandem::tools
