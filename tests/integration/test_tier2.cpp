// Tier 2 end to end (issue 13): one `tandem node` with every role and a kv-offload instance
// on the cpu device (stories15M), every prompt through the prefill instance (P/D), pools
// small enough that a few prompts evict a long one.
// - A long prompt's blocks are offered to tier 2 and stored; after other prompts evicted it
//   from both pools, the same prompt is served with its blocks read back from tier 2 (the
//   prefill's tandem:prefill_tier2_loaded_blocks_total grows) and the greedy answer is the
//   same as the first time (identical to computing it).
// - The blocks survive a restart of the node: after SIGTERM and a fresh start on the same
//   directory, the prompt is again served from tier 2, same answer.
#include <doctest.h>

#include <filesystem>
#include <memory>
#include <sstream>
#include <nlohmann/json.hpp>

#include "tests/support/http_client.hpp"
#include "tests/support/process.hpp"

using namespace tandem::testing;
using namespace std::chrono_literals;
using json = nlohmann::json;
namespace http = tandem::testing::http;

namespace {

class Tier2Node {
 public:
  Tier2Node(const std::string& dir, uint16_t http_port, uint16_t admin_port, uint16_t fabric_port,
            uint64_t capacity_bytes = 64u << 20)
      : dir_(dir), http_port_(http_port), admin_port_(admin_port) {
    std::string manifest = dir_ + "/cluster.toml";
    write_file(manifest, manifest_text(fabric_port, capacity_bytes));
    node_ = std::make_unique<Child>(
        std::vector<std::string>{tandem_bin(), "node", "--manifest", manifest, "--node", "solo"},
        dir_ + "/solo.log");
  }
  ~Tier2Node() {
    node_->signal(SIGTERM);
    node_->wait(10000ms);
  }
  Tier2Node(const Tier2Node&) = delete;
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
  double metric(const std::string& series) {
    auto r = http::get(admin_port_, "/metrics", 3000ms);
    return http::metric_sum(r.ok() && r.status == 200 ? r.body : "", series, "");
  }
  // The router's tier-2 view of this node equals what its store holds (and is not empty).
  bool router_view_exact() {
    double used = metric("tandem:tier2_blocks_used");
    return used > 0 && metric("tandem_router_tier2_blocks") == used;
  }
  // Both instances eligible and a completion answered.
  bool wait_ready(std::chrono::milliseconds timeout) {
    return eventually(timeout, [&] {
      if (metric("tandem_router_instance_eligible") < 2) return false;
      json body = {{"model", "stories15M"}, {"prompt", "Warm"}, {"max_tokens", 1}};
      auto r = http::post(http_port_, "/v1/completions", body.dump(), 30000ms);
      return r.ok() && r.status == 200;
    });
  }

 private:
  std::string manifest_text(uint16_t fabric_port, uint64_t capacity_bytes) {
    auto inst = [](const std::string& role, const std::string& name, const std::string& extra) {
      return "[[node.instance]]\nrole = \"" + role + "\"\nname = \"" + name + "\"\n" + extra;
    };
    // Pools of 16-token blocks: prefill 40 (four 11-block prompts evict the first one),
    // decode 16 (one prompt and its answer: the next prompt evicts it), so the answer
    // depends on the KV prefill read back from tier 2 and decode pulled from it.
    return "[cluster]\nname = \"tier2-it\"\n[fabric]\nprovider = \"tcp;ofi_rxm\"\n"
           "[logging]\nlevel = \"info\"\n"
           "[model]\nname = \"stories15M\"\npath = \"" + model_dir() + "\"\n"
           "block_tokens = 16\nmax_model_tokens = 256\nchat_format = \"plain\"\n"
           "[router]\npolicy = \"prefix-aware\"\ndisaggregate_tokens_min = 1\n"
           "[kv_offload]\nenabled = true\npath = \"" + dir_ + "/tier2\"\n"
           "capacity_bytes = " + std::to_string(capacity_bytes) + "\nstaging_blocks = 32\n"
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

Answer complete(uint16_t port, const std::string& prompt) {
  json body = {{"model", "stories15M"}, {"prompt", prompt}, {"max_tokens", 16},
               {"temperature", 0}};
  auto r = http::post(port, "/v1/completions", body.dump(), 60000ms);
  REQUIRE_MESSAGE((r.ok() && r.status == 200), r.status, " ", r.error, " ", r.body);
  json j = json::parse(r.body, nullptr, false);
  REQUIRE(!j.is_discarded());
  return {j["choices"][0]["text"].get<std::string>(),
          j["usage"]["prompt_tokens"].get<int>() / 16};
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
