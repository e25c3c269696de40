// The interactive admin shell on a real terminal (tmux): tab completion, line editing,
// history, quit.
#include <doctest.h>

#include "tests/support/process.hpp"

using namespace tandem::testing;
using namespace std::chrono_literals;

namespace {

std::string tmux(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/tmux", "-L", "tandem-test"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, 5000ms).output;
}

std::string screen() { return tmux({"capture-pane", "-p", "-t", "shell"}); }

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("interactive shell: completion, editing, history, quit") {
  std::string dir = make_temp_dir("shell");
  std::string manifest = dir + "/one.toml";
  // A manifest without gateway/prefill/decode is refused by `tandem check`; the shell only
  // needs the node list, so write a complete one-node manifest instead.
  write_file(manifest,
             "[cluster]\nname = \"tty\"\n[model]\nname = \"m\"\npath = \"" + source_root() +
                 "/models/stories15M\"\n[sim]\nvocab = 32000\nbos_id = 1\neos_id = 2\n"
                 "[[node]]\nname = \"solo\"\nhost = \"127.0.0.1\"\nfabric_port = " +
                 std::to_string(free_port()) + "\nhttp_port = " + std::to_string(free_port()) +
                 "\n[[node.instance]]\nrole = \"gateway\"\nname = \"g\"\n"
                 "[[node.instance]]\nrole = \"router\"\nname = \"r\"\n"
                 "[[node.instance]]\nrole = \"decode\"\nname = \"d\"\nexecutor = \"e\"\n"
                 "[[node.instance]]\nrole = \"executor\"\nname = \"e\"\ndevice = \"sim\"\n");
  Child node({tandem_bin(), "node", "--manifest", manifest, "--node", "solo"}, dir + "/node.log");
  REQUIRE(eventually(10000ms, [&] {
    return run({tandem_bin(), "shell", "--manifest", manifest, "-c", "nodes"}, 3000ms).exit_code == 0;
  }));
  tmux({"kill-server"});
  std::string command = "HOME=" + dir + " " + tandem_bin() + " shell --manifest " + manifest;
  tmux({"new-session", "-d", "-s", "shell", "-x", "120", "-y", "40", command});
  REQUIRE(eventually(5000ms, [] { return screen().find("tty>") != std::string::npos; }));

  tmux({"send-keys", "-t", "shell", "no", "Tab"});  // completes to "nodes"
  CHECK(eventually(2000ms, [] { return screen().find("tty> nodes") != std::string::npos; }));
  tmux({"send-keys", "-t", "shell", "Enter"});
  CHECK(eventually(3000ms, [] { return screen().find("up (this node)") != std::string::npos; }));

  tmux({"send-keys", "-t", "shell", "Up", "Enter"});  // history: the same command again
  CHECK(eventually(3000ms, [] { return count(screen(), "up (this node)") == 2; }));

  // Line editing: type a wrong word, fix it with Home/Ctrl-A and deletes, run it.
  tmux({"send-keys", "-t", "shell", "xctors", "C-a", "Delete", "a", "Enter"});
  CHECK(eventually(3000ms, [] { return screen().find("solo/router/r") != std::string::npos; }));

  // Arguments complete too: a router setting's key.
  tmux({"send-keys", "-t", "shell", "router set weight_q", "Tab"});
  CHECK(eventually(
      2000ms, [] { return screen().find("tty> router set weight_queue") != std::string::npos; }));
  tmux({"send-keys", "-t", "shell", "2", "Enter"});
  CHECK(eventually(3000ms, [] {
    return screen().find("solo/router/r: weight_queue = 2.0 (was 1.0)") != std::string::npos;
  }));
  tmux({"send-keys", "-t", "shell", "help drain", "Enter"});
  CHECK(eventually(3000ms, [] {
    return screen().find("drain NODE|INSTANCE [DEADLINE_S]") != std::string::npos;
  }));
  tmux({"send-keys", "-t", "shell", "quit", "Enter"});
  // The shell exits, so its tmux session ends: has-session fails.
  CHECK(eventually(3000ms, [] {
    return run({"/usr/bin/tmux", "-L", "tandem-test", "has-session", "-t", "shell"}, 5000ms)
               .exit_code != 0;
  }));
  CHECK(read_file(dir + "/.tandem_history").find("nodes") != std::string::npos);
  tmux({"kill-server"});
}
