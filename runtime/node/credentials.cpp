#include "runtime/node/credentials.hpp"

#include <fcntl.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "runtime/fabric/endpoint.hpp"
#include "runtime/node/state_files.hpp"

namespace tandem::runtime {

namespace {

Error key_error(const std::string& path, const std::string& what) {
  return make_error(ErrorKind::invalid, "key file " + path + ": " + what);
}

std::string manifest_address(const config::Node& node) {
  return node.host + ":" + std::to_string(node.fabric_port);
}

}  // namespace

Result<ChannelKey> load_key_file(const std::string& path, KeyRole role) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return key_error(path, std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return key_error(path, "not a regular file");
  }
  if (st.st_uid != ::geteuid()) {
    ::close(fd);
    return key_error(path, "owned by uid " + std::to_string(st.st_uid) + ", not by this user (" +
                               std::to_string(::geteuid()) + ")");
  }
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return key_error(path, std::string("mode ") + mode +
                               " lets group or others read it; chmod 600 " + path);
  }
  if (st.st_size > static_cast<off_t>(channel_key_bytes_max + 64)) {
    ::close(fd);
    return key_error(path, std::to_string(st.st_size) + " bytes; a key has at most " +
                               std::to_string(channel_key_bytes_max));
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  ssize_t got = bytes.empty() ? 0 : ::read(fd, bytes.data(), bytes.size());
  ::close(fd);
  if (got != static_cast<ssize_t>(bytes.size())) return key_error(path, "short read");
  while (!bytes.empty() && (bytes.back() == '\n' || bytes.back() == '\r' ||
                            bytes.back() == ' ' || bytes.back() == '\t')) {
    bytes.pop_back();
  }
  if (bytes.size() < channel_key_bytes_min || bytes.size() > channel_key_bytes_max) {
    return key_error(path, std::to_string(bytes.size()) + " bytes; a key has at least " +
                               std::to_string(channel_key_bytes_min) +
                               " (write one with `tandem keygen " + path + "`)");
  }
  return ChannelKey{role, std::move(bytes)};
}

Status write_key_file(const std::string& path) {
  uint8_t random[32];
  if (RAND_bytes(random, sizeof random) != 1) {
    return make_error(ErrorKind::failed, "no randomness for a key");
  }
  static const char* hex = "0123456789abcdef";
  std::string text;
  for (uint8_t b : random) {
    text += hex[b >> 4];
    text += hex[b & 15];
  }
  text += "\n";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return key_error(path, std::strerror(errno));
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
            ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) {
    ::unlink(path.c_str());
    return key_error(path, "could not write it");
  }
  return {};
}

std::string auto_key_path(const config::Manifest& manifest) {
  return state_file_path(manifest.cluster.name, "", manifest.file, ".key");
}

Result<ChannelKey> cluster_key(const config::Manifest& manifest, bool create) {
  if (!manifest.cluster.key_file.empty()) {
    return load_key_file(manifest.cluster.key_file, KeyRole::cluster);
  }
  RT_ASSERT(manifest.single_host(), "a keyless manifest on several hosts was refused at load");
  std::string path = auto_key_path(manifest);
  if (::access(path.c_str(), F_OK) != 0 && create) {
    if (Status s = ensure_private_state_directory(); !s.ok()) return s.error();
    // Made beside and linked into place: several nodes starting at once agree on one key,
    // and none reads a half-written file.
    std::string temp = path + ".tmp." + std::to_string(::getpid()) + "." +
                       std::to_string(std::random_device{}());
    if (Status s = write_key_file(temp); !s.ok()) return s.error();
    int rc = ::link(temp.c_str(), path.c_str());
    int link_errno = errno;
    ::unlink(temp.c_str());
    if (rc != 0 && link_errno != EEXIST) {
      return key_error(path, std::string("cannot make it: ") + std::strerror(link_errno));
    }
  }
  return load_key_file(path, KeyRole::cluster);
}

