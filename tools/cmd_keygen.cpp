// `tandem keygen FILE`: writes a new cluster key (or admin token) for [cluster] key_file /
// [admin] token_file.
#include <cstdio>

#include "runtime/node/credentials.hpp"
#include "tools/commands.hpp"

namespace tandem::tools {

int cmd_keygen(cli::Args args) {
  cli::Flags flags("tandem keygen FILE",
                   "Writes a new key to FILE (never over an existing file): 32 random bytes as 64\n"
                   "hex digits, mode 0600. Name it as [cluster] key_file (every node and the shell\n"
                   "of the cluster must have it: copy it to each host, mode 0600, owned by the user\n"
                   "that runs tandem) or as [admin] token_file (operators' credential, which lets\n"
                   "its holder run admin commands but not join as a node).");
  flags.positional("FILE", "where to write the key");
  int code = 0;
  if (!flags.parse(args, &code)) return code;
  std::string path = flags.get("FILE");
  if (Status s = runtime::write_key_file(path); !s.ok()) {
    std::fprintf(stderr, "tandem keygen: %s\n", s.error().message.c_str());
    return 1;
  }
  auto key = runtime::load_key_file(path, runtime::KeyRole::cluster);
  if (!key.ok()) {
    std::fprintf(stderr, "tandem keygen: %s\n", key.error().message.c_str());
    return 1;
  }
  std::printf("wrote a key to %s (key id %08x, mode 0600)\n", path.c_str(), key->id());
  return 0;
}

}  // namespace tandem::tools
