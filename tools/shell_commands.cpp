#include "tools/shell_commands.hpp"

#include <algorithm>
#include <cstdio>

#include "runtime/node/diagnostics.hpp"

namespace tandem::tools {

using runtime::AdminAnswer;

std::vector<std::string> split_words(const std::string& line) {
  std::vector<std::string> words;
  std::string current;
  bool quoted = false, any = false;
  for (char c : line) {
    if (c == '"') {
      quoted = !quoted;
      any = true;
    } else if (!quoted && (c == ' ' || c == '\t')) {
      if (any) words.push_back(current);
      current.clear();
      any = false;
    } else {
      current += c;
      any = true;
    }
  }
  if (any) words.push_back(current);
  return words;
}

namespace {

int print_answer(const Result<AdminAnswer>& answer, bool say_who) {
  if (!answer.ok()) {
    std::printf("error: %s\n", answer.error().describe().c_str());
    return 1;
  }
  std::fputs(answer->text.c_str(), stdout);
  if (say_who) std::printf("(as seen by node %s)\n", answer->answered_by.c_str());
  return answer->ok ? 0 : 1;
}

int cmd_nodes(ShellContext& ctx, const std::vector<std::string>&) {
  return print_answer(ctx.client->admin_any("nodes", ctx.timeout), true);
}

int cmd_actors(ShellContext& ctx, const std::vector<std::string>& args) {
  if (!args.empty()) return print_answer(ctx.client->admin(args[0], "actors", {}, ctx.timeout), false);
  int rc = 0;
  for (const auto& node : ctx.manifest->nodes) {
    auto answer = ctx.client->admin(node.name, "actors", {}, ctx.timeout);
    if (!answer.ok()) {
      std::printf("%s: unreachable (%s)\n", node.name.c_str(), answer.error().message.c_str());
      rc = 1;
      continue;
    }
    for (size_t r = 1; r < answer->rows.size(); ++r) std::printf("%s\n", answer->rows[r][0].c_str());
  }
  return rc;
}

int cmd_ping(ShellContext& ctx, const std::vector<std::string>& args) {
  if (args.empty()) {
    std::printf("usage: ping NODE|NODE/ROLE/INSTANCE [COUNT]\n");
    return 1;
  }
  messages::ActorName target{args[0], "node", ""};
  if (args[0].find('/') != std::string::npos) {
    auto parsed = messages::ActorName::parse(args[0]);
    if (!parsed.ok()) {
      std::printf("error: %s\n", parsed.error().message.c_str());
      return 1;
    }
    target = *parsed;
  }
  int count = args.size() > 1 ? std::max(1, std::min(10000, std::atoi(args[1].c_str()))) : 3;
  double min_us = 1e18, max_us = 0, sum_us = 0;
  int ok = 0;
  for (int i = 0; i < count; ++i) {
    auto rtt = ctx.client->ping(target, ctx.timeout);
    if (!rtt.ok()) {
      std::printf("ping %s: %s\n", target.to_string().c_str(), rtt.error().describe().c_str());
      continue;
    }
    double us = std::chrono::duration<double, std::micro>(*rtt).count();
    min_us = std::min(min_us, us), max_us = std::max(max_us, us), sum_us += us, ++ok;
    if (count <= 10) std::printf("reply from %s: %.1f us\n", target.to_string().c_str(), us);
  }
  if (ok == 0) return 1;
  std::printf("%d/%d replies, round trip min/avg/max = %.1f/%.1f/%.1f us\n", ok, count, min_us,
              sum_us / ok, max_us);
  return ok == count ? 0 : 1;
}

int cmd_peer_ping(ShellContext& ctx, const std::vector<std::string>& args) {
  if (args.size() != 2) {
    std::printf("usage: peer-ping FROM_NODE TARGET\n");
    return 1;
  }
  return print_answer(ctx.client->admin(args[0], "ping", {args[1]}, ctx.timeout * 3), false);
}

// rma-test FROM TO [MIB]: FROM exposes a patterned region, TO reads it with one-sided RMA
// reads, both checksum it; the checksums must agree.
int cmd_rma_test(ShellContext& ctx, const std::vector<std::string>& args) {
  if (args.size() < 2 || args.size() > 3) {
    std::printf("usage: rma-test FROM_NODE TO_NODE [MIB]\n");
    return 1;
  }
  long mib = args.size() == 3 ? std::atol(args[2].c_str()) : 64;
  if (mib <= 0 || mib > 1024) {
    std::printf("MIB must be 1..1024\n");
    return 1;
  }
  auto exposed = ctx.client->admin(args[0], "rma-expose", {std::to_string(mib << 20)}, ctx.timeout * 5);
  if (!exposed.ok() || !exposed->ok || exposed->rows.size() != 2) return print_answer(exposed, false);
  const auto& e = exposed->rows[1];  // node, base, bytes, key, checksum
  auto read = ctx.client->admin(args[1], "rma-read", {e[0], e[1], e[2], e[3]},
                                std::chrono::milliseconds(60000));
  (void)ctx.client->admin(args[0], "rma-release", {e[3]}, ctx.timeout);
  if (!read.ok() || !read->ok || read->rows.size() != 2) return print_answer(read, false);
  const auto& r = read->rows[1];  // bytes, checksum, micros, gb_per_s
  bool match = r[1] == e[4];
  std::printf("%s read %s bytes from %s in %s us (%s GB/s); checksum %s %s %s\n",
              args[1].c_str(), r[0].c_str(), args[0].c_str(), r[2].c_str(), r[3].c_str(),
              r[1].c_str(), match ? "==" : "!=", e[4].c_str());
  std::printf("%s\n", match ? "OK" : "MISMATCH");
  return match ? 0 : 1;
}

int cmd_stats(ShellContext& ctx, const std::vector<std::string>& args) {
  if (args.empty()) {
    std::printf("usage: stats NODE\n");
    return 1;
  }
  return print_answer(ctx.client->admin(args[0], "stats", {}, ctx.timeout), false);
}

bool runs_kv_offload(const config::Node& node) {
  return std::any_of(node.instances.begin(), node.instances.end(),
                     [](const config::Instance& i) { return i.role == config::Role::kv_offload; });
}

// tier2 [NODE] | tier2 verify NODE | tier2 drop NODE: the kv-offload instances' tier 2 (what
// they hold, hits, misses, bytes, rates), a re-read of every stored block, or dropping them.
int cmd_tier2(ShellContext& ctx, const std::vector<std::string>& args) {
  bool action = !args.empty() && (args[0] == "verify" || args[0] == "drop");
  if (action && args.size() == 2) {
    // The node waits up to admin_disk_timeout for its kv-offload instances; wait longer.
    auto wait = std::max(ctx.timeout, runtime::admin_disk_timeout + std::chrono::seconds(30));
    return print_answer(ctx.client->admin(args[1], "tier2-" + args[0], {}, wait), false);
  }
  if (action || args.size() > 1) {
    std::printf("usage: tier2 [NODE] | tier2 verify NODE | tier2 drop NODE\n");
    return 1;
  }
  if (args.size() == 1) {
    return print_answer(ctx.client->admin(args[0], "tier2", {}, ctx.timeout), false);
  }
  int rc = 0;
  for (const auto& node : ctx.manifest->nodes) {
    if (!runs_kv_offload(node)) {
      std::printf("%s: no kv-offload instance\n", node.name.c_str());
      continue;
    }
    auto answer = ctx.client->admin(node.name, "tier2", {}, ctx.timeout);
    if (!answer.ok()) {
      std::printf("%s: unreachable (%s)\n", node.name.c_str(), answer.error().message.c_str());
      rc = 1;
      continue;
    }
    std::fputs(answer->text.c_str(), stdout);
    if (!answer->ok) rc = 1;
  }
  return rc;
}

// TEST HOOK: answered only by nodes started with `tandem node --test-hooks`.
int cmd_debug_crash(ShellContext& ctx, const std::vector<std::string>& args) {
  if (args.size() != 2) {
    std::printf("usage: debug-crash NODE ACTOR\n");
    return 1;
  }
  return print_answer(ctx.client->admin(args[0], "debug-crash", {args[1]}, ctx.timeout), false);
}

// TEST HOOK: answered only by nodes started with `tandem node --test-hooks`.
int cmd_debug_drop_kv_events(ShellContext& ctx, const std::vector<std::string>& args) {
  if (args.size() != 2 && args.size() != 3) {
    std::printf("usage: debug-drop-kv-events NODE N [tier2|device]\n");
    return 1;
  }
  std::vector<std::string> rest(args.begin() + 1, args.end());
  return print_answer(ctx.client->admin(args[0], "debug-drop-kv-events", rest, ctx.timeout),
                      false);
}

int cmd_help(ShellContext&, const std::vector<std::string>&) {
  for (const auto& c : shell_commands()) {
    std::printf("  %-28s %s\n", c.usage.c_str(), c.summary.c_str());
  }
  return 0;
}

int cmd_quit(ShellContext& ctx, const std::vector<std::string>&) {
  ctx.quit = true;
  return 0;
}

}  // namespace

const std::vector<ShellCommand>& shell_commands() {
  static const std::vector<ShellCommand> table = {
      {"nodes", "nodes", "every node: address, up/down, uptime, last heartbeat", cmd_nodes},
      {"actors", "actors [NODE]", "actors on one node, or on all", cmd_actors},
      {"ping", "ping NODE|NODE/ROLE/INST [N]", "fabric round trip in microseconds", cmd_ping},
      {"peer-ping", "peer-ping FROM TARGET", "round trip from one node to another actor",
       cmd_peer_ping},
      {"rma-test", "rma-test FROM TO [MIB]", "RMA read FROM's region on TO, verify checksum",
       cmd_rma_test},
      {"stats", "stats NODE", "a node's metrics (Prometheus text)", cmd_stats},
      {"tier2", "tier2 [NODE]",
       "tier 2 of every kv-offload: blocks, hits, misses, bytes, per second", cmd_tier2},
      {"tier2", "tier2 verify NODE", "re-read every tier-2 block of NODE, drop bad ones",
       cmd_tier2},
      {"tier2", "tier2 drop NODE", "remove every tier-2 block of NODE (durable)", cmd_tier2},
      {"debug-crash", "debug-crash NODE ACTOR",
       "TEST HOOK (nodes run with --test-hooks): crash a supervised actor", cmd_debug_crash},
      {"debug-drop-kv-events", "debug-drop-kv-events NODE N [tier2|device]",
       "TEST HOOK (nodes run with --test-hooks): lose NODE's next N KV event frames",
       cmd_debug_drop_kv_events},
      {"help", "help", "this list", cmd_help},
      {"quit", "quit", "leave the shell (also: exit, Ctrl-D)", cmd_quit},
      {"exit", "exit", "leave the shell", cmd_quit},
  };
  return table;
}

int run_shell_line(ShellContext& ctx, const std::string& line) {
  auto words = split_words(line);
  if (words.empty()) return 0;
  for (const auto& c : shell_commands()) {
    if (c.name == words[0]) return c.run(ctx, {words.begin() + 1, words.end()});
  }
  std::printf("unknown command '%s' (try: help)\n", words[0].c_str());
  return 1;
}

}  // namespace tandem::tools
