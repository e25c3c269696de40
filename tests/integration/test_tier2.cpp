// Tier 2 end to end (issue 13): one `tandem node` with every role and a kv-offload instance
// on the cpu device (stories15M), every prompt through the prefill instance (P/D), pools
// small enough that a few prompts evict a long one.
// - A long prompt's blocks are offered to tier 2 and stored; after other prompts evicted it
//   from both pools, the same prompt is served with its blocks read back from tier 2 (the
//   prefill's tandem:prefill_tier2_loaded_blocks_total grows) and the greedy answer is the
//   same as the first time (identical to computing it).
// - The blocks survive a restart of the node: after SIGTERM and a fresh start on the same
//   directory, the prompt is again served from tier 2, same answer.
// - `tandem shell`: `tier2 solo` shows the stored blocks, `tier2 verify solo` finds every one
//   good, then the one whose bytes the test flipped on disk (dropped; the prompt is still
//   answered the same), `tier2 drop solo` leaves none (the prompt is computed, same answer).
// - SIGKILL during a burst of write-behind: after a restart every block the metrics called
//   stored is back, `tier2 verify` drops none, each block from before the kill is served to
//   its re-sent prompt or reported by verify (the counts add up), and the answers are the same.
#include <doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include "tests/support/http_client.hpp"
#include "tests/support/metric_check.hpp"
#include "tests/support/process.hpp"

using namespace tandem::testing;
using namespace std::chrono_literals;
using json = nlohmann::json;
namespace http = tandem::testing::http;

namespace {

class Tier2Node {
 public:
  // `model_extra`: more [model] keys (e.g. sub_block_tokens).
  Tier2Node(const std::string& dir, uint16_t http_port, uint16_t admin_port, uint16_t fabric_port,
            uint64_t capacity_bytes = 64u << 20, const std::string& model_extra = "",
            const std::string& kv_extra = "")
      : dir_(dir), http_port_(http_port), admin_port_(admin_port) {
    std::string manifest = dir_ + "/cluster.toml";
    write_file(manifest, manifest_text(fabric_port, capacity_bytes, model_extra, kv_extra));
    node_ = std::make_unique<Child>(
        std::vector<std::string>{tandem_bin(), "node", "--manifest", manifest, "--node", "solo"},
        dir_ + "/solo.log");
  }
  ~Tier2Node() {
    if (!node_->running()) return;  // killed: reaped already
    node_->signal(SIGTERM);
    node_->wait(10000ms);
  }
  Tier2Node(const Tier2Node&) = delete;
  void kill() {
    node_->signal(SIGKILL);
    node_->wait(10000ms);
  }
  // `tandem shell -c COMMAND` against this node's manifest.
  RunResult shell(const std::string& command) {
    return run({tandem_bin(), "shell", "--manifest", dir_ + "/cluster.toml", "-c", command},
               30000ms);
  }
  std::string data_file() const { return dir_ + "/tier2/solo/tier2.data"; }
  uint16_t port() const { return http_port_; }
  std::string log() { return node_->log(); }
  bool running() { return node_->running(); }
  std::string metrics() {
    auto r = http::get(admin_port_, "/metrics", 3000ms);
    std::string out;
    std::istringstream in(r.body);
    for (std::string line; std::getline(in, line);) {
      if (line.find("tier2") != std::string::npos && line[0] != '#') out += line + "\n";
    }
    return out;
  }
  // The test fails when /metrics does not answer (a dead node must not read as 0).
  double metric(const std::string& series) {
    return required_metric(admin_port_, "solo", series);
  }
  // The router's tier-2 view of this node equals what its store holds (and is not empty).
  bool router_view_exact() {
    double used = metric("tandem:tier2_blocks_used");
    return used > 0 && metric("tandem_router_tier2_blocks") == used;
  }
  // Both instances eligible and a completion answered.
  bool wait_ready(std::chrono::milliseconds timeout) {
    return eventually(timeout, [&] {
      // Polled from the start: a node that does not answer yet is not ready.
      if (http::scrape_metric(admin_port_, "tandem_router_instance_eligible").value_or(-1) < 2) {
        return false;
      }
      json body = {{"model", "stories15M"}, {"prompt", "Warm"}, {"max_tokens", 1}};
      auto r = http::post(http_port_, "/v1/completions", body.dump(), 30000ms);
      return r.ok() && r.status == 200;
    });
  }

