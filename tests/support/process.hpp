// Test support: real child processes and loopback ports, with hard timeouts.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace tandem::testing {

inline std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : fallback;
}

inline std::string build_root() { return env_or("TANDEM_BUILD_ROOT", "build"); }
inline std::string source_root() { return env_or("TANDEM_SOURCE_ROOT", "."); }
// The bundled demo model (tools/setup.sh puts it there).
inline std::string model_dir() { return source_root() + "/models/stories15M"; }
inline std::string tandem_bin() { return build_root() + "/tools/tandem"; }

// A free TCP port on 127.0.0.1 for a node a test starts (bound then released, so a test binds
// it moments later). Taken from [20000, 32768), below Linux's ephemeral range (32768-60999 by
// default): the kernel never hands these out as the source port of an outgoing connection,
// so no client socket of this or another test process (meson runs suites in parallel) can
// take a port between its release here and the node's bind. Each process starts at its own
// pseudo-random offset, and a port this process already got is never returned twice (a
// manifest's fabric, admin and HTTP ports must differ).
inline uint16_t free_port() {
  constexpr uint32_t first = 20000, count = 12768;
  static std::set<uint16_t> given;  // ports returned so far, this process
  static uint32_t next = static_cast<uint32_t>(
      (static_cast<uint64_t>(getpid()) * 2654435761u +
       static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())) %
      count);
  for (uint32_t attempt = 0; attempt < count; ++attempt) {
    auto port = static_cast<uint16_t>(first + (next++ % count));
    if (given.count(port)) continue;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) throw std::runtime_error("free_port: socket failed");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    bool bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (bound) {
      given.insert(port);
      return port;
    }
  }
  throw std::runtime_error("free_port: no free port in 20000..32767");
}

inline std::string make_temp_dir(const std::string& tag) {
  std::string pattern = "/tmp/tandem-" + tag + "-XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return buf.data();
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A child process whose stdout+stderr go to a log file. Killed (SIGKILL) on destruction if
// still running.
class Child {
 public:
  Child(std::vector<std::string> argv, std::string log_path) : log_path_(std::move(log_path)) {
    pid_ = fork();
    if (pid_ == 0) {
      int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  Child(const Child&) = delete;
  ~Child() {
    if (running()) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  bool running() {
    if (exited_) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      status_ = status;
      return false;
    }
    return true;
  }
  void signal(int sig) { kill(pid_, sig); }
  // Waits for exit up to `timeout`; returns the wait status or -1 on timeout.
  int wait(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (running()) {
      if (std::chrono::steady_clock::now() > deadline) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return status_;
  }
  std::string log() const { return read_file(log_path_); }

 private:
  pid_t pid_ = -1;
  std::string log_path_;
  bool exited_ = false;
  int status_ = 0;
};

// Runs a command to completion (hard timeout, then SIGKILL); returns exit code and output.
struct RunResult {
  int exit_code = -1;
  std::string output;
};

inline RunResult run(std::vector<std::string> argv, std::chrono::milliseconds timeout) {
  std::string dir = make_temp_dir("run");
  std::string log = dir + "/out.txt";
  Child child(std::move(argv), log);
  int status = child.wait(timeout);
  RunResult result;
  if (status >= 0 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  result.output = read_file(log);
  std::remove(log.c_str());
  rmdir(dir.c_str());
  return result;
}

// Polls `condition` every `poll` until true or timeout; returns whether it became true.
inline bool eventually(std::chrono::milliseconds timeout, const std::function<bool()>& condition,
                       std::chrono::milliseconds poll = std::chrono::milliseconds(20)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(poll);
  }
  return condition();
}

// The line of `text` (a command's table) that starts with `first` and a space (its first
// cell), without its newline; "" when there is none.
inline std::string table_row(const std::string& text, const std::string& first) {
  size_t at = text.rfind('\n' + first + ' ');
  if (at != std::string::npos) ++at;
  if (at == std::string::npos && text.compare(0, first.size() + 1, first + ' ') == 0) at = 0;
  if (at == std::string::npos) return "";
  return text.substr(at, text.find('\n', at) - at);
}

}  // namespace tandem::testing
