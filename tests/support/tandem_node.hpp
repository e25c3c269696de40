// Test support: one `tandem node` serving stories15M with every role (like
// config/examples/local.toml) on free loopback ports, with extra [gateway] keys, plus a
// socket probe for its HTTP port. The node runs until the object is destroyed (SIGTERM, then
// SIGKILL after 5 s) and its temp dir (manifest, node.log) is removed.
// Requires $TANDEM_SOURCE_ROOT/models/stories15M (tools/setup.sh).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/process.hpp"

namespace tandem::testing {

// Status of `GET path` on 127.0.0.1:port, or 0 when nothing answers within `timeout_ms`.
inline int http_get_status(uint16_t port, const std::string& path, int timeout_ms = 1000) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    std::string req = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      pollfd p{fd, POLLIN, 0};
      char buf[512];
      while (reply.size() < 12 && poll(&p, 1, timeout_ms) > 0) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        reply.append(buf, static_cast<size_t>(n));
      }
    }
  }
  close(fd);
  if (reply.size() < 12 || reply.rfind("HTTP/1.1 ", 0) != 0) return 0;
  return std::atoi(reply.substr(9, 3).c_str());
}

// The first executable called `name` on $PATH, or "" if none.
inline std::string find_on_path(const std::string& name) {
  std::string path = env_or("PATH", "/usr/local/bin:/usr/bin:/bin");
  size_t at = 0;
  while (at <= path.size()) {
    size_t end = path.find(':', at);
    if (end == std::string::npos) end = path.size();
    std::string candidate = path.substr(at, end - at) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    at = end + 1;
  }
  return "";
}

class TandemNode {
 public:
  // `gateway_toml`: extra lines for the [gateway] section (e.g. "api_keys = [\"sk-test\"]").
  // `node_args`: extra arguments for `tandem node` (e.g. "--test-hooks").
  explicit TandemNode(const std::string& gateway_toml, const std::string& tag = "node",
                      const std::vector<std::string>& node_args = {})
      : dir_(make_temp_dir(tag)), http_port_(free_port()), admin_port_(free_port()) {
    if (access(tandem_bin().c_str(), X_OK) != 0) {
      throw std::runtime_error(tandem_bin() + " is not executable (is TANDEM_BUILD_ROOT set?)");
    }
    manifest_path_ = dir_ + "/local.toml";
    write_file(manifest_path_, manifest_text(gateway_toml));
    std::vector<std::string> argv = {tandem_bin(), "node", "--manifest", manifest_path_,
                                     "--node", "local"};
    argv.insert(argv.end(), node_args.begin(), node_args.end());
    child_ = std::make_unique<Child>(std::move(argv), dir_ + "/node.log");
  }
  TandemNode(const TandemNode&) = delete;
  TandemNode& operator=(const TandemNode&) = delete;
  ~TandemNode() {
    child_->signal(SIGTERM);
    child_->wait(std::chrono::milliseconds(5000));
    child_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  // True once GET /health answers 200 (the gateway reaches a decode instance).
  bool wait_healthy(std::chrono::milliseconds timeout) {
    return eventually(timeout, [this] {
      return child_->running() && http_get_status(http_port_, "/health") == 200;
    });
  }
  uint16_t http_port() const { return http_port_; }
  uint16_t admin_port() const { return admin_port_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(http_port_); }
  std::string log() const { return child_->log(); }
  bool running() { return child_->running(); }
  const std::string& manifest_path() const { return manifest_path_; }

 private:
  std::string manifest_text(const std::string& gateway_toml) {
    auto port = [](uint16_t p) { return std::to_string(p); };
    std::string text = "[cluster]\nname = \"" + std::string("it-local") +
                       "\"\nprotocol_version = 1\n[fabric]\nprovider = \"tcp;ofi_rxm\"\n"
                       "[logging]\nlevel = \"warn\"\n[model]\nname = \"stories15M\"\n"
                       "path = \"" + source_root() + "/models/stories15M\"\n"
                       "block_tokens = 16\nmax_model_tokens = 256\nchat_format = \"plain\"\n"
                       "[router]\npolicy = \"prefix-aware\"\n[gateway]\n" + gateway_toml + "\n";
    text += "[[node]]\nname = \"local\"\nhost = \"127.0.0.1\"\nfabric_port = " +
            port(free_port()) + "\nadmin_port = " + port(admin_port_) +
            "\nhttp_port = " + port(http_port_) + "\n";
    auto instance = [](const std::string& body) { return "[[node.instance]]\n" + body + "\n"; };
    text += instance("role = \"gateway\"\nname = \"gateway\"");
    text += instance("role = \"router\"\nname = \"router\"");
    text += instance("role = \"prefill\"\nname = \"prefill\"\nexecutor = \"exec-prefill\"");
    text += instance("role = \"decode\"\nname = \"decode\"\nexecutor = \"exec-decode\"");
    text += instance("role = \"kv-offload\"\nname = \"kv-offload\"");
    text += instance("role = \"executor\"\nname = \"exec-prefill\"\ndevice = \"cpu\"\n"
                     "devices = [0]");
    text += instance("role = \"executor\"\nname = \"exec-decode\"\ndevice = \"cpu\"\n"
                     "devices = [1]");
    return text;
  }

  std::string dir_;
  std::string manifest_path_;
  uint16_t http_port_;
  uint16_t admin_port_;
  std::unique_ptr<Child> child_;
};

}  // namespace tandem::testing