 private:
  std::string manifest_text(uint16_t fabric_port, uint64_t capacity_bytes,
                            const std::string& model_extra, const std::string& kv_extra) {
    auto inst = [](const std::string& role, const std::string& name, const std::string& extra) {
      return "[[node.instance]]\nrole = \"" + role + "\"\nname = \"" + name + "\"\n" + extra;
    };
    // Pools of 16-token blocks: prefill 40 (four 11-block prompts evict the first one),
    // decode 16 (one prompt and its answer: the next prompt evicts it), so the answer
    // depends on the KV prefill read back from tier 2 and decode pulled from it.
    return "[cluster]\nname = \"tier2-it\"\n[fabric]\nprovider = \"tcp;ofi_rxm\"\n"
           "[logging]\nlevel = \"info\"\n"
           "[model]\nname = \"stories15M\"\npath = \"" + model_dir() + "\"\n"
           "block_tokens = 16\nmax_model_tokens = 256\nchat_format = \"plain\"\n" + model_extra +
           "[router]\npolicy = \"prefix-aware\"\ndisaggregate_tokens_min = 1\n"
           "[kv_offload]\nenabled = true\npath = \"" + dir_ + "/tier2\"\n"
           "capacity_bytes = " + std::to_string(capacity_bytes) + "\nstaging_blocks = 32\n" +
           kv_extra +
           "[[node]]\nname = \"solo\"\nhost = \"127.0.0.1\"\nfabric_port = " +
           std::to_string(fabric_port) + "\nadmin_port = " + std::to_string(admin_port_) +
           "\nhttp_port = " + std::to_string(http_port_) + "\n" +
           inst("gateway", "gateway", "") + inst("router", "router", "") +
           inst("prefill", "prefill", "executor = \"exec-p\"\n") +
           inst("decode", "decode", "executor = \"exec-d\"\n") +
           inst("kv-offload", "kv-offload", "") +
           inst("executor", "exec-p", "device = \"cpu\"\ndevices = [0]\nkv_blocks = 40\n") +
           inst("executor", "exec-d", "device = \"cpu\"\ndevices = [1]\nkv_blocks = 16\n");
  }

  std::string dir_;
  uint16_t http_port_, admin_port_;
  std::unique_ptr<Child> node_;
};

// A prompt of about `words` words, different for each seed (so each has its own blocks).
std::string story(int seed, int words) {
  static const char* vocab[] = {"the", "little", "dog", "ran", "to", "a", "big", "tree",
                                "and", "saw", "bird", "sky", "happy", "girl", "park", "sun"};
  std::string out = "Once upon a time";
  uint32_t x = static_cast<uint32_t>(seed) * 2654435761u + 7;
  for (int i = 0; i < words; ++i) {
    x = x * 1664525u + 1013904223u;
    out += " ";
    out += vocab[(x >> 16) % 16];
  }
  return out;
}

struct Answer {
  std::string text;
  int full_blocks = 0;  // of the prompt (16 tokens each)
};

// The greedy answer, or nullopt with *why (no 200, or not the JSON of a completion). Safe on
// any thread (no doctest assertion).
std::optional<Answer> try_complete(uint16_t port, const std::string& prompt, std::string* why) {
  json body = {{"model", "stories15M"}, {"prompt", prompt}, {"max_tokens", 16},
               {"temperature", 0}};
  auto r = http::post(port, "/v1/completions", body.dump(), 60000ms);
  json j = json::parse(r.body, nullptr, false);
  if (!r.ok() || r.status != 200 || j.is_discarded() || !j.contains("choices")) {
    *why = std::to_string(r.status) + " " + r.error + " " + r.body;
    return std::nullopt;
  }
  return Answer{j["choices"][0]["text"].get<std::string>(),
                j["usage"]["prompt_tokens"].get<int>() / 16};
}

// A prompt of exactly these token ids (the completions API takes them): lengths to the token.
Answer complete_ids(uint16_t port, const std::vector<int>& ids) {
  json body = {{"model", "stories15M"}, {"prompt", ids}, {"max_tokens", 16}, {"temperature", 0}};
  auto r = http::post(port, "/v1/completions", body.dump(), 60000ms);
  json j = json::parse(r.body, nullptr, false);
  REQUIRE_MESSAGE((r.ok() && r.status == 200 && !j.is_discarded() && j.contains("choices")),
                  r.status, " ", r.error, " ", r.body);
  CHECK(j["usage"]["prompt_tokens"].get<size_t>() == ids.size());
  return Answer{j["choices"][0]["text"].get<std::string>(),
                j["usage"]["prompt_tokens"].get<int>() / 16};
}

std::vector<int> token_ids(uint32_t seed, size_t count) {
  std::vector<int> ids;
  uint32_t x = seed * 2654435761u + 11;
  for (size_t i = 0; i < count; ++i) {
    x = x * 1664525u + 1013904223u;
    ids.push_back(static_cast<int>(300 + (x >> 16) % 20000));  // plain word pieces of stories15M
  }
  return ids;
}

Answer complete(uint16_t port, const std::string& prompt) {
  std::string why;
  auto answer = try_complete(port, prompt, &why);
  REQUIRE_MESSAGE(answer.has_value(), why);
  return *answer;
}

// The number the first group of `pattern` matches in `text`, or -1.
long long number_in(const std::string& text, const std::string& pattern) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(pattern))) return -1;
  return std::stoll(m[1].str());
}

struct Verified {
  long long checked = -1, ok = -1, dropped = -1, checksum = -1;
};

