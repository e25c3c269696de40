// The credentials a node or a client of the cluster connects with, and the channel built on
// them (runtime/fabric/secure_channel.hpp).
//
// Key files: a file whose bytes (trailing whitespace removed) are the key; 32 to 4096 bytes;
// owned by the user that reads it and unreadable by group and others (mode 0600 or 0400), or
// it is refused with the file and what is wrong. `tandem keygen FILE` writes one (64 hex
// digits of randomness, mode 0600).
//
// Which keys:
//   - a node connects with [cluster] key_file and accepts it, every [cluster]
//     accept_key_files, and the [admin] token_file (its holders may only administer);
//   - a manifest with no key_file (only allowed when its nodes are on one host) uses the key
//     at auto_key_path(), made on first use by whichever of `tandem up`, `tandem node` or
//     `tandem shell` comes first (mode 0600 in a private state directory);
//   - a client connects with an explicit token file when given, else with the cluster key
//     when it can read it, else with [admin] token_file.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/manifest.hpp"
#include "runtime/fabric/secure_channel.hpp"

namespace tandem::runtime {

Result<ChannelKey> load_key_file(const std::string& path, KeyRole role);
// Writes a new key to `path` (never over an existing file): 32 random bytes as 64 hex digits
// and a newline, mode 0600, synced.
Status write_key_file(const std::string& path);

// The key file of a keyless single-host manifest: in the node's state directory, named after
// the cluster and the manifest's path.
std::string auto_key_path(const config::Manifest& manifest);
// The cluster key of `manifest`: key_file, or the auto key (made when absent and `create`).
Result<ChannelKey> cluster_key(const config::Manifest& manifest, bool create);

// What a node accepts, the key it connects with first.
Result<std::vector<ChannelKey>> node_keys(const config::Manifest& manifest);
// What a client connects with (see above); `token_file` "" = none given.
Result<std::vector<ChannelKey>> client_keys(const config::Manifest& manifest,
                                            const std::string& token_file);

// Who may connect to node `self`: a manifest node (with the cluster key) only at its manifest
// address; a client under a name no node has, at the address it gives. The address to answer.
Result<std::string> admit_to_node(const config::Manifest& manifest, const std::string& self,
                                  const PeerClaim& claim);
// What a client accepts answering it: manifest nodes at their manifest addresses.
Result<std::string> admit_to_client(const config::Manifest& manifest, const PeerClaim& claim);

// The channels. `manifest` outlives them.
Result<std::shared_ptr<SecureChannel>> node_channel(const config::Manifest& manifest,
                                                    const std::string& node);
Result<std::shared_ptr<SecureChannel>> client_channel(const config::Manifest& manifest,
                                                      const std::string& client_name,
                                                      const std::string& token_file = "");

}  // namespace tandem::runtime
