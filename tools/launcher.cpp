#include "tools/launcher.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

namespace tandem::tools {

std::string describe_exit(std::string_view name, int wait_status) {
  std::string out = "node '" + std::string(name) + "' ";
  if (WIFEXITED(wait_status)) {
    int code = WEXITSTATUS(wait_status);
    out += "exited with status " + std::to_string(code);
    if (code == runtime::kExitDeviceLost) out += " (an executor's device was lost)";
    return out;
  }
  if (WIFSIGNALED(wait_status))
    return out + "was killed by signal " + std::to_string(WTERMSIG(wait_status));
  return out + "ended with wait status " + std::to_string(wait_status);
}

std::string make_prefix(std::string_view name, size_t width_bytes, size_t colour_index,
                        bool color) {
  RT_ASSERT(width_bytes >= name.size() + 2, width_bytes, name);
  static constexpr const char* palette[] = {"\x1b[36m", "\x1b[33m", "\x1b[32m",
                                            "\x1b[35m", "\x1b[34m", "\x1b[31m"};
  std::string tag = "[" + std::string(name) + "]";
  std::string padding(width_bytes + 1 - tag.size(), ' ');
  if (!color) return tag + padding;
  return palette[colour_index % std::size(palette)] + tag + "\x1b[0m" + padding;
}

LinePrefixer::LinePrefixer(std::string prefix, size_t line_bytes_max)
    : prefix_(std::move(prefix)), line_bytes_max_(line_bytes_max) {
  RT_ASSERT(line_bytes_max_ >= 1, line_bytes_max_);
}

void LinePrefixer::emit(std::string_view line, std::string& out) const {
  out += prefix_;
  out += line;
  out += '\n';
}

void LinePrefixer::feed(std::string_view bytes, std::string& out) {
  while (!bytes.empty()) {
    size_t newline = bytes.find('\n');
    size_t take = newline == std::string_view::npos ? bytes.size() : newline;
    // Fill the pending line up to the limit; a full pending line is emitted as is.
    size_t room = line_bytes_max_ - pending_.size();
    if (take > room) {
      pending_.append(bytes.substr(0, room));
      emit(pending_, out);
      pending_.clear();
      bytes.remove_prefix(room);
      continue;
    }
    pending_.append(bytes.substr(0, take));
    if (newline == std::string_view::npos) break;
    emit(pending_, out);
    pending_.clear();
    bytes.remove_prefix(take + 1);
  }
  RT_ASSERT(pending_.size() <= line_bytes_max_, pending_.size(), line_bytes_max_);
}

void LinePrefixer::finish(std::string& out) {
  if (!pending_.empty()) emit(pending_, out);
  pending_.clear();
}

namespace {

using Clock = std::chrono::steady_clock;
constexpr Clock::time_point never = Clock::time_point::max();

std::string seconds_text(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
      continue;
    }
    if (n <= 0) return;  // the reader is gone; output is best effort from here
    data.remove_prefix(static_cast<size_t>(n));
  }
}

struct Child {
  const ChildSpec* spec = nullptr;
  std::string name;
  pid_t pid = -1;
  int fd = -1;  // read end of its stdout+stderr pipe; -1 once at EOF
  bool reaped = false;
  int wait_status = 0;
  LinePrefixer prefixer;
  runtime::RestartBudget budget;
  Clock::time_point started{};
  Clock::time_point restart_at = never;  // restart on: when to start it again
  bool given_up = false;
};

// Blocks SIGINT/SIGTERM/SIGCHLD, ignores SIGPIPE, and restores both on destruction.
class SignalScope {
 public:
  SignalScope() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGCHLD);
    ::sigprocmask(SIG_BLOCK, &set_, &old_mask_);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &old_pipe_);
    fd_ = ::signalfd(-1, &set_, SFD_CLOEXEC | SFD_NONBLOCK);
  }
  ~SignalScope() {
    if (fd_ >= 0) ::close(fd_);
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;
  int fd() const { return fd_; }
  const sigset_t& old_mask() const { return old_mask_; }

 private:
  sigset_t set_{}, old_mask_{};
  struct sigaction old_pipe_ {};
  int fd_ = -1;
};

class Supervisor {
 public:
  Supervisor(const LauncherOptions& options, const SignalScope& signals)
      : options_(options), signals_(signals) {}

  Status spawn(const ChildSpec& spec, std::string prefix);  // `spec` outlives the supervisor
  LaunchOutcome run();
  void kill_all_now();  // after a failed spawn: SIGKILL and reap everything started

 private:
  Status start(Child& child);
  void on_signals();
  void reap();
  void on_exit(Child& child);
  void restart_due();
  bool pending(const Child& child) const { return !stopping_ && child.restart_at != never; }
  void read_output(Child& child);
  void close_output(Child& child);
  void begin_stop();
  void kill_remaining();
  bool done() const;
  int poll_timeout_ms() const;
  void say(const std::string& line) const {
    write_all(options_.err_fd, "tandem up: " + line + "\n");
  }