// Runs `tier2 verify solo` and reads its line ("verify checked N blocks in T s: K ok, D
// dropped (short_read 0, io_error 0, checksum C)").
Verified verify(Tier2Node& node) {
  RunResult r = node.shell("tier2 verify solo");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  return {number_in(r.output, "verify checked (\\d+) blocks"), number_in(r.output, "s: (\\d+) ok"),
          number_in(r.output, "ok, (\\d+) dropped"), number_in(r.output, "checksum (\\d+)\\)")};
}

// Blocks `tier2 solo` says are used, or -1.
long long blocks_used(Tier2Node& node) {
  RunResult r = node.shell("tier2 solo");
  return r.exit_code == 0 ? number_in(r.output, "blocks +(\\d+) used of") : -1;
}

bool tier2_open(Tier2Node& node) {
  return node.shell("tier2 solo").output.find("kv-offload: open") != std::string::npos;
}

// Waits until the write-behind of the prompts answered so far has landed: the stored-blocks
// count holds still for half a second.
bool writes_settled(Tier2Node& node) {
  double last = -1;
  return eventually(20s, [&] {
    double now = node.metric("tandem:tier2_stored_blocks_total");
    bool still = now == last;
    last = now;
    if (!still) std::this_thread::sleep_for(500ms);
    return still;
  });
}

// Flips one byte of a stored block in the data file: of the first 4096-byte page that is not
// all zeros (the file is preallocated with zeros, slots are 4096-aligned and a block's
// padding is zeros, so that page holds a block's bytes). Returns its offset, or -1.
long long corrupt_one_block(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR);
  if (fd < 0) return -1;
  std::vector<uint8_t> page(4096);
  long long found = -1;
  for (off_t at = 0; found < 0 && ::pread(fd, page.data(), page.size(), at) == 4096; at += 4096) {
    for (size_t i = 0; i < page.size() && found < 0; ++i) {
      if (page[i] == 0) continue;
      uint8_t flipped = page[i] ^ 0x5a;
      if (::pwrite(fd, &flipped, 1, at + static_cast<off_t>(i)) == 1) found = at + i;
    }
  }
  ::fsync(fd);
  ::close(fd);
  return found;
}

}  // namespace