Result<std::vector<ChannelKey>> node_keys(const config::Manifest& manifest) {
  std::vector<ChannelKey> keys;
  auto key = cluster_key(manifest, true);
  if (!key.ok()) return key.error();
  keys.push_back(std::move(key).value());
  for (const auto& file : manifest.cluster.accept_key_files) {
    auto extra = load_key_file(file, KeyRole::cluster);
    if (!extra.ok()) return extra.error();
    keys.push_back(std::move(extra).value());
  }
  if (!manifest.admin.token_file.empty()) {
    auto token = load_key_file(manifest.admin.token_file, KeyRole::admin);
    if (!token.ok()) return token.error();
    keys.push_back(std::move(token).value());
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (keys[i].id() == keys[j].id() && keys[i].role != keys[j].role) {
        return make_error(ErrorKind::invalid,
                          "the admin token is the cluster key: give operators a token of its "
                          "own (tandem keygen)");
      }
    }
  }
  return keys;
}

Result<std::vector<ChannelKey>> client_keys(const config::Manifest& manifest,
                                            const std::string& token_file) {
  if (!token_file.empty()) {
    auto token = load_key_file(token_file, KeyRole::admin);
    if (!token.ok()) return token.error();
    return std::vector<ChannelKey>{std::move(token).value()};
  }
  auto key = cluster_key(manifest, true);
  if (key.ok()) return std::vector<ChannelKey>{std::move(key).value()};
  if (!manifest.admin.token_file.empty()) {
    auto token = load_key_file(manifest.admin.token_file, KeyRole::admin);
    if (token.ok()) return std::vector<ChannelKey>{std::move(token).value()};
    return make_error(ErrorKind::invalid, key.error().message + "; and " + token.error().message);
  }
  return make_error(ErrorKind::invalid,
                    key.error().message + " (an operator without the cluster key uses the admin "
                                          "token: [admin] token_file, or --token-file)");
}

Result<std::string> admit_to_node(const config::Manifest& manifest, const std::string& self,
                                  const PeerClaim& claim) {
  const config::Node* node = manifest.find_node(claim.name);
  if (claim.peer_class == PeerClass::node) {
    if (node == nullptr || node->name == self || claim.key_role != KeyRole::cluster) {
      return make_error(ErrorKind::invalid, "not a node of this cluster");
    }
    return manifest_address(*node);
  }
  if (node != nullptr) return make_error(ErrorKind::invalid, "a client under a node's name");
  if (!split_host_port(claim.address).ok()) return make_error(ErrorKind::invalid, "no address");
  return claim.address;
}

Result<std::string> admit_to_client(const config::Manifest& manifest, const PeerClaim& claim) {
  const config::Node* node = manifest.find_node(claim.name);
  if (claim.peer_class != PeerClass::node || node == nullptr) {
    return make_error(ErrorKind::invalid, "not a node of this cluster");
  }
  return manifest_address(*node);
}

Result<std::shared_ptr<SecureChannel>> node_channel(const config::Manifest& manifest,
                                                    const std::string& node) {
  auto keys = node_keys(manifest);
  if (!keys.ok()) return keys.error();
  ChannelConfig config;
  config.cluster = manifest.cluster.name;
  config.self_name = node;
  config.self_class = PeerClass::node;
  config.keys = std::move(keys).value();
  config.admit = [&manifest, node](const PeerClaim& claim) {
    return admit_to_node(manifest, node, claim);
  };
  return std::make_shared<SecureChannel>(std::move(config));
}

Result<std::shared_ptr<SecureChannel>> client_channel(const config::Manifest& manifest,
                                                      const std::string& client_name,
                                                      const std::string& token_file) {
  auto keys = client_keys(manifest, token_file);
  if (!keys.ok()) return keys.error();
  ChannelConfig config;
  config.cluster = manifest.cluster.name;
  config.self_name = client_name;
  config.self_class = PeerClass::client;
  config.keys = std::move(keys).value();
  config.admit = [&manifest](const PeerClaim& claim) { return admit_to_client(manifest, claim); };
  return std::make_shared<SecureChannel>(std::move(config));
}

}  // namespace tandem::runtime
