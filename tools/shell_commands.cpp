#include "tools/shell_commands.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "runtime/node/diagnostics.hpp"
#include "tools/cluster_status.hpp"

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

// JSON (--json): the answer's rows as objects keyed by the header row.
std::string answer_json(const Result<AdminAnswer>& answer) {
  nlohmann::json j;
  if (!answer.ok()) {
    j = {{"ok", false}, {"error", answer.error().describe()}};
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  j = {{"ok", answer->ok}, {"node", answer->answered_by}};
  nlohmann::json rows = nlohmann::json::array();
  for (size_t r = 1; r < answer->rows.size(); ++r) {
    nlohmann::json row = nlohmann::json::object();
    for (size_t c = 0; c < answer->rows[r].size() && c < answer->rows[0].size(); ++c) {
      row[answer->rows[0][c]] = answer->rows[r][c];
    }
    rows.push_back(std::move(row));
  }
  j["rows"] = std::move(rows);
  if (answer->rows.empty() || !answer->ok) j["text"] = answer->text;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

int print_answer(ShellContext& ctx, const Result<AdminAnswer>& answer, bool say_who) {
  if (ctx.json) {
    ctx.json_items.push_back(answer_json(answer));
    return answer.ok() && answer->ok ? 0 : 1;
  }
  if (!answer.ok()) {
    std::printf("error: %s\n", answer.error().describe().c_str());
    return 1;
  }
  std::fputs(answer->text.c_str(), stdout);
  if (say_who) std::printf("(as seen by node %s)\n", answer->answered_by.c_str());
  return answer->ok ? 0 : 1;
}

// Asks every node that `keep` accepts; with --json each answer is collected as JSON, otherwise
// `show` prints it (an unreachable node is said so). 0 when every node asked answered ok.
int ask_each_node(ShellContext& ctx, const std::function<bool(const config::Node&)>& keep,
                  const std::string& command, const std::vector<std::string>& args,
                  const std::function<void(const AdminAnswer&)>& show) {
  int rc = 0;
  for (const auto& node : ctx.manifest->nodes) {
    if (!keep(node)) continue;
    auto answer = ctx.client->admin(node.name, command, args, ctx.timeout);
    if (ctx.json) {
      rc |= print_answer(ctx, answer, false);
      continue;
    }
    if (!answer.ok()) {
      std::printf("%s: unreachable (%s)\n", node.name.c_str(), answer.error().message.c_str());
      rc = 1;
      continue;
    }
    show(*answer);
    if (!answer->ok) rc = 1;
  }
  return rc;
}

bool any_node(const config::Node&) {
  return true;
}

int cmd_nodes(ShellContext& ctx, const std::vector<std::string>&) {
  return print_answer(ctx, ctx.client->admin_any("nodes", ctx.timeout), true);
}

int cmd_actors(ShellContext& ctx, const std::vector<std::string>& args) {
  if (!args.empty())
    return print_answer(ctx, ctx.client->admin(args[0], "actors", {}, ctx.timeout), false);
  return ask_each_node(ctx, any_node, "actors", {}, [](const AdminAnswer& answer) {
    for (size_t r = 1; r < answer.rows.size(); ++r) std::printf("%s\n", answer.rows[r][0].c_str());
  });
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
  return print_answer(ctx, ctx.client->admin(args[0], "ping", {args[1]}, ctx.timeout * 3), false);
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
  auto exposed =
      ctx.client->admin(args[0], "rma-expose", {std::to_string(mib << 20)}, ctx.timeout * 5);
  if (!exposed.ok() || !exposed->ok || exposed->rows.size() != 2)
    return print_answer(ctx, exposed, false);
  const auto& e = exposed->rows[1];  // node, base, bytes, key, checksum
  auto read = ctx.client->admin(args[1], "rma-read", {e[0], e[1], e[2], e[3]},
                                std::chrono::milliseconds(60000));
  (void)ctx.client->admin(args[0], "rma-release", {e[3]}, ctx.timeout);
  if (!read.ok() || !read->ok || read->rows.size() != 2) return print_answer(ctx, read, false);
  const auto& r = read->rows[1];  // bytes, checksum, micros, gb_per_s
  bool match = r[1] == e[4];
  std::printf("%s read %s bytes from %s in %s us (%s GB/s); checksum %s %s %s\n", args[1].c_str(),
              r[0].c_str(), args[0].c_str(), r[2].c_str(), r[3].c_str(), r[1].c_str(),
              match ? "==" : "!=", e[4].c_str());
  std::printf("%s\n", match ? "OK" : "MISMATCH");
  return match ? 0 : 1;
}

int cmd_stats(ShellContext& ctx, const std::vector<std::string>& args) {
  if (args.empty()) {
    std::printf("usage: stats NODE\n");
    return 1;
  }
  return print_answer(ctx, ctx.client->admin(args[0], "stats", {}, ctx.timeout), false);
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
    return print_answer(ctx, ctx.client->admin(args[1], "tier2-" + args[0], {}, wait), false);
  }
  if (action || args.size() > 1) {
    std::printf("usage: tier2 [NODE] | tier2 verify NODE | tier2 drop NODE\n");
    return 1;
  }
  if (args.size() == 1) {
    return print_answer(ctx, ctx.client->admin(args[0], "tier2", {}, ctx.timeout), false);
  }
  int rc = 0;
  for (const auto& node : ctx.manifest->nodes) {
    if (!runs_kv_offload(node)) {
      std::printf("%s: no kv-offload instance\n", node.name.c_str());
      continue;
    }
    auto answer = ctx.client->admin(node.name, "tier2", {}, ctx.timeout);
    if (ctx.json) {
      rc |= print_answer(ctx, answer, false);
      continue;
    }
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
  return print_answer(ctx, ctx.client->admin(args[0], "debug-crash", {args[1]}, ctx.timeout),
                      false);
}

// TEST HOOK: answered only by nodes started with `tandem node --test-hooks`.
int cmd_debug_drop_kv_events(ShellContext& ctx, const std::vector<std::string>& args) {
  if (args.size() != 2 && args.size() != 3) {
    std::printf("usage: debug-drop-kv-events NODE N [tier2|device]\n");
    return 1;
  }
  std::vector<std::string> rest(args.begin() + 1, args.end());
  return print_answer(ctx, ctx.client->admin(args[0], "debug-drop-kv-events", rest, ctx.timeout),
                      false);
}

// A drain target: a node (its prefill and decode instances), or one instance by its name or
// "node/role/instance". Errors name what the manifest has.
struct DrainTarget {
  std::string node;
  std::string instance;  // "": every serving instance of the node
};

Result<DrainTarget> drain_target(const config::Manifest& manifest, const std::string& word) {
  if (manifest.find_node(word) != nullptr) return DrainTarget{word, ""};
  auto full = messages::ActorName::parse(word);
  for (const auto& node : manifest.nodes) {
    for (const auto& inst : node.instances) {
      if (inst.role != config::Role::prefill && inst.role != config::Role::decode) continue;
      bool named = inst.name == word;
      bool by_full = full.ok() && full->node == node.name && full->instance == inst.name &&
                     full->role == config::to_string(inst.role);
      if (named || by_full) return DrainTarget{node.name, inst.name};
    }
  }
  return make_error(ErrorKind::not_found, "no node and no prefill or decode instance is named '" +
                                              word + "' in the manifest");
}

// The rows of `instances` on the target's node that the drain covers.
std::vector<std::vector<std::string>> target_rows(
    const DrainTarget& target, const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::vector<std::string>> out;
  for (size_t r = 1; r < rows.size(); ++r) {
    if (rows[r].size() < 4) continue;
    auto name = messages::ActorName::parse(rows[r][0]);
    if (target.instance.empty() || (name.ok() && name->instance == target.instance)) {
      out.push_back(rows[r]);
    }
  }
  return out;
}

// drain NODE|INSTANCE [DEADLINE_S]: the routers stop picking it; returns once what it held
// has ended (seen twice in a row, after two heartbeats so every router has heard), or says
// what still runs at the deadline (default 60 s) and fails.
int cmd_drain(ShellContext& ctx, const std::vector<std::string>& args) {
  if (args.empty() || args.size() > 2) {
    std::printf("usage: drain NODE|INSTANCE [DEADLINE_S]\n");
    return 1;
  }
  auto target = drain_target(*ctx.manifest, args[0]);
  if (!target.ok()) return std::printf("error: %s\n", target.error().message.c_str()), 1;
  double deadline_s = 60;
  if (args.size() == 2) {
    char* end = nullptr;
    deadline_s = std::strtod(args[1].c_str(), &end);
    if (end == args[1].c_str() || *end != '\0' || !(deadline_s > 0) || deadline_s > 86400) {
      std::printf("error: DEADLINE_S must be a number of seconds in (0, 86400], got '%s'\n",
                  args[1].c_str());
      return 1;
    }
  }
  std::vector<std::string> which;
  if (!target->instance.empty()) which.push_back(target->instance);
  auto answer = ctx.client->admin(target->node, "drain", which, ctx.timeout);
  if (!answer.ok() || !answer->ok) return print_answer(ctx, answer, false);
  using Clock = std::chrono::steady_clock;
  auto started = Clock::now();
  auto settle = std::chrono::milliseconds(2 * ctx.manifest->membership.heartbeat_interval_ms);
  auto deadline = started + std::chrono::milliseconds(static_cast<int64_t>(deadline_s * 1000));
  int empty_in_a_row = 0;
  std::vector<std::vector<std::string>> last = target_rows(*target, answer->rows);
  while (true) {
    bool empty = !last.empty() && std::all_of(last.begin(), last.end(), [](const auto& row) {
      return row[2] == "0" && row[3] == "0";
    });
    empty_in_a_row = empty ? empty_in_a_row + 1 : 0;
    double took_s = std::chrono::duration<double>(Clock::now() - started).count();
    if (empty_in_a_row >= 2 && Clock::now() - started >= settle) {
      if (ctx.json) {
        ctx.json_items.push_back(nlohmann::json{
            {"ok", true},
            {"node", target->node},
            {"instance", target->instance},
            {"drained_after_s",
             took_s}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
        return 0;
      }
      std::printf(
          "drained %s on node %s: empty after %.1f s; the routers do not pick it "
          "(undrain %s to bring it back)\n",
          target->instance.empty() ? "every prefill and decode instance" : target->instance.c_str(),
          target->node.c_str(), took_s, args[0].c_str());
      return 0;
    }
    if (Clock::now() >= deadline) {
      if (ctx.json) {
        nlohmann::json held = nlohmann::json::array();
        for (const auto& row : last) {
          held.push_back({{"instance", row[0]}, {"waiting", row[2]}, {"running", row[3]}});
        }
        ctx.json_items.push_back(nlohmann::json{
            {"ok", false},
            {"node", target->node},
            {"deadline_s", deadline_s},
            {"held", held}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
        return 1;
      }
      std::printf("deadline (%.0f s) reached; still held (the routers do not pick them):\n",
                  deadline_s);
      for (const auto& row : last) {
        std::printf("  %s: %s waiting, %s running\n", row[0].c_str(), row[2].c_str(),
                    row[3].c_str());
      }
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto now = ctx.client->admin(target->node, "instances", {}, ctx.timeout);
    if (!now.ok() || !now->ok) continue;  // try again until the deadline
    last = target_rows(*target, now->rows);
  }
}

int cmd_undrain(ShellContext& ctx, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    std::printf("usage: undrain NODE|INSTANCE\n");
    return 1;
  }
  auto target = drain_target(*ctx.manifest, args[0]);
  if (!target.ok()) return std::printf("error: %s\n", target.error().message.c_str()), 1;
  std::vector<std::string> which;
  if (!target->instance.empty()) which.push_back(target->instance);
  return print_answer(ctx, ctx.client->admin(target->node, "undrain", which, ctx.timeout), false);
}

// True when `node` runs an instance of `role`.
bool runs(const config::Node& node, config::Role role) {
  return std::any_of(node.instances.begin(), node.instances.end(),
                     [role](const config::Instance& i) { return i.role == role; });
}
bool runs_executor(const config::Node& node) {
  return runs(node, config::Role::executor);
}
bool runs_gateway(const config::Node& node) {
  return runs(node, config::Role::gateway);
}

// A table per node: `command` asked of NODE, or of every node `keep` accepts (the nodes
// without a row are left out).
int rows_per_node(ShellContext& ctx, const std::vector<std::string>& args, const char* command,
                  const std::function<bool(const config::Node&)>& keep) {
  if (args.size() > 1) {
    std::printf("usage: %s [NODE]\n", command);
    return 1;
  }
  if (args.size() == 1)
    return print_answer(ctx, ctx.client->admin(args[0], command, {}, ctx.timeout), false);
  return ask_each_node(ctx, keep, command, {}, [](const AdminAnswer& answer) {
    if (answer.rows.size() > 1 || !answer.ok) std::fputs(answer.text.c_str(), stdout);
  });
}

// instances [NODE]: every prefill and decode instance (or NODE's): serving or draining, load.
int cmd_instances(ShellContext& ctx, const std::vector<std::string>& args) {
  return rows_per_node(ctx, args, "instances", any_node);
}

// executors [NODE]: every executor (or NODE's): its device kind and ids, whether the device is
// ready, failed to open or lost, its passes, how busy it is and what it runs.
int cmd_executors(ShellContext& ctx, const std::vector<std::string>& args) {
  return rows_per_node(ctx, args, "executors", runs_executor);
}

// status: nodes, instances (state, load, KV, prefix hit rate), gateways (requests running and
// queued, TTFT and ITL p50/p90 over the last minute), tier 2, errors by type: one screen.
int cmd_status(ShellContext& ctx, const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::printf("usage: status\n");
    return 1;
  }
  bool answered = false;
  ClusterStatus status = gather_status(*ctx.client, *ctx.manifest, ctx.timeout, &answered);
  if (ctx.json) {
    ctx.json_items.push_back(status_json(status));
  } else {
    std::fputs(render_status(status).c_str(), stdout);
    if (!answered) std::printf("(no node answered `nodes`)\n");
  }
  return answered && status.nodes_up == status.nodes.size() ? 0 : 1;
}

// requests [INSTANCE]: every gateway's requests in flight (id, state, age, tokens so far, where).
// cancel ID: the gateway that holds ID ends it with an error to its client.
int cmd_requests(ShellContext& ctx, const std::vector<std::string>& args) {
  if (args.size() > 1) {
    std::printf("usage: requests [INSTANCE]\n");
    return 1;
  }
  std::vector<std::vector<std::string>> rows;
  int rc = ask_each_node(ctx, runs_gateway, "requests", args, [&rows](const AdminAnswer& answer) {
    if (!answer.ok) return (void)std::fputs(answer.text.c_str(), stdout);
    if (answer.rows.empty()) return;
    if (rows.empty()) rows.push_back(answer.rows[0]);
    rows.insert(rows.end(), answer.rows.begin() + 1, answer.rows.end());
  });
  if (ctx.json) return rc;
  if (rows.size() <= 1) {
    std::printf("no request in flight%s\n", args.empty() ? "" : (" on " + args[0]).c_str());
    return rc;
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size() && i < width.size(); ++i)
      width[i] = std::max(width[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size() && i < width.size(); ++i) {
      line += row[i] + (i + 1 < row.size() ? std::string(width[i] - row[i].size() + 2, ' ') : "");
    }
    std::printf("%s\n", line.c_str());
  }
  return rc;
}

int cmd_cancel(ShellContext& ctx, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    std::printf("usage: cancel ID (an id from `requests`)\n");
    return 1;
  }
  std::string misses;
  for (const auto& node : ctx.manifest->nodes) {
    if (!runs_gateway(node)) continue;
    auto answer = ctx.client->admin(node.name, "cancel", args, ctx.timeout);
    if (answer.ok() && answer->ok) return print_answer(ctx, answer, false);
    misses += answer.ok() ? answer->text : node.name + ": unreachable\n";
  }
  if (ctx.json) {
    ctx.json_items.push_back(nlohmann::json{{"ok", false}, {"error", misses}}.dump(
        -1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    std::printf("%s", misses.c_str());
  }
  return 1;
}

bool runs_router(const config::Node& node) {
  return std::any_of(node.instances.begin(), node.instances.end(),
                     [](const config::Instance& i) { return i.role == config::Role::router; });
}

// router show | router set KEY VALUE: every router of the cluster (each node runs its own), its
// live settings, or one changed on all of them (validated like the manifest; the manifest
// itself is unchanged: it is what the next start uses).
int cmd_router(ShellContext& ctx, const std::vector<std::string>& args) {
  bool show = args.size() == 1 && args[0] == "show";
  bool set = args.size() == 3 && args[0] == "set";
  if (!show && !set) {
    std::printf("usage: router show | router set KEY VALUE\n");
    return 1;
  }
  int rc =
      ask_each_node(ctx, runs_router, show ? "router-show" : "router-set",
                    show ? std::vector<std::string>{} : std::vector<std::string>{args[1], args[2]},
                    [](const AdminAnswer& answer) { std::fputs(answer.text.c_str(), stdout); });
  if (set && rc == 0 && !ctx.json) {
    std::printf("(live only: the manifest is unchanged and is what the next start uses)\n");
  }
  return rc;
}

// help [COMMAND]: every command's forms, or one command's.
// TEST HOOK: answered only by nodes started with `tandem node --test-hooks`.
int cmd_debug_stall_executor(ShellContext& ctx, const std::vector<std::string>& args) {
  if (args.size() != 3) {
    std::printf("usage: debug-stall-executor NODE EXECUTOR MS\n");
    return 1;
  }
  return print_answer(
      ctx, ctx.client->admin(args[0], "debug-stall-executor", {args[1], args[2]}, ctx.timeout),
      false);
}

int cmd_help(ShellContext&, const std::vector<std::string>& args) {
  bool found = false;
  for (const auto& c : shell_commands()) {
    if (!args.empty() && c.name != args[0]) continue;
    std::printf("  %-34s %s\n", c.usage.c_str(), c.summary.c_str());
    found = true;
  }
  if (!found) std::printf("no command '%s' (try: help)\n", args[0].c_str());
  return found ? 0 : 1;
}

int cmd_quit(ShellContext& ctx, const std::vector<std::string>&) {
  ctx.quit = true;
  return 0;
}

}  // namespace

const std::vector<ShellCommand>& shell_commands() {
  static const std::vector<ShellCommand> table = {
      {"status", "status",
       "the cluster at a glance: nodes, instances, load, KV, hit rate, TTFT/ITL, errors",
       cmd_status},
      {"nodes", "nodes", "every node: address, up/down, uptime, last heartbeat", cmd_nodes},
      {"actors", "actors [NODE]", "actors on one node, or on all", cmd_actors},
      {"ping", "ping NODE|NODE/ROLE/INST [N]", "fabric round trip in microseconds", cmd_ping},
      {"peer-ping", "peer-ping FROM TARGET", "round trip from one node to another actor",
       cmd_peer_ping},
      {"rma-test", "rma-test FROM TO [MIB]", "RMA read FROM's region on TO, verify checksum",
       cmd_rma_test},
      {"stats", "stats NODE", "a node's metrics (Prometheus text)", cmd_stats},
      {"instances", "instances [NODE]",
       "prefill and decode instances: serving or draining, waiting, running, KV", cmd_instances},
      {"executors", "executors [NODE]",
       "every executor: device kind and ids, ready / failed / lost, passes, device busy, what it "
       "runs",
       cmd_executors},
      {"drain", "drain NODE|INSTANCE [DEADLINE_S]",
       "stop routing to it; returns when what it holds has ended (default deadline 60 s)",
       cmd_drain},
      {"undrain", "undrain NODE|INSTANCE", "route to it again", cmd_undrain},
      {"requests", "requests [INSTANCE]",
       "requests in flight at every gateway: id, state, age, tokens so far, decode, prefill",
       cmd_requests},
      {"cancel", "cancel ID", "end a request (its client gets an error)", cmd_cancel},
      {"router", "router show", "every router's live settings (policy, weights, ...)", cmd_router},
      {"router", "router set KEY VALUE",
       "change a router setting on every router now, validated like the manifest", cmd_router},
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
      {"debug-stall-executor", "debug-stall-executor NODE EXECUTOR MS",
       "TEST HOOK (nodes run with --test-hooks): the executor's next pass answers MS late",
       cmd_debug_stall_executor},
      {"help", "help [COMMAND]", "this list, or one command's forms", cmd_help},
      {"quit", "quit", "leave the shell (also: exit, Ctrl-D)", cmd_quit},
      {"exit", "exit", "leave the shell", cmd_quit},
  };
  return table;
}

int run_shell_line(ShellContext& ctx, const std::string& line) {
  auto words = split_words(line);
  if (words.empty()) return 0;
  for (const auto& c : shell_commands()) {
    if (c.name != words[0]) continue;
    ctx.json_items.clear();
    int rc = c.run(ctx, {words.begin() + 1, words.end()});
    if (ctx.json && ctx.json_items.size() == 1) std::printf("%s\n", ctx.json_items[0].c_str());
    if (ctx.json && ctx.json_items.size() > 1) {
      std::string all = "[";
      for (size_t i = 0; i < ctx.json_items.size(); ++i) {
        all += (i ? "," : "") + ctx.json_items[i];
      }
      std::printf("%s]\n", all.c_str());
    }
    ctx.json_items.clear();
    return rc;
  }
  std::printf("unknown command '%s' (try: help)\n", words[0].c_str());
  return 1;
}

}  // namespace tandem::tools
