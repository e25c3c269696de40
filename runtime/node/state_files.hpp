// Where a node keeps the small files that outlive its process (the device-lost record, the
// key of a keyless single-host cluster): $STATE_DIRECTORY (systemd's StateDirectory=; the
// first when several) when set, else $XDG_RUNTIME_DIR/tandem, else /tmp/tandem-<uid>.
#pragma once

#include <string>

#include "runtime/base/result.hpp"

namespace tandem::runtime {

std::string state_directory();

// state_directory()/<cluster>[-<node>]-<hash of the manifest's absolute path><suffix>: two
// clusters on one host, or two copies of one manifest, never share a file.
std::string state_file_path(const std::string& cluster, const std::string& node,
                            const std::string& manifest_file, const std::string& suffix);

// Makes state_directory() when absent (mode 0700) and checks it is this user's and not
// writable by anyone else, so another local user cannot plant or swap a file in it.
// $STATE_DIRECTORY (systemd's) is taken as it is, made when absent.
Status ensure_private_state_directory();

}  // namespace tandem::runtime
