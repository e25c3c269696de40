// `tandem up`'s supervisor: runs a set of named child processes, prefixes and forwards their
// output, and stops them all together.
//
// run_cluster() starts every child in its own process group with stdout and stderr on one
// pipe, then runs a single poll() loop (no thread per child) over the pipes and a signalfd:
//   - each output line becomes "[name]  line" (name padded to the longest; coloured prefix
//     when LauncherOptions::color) on out_fd; a line longer than line_bytes_max is split;
//     a last line without a newline gets one; nothing is dropped;
//   - SIGINT or SIGTERM to the launcher: SIGTERM to every child's process group, wait up to
//     `grace`, then SIGKILL what is left; the outcome's exit code is 0. A second SIGINT or
//     SIGTERM while stopping kills at once;
//   - a child that exits on its own (any status), with LauncherOptions::restart off
//     (restarts_max == 0): "tandem up: node 'x' exited with status 1; stopping the cluster" on
//     err_fd, the others are stopped as above, exit code 1;
//   - with restart on: the child is started again after a backoff (runtime::RestartBudget, with
//   backoff), the
//     others keep running; a child that used up its restarts in the window is given up on
//     ("... giving up on it; the other nodes keep serving"); when no child is left running or
//     waiting to restart, the launcher ends with exit code 1. A stop signal cancels pending
//     restarts; the outcome's exit code is 1 if any child was given up on.
// Children also get PR_SET_PDEATHSIG=SIGTERM, so they stop if the launcher is killed.
//
// Preconditions: call from a single-threaded process (SIGINT, SIGTERM and SIGCHLD are
// blocked while it runs and read through a signalfd; the previous mask is restored before it
// returns). It reaps only its own children.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/result.hpp"
#include "runtime/node/restart_budget.hpp"

namespace tandem::tools {

struct ChildSpec {
  std::string name;               // unique, non-empty (asserted)
  std::vector<std::string> argv;  // argv[0] is looked up in PATH (execvp); non-empty (asserted)
};

struct LauncherOptions {
  std::chrono::milliseconds grace{5000};  // SIGTERM -> SIGKILL delay
  int out_fd = STDOUT_FILENO;             // children's prefixed lines
  int err_fd = STDERR_FILENO;             // the launcher's own messages
  bool color = false;                     // ANSI-coloured prefixes
  size_t line_bytes_max = 64 * 1024;      // longer lines are split at this many bytes
  // restarts_max 0 (the default): a child's exit stops the cluster. `tandem up` sets
  // 5 per 60 s, 0.5 s doubling to 30 s.
  runtime::RestartPolicy restart{0, std::chrono::seconds(60), std::chrono::milliseconds(500),
                                 std::chrono::seconds(30)};
};

struct LaunchOutcome {
  int exit_code = 0;  // 0: stopped on request; 1: a node exited (restart off) or was given up on
  bool stop_requested = false;            // SIGINT/SIGTERM was received
  std::string failed_node;                // the node whose exit stopped the cluster, if any
  int failed_wait_status = 0;             // its raw waitpid() status
  std::vector<std::string> killed_nodes;  // nodes that needed SIGKILL after the grace period
  std::vector<std::string> given_up_nodes;  // restart on: nodes that used up their restarts
  uint32_t restarts = 0;                    // restart on: children started again, in all
};

// Runs the children until they have all exited (see the header comment).
// Errors: failed when a pipe, fork or signalfd cannot be made (children already started are
// killed and reaped first). A child whose exec fails prints why and exits 127, which counts
// as an unexpected exit.
Result<LaunchOutcome> run_cluster(const std::vector<ChildSpec>& children,
                                  const LauncherOptions& options);

// "node 'x' exited with status 1" / "node 'x' was killed by signal 9".
std::string describe_exit(std::string_view name, int wait_status);

// "[name]" padded with spaces to width_bytes + 1 (so messages align), optionally coloured
// (colour_index picks from a fixed palette). Precondition: width_bytes >= name.size() + 2.
std::string make_prefix(std::string_view name, size_t width_bytes, size_t colour_index, bool color);

// Splits a byte stream into lines and prefixes each. Pure: no I/O.
class LinePrefixer {
 public:
  LinePrefixer(std::string prefix, size_t line_bytes_max);  // line_bytes_max >= 1 (asserted)

  // Appends the prefixed complete lines found so far (each ending in '\n') to `out`.
  void feed(std::string_view bytes, std::string& out);
  // At end of stream: the pending partial line, prefixed and given a '\n' (if any).
  void finish(std::string& out);
  size_t pending_bytes() const { return pending_.size(); }

 private:
  void emit(std::string_view line, std::string& out) const;
  std::string prefix_;
  size_t line_bytes_max_;
  std::string pending_;
};

}  // namespace tandem::tools
