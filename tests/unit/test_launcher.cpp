// `tandem up`'s supervisor, with `sh -c` children, plus local-host detection and planning.
#include <doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "tools/launcher.hpp"
#include "tools/local_host.hpp"
#include "tools/up_plan.hpp"

namespace fs = std::filesystem;
using tandem::tools::ChildSpec;
using tandem::tools::LauncherOptions;
using Clock = std::chrono::steady_clock;

namespace {

// A fresh directory with files for the launcher's out/err streams.
struct Scratch {
  fs::path dir;
  int out_fd = -1, err_fd = -1;
  Scratch() {
    std::string pattern = (fs::temp_directory_path() / "tandem-launcher-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    dir = pattern;
    out_fd = ::open((dir / "out").c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
    err_fd = ::open((dir / "err").c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
    REQUIRE(out_fd >= 0);
    REQUIRE(err_fd >= 0);
  }
  ~Scratch() {
    ::close(out_fd);
    ::close(err_fd);
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
  LauncherOptions options(std::chrono::milliseconds grace) const {
    LauncherOptions o;
    o.grace = grace;
    o.out_fd = out_fd;
    o.err_fd = err_fd;
    return o;
  }
  std::string read(const std::string& name) const {
    std::ifstream in(dir / name);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::string path(const std::string& name) const { return (dir / name).string(); }
};

ChildSpec sh(std::string name, std::string script) {
  return ChildSpec{std::move(name), {"sh", "-c", std::move(script)}};
}

bool process_gone(pid_t pid) {
  return ::kill(pid, 0) == -1 && errno == ESRCH;
}

bool wait_for_file(const std::string& path, std::chrono::milliseconds timeout) {
  auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    if (fs::exists(path) && fs::file_size(path) > 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

pid_t read_pid(const std::string& path) {
  std::ifstream in(path);
  pid_t pid = 0;
  in >> pid;
  return pid;
}

}  // namespace

TEST_CASE("LinePrefixer: complete, partial, split and over-long lines") {
  tandem::tools::LinePrefixer p("[a] ", 8);
  std::string out;
  p.feed("hel", out);
  CHECK(out.empty());
  p.feed("lo\nwor", out);
  CHECK(out == "[a] hello\n");
  p.feed("ld\n\nabcdefghijkl", out);  // empty line kept; 12 bytes split at 8
  CHECK(out == "[a] hello\n[a] world\n[a] \n[a] abcdefgh\n");
  CHECK(p.pending_bytes() == 4);
  p.finish(out);
  CHECK(out == "[a] hello\n[a] world\n[a] \n[a] abcdefgh\n[a] ijkl\n");
  p.finish(out);  // nothing pending: nothing added
  CHECK(out.size() == std::string("[a] hello\n[a] world\n[a] \n[a] abcdefgh\n[a] ijkl\n").size());
}

TEST_CASE("prefixes are padded to the longest name; colour wraps only the tag") {
  using tandem::tools::make_prefix;
  CHECK(make_prefix("a", 8, 0, false) == "[a]      ");
  CHECK(make_prefix("prefill", 9, 1, false) == "[prefill] ");
  CHECK(make_prefix("gw", 9, 1, false) == "[gw]      ");
  CHECK(make_prefix("a", 3, 0, true) == "\x1b[36m[a]\x1b[0m ");
  CHECK(tandem::tools::describe_exit("prefill", 1 << 8) == "node 'prefill' exited with status 1");
  CHECK(tandem::tools::describe_exit("d", SIGKILL) == "node 'd' was killed by signal 9");
  CHECK(tandem::tools::describe_exit("p", 75 << 8) ==
        "node 'p' exited with status 75 (an executor's device was lost)");
}

TEST_CASE("every line of every child is forwarded with its node's prefix, none lost") {
  Scratch s;
  constexpr int lines_count = 3000;
  std::string loop = "i=0; while [ $i -lt " + std::to_string(lines_count) + " ]; do ";
  std::vector<ChildSpec> children{
      sh("a", loop + "echo \"a $i\"; i=$((i+1)); done; printf 'a-tail'; touch " + s.path("a.done") +
                  "; exec sleep 30"),
      sh("node-bb", loop + "echo \"b $i\" >&2; i=$((i+1)); done; touch " + s.path("b.done") +
                        "; exec sleep 30"),
      // Asks the launcher (its parent, this test process) to stop once both are done.
      sh("ctl", "while [ ! -e " + s.path("a.done") + " ] || [ ! -e " + s.path("b.done") +
                    " ]; do sleep 0.02; done; kill -TERM $PPID; exec sleep 30"),
  };
  auto begin = Clock::now();
  auto outcome = tandem::tools::run_cluster(children, s.options(std::chrono::seconds(5)));
  REQUIRE(outcome.ok());
  CHECK(Clock::now() - begin < std::chrono::seconds(5));  // sleeps died on SIGTERM
  CHECK(outcome->exit_code == 0);
  CHECK(outcome->stop_requested);
  CHECK(outcome->failed_node.empty());
  CHECK(outcome->killed_nodes.empty());
  std::istringstream out(s.read("out"));
  std::string line;
  int a_next = 0, b_next = 0, other_count = 0;
  bool tail_seen = false;
  while (std::getline(out, line)) {
    if (line == "[a]       a " + std::to_string(a_next)) {
      ++a_next;
    } else if (line == "[node-bb] b " + std::to_string(b_next)) {
      ++b_next;
    } else if (line == "[a]       a-tail") {
      tail_seen = true;
    } else {
      ++other_count;
      INFO("unexpected line: ", line);
      CHECK(false);
    }
  }
  CHECK(a_next == lines_count);  // in order, none missing
  CHECK(b_next == lines_count);
  CHECK(tail_seen);  // a last line without '\n' still arrives
  CHECK(other_count == 0);
  CHECK(s.read("err").find("tandem up: stopping the cluster (signal 15)") != std::string::npos);
}

TEST_CASE("a child exiting non-zero stops the others and is reported") {
  Scratch s;
  std::vector<ChildSpec> children{
      sh("decode", "echo $$ > " + s.path("decode.pid") + "; exec sleep 30"),
      sh("prefill", "while [ ! -s " + s.path("decode.pid") +
                        " ]; do sleep 0.02; done; echo 'cannot open model'; exit 3"),
  };
  auto begin = Clock::now();
  auto outcome = tandem::tools::run_cluster(children, s.options(std::chrono::seconds(5)));
  REQUIRE(outcome.ok());
  CHECK(Clock::now() - begin < std::chrono::seconds(4));
  CHECK(outcome->exit_code == 1);
  CHECK_FALSE(outcome->stop_requested);
  CHECK(outcome->failed_node == "prefill");
  CHECK(WIFEXITED(outcome->failed_wait_status));
  CHECK(WEXITSTATUS(outcome->failed_wait_status) == 3);
  CHECK(s.read("out") == "[prefill] cannot open model\n");
  CHECK(s.read("err") == "tandem up: node 'prefill' exited with status 3; stopping the cluster\n");
  CHECK(process_gone(read_pid(s.path("decode.pid"))));
}

TEST_CASE("a child killed by a signal, or that cannot be executed, is reported") {
  Scratch s;
  auto killed =
      tandem::tools::run_cluster({sh("x", "kill -9 $$")}, s.options(std::chrono::seconds(1)));
  REQUIRE(killed.ok());
  CHECK(killed->exit_code == 1);
  CHECK(s.read("err").find("node 'x' was killed by signal 9; stopping") != std::string::npos);
  auto missing = tandem::tools::run_cluster({ChildSpec{"ghost", {s.path("no-such-binary")}}},
                                            s.options(std::chrono::seconds(1)));
  REQUIRE(missing.ok());
  CHECK(missing->exit_code == 1);
  CHECK(missing->failed_node == "ghost");
  CHECK(WEXITSTATUS(missing->failed_wait_status) == 127);
  CHECK(s.read("out").find("[ghost] cannot exec " + s.path("no-such-binary") +
                           ": No such file or directory\n") != std::string::npos);
}

TEST_CASE("SIGTERM to the launcher stops children; stragglers are killed after the grace") {
  Scratch s;
  constexpr int grace_ms = 400;
  std::vector<ChildSpec> children{
      sh("polite", "echo $$ > " + s.path("polite.pid") + "; exec sleep 30"),
      sh("stubborn",
         "trap '' TERM; echo $$ > " + s.path("stubborn.pid") + "; while true; do sleep 0.05; done"),
  };
  pid_t launcher = ::fork();
  REQUIRE(launcher >= 0);
  if (launcher == 0) {  // the launcher process
    auto outcome =
        tandem::tools::run_cluster(children, s.options(std::chrono::milliseconds(grace_ms)));
    ::_exit(outcome.ok() ? outcome->exit_code : 99);
  }
  REQUIRE(wait_for_file(s.path("polite.pid"), std::chrono::seconds(5)));
  REQUIRE(wait_for_file(s.path("stubborn.pid"), std::chrono::seconds(5)));
  pid_t polite = read_pid(s.path("polite.pid"));
  pid_t stubborn = read_pid(s.path("stubborn.pid"));
  auto begin = Clock::now();
  REQUIRE(::kill(launcher, SIGTERM) == 0);
  int status = 0;
  pid_t got = 0;
  while ((got = ::waitpid(launcher, &status, WNOHANG)) == 0 &&
         Clock::now() - begin < std::chrono::seconds(20)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto elapsed = Clock::now() - begin;
  if (got == 0) ::kill(launcher, SIGKILL), ::waitpid(launcher, &status, 0);
  REQUIRE(got == launcher);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);                        // a requested stop is a clean exit
  CHECK(elapsed >= std::chrono::milliseconds(grace_ms));  // the stubborn one got its grace
  // Killed after its grace rather than waited for (bounded generously: 2 noisy shared cores).
  CHECK(elapsed < std::chrono::milliseconds(grace_ms + 8000));
  CHECK(process_gone(polite));
  CHECK(process_gone(stubborn));
  std::string err = s.read("err");
  CHECK(err.find("node 'stubborn' did not stop within 400 ms; killing it") != std::string::npos);
  CHECK(err.find("'polite' did not stop") == std::string::npos);
}

TEST_CASE("local host detection") {
  tandem::tools::HostIdentity self{"box1.example.org", {"10.1.2.3", "fe80::1%eth0"}};
  using tandem::tools::is_local_host;
  CHECK(is_local_host("127.0.0.1", self));
  CHECK(is_local_host("127.0.1.1", self));
  CHECK(is_local_host("::1", self));
  CHECK(is_local_host("[::1]", self));
  CHECK(is_local_host("LOCALHOST", self));
  CHECK(is_local_host("box1", self));
  CHECK(is_local_host("box1.example.org", self));
  CHECK(is_local_host("10.1.2.3", self));
  CHECK(is_local_host("fe80::1", self));
  CHECK_FALSE(is_local_host("10.1.2.4", self));
  CHECK_FALSE(is_local_host("box2", self));
  CHECK_FALSE(is_local_host("", self));
  // The real machine: its own interface addresses and hostname are local.
  tandem::tools::HostIdentity real = tandem::tools::this_host();
  CHECK_FALSE(real.hostname.empty());
  CHECK(is_local_host(real.hostname, real));
  for (const auto& address : real.addresses) CHECK(is_local_host(address, real));
}

TEST_CASE("plan_local_nodes picks local nodes, honours --only and explains refusals") {
  tandem::config::Manifest manifest;
  manifest.nodes.resize(3);
  manifest.nodes[0].name = "gw";
  manifest.nodes[0].host = "127.0.0.1";
  manifest.nodes[1].name = "remote";
  manifest.nodes[1].host = "10.9.9.9";
  manifest.nodes[2].name = "prefill";
  manifest.nodes[2].host = "localhost";
  tandem::tools::HostIdentity self{"box", {"10.0.0.1"}};
  tandem::tools::UpRequest request{"c.toml", "/bin/tandem", {}};
  auto all = tandem::tools::plan_local_nodes(manifest, request, self);
  REQUIRE(all.ok());
  REQUIRE(all->size() == 2);
  CHECK((*all)[0].name == "gw");
  CHECK((*all)[0].argv ==
        std::vector<std::string>{"/bin/tandem", "node", "--manifest", "c.toml", "--node", "gw"});
  CHECK((*all)[1].name == "prefill");

  request.only = tandem::tools::split_node_list({"prefill,", ""});
  CHECK(request.only == std::vector<std::string>{"prefill"});
  auto one = tandem::tools::plan_local_nodes(manifest, request, self);
  REQUIRE(one.ok());
  REQUIRE(one->size() == 1);
  CHECK((*one)[0].name == "prefill");

  request.only = {"nope"};
  auto unknown = tandem::tools::plan_local_nodes(manifest, request, self);
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().message.find("--only: no node 'nope' in c.toml (nodes: gw") == 0);
  request.only = {"remote"};
  auto far = tandem::tools::plan_local_nodes(manifest, request, self);
  REQUIRE_FALSE(far.ok());
  CHECK(far.error().message.find("node 'remote' is on host '10.9.9.9'") != std::string::npos);

  request.only.clear();
  manifest.nodes.erase(manifest.nodes.begin());
  manifest.nodes.pop_back();
  auto none = tandem::tools::plan_local_nodes(manifest, request, self);
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().message ==
        "no node of c.toml is on this host (box); nodes: remote (10.9.9.9)");
}

TEST_CASE("a second SIGTERM while stopping kills at once instead of waiting out the grace") {
  Scratch s;
  std::vector<ChildSpec> children{
      sh("stubborn", "trap '' TERM; echo $$ > " + s.path("stubborn.pid") +
                         "; while true; do sleep 0.05; done"),
  };
  pid_t launcher = ::fork();
  REQUIRE(launcher >= 0);
  if (launcher == 0) {
    auto outcome = tandem::tools::run_cluster(children, s.options(std::chrono::seconds(30)));
    ::_exit(outcome.ok() ? outcome->exit_code : 99);
  }
  REQUIRE(wait_for_file(s.path("stubborn.pid"), std::chrono::seconds(5)));
  pid_t stubborn = read_pid(s.path("stubborn.pid"));
  auto begin = Clock::now();
  REQUIRE(::kill(launcher, SIGTERM) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(::kill(launcher, SIGINT) == 0);
  int status = 0;
  pid_t got = 0;
  while ((got = ::waitpid(launcher, &status, WNOHANG)) == 0 &&
         Clock::now() - begin < std::chrono::seconds(20)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (got == 0) ::kill(launcher, SIGKILL), ::waitpid(launcher, &status, 0);
  REQUIRE(got == launcher);
  CHECK(Clock::now() - begin < std::chrono::seconds(10));  // far less than the 30 s grace
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(process_gone(stubborn));
  CHECK(s.read("err").find("stop signal while stopping; killing the cluster now") !=
        std::string::npos);
}

TEST_CASE("RestartBudget: doubling backoff, at most restarts_max per window, reset once settled") {
  using namespace std::chrono_literals;
  tandem::runtime::RestartPolicy policy{3, 10s, 100ms, 300ms};
  tandem::runtime::RestartBudget budget(policy);
  auto t = Clock::time_point{} + 1000s;
  CHECK(budget.next_delay(t, 1s) == 100ms);
  CHECK(budget.next_delay(t + 1s, 1s) == 200ms);
  CHECK(budget.next_delay(t + 2s, 1s) == 300ms);  // capped at delay_max_ms
  CHECK(budget.restarts_in_window(t + 3s) == 3);
  CHECK_FALSE(budget.next_delay(t + 3s, 1s).has_value());  // three in the window: given up
  // The window slides: the first restart (at t + 0.1 s) has left it 10 s later.
  CHECK(budget.next_delay(t + 10s + 200ms, 1s) == 300ms);
  // A child that ran a whole window before exiting starts over at the initial delay.
  CHECK(budget.next_delay(t + 40s, 20s) == 100ms);
  tandem::runtime::RestartPolicy off{0, 10s, 100ms, 300ms};  // restarts_max 0: never
  CHECK_FALSE(tandem::runtime::RestartBudget(off).next_delay(t, 1s).has_value());
  // delay_max_ms 0: a constant delay (what a node's actor supervisor uses).
  tandem::runtime::RestartBudget constant(tandem::runtime::RestartPolicy{5, 10s, 50ms});
  CHECK(constant.next_delay(t, 1s) == 50ms);
  CHECK(constant.next_delay(t + 1s, 1s) == 50ms);
}

TEST_CASE("restart on: a child killed with SIGKILL is started again, the others never stop") {
  Scratch s;
  auto options = s.options(std::chrono::seconds(2));
  options.restart.restarts_max = 3;
  options.restart.delay_ms = std::chrono::milliseconds(50);
  std::string starts = s.path("victim.starts");
  std::vector<ChildSpec> children{
      sh("steady", "echo $$ >> " + s.path("steady.starts") + "; exec sleep 30"),
      sh("victim", "echo $$ >> " + starts + "; echo up; exec sleep 30"),
      // SIGKILL the victim's first run, wait for its second, then stop the launcher.
      sh("ctl", "while [ ! -s " + starts + " ]; do sleep 0.02; done; kill -9 $(head -n1 " + starts +
                    "); while [ $(wc -l < " + starts +
                    ") -lt 2 ]; do sleep 0.02; done; kill -TERM $PPID; exec sleep 30"),
  };
  auto outcome = tandem::tools::run_cluster(children, options);
  REQUIRE(outcome.ok());
  CHECK(outcome->exit_code == 0);
  CHECK(outcome->stop_requested);
  CHECK(outcome->restarts == 1);
  CHECK(outcome->given_up_nodes.empty());
  CHECK(outcome->failed_node.empty());
  std::string err = s.read("err");
  CHECK(err.find("node 'victim' was killed by signal 9; restarting it in 0.1 s (restart 1 of at "
                 "most 3 per 60.0 s)") != std::string::npos);
  CHECK(err.find("node 'victim' restarted (pid ") != std::string::npos);
  CHECK(err.find("stopping the cluster (signal 15)") != std::string::npos);
  std::ifstream victim(starts), steady(s.path("steady.starts"));
  std::string a, b, c;
  std::getline(victim, a);
  std::getline(victim, b);
  CHECK(!a.empty());
  CHECK(!b.empty());
  CHECK(a != b);  // a new process
  int steady_starts = 0;
  while (std::getline(steady, c)) ++steady_starts;
  CHECK(steady_starts == 1);  // never restarted, never stopped before the end
  std::string out = s.read("out");
  size_t first = out.find("[victim] up\n");
  REQUIRE(first != std::string::npos);
  CHECK(out.find("[victim] up\n", first + 1) != std::string::npos);  // both runs' output
}

TEST_CASE("restart on: a child that keeps failing is given up on; the others keep serving") {
  Scratch s;
  auto options = s.options(std::chrono::seconds(2));
  options.restart.restarts_max = 2;
  options.restart.delay_ms = std::chrono::milliseconds(20);
  std::string runs = s.path("flaky.runs");
  std::vector<ChildSpec> children{
      sh("steady", "echo $$ >> " + s.path("steady.starts") + "; exec sleep 30"),
      sh("flaky", "echo run >> " + runs + "; echo 'cannot bind port'; exit 4"),
      // Once flaky has run three times (1 + 2 restarts), give the launcher time to give up and
      // show it does not stop steady, then stop it.
      sh("ctl", "while [ ! -s " + runs + " ] || [ $(wc -l < " + runs +
                    ") -lt 3 ]; do sleep 0.02; done; sleep 0.5; kill -TERM $PPID; exec sleep 30"),
  };
  auto outcome = tandem::tools::run_cluster(children, options);
  REQUIRE(outcome.ok());
  CHECK(outcome->exit_code == 1);  // a node was given up on
  CHECK(outcome->stop_requested);
  CHECK(outcome->restarts == 2);
  REQUIRE(outcome->given_up_nodes.size() == 1);
  CHECK(outcome->given_up_nodes[0] == "flaky");
  CHECK(outcome->failed_node.empty());  // the cluster was stopped by the signal, not by flaky
  std::string err = s.read("err");
  CHECK(err.find("node 'flaky' exited with status 4; it was restarted 2 times within 60.0 s: "
                 "giving up on it; the other nodes keep serving") != std::string::npos);
  CHECK(err.find("stopping the cluster (signal 15)") != std::string::npos);
  std::ifstream in(runs);
  int run_count = 0;
  for (std::string line; std::getline(in, line);) ++run_count;
  CHECK(run_count == 3);  // no fourth start
  std::ifstream steady(s.path("steady.starts"));
  int steady_starts = 0;
  for (std::string line; std::getline(steady, line);) ++steady_starts;
  CHECK(steady_starts == 1);
}

TEST_CASE("restart on: when every child is given up on, the launcher ends with exit code 1") {
  Scratch s;
  auto options = s.options(std::chrono::seconds(1));
  options.restart.restarts_max = 1;
  options.restart.delay_ms = std::chrono::milliseconds(10);
  auto outcome =
      tandem::tools::run_cluster({ChildSpec{"ghost", {s.path("no-such-binary")}}}, options);
  REQUIRE(outcome.ok());
  CHECK(outcome->exit_code == 1);
  CHECK_FALSE(outcome->stop_requested);
  CHECK(outcome->failed_node == "ghost");
  CHECK(outcome->restarts == 1);
  CHECK(WEXITSTATUS(outcome->failed_wait_status) == 127);
  std::string err = s.read("err");
  CHECK(err.find("giving up on it") != std::string::npos);
  CHECK(err.find("no node is left running; stopping") != std::string::npos);
}