TEST_CASE("tier 2: an evicted prompt comes back from NVMe, same answer, also after a restart" *
          doctest::timeout(300)) {
  std::string dir = make_temp_dir("tier2");
  uint16_t http_port = free_port(), admin_port = free_port(), fabric_port = free_port();
  std::string long_prompt = story(1, 180);  // ~180 tokens: 11 full blocks
  Answer first;
  {
    Tier2Node node(dir, http_port, admin_port, fabric_port);
    REQUIRE_MESSAGE(node.wait_ready(90s), node.log());
    first = complete(node.port(), long_prompt);
    // Write-behind: its blocks reach tier 2 after the answer.
    REQUIRE(first.full_blocks >= 8);
    bool stored = eventually(10s, [&] {
      return node.metric("tandem:tier2_stored_blocks_total") >= first.full_blocks;
    });
    REQUIRE_MESSAGE(stored, node.metrics(), node.log());
    for (int seed = 2; seed <= 5; ++seed) (void)complete(node.port(), story(seed, 180));
    // Precise events: the router's view of this node's tier 2 is what the store holds.
    CHECK_MESSAGE(eventually(10s, [&] { return node.router_view_exact(); }), node.metrics());
    double credited_before = node.metric("tandem_router_tier2_credited_picks_total");
    double loaded_before = node.metric("tandem:prefill_tier2_loaded_blocks_total");
    double pulled_before = node.metric("tandem:kv_pulled_blocks_total");
    double hits_before = node.metric("tandem:prefix_cache_hits_total");
    Answer again = complete(node.port(), long_prompt);
    double loaded = node.metric("tandem:prefill_tier2_loaded_blocks_total") - loaded_before;
    INFO(node.metrics(), node.log());
    // Its blocks were read back instead of computed (the pool had evicted all of them).
    CHECK(loaded == first.full_blocks);
    // ... and the prompt used them: its prefill matched them in the pool (all but the last
    // block, which a fully cached prompt recomputes for its first token).
    CHECK(node.metric("tandem:prefix_cache_hits_total") - hits_before >=
          (first.full_blocks - 1) * 16);
    // Decode had evicted it too: it pulled the prompt's KV from prefill's pool.
    CHECK(node.metric("tandem:kv_pulled_blocks_total") - pulled_before >= first.full_blocks);
    CHECK(again.text == first.text);
    CHECK(node.metric("tandem:tier2_corrupt_blocks_dropped_total") == 0);
    // The router knew the prefill's node held the prompt in tier 2 when it picked.
    CHECK(node.metric("tandem_router_tier2_credited_picks_total") == credited_before + 1);
  }
  {
    Tier2Node node(dir, http_port, admin_port, fabric_port);  // the same tier-2 directory
    REQUIRE_MESSAGE(node.wait_ready(90s), node.log());
    Answer after = complete(node.port(), long_prompt);
    INFO(node.metrics(), node.log());
    CHECK(node.metric("tandem:tier2_blocks_used") >= 5 * first.full_blocks);  // index is back
    // The restarted router learned it all again: a snapshot when the store opened.
    CHECK(eventually(10s, [&] { return node.router_view_exact(); }));
    CHECK(node.metric("tandem_router_tier2_blocks") >= 5 * first.full_blocks);
    CHECK(node.metric("tandem:prefill_tier2_loaded_blocks_total") == first.full_blocks);
    CHECK(after.text == first.text);
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

TEST_CASE("tier 2: a capacity above the free space stops the node at start, naming the key") {
  std::string dir = make_temp_dir("tier2-full");
  Tier2Node node(dir, free_port(), free_port(), free_port(), uint64_t{1} << 62);
  bool exited = eventually(30s, [&] { return !node.running(); });
  std::string log = node.log();
  INFO(log);
  CHECK(exited);
  CHECK(log.find("kv_offload.capacity_bytes") != std::string::npos);
  CHECK(log.find("do not fit in " + dir + "/tier2/solo") != std::string::npos);
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

TEST_CASE("tier 2: tandem shell shows, verifies and drops the blocks; answers stay the same" *
          doctest::timeout(400)) {
  std::string dir = make_temp_dir("tier2-ops");
  Tier2Node node(dir, free_port(), free_port(), free_port());
  REQUIRE_MESSAGE(node.wait_ready(90s), node.log());
  // Before any block: tier 2 is not open; verify says so (an error), bad usage prints usage.
  RunResult shown = node.shell("tier2 solo");
  CHECK(shown.exit_code == 0);
  CHECK(shown.output.find("solo/kv-offload/kv-offload: off (not open yet") != std::string::npos);
  RunResult early = node.shell("tier2 verify solo");
  CHECK(early.exit_code == 1);
  CHECK(early.output.find("tier 2 is not open yet") != std::string::npos);
  for (const char* bad : {"tier2 verify", "tier2 drop", "tier2 solo extra", "tier2 scrub solo"}) {
    RunResult usage = node.shell(bad);
    INFO(bad, ": ", usage.output);
    CHECK(usage.exit_code == 1);
    CHECK(usage.output.find("usage: tier2 [NODE] | tier2 verify NODE | tier2 drop NODE") !=
          std::string::npos);
  }
  RunResult ghost = node.shell("tier2 ghost");  // not a node of the manifest
  CHECK(ghost.exit_code == 1);
  CHECK(ghost.output.find("error: ") != std::string::npos);
  RunResult all = node.shell("tier2");  // every node of the manifest: the one
  CHECK(all.exit_code == 0);
  CHECK(all.output.find("solo/kv-offload/kv-offload: off") != std::string::npos);

  std::string long_prompt = story(1, 180);
  Answer first = complete(node.port(), long_prompt);
  REQUIRE(first.full_blocks >= 8);
  REQUIRE_MESSAGE(eventually(10s, [&] { return blocks_used(node) >= first.full_blocks; }),
                  node.shell("tier2 solo").output, node.log());
  shown = node.shell("tier2 solo");
  INFO(shown.output);
  CHECK(shown.output.find("kv-offload: open, ") != std::string::npos);
  CHECK(number_in(shown.output, "(\\d+) blocks stored") >= first.full_blocks);
  long long used = blocks_used(node);
  Verified good = verify(node);
  CHECK(good.checked == used);
  CHECK(good.ok == used);
  CHECK(good.dropped == 0);

  // One byte of one stored block flipped on disk, behind the store's back.
  REQUIRE(corrupt_one_block(node.data_file()) >= 0);
  Verified bad = verify(node);
  CHECK(bad.checked == used);
  CHECK(bad.ok == used - 1);
  CHECK(bad.dropped == 1);
  CHECK(bad.checksum == 1);
  CHECK(blocks_used(node) == used - 1);
  CHECK(node.metric("tandem:tier2_corrupt_blocks_dropped_total") == 1);
  // ... and the router was told (precise events): its view of this tier 2 lost the block.
  CHECK(eventually(5s, [&] { return node.metric("tandem_router_tier2_blocks") == used - 1; }));
  // Evicted from both pools, the prompt comes back from tier 2 up to the dropped block at
  // most and is computed from there: the same answer.
  for (int seed = 2; seed <= 5; ++seed) (void)complete(node.port(), story(seed, 180));
  double loaded_before = node.metric("tandem:prefill_tier2_loaded_blocks_total");
  double misses_before = node.metric("tandem:tier2_miss_blocks_total");
  Answer after_corrupt = complete(node.port(), long_prompt);
  INFO(node.metrics());
  CHECK(node.metric("tandem:prefill_tier2_loaded_blocks_total") - loaded_before <
        first.full_blocks);
  CHECK(after_corrupt.text == first.text);
  // kv-offload forgot the dropped block: no lookup tried to read it again.
  CHECK(node.metric("tandem:tier2_miss_blocks_total") == misses_before);
  CHECK(node.metric("tandem:tier2_corrupt_blocks_dropped_total") == 1);

  // Drop: nothing left; the prompt, evicted again, is computed (no tier-2 hit), same answer.
  REQUIRE(writes_settled(node));
  long long before_drop = blocks_used(node);
  CHECK(before_drop > used);  // the four other prompts' blocks
  RunResult dropped = node.shell("tier2 drop solo");
  INFO(dropped.output);
  CHECK(dropped.exit_code == 0);
  CHECK(number_in(dropped.output, "dropped (\\d+) blocks") == before_drop);
  CHECK(blocks_used(node) == 0);
  CHECK(eventually(5s, [&] { return node.metric("tandem_router_tier2_blocks") == 0; }));
  CHECK(verify(node).checked == 0);
  for (int seed = 2; seed <= 5; ++seed) (void)complete(node.port(), story(seed, 180));
  loaded_before = node.metric("tandem:prefill_tier2_loaded_blocks_total");
  double hits_before = node.metric("tandem:tier2_hit_blocks_total");
  double lookups_before = node.metric("tandem:tier2_lookups_total");
  misses_before = node.metric("tandem:tier2_miss_blocks_total");
  Answer after_drop = complete(node.port(), long_prompt);
  CHECK(node.metric("tandem:tier2_lookups_total") > lookups_before);      // it asked tier 2 ...
  CHECK(node.metric("tandem:tier2_hit_blocks_total") == hits_before);     // ... and got nothing,
  CHECK(node.metric("tandem:tier2_miss_blocks_total") == misses_before);  // not even a read
  CHECK(node.metric("tandem:prefill_tier2_loaded_blocks_total") == loaded_before);
  CHECK(after_drop.text == first.text);
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

TEST_CASE("tier 2: SIGKILL during a burst of writes loses no stored block and serves none bad" *
          doctest::timeout(400)) {
  std::string dir = make_temp_dir("tier2-kill");
  uint16_t http_port = free_port(), admin_port = free_port(), fabric_port = free_port();
  std::map<int, std::string> answered;  // seed -> greedy text, answered before the kill
  double stored_at_kill = 0;
  std::vector<int> seeds;
  {
    Tier2Node node(dir, http_port, admin_port, fabric_port);
    REQUIRE_MESSAGE(node.wait_ready(90s), node.log());
    // Two clients send distinct long prompts back to back, so offers and disk writes keep
    // coming; the node is killed as soon as the stored-blocks count has just risen.
    std::mutex mu;
    std::atomic<bool> stop{false};
    std::vector<std::thread> clients;
    for (int c = 0; c < 2; ++c) {
      clients.emplace_back([&, c] {
        for (int i = 0; i < 10 && !stop; ++i) {
          int seed = 100 + c * 10 + i;
          {
            std::lock_guard lock(mu);
            seeds.push_back(seed);
          }
          std::string why;
          auto a = try_complete(node.port(), story(seed, 180), &why);
          if (!a) return;  // the node is gone
          std::lock_guard lock(mu);
          answered[seed] = a->text;
        }
      });
    }
    double before = 0;
    bool killed = false;
    for (auto deadline = std::chrono::steady_clock::now() + 180s;
         !killed && std::chrono::steady_clock::now() < deadline;) {
      double now = node.metric("tandem:tier2_stored_blocks_total");
      size_t answers = 0;
      {
        std::lock_guard lock(mu);
        answers = answered.size();
      }
      if (now > before && answers >= 2) {
        node.kill();
        killed = true;
        stored_at_kill = now;
      }
      before = now;
      std::this_thread::sleep_for(20ms);
    }
    stop = true;
    for (auto& t : clients) t.join();
    REQUIRE_MESSAGE(killed, node.metrics(), node.log());
  }
  MESSAGE("killed after ", stored_at_kill, " blocks stored, ", answered.size(), " of ",
          seeds.size(), " prompts answered");
  Tier2Node node(dir, http_port, admin_port, fabric_port);  // the same tier-2 directory
  REQUIRE_MESSAGE(node.wait_ready(90s), node.log());
  // Tier 2 opens with the first block a prefill offers or asks for: a short new prompt. Its
  // blocks are written behind and indexed too: the store's stored-blocks count since the
  // restart says how many of the indexed blocks are its, the rest were indexed before the kill.
  (void)complete(node.port(), story(999, 40));
  REQUIRE_MESSAGE(eventually(20s, [&] { return tier2_open(node); }), node.log());
  REQUIRE(writes_settled(node));
  const double stored_since_restart = node.metric("tandem:tier2_stored_blocks_total");
  Verified after = verify(node);
  INFO(node.log());
  // Blocks indexed before the kill and back in the index after it.
  const double recovered = static_cast<double>(after.checked) - stored_since_restart;
  MESSAGE("after the restart: ", after.checked, " blocks indexed, ", stored_since_restart,
          " of them the new prompt's: ", recovered, " from before the kill (", stored_at_kill,
          " stored when last read before it)");
  CHECK(after.checked > 0);
  // None silently missing: every block stored before the kill is indexed again (>=: blocks
  // stored between the last read of the count and the kill are back too).
  CHECK(recovered >= stored_at_kill);
  // verify accounts for each block it checked: good, or dropped as corrupt/short/unreadable.
  CHECK(after.ok + after.dropped == after.checked);
  CHECK(after.ok == after.checked);
  CHECK(after.dropped == 0);
  double loaded_before = node.metric("tandem:prefill_tier2_loaded_blocks_total");
  double misses_before = node.metric("tandem:tier2_miss_blocks_total");
  for (int seed : seeds) {
    Answer again = complete(node.port(), story(seed, 180));
    if (answered.count(seed)) CHECK_MESSAGE(again.text == answered[seed], "seed ", seed);
  }
  // The re-sent prompts were served from the blocks that survived the kill; each block read
  // is in the read-latency histogram.
  double loaded = node.metric("tandem:prefill_tier2_loaded_blocks_total");
  const double served = loaded - loaded_before;
  MESSAGE("re-sent prompts: ", served, " blocks served from tier 2");
  CHECK(loaded > loaded_before);
  CHECK(node.metric("tandem:tier2_read_seconds_count") >= loaded);
  // They add up: each block from before the kill was served to its re-sent prompt or reported
  // by verify; none indexed but never read (a lost predecessor makes it unreachable) or
  // missing on read (a miss would be a third, silent outcome).
  CHECK(served + static_cast<double>(after.dropped) == recovered);
  CHECK(node.metric("tandem:tier2_miss_blocks_total") == misses_before);
  CHECK(node.metric("tandem:tier2_corrupt_blocks_dropped_total") == 0);
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

namespace {

// Two nodes, each with a prefill instance and its kv-offload: "a" also runs the gateway, the
// router and decode. Round-robin picks alternate the prefill instances, so a prompt's second
// turn can land on the node that never computed it: the router names the other node's tier
// 2 (RouteReply.tier2Source) and that prefill reads the blocks from it over the fabric.
class RemoteTier2 {
 public:
  explicit RemoteTier2(const std::string& dir)
      : dir_(dir), http_port_(free_port()), admin_{free_port(), free_port()} {
    write_file(dir_ + "/cluster.toml", manifest_text());
    for (const char* node : {"a", "b"}) {
      std::vector<std::string> argv{tandem_bin(), "node", "--manifest", dir_ + "/cluster.toml",
                                    "--node", node};
      if (std::string(node) == "b") argv.push_back("--test-hooks");  // debug-drop-kv-events
      nodes_.push_back(std::make_unique<Child>(std::move(argv), dir_ + "/" + node + ".log"));
    }
  }
  ~RemoteTier2() {
    for (auto& node : nodes_) node->signal(SIGTERM);
    for (auto& node : nodes_) node->wait(10000ms);
  }
  uint16_t port() const { return http_port_; }
  RunResult shell(const std::string& command) {
    return run({tandem_bin(), "shell", "--manifest", dir_ + "/cluster.toml", "-c", command},
               30000ms);
  }
  // The router's tier-2 view equals what both stores hold, and holds at least `blocks_min`.
  bool router_view_exact(double blocks_min) {
    double used = metric("tandem:tier2_blocks_used");
    return used >= blocks_min && metric("tandem_router_tier2_blocks") == used;
  }
  // `series` summed over both nodes' /metrics; the test fails when either does not answer.
  double metric(const std::string& series) {
    double sum = 0;
    for (size_t i = 0; i < admin_.size(); ++i) {
      sum += required_metric(admin_[i], i == 0 ? "a" : "b", series);
    }
    return sum;
  }
  std::string logs() { return nodes_[0]->log() + "\n---- node b\n" + nodes_[1]->log(); }
  // Decode and both prefill instances eligible and a completion answered.
  bool wait_ready(std::chrono::milliseconds timeout) {
    return eventually(timeout, [&] {
      // Polled from the start: a node that does not answer yet is not ready.
      double eligible = 0;
      for (uint16_t admin : admin_) {
        eligible += http::scrape_metric(admin, "tandem_router_instance_eligible").value_or(-9);
      }
      if (eligible < 3) return false;
      json body = {{"model", "stories15M"}, {"prompt", "Warm"}, {"max_tokens", 1}};
      auto r = http::post(http_port_, "/v1/completions", body.dump(), 30000ms);
      return r.ok() && r.status == 200;
    });
  }

 private:
  std::string manifest_text() {
    auto inst = [](const std::string& role, const std::string& name, const std::string& extra) {
      return "[[node.instance]]\nrole = \"" + role + "\"\nname = \"" + name + "\"\n" + extra;
    };
    auto node = [&](const std::string& name, uint16_t admin, const std::string& http) {
      return "[[node]]\nname = \"" + name + "\"\nhost = \"127.0.0.1\"\nfabric_port = " +
             std::to_string(free_port()) + "\nadmin_port = " + std::to_string(admin) + "\n" +
             http;
    };
    return "[cluster]\nname = \"tier2-remote\"\n[fabric]\nprovider = \"tcp;ofi_rxm\"\n"
           "[logging]\nlevel = \"info\"\n"
           "[model]\nname = \"stories15M\"\npath = \"" + model_dir() + "\"\n"
           "block_tokens = 16\nmax_model_tokens = 256\nchat_format = \"plain\"\n"
           "[router]\npolicy = \"round-robin\"\ndisaggregate_tokens_min = 1\n"
           "[kv_offload]\nenabled = true\npath = \"" + dir_ + "/tier2\"\n"
           "capacity_bytes = " + std::to_string(64u << 20) + "\nstaging_blocks = 32\n" +
           node("a", admin_[0], "http_port = " + std::to_string(http_port_) + "\n") +
           inst("gateway", "gateway", "") + inst("router", "router", "") +
           inst("prefill", "prefill", "executor = \"exec-p\"\n") +
           inst("decode", "decode", "executor = \"exec-d\"\n") +
           inst("kv-offload", "kv-offload", "") +
           inst("executor", "exec-p", "device = \"cpu\"\ndevices = [0]\nkv_blocks = 40\n") +
           inst("executor", "exec-d", "device = \"cpu\"\ndevices = [1]\nkv_blocks = 16\n") +
           node("b", admin_[1], "") + inst("prefill", "prefill-b", "executor = \"exec-pb\"\n") +
           inst("kv-offload", "kv-offload-b", "") +
           inst("executor", "exec-pb", "device = \"cpu\"\ndevices = [0]\nkv_blocks = 40\n");
  }

  std::string dir_;
  uint16_t http_port_;
  std::array<uint16_t, 2> admin_;
  std::vector<std::unique_ptr<Child>> nodes_;
};

}  // namespace

TEST_CASE("tier 2: a prefill instance reads a prompt's blocks from another node's tier 2" *
          doctest::timeout(300)) {
  std::string dir = make_temp_dir("tier2-remote");
  {
    RemoteTier2 cluster(dir);
    REQUIRE_MESSAGE(cluster.wait_ready(120s), cluster.logs());
    std::string prompt = story(11, 180);
    // X on one prefill instance, two others (round robin: the other, then this one again,
    // each evicting decode's copy of the one before), then X on the other instance: its
    // pool and its node's tier 2 never saw X; the first instance's node's tier 2 has it.
    Answer first = complete(cluster.port(), prompt);
    REQUIRE(first.full_blocks >= 8);
    bool stored = eventually(10s, [&] {
      return cluster.metric("tandem:tier2_stored_blocks_total") >= first.full_blocks;
    });
    REQUIRE_MESSAGE(stored, cluster.logs());
    (void)complete(cluster.port(), story(12, 180));
    (void)complete(cluster.port(), story(13, 180));
    // Both nodes' stores reported to the router on a: its view is what they hold.
    bool exact = eventually(10s, [&] {
      double used = cluster.metric("tandem:tier2_blocks_used");
      return used >= 3 * first.full_blocks && cluster.metric("tandem_router_tier2_blocks") == used;
    });
    CHECK_MESSAGE(exact, cluster.logs());
    double remote_picks = cluster.metric("tandem_router_tier2_remote_picks_total");
    double remote_lookups = cluster.metric("tandem:prefill_tier2_remote_lookups_total");
    double loaded_before = cluster.metric("tandem:prefill_tier2_loaded_blocks_total");
    Answer again = complete(cluster.port(), prompt);
    INFO(cluster.logs());
    CHECK(cluster.metric("tandem_router_tier2_remote_picks_total") == remote_picks + 1);
    // Two lookups: the remote reads' rates are unmeasured, so a probe of one block first,
    // then (it read, and a read beats computing) the rest (tier2_policy.hpp).
    CHECK(cluster.metric("tandem:prefill_tier2_remote_lookups_total") == remote_lookups + 2);
    // Every full block came over the fabric from the other node's tier 2, none computed ...
    CHECK(cluster.metric("tandem:prefill_tier2_loaded_blocks_total") - loaded_before ==
          first.full_blocks);
    // ... and the greedy answer is the one computing it gave.
    CHECK(again.text == first.text);
    CHECK(cluster.metric("tandem:tier2_corrupt_blocks_dropped_total") == 0);

    // A numbered event frame lost over the real fabric: node b loses its next tier-2 frame
    // to the router on a. The router finds the gap at b's next frame (or its keepalive),
    // drops b's view, asks for a snapshot, and its view equals both stores again.
    double gaps = cluster.metric("tandem_router_kv_event_gaps_total");
    double resyncs = cluster.metric("tandem_router_kv_resyncs_total");
    double used_before = cluster.metric("tandem:tier2_blocks_used");
    RunResult armed = cluster.shell("debug-drop-kv-events b 1");
    REQUIRE_MESSAGE(armed.exit_code == 0, armed.output);
    CHECK(armed.output.find("the next 1 numbered tier-2") != std::string::npos);
    RunResult refused = cluster.shell("debug-drop-kv-events a 1");  // a runs without hooks
    CHECK(refused.exit_code != 0);
    CHECK(refused.output.find("runs without --test-hooks") != std::string::npos);
    // New prompts (round-robin: half of them prefilled on b, whose store takes their blocks).
    for (int seed = 20; seed < 26; ++seed) (void)complete(cluster.port(), story(seed, 180));
    bool healed = eventually(20s, [&] {
      return cluster.metric("tandem_router_kv_event_gaps_total") > gaps &&
             cluster.router_view_exact(used_before + 1);
    });
    CHECK_MESSAGE(healed, cluster.logs());
    CHECK(cluster.metric("tandem_router_kv_resyncs_total") > resyncs);
    CHECK(cluster.logs().find("out of sequence") != std::string::npos);
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

// Sub-blocks in tier 2: with 4-token sub-blocks of 16-token blocks, a prompt's trailing
// partial block is written behind under its last full sub-block's prefix hash, and the next
// turn (the same prompt and more, as an agent's next request) reads it back after the pools
// evicted everything: whole blocks, then that partial block, which the prefill copies into
// the block it computes the rest in. Greedy answers are the ones computing gives.
namespace {
// Turn 1 of 188 tokens, both pools evicted, turn 2 extending it by 8 tokens: with partial
// blocks (the default) tier 2 brings back 11 whole blocks and block 11's first 3 sub-blocks;
// with `[kv_offload] partial_blocks = false` the 11 whole blocks only.
void trailing_partial_turn(bool partials) {
  std::string dir = make_temp_dir("tier2-sub");
  uint16_t http_port = free_port(), admin_port = free_port(), fabric_port = free_port();
  Tier2Node node(dir, http_port, admin_port, fabric_port, 64u << 20, "sub_block_tokens = 4\n",
                 partials ? "" : "partial_blocks = false\n");
  REQUIRE_MESSAGE(node.wait_ready(90s), node.log());
  // Turn 1: 188 tokens = 11 blocks and 12 tokens (3 sub-blocks of block 11).
  std::vector<int> turn1 = token_ids(1, 188);
  (void)complete_ids(node.port(), turn1);
  const double offered = partials ? 12 : 11;  // 11 whole + the partial
  bool stored = eventually(10s, [&] {
    return node.metric("tandem:tier2_stored_blocks_total") >= offered;
  });
  REQUIRE_MESSAGE(stored, node.metrics(), node.log());
  REQUIRE(writes_settled(node));
  CHECK(node.metric("tandem:tier2_stored_blocks_total") == offered);  // no partial when off
  // Evict both pools (prefill 40 blocks, decode 16).
  auto evict = [&](uint32_t from) {
    for (uint32_t seed = from; seed < from + 4; ++seed) (void)complete_ids(node.port(), token_ids(seed, 180));
  };
  evict(10);
  REQUIRE(writes_settled(node));
  // Turn 2: turn 1 and 8 more tokens = 196 tokens: block 11 is now full (its whole hash is
  // new), so tier 2 has blocks 0..10 whole and block 11's first 3 sub-blocks.
  std::vector<int> turn2 = turn1;
  for (int id : token_ids(99, 8)) turn2.push_back(id);
  double partial_before = node.metric("tandem:tier2_partial_hit_blocks_total");
  double loaded_before = node.metric("tandem:prefill_tier2_loaded_blocks_total");
  double hits_before = node.metric("tandem:prefix_cache_hits_total");
  Answer read_back = complete_ids(node.port(), turn2);
  {
    INFO(node.metrics(), node.log());
    CHECK(node.metric("tandem:tier2_partial_hit_blocks_total") == partial_before + partials);
    CHECK(node.metric("tandem:prefill_tier2_loaded_blocks_total") - loaded_before == offered);
    // The prompt matched 11 blocks and 3 sub-blocks: 188 tokens not computed (176 without).
    CHECK(node.metric("tandem:prefix_cache_hits_total") - hits_before >= (partials ? 188 : 176));
    CHECK(node.metric("tandem:tier2_corrupt_blocks_dropped_total") == 0);
  }
  // The same turn computed from nothing: tier 2 dropped, the pools evicted again.
  RunResult dropped = node.shell("tier2 drop solo");
  REQUIRE_MESSAGE(dropped.exit_code == 0, dropped.output);
  evict(20);
  double loaded_mid = node.metric("tandem:prefill_tier2_loaded_blocks_total");
  Answer computed = complete_ids(node.port(), turn2);
  CHECK(node.metric("tandem:prefill_tier2_loaded_blocks_total") == loaded_mid);
  CHECK(read_back.text == computed.text);
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}
}  // namespace

TEST_CASE("tier 2: a prompt's trailing partial block comes back for its next turn (sub-blocks)" *
          doctest::timeout(300)) {
  trailing_partial_turn(true);
}

TEST_CASE("tier 2: [kv_offload] partial_blocks = false keeps whole blocks only" *
          doctest::timeout(300)) {
  trailing_partial_turn(false);
}