  const LauncherOptions& options_;
  const SignalScope& signals_;
  std::vector<Child> children_;
  LaunchOutcome outcome_;
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point kill_deadline_{};
  Clock::time_point drain_deadline_{Clock::time_point::max()};
};

Status Supervisor::spawn(const ChildSpec& spec, std::string prefix) {
  children_.push_back(Child{&spec, spec.name, -1, -1, true, 0,
                            LinePrefixer(std::move(prefix), options_.line_bytes_max),
                            runtime::RestartBudget(options_.restart)});
  Status started = start(children_.back());
  if (!started.ok()) children_.pop_back();
  return started;
}

Status Supervisor::start(Child& child) {
  const ChildSpec& spec = *child.spec;
  std::vector<char*> argv;
  for (const auto& arg : spec.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return make_error(ErrorKind::failed,
                      "pipe for node '" + spec.name + "': " + std::strerror(errno));
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    int saved = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return make_error(ErrorKind::failed,
                      "fork for node '" + spec.name + "': " + std::strerror(saved));
  }
  if (pid == 0) {  // child: only async-signal-safe calls until exec
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    ::signal(SIGPIPE, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &signals_.old_mask(), nullptr);
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    ::execvp(argv[0], argv.data());
    const char* why = std::strerror(errno);
    std::string message = "cannot exec " + spec.argv[0] + ": " + why + "\n";
    write_all(STDERR_FILENO, message);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so the group exists before we might signal it
  ::close(fds[1]);
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  child.pid = pid;
  child.fd = fds[0];
  child.reaped = false;
  child.wait_status = 0;
  child.started = Clock::now();
  child.restart_at = never;
  return {};
}

void Supervisor::kill_all_now() {
  for (auto& child : children_) {
    ::kill(-child.pid, SIGKILL);
    ::waitpid(child.pid, &child.wait_status, 0);
    child.reaped = true;
    close_output(child);
  }
}

void Supervisor::close_output(Child& child) {
  if (child.fd < 0) return;
  std::string out;
  child.prefixer.finish(out);
  write_all(options_.out_fd, out);
  ::close(child.fd);
  child.fd = -1;
}

void Supervisor::read_output(Child& child) {
  char buf[16 * 1024];
  std::string out;
  while (child.fd >= 0) {
    ssize_t n = ::read(child.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;  // EAGAIN: nothing more for now
    if (n == 0) {
      write_all(options_.out_fd, out);
      out.clear();
      close_output(child);
      break;
    }
    child.prefixer.feed(std::string_view(buf, static_cast<size_t>(n)), out);
    if (out.size() >= sizeof buf) {
      write_all(options_.out_fd, out);
      out.clear();
    }
  }
  write_all(options_.out_fd, out);
}

void Supervisor::begin_stop() {
  if (stopping_) return;
  stopping_ = true;
  kill_deadline_ = Clock::now() + options_.grace;
  for (auto& child : children_) child.restart_at = never;  // pending restarts are cancelled
  for (auto& child : children_) {
    if (!child.reaped) ::kill(-child.pid, SIGTERM);
  }
}

void Supervisor::kill_remaining() {
  RT_ASSERT(stopping_, "kill_remaining before stopping");
  killed_ = true;
  for (auto& child : children_) {
    if (!child.reaped) {
      say("node '" + child.name + "' did not stop within " +
          std::to_string(options_.grace.count()) + " ms; killing it");
      outcome_.killed_nodes.push_back(child.name);
      ::kill(-child.pid, SIGKILL);
    } else if (child.fd >= 0) {
      ::kill(-child.pid, SIGKILL);  // its group still holds the pipe open
    }
  }
}

void Supervisor::on_signals() {
  signalfd_siginfo info;
  while (::read(signals_.fd(), &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    if (info.ssi_signo == SIGCHLD) continue;  // reap() runs after every wake-up
    if (stopping_ && !killed_) {
      say("stop signal while stopping; killing the cluster now");
      kill_remaining();
      continue;
    }
    if (!stopping_) {
      say("stopping the cluster (signal " + std::to_string(info.ssi_signo) + ")");
      outcome_.stop_requested = true;
      begin_stop();
    }
  }
}

void Supervisor::reap() {
  for (auto& child : children_) {
    if (child.reaped) continue;
    pid_t got = ::waitpid(child.pid, &child.wait_status, WNOHANG);
    if (got != child.pid) continue;
    child.reaped = true;
    read_output(child);  // its last words come before our message
    if (!stopping_) on_exit(child);
  }
  bool all_reaped = std::all_of(children_.begin(), children_.end(),
                                [&](const Child& c) { return c.reaped && !pending(c); });
  if (all_reaped && drain_deadline_ == Clock::time_point::max()) {
    // Grandchildren may hold a pipe open; give their output a moment, then stop reading.
    drain_deadline_ = Clock::now() + std::chrono::milliseconds(500);
  }
}

void Supervisor::on_exit(Child& child) {
  std::string what = describe_exit(child.name, child.wait_status);
  const runtime::RestartPolicy& policy = options_.restart;
  if (policy.restarts_max == 0) {
    say(what + "; stopping the cluster");
    outcome_.failed_node = child.name;
    outcome_.failed_wait_status = child.wait_status;
    begin_stop();
    return;
  }
  auto now = Clock::now();
  auto ran_for = std::chrono::duration_cast<std::chrono::milliseconds>(now - child.started);
  if (auto delay = child.budget.next_delay(now, ran_for)) {
    child.restart_at = now + *delay;
    say(what + "; restarting it in " + seconds_text(*delay) + " (restart " +
        std::to_string(child.budget.restarts_in_window(now + *delay)) + " of at most " +
        std::to_string(policy.restarts_max) + " per " + seconds_text(policy.window_ms) + ")");
    return;
  }
  child.given_up = true;
  outcome_.given_up_nodes.push_back(child.name);
  say(what + "; it was restarted " + std::to_string(policy.restarts_max) + " times within " +
      seconds_text(policy.window_ms) + ": giving up on it; the other nodes keep serving");
  bool any_left = std::any_of(children_.begin(), children_.end(),
                              [&](const Child& c) { return !c.reaped || pending(c); });
  if (!any_left) {
    say("no node is left running; stopping");
    outcome_.failed_node = child.name;
    outcome_.failed_wait_status = child.wait_status;
    begin_stop();
  }
}

void Supervisor::restart_due() {
  auto now = Clock::now();
  for (auto& child : children_) {
    if (!pending(child) || now < child.restart_at) continue;
    // What its previous run left in its process group (and the pipe they hold) goes first.
    if (child.fd >= 0) ::kill(-child.pid, SIGKILL);
    close_output(child);
    Status started = start(child);
    if (!started.ok()) {
      child.restart_at = never;
      child.given_up = true;
      outcome_.given_up_nodes.push_back(child.name);
      say("node '" + child.name + "' could not be restarted (" + started.error().message +
          "): giving up on it");
      continue;
    }
    ++outcome_.restarts;
    drain_deadline_ = never;
    say("node '" + child.name + "' restarted (pid " + std::to_string(child.pid) + ")");
  }
}

bool Supervisor::done() const {
  for (const auto& child : children_) {
    if (pending(child)) return false;
    if (!child.reaped) return false;
    if (child.fd >= 0 && Clock::now() < drain_deadline_) return false;
  }
  return true;
}

int Supervisor::poll_timeout_ms() const {
  Clock::time_point next = drain_deadline_;
  if (stopping_ && !killed_) next = std::min(next, kill_deadline_);
  for (const auto& child : children_) {
    if (pending(child)) next = std::min(next, child.restart_at);
  }
  if (next == Clock::time_point::max()) return 1000;  // SIGCHLD wakes us; this is a backstop
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, 1000));
}

LaunchOutcome Supervisor::run() {
  RT_ASSERT(!children_.empty(), "run() without children");
  while (!done()) {
    std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
    std::vector<Child*> owners{nullptr};
    for (auto& child : children_) {
      if (child.fd < 0) continue;
      fds.push_back({child.fd, POLLIN, 0});
      owners.push_back(&child);
    }
    int ready = ::poll(fds.data(), fds.size(), poll_timeout_ms());
    RT_ASSERT(ready >= 0 || errno == EINTR, "poll failed:", std::strerror(errno));
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) read_output(*owners[i]);
    }
    if (fds[0].revents != 0) on_signals();
    reap();
    restart_due();
    if (stopping_ && !killed_ && Clock::now() >= kill_deadline_) kill_remaining();
  }
  for (auto& child : children_) close_output(child);
  outcome_.exit_code =
      outcome_.failed_node.empty() && outcome_.given_up_nodes.empty() && outcome_.stop_requested
          ? 0
          : 1;
  return outcome_;
}

}  // namespace

Result<LaunchOutcome> run_cluster(const std::vector<ChildSpec>& children,
                                  const LauncherOptions& options) {
  RT_ASSERT(!children.empty(), "run_cluster needs at least one child");
  RT_ASSERT(options.grace.count() >= 0, options.grace.count());
  size_t width = 0;
  std::set<std::string> names;
  for (const auto& spec : children) {
    RT_ASSERT(!spec.name.empty() && !spec.argv.empty(), "child without name or argv");
    RT_ASSERT(names.insert(spec.name).second, "duplicate child name:", spec.name);
    width = std::max(width, spec.name.size() + 2);
  }
  SignalScope signals;
  if (signals.fd() < 0) {
    return make_error(ErrorKind::failed, std::string("signalfd: ") + std::strerror(errno));
  }
  Supervisor supervisor(options, signals);
  for (size_t i = 0; i < children.size(); ++i) {
    Status started =
        supervisor.spawn(children[i], make_prefix(children[i].name, width, i, options.color));
    if (!started.ok()) {
      supervisor.kill_all_now();
      return started.error();
    }
  }
  return supervisor.run();
}

}  // namespace tandem::tools
