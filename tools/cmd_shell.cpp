// `tandem shell --manifest M [-c CMD]`: the admin shell.
#include <editline/readline.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tools/commands.hpp"
#include "tools/shell_commands.hpp"

namespace tandem::tools {
namespace {

const config::Manifest* completion_manifest = nullptr;  // readline's C callbacks need it

char* complete_word(const char* text, int state) {
  static std::vector<std::string> candidates;
  static size_t next = 0;
  if (state == 0) {
    candidates.clear();
    next = 0;
    std::string prefix(text);
    for (const auto& c : shell_commands()) {
      // A command with several forms has a help row each: offer its name once.
      bool listed = std::find(candidates.begin(), candidates.end(), c.name) != candidates.end();
      if (c.name.rfind(prefix, 0) == 0 && !listed) candidates.push_back(c.name);
    }
    if (completion_manifest) {
      // Arguments: node names, prefill/decode instance names (drain, undrain), router words
      // and the router's live settings (router set KEY).
      std::vector<std::string> words = {"show", "set"};
      for (const auto& node : completion_manifest->nodes) {
        words.push_back(node.name);
        for (const auto& inst : node.instances) {
          if (inst.role == config::Role::prefill || inst.role == config::Role::decode) {
            words.push_back(inst.name);
          }
        }
      }
      for (const auto& [key, value] : config::router_settings(completion_manifest->router)) {
        words.push_back(key);
      }
      for (const auto& w : words) {
        bool listed = std::find(candidates.begin(), candidates.end(), w) != candidates.end();
        if (w.rfind(prefix, 0) == 0 && !listed) candidates.push_back(w);
      }
    }
  }
  if (next >= candidates.size()) return nullptr;
  return strdup(candidates[next++].c_str());
}

char** complete(const char* text, int, int) {
  rl_attempted_completion_over = 1;
  return rl_completion_matches(text, complete_word);
}

std::string history_path() {
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.tandem_history";
}

int interactive(ShellContext& ctx) {
  completion_manifest = ctx.manifest;
  rl_attempted_completion_function = complete;
  std::string history = history_path();
  read_history(history.c_str());
  std::printf("tandem shell: cluster '%s', %zu node(s). Type help.\n",
              ctx.manifest->cluster.name.c_str(), ctx.manifest->nodes.size());
  std::string prompt = ctx.manifest->cluster.name + "> ";
  while (!ctx.quit) {
    char* line = readline(prompt.c_str());
    if (line == nullptr) break;
    std::string text(line);
    std::free(line);
    if (text.find_first_not_of(" \t") == std::string::npos) continue;
    add_history(text.c_str());
    run_shell_line(ctx, text);
    std::fflush(stdout);
  }
  write_history(history.c_str());
  history_truncate_file(history.c_str(), 1000);
  return 0;
}

}  // namespace

int cmd_shell(cli::Args args) {
  cli::Flags flags("tandem shell --manifest MANIFEST [-c COMMAND] [--json]",
                   "An admin shell that joins the cluster as a client (not a member) over the\n"
                   "fabric. Interactive with line editing, history (~/.tandem_history) and tab\n"
                   "completion; or runs one command with -c and exits with its status.");
  flags.flag("manifest", "FILE", "the cluster manifest (TOML)")
      .flag("c", "COMMAND", "run one command and exit (for scripts)")
      .flag("json", "",
            "answers as JSON (rows as objects keyed by their header; status as one "
            "object; several nodes' answers as an array)")
      .flag("bind", "HOST",
            "local address for the shell's endpoint (default: loopback when "
            "the cluster has loopback nodes)")
      .flag("token-file", "FILE",
            "connect with this admin token instead of the cluster key (default: the cluster "
            "key when readable, else [admin] token_file)")
      .flag("timeout-ms", "MS", "how long to wait for each answer", "1000");
  std::vector<char*> fixed(args.begin(), args.end());
  static char long_c[] = "--c";
  for (auto& a : fixed) {
    if (std::strcmp(a, "-c") == 0) a = long_c;  // accept the conventional short form
  }
  int code = 0;
  if (!flags.parse(cli::Args(fixed.data(), fixed.size()), &code)) return code;
  if (!flags.has("manifest")) {
    std::fprintf(stderr, "tandem shell: --manifest is required\n");
    return 2;
  }
  auto timeout = flags.get_int("timeout-ms");
  if (!timeout || *timeout <= 0) return 2;
  auto loaded = config::load_manifest(flags.get("manifest"));
  if (auto* errors = std::get_if<config::ManifestErrors>(&loaded)) {
    std::fprintf(stderr, "%s", errors->describe().c_str());
    return 1;
  }
  const auto& manifest = std::get<config::Manifest>(loaded);
  std::string bind = flags.has("bind") ? flags.get("bind") : runtime::default_client_bind(manifest);
  if (bind.empty()) {
    std::fprintf(stderr, "tandem shell: pass --bind HOST (an address of this machine that the "
                         "cluster can reach)\n");
    return 2;
  }
  auto client = runtime::ClusterClient::connect(
      manifest, bind, flags.has("token-file") ? flags.get("token-file") : std::string());
  if (!client.ok()) {
    std::fprintf(stderr, "tandem shell: %s\n", client.error().describe().c_str());
    return 1;
  }
  ShellContext ctx{&manifest, client->get(), std::chrono::milliseconds(*timeout)};
  ctx.json = flags.has("json");
  if (flags.has("c")) {
    int rc = run_shell_line(ctx, flags.get("c"));
    std::fflush(stdout);
    return rc;
  }
  return interactive(ctx);
}

}  // namespace tandem::tools
