// Test support: a cluster of `tandem node` processes on loopback serving stories15M on the cpu
// device (one node with every role, loopback-3's front/prefill/decode split, or loopback-3 with a
// second decode node), each case with its own manifest and free ports in a temp dir; plus
// small completion helpers. Requires $TANDEM_SOURCE_ROOT/models/stories15M (tools/setup.sh).
#pragma once

#include <doctest.h>

#include <csignal>
#include <map>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/http_client.hpp"
#include "tests/support/metric_check.hpp"
#include "tests/support/process.hpp"

namespace tandem::testing {

using namespace std::chrono_literals;

// Which processes a cluster runs: every role in one node, the loopback-3 split, or loopback-3
// with a second decode node ("decode2").
enum class Layout { one_node, loopback3, two_decode };

struct NodePorts {
  uint16_t fabric = 0, admin = 0;
};

inline std::string instance(const std::string& role, const std::string& name,
                            const std::string& executor = "") {
  std::string text = "  [[node.instance]]\n  role = \"" + role + "\"\n  name = \"" + name + "\"\n";
  if (!executor.empty()) text += "  executor = \"" + executor + "\"\n";
  return text;
}

inline std::string executor(const std::string& name, int device_index = 0, uint32_t kv_blocks = 0) {
  std::string text = instance("executor", name) + "  device = \"cpu\"\n  devices = [" +
                     std::to_string(device_index) + "]\n";
  if (kv_blocks > 0) text += "  kv_blocks = " + std::to_string(kv_blocks) + "\n";
  return text;
}

// A running cluster; nodes are SIGTERMed (then SIGKILLed by ~Child) on destruction.
class ServeCluster {
 public:
  // decode_kv_blocks: the decode executor's KV pool (0 = the manifest default);
  // fabric_toml: extra lines for the [fabric] section (they may open further sections).
  // model_toml / router_toml: extra lines for the [model] / [router] section; test_hooks:
  // every node runs with --test-hooks.
  ServeCluster(Layout layout, int disaggregate_tokens_min, uint32_t decode_kv_blocks = 0,
               std::string fabric_toml = "", std::string model_toml = "",
               std::string router_toml = "", bool test_hooks = false, bool start_nodes = true,
               std::string sim_toml = "", std::string rbln_toml = "",
               std::string cluster_toml = "")
      : layout_(layout),
        dir_(make_temp_dir("serve")),
        http_port_(free_port()),
        decode_kv_blocks_(decode_kv_blocks),
        fabric_toml_(std::move(fabric_toml)),
        model_toml_(std::move(model_toml)),
        router_toml_(std::move(router_toml)),
        test_hooks_(test_hooks),
        sim_toml_(std::move(sim_toml)),
        rbln_toml_(std::move(rbln_toml)),
        cluster_toml_(std::move(cluster_toml)) {
    for (const auto& name : node_names()) ports_[name] = {free_port(), free_port()};
    manifest_path_ = dir_ + "/cluster.toml";
    write_file(manifest_path_, manifest_text(disaggregate_tokens_min));
    if (start_nodes) {
      for (const auto& name : node_names()) start(name);
    }
  }
  ~ServeCluster() {
    for (auto& [name, child] : nodes_) child->signal(SIGTERM);
    for (auto& [name, child] : nodes_) child->wait(5000ms);
  }
  ServeCluster(const ServeCluster&) = delete;

  std::vector<std::string> node_names() const {
    if (layout_ == Layout::one_node) return {"solo"};
    if (layout_ == Layout::two_decode) return {"front", "prefill", "decode", "decode2"};
    return {"front", "prefill", "decode"};
  }
  std::string front() const { return layout_ == Layout::one_node ? "solo" : "front"; }
  std::string prefill() const { return layout_ == Layout::one_node ? "solo" : "prefill"; }
  std::string decode() const { return layout_ == Layout::one_node ? "solo" : "decode"; }
  uint16_t http_port() const { return http_port_; }
  uint16_t admin_port(const std::string& name) const { return ports_.at(name).admin; }
  uint16_t fabric_port(const std::string& name) const { return ports_.at(name).fabric; }
  const std::string& manifest_path() const { return manifest_path_; }
  const std::string& dir() const { return dir_; }
  Child& node(const std::string& name) { return *nodes_.at(name); }
  // Starts a node again (after it was killed), with the same manifest and log file.
  void restart(const std::string& name) {
    nodes_.erase(name);
    start(name);
  }

  RunResult shell(const std::string& command) {
    return run({tandem_bin(), "shell", "--manifest", manifest_path_, "-c", command}, 30000ms);
  }
  // The node's admin /metrics text ("" when it does not answer).
  std::string metrics(const std::string& name) {
    auto r = http::get(ports_.at(name).admin, "/metrics", 3000ms);
    return r.ok() && r.status == 200 ? r.body : "";
  }
  // `series` on node `name` (summed over label blocks containing `labels`; 0 when absent). The
  // test fails (REQUIRE) when the node's /metrics does not answer or does not parse.
  double metric(const std::string& name, const std::string& series,
                const std::string& labels = "") {
    return required_metric(ports_.at(name).admin, name, series, labels);
  }
  // As metric(), for polling a node that may not answer yet: nullopt when it does not.
  std::optional<double> try_metric(const std::string& name, const std::string& series,
                                   const std::string& labels = "") {
    return http::scrape_metric(ports_.at(name).admin, series, labels);
  }
  std::string logs() {
    std::string out = "last warm-up answer: " + warm_up_answer_ + "\n";
    for (auto& [name, child] : nodes_) out += "---- " + name + " ----\n" + child->log();
    return out;
  }
  // /health is 200 and a warm-up completion succeeds (every role has joined).
  bool wait_ready(std::chrono::milliseconds timeout) {
    auto ok = eventually(timeout, [&] {
      auto h = http::get(http_port_, "/health", 1000ms);
      return h.ok() && h.status == 200;
    });
    if (!ok) return false;
    // /health needs one ready decode instance only: also wait until the router may pick every
    // prefill and decode instance (a request routed before a prefill instance reported ready
    // prefills on decode, which some tests tell apart).
    size_t instances = layout_ == Layout::two_decode ? 3 : 2;
    ok = eventually(timeout, [&] {
      return try_metric(front(), "tandem_router_instance_eligible") ==
             static_cast<double>(instances);
    });
    if (!ok) return false;
    return eventually(timeout, [&] {
      nlohmann::json body = {
          {"model", "stories15M"}, {"prompt", "Warm up"}, {"max_tokens", 2}, {"temperature", 0}};
      auto started = std::chrono::steady_clock::now();
      auto r = http::post(http_port_, "/v1/completions", body.dump(), 30000ms);
      double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
              .count();
      warm_up_answer_ = std::to_string(r.status) + " after " + std::to_string(ms) + " ms " +
                        r.error + " " + r.body.substr(0, 400);
      return r.ok() && r.status == 200;
    });
  }

 private:
  void start(const std::string& name) {
    std::vector<std::string> argv{tandem_bin(),   "node",   "--manifest",
                                  manifest_path_, "--node", name};
    if (test_hooks_) argv.push_back("--test-hooks");
    nodes_[name] = std::make_unique<Child>(std::move(argv), dir_ + "/" + name + ".log");
  }
  std::string node_text(const std::string& name, const std::string& body) {
    NodePorts p = ports_.at(name);
    std::string text = "\n[[node]]\nname = \"" + name + "\"\nhost = \"127.0.0.1\"\n" +
                       "fabric_port = " + std::to_string(p.fabric) +
                       "\nadmin_port = " + std::to_string(p.admin) + "\n";
    if (name == front()) text += "http_port = " + std::to_string(http_port_) + "\n";
    return text + body;
  }
  std::string manifest_text(int disaggregate_tokens_min) {
    std::string text = manifest_body(disaggregate_tokens_min);
    if (sim_toml_.empty() && rbln_toml_.empty()) return text;
    // "# devices NAME: [0, 1]" lines in the rbln lines: that executor's devices.
    const std::string devices = "# devices ";
    for (size_t at = rbln_toml_.find(devices); at != std::string::npos;
         at = rbln_toml_.find(devices, at + 1)) {
      const size_t colon = rbln_toml_.find(": ", at), end = rbln_toml_.find('\n', at);
      REQUIRE((colon != std::string::npos && colon < end));
      const std::string name = rbln_toml_.substr(at + devices.size(), colon - at - devices.size());
      size_t line = text.find("devices = [", text.find("name = \"" + name + "\"\n  device = "));
      REQUIRE_MESSAGE(line != std::string::npos, name);
      text.replace(line, text.find('\n', line) - line,
                   "devices = " + rbln_toml_.substr(colon + 2, end - colon - 2));
    }
    const std::string kind = sim_toml_.empty() ? "device = \"rbln\"" : "device = \"sim\"";
    // "# rbln executors: A B\n" first in the rbln lines: only those executors are on rbln.
    const std::string only = "# rbln executors:";
    if (!rbln_toml_.empty() && rbln_toml_.rfind(only, 0) == 0) {
      std::istringstream names(rbln_toml_.substr(only.size(), rbln_toml_.find('\n') - only.size()));
      for (std::string name; names >> name;) {
        size_t at = text.find("name = \"" + name + "\"\n  device = \"cpu\"");
        REQUIRE_MESSAGE(at != std::string::npos, name);
        at = text.find("device = \"cpu\"", at);
        text.replace(at, 14, kind);
      }
      return text;
    }
    for (size_t at = text.find("device = \"cpu\""); at != std::string::npos;
         at = text.find("device = \"cpu\"", at)) {
      text.replace(at, 14, kind);
    }
    return text;
  }
  std::string manifest_body(int disaggregate_tokens_min) {
    std::string text =
        "[cluster]\nname = \"serve-it\"\n" + cluster_toml_ +
        "[fabric]\nprovider = \"tcp;ofi_rxm\"\n" + fabric_toml_ +
        "[membership]\nheartbeat_interval_ms = 100\nheartbeat_miss_max = 5\n"
        "[model]\nname = \"stories15M\"\npath = \"" +
        model_dir() +
        "\"\n"
        "block_tokens = 16\nmax_model_tokens = 256\nchat_format = \"plain\"\n" +
        model_toml_ + "[router]\npolicy = \"prefix-aware\"\ndisaggregate_tokens_min = " +
        std::to_string(disaggregate_tokens_min) + "\n" + router_toml_;
    if (!sim_toml_.empty()) {
      text +=
          "[sim]\nkv_scale = 0.0078125\nvocab = 32000\nbos_id = 1\neos_id = 2\n"
          "max_position = 256\n" +
          sim_toml_;
    }
    text += rbln_toml_;
    std::string front_roles = instance("gateway", "gateway") + instance("router", "router");
    if (layout_ == Layout::one_node) {
      return text +
             node_text("solo", front_roles + instance("prefill", "prefill", "exec-p") +
                                   instance("decode", "decode", "exec-d") + executor("exec-p") +
                                   executor("exec-d", 1, decode_kv_blocks_));
    }
    text += node_text("front", front_roles) +
            node_text("prefill", instance("prefill", "prefill", "exec-p") + executor("exec-p")) +
            node_text("decode", instance("decode", "decode", "exec-d") +
                                    executor("exec-d", 0, decode_kv_blocks_));
    if (layout_ == Layout::two_decode) {
      text += node_text("decode2", instance("decode", "decode2", "exec-d2") +
                                       executor("exec-d2", 0, decode_kv_blocks_));
    }
    return text;
  }

  Layout layout_;
  std::string dir_, manifest_path_;
  uint16_t http_port_;
  uint32_t decode_kv_blocks_;
  std::string fabric_toml_, model_toml_, router_toml_;
  bool test_hooks_ = false;
  // Non-empty: every executor is on the sim device with these [sim] keys (slow, long outputs
  // on demand, e.g. time_factor); the model's tokenizer is still stories15M's.
  std::string sim_toml_;
  // Non-empty: every executor is on the rbln device (or those a first line "# rbln executors: A
  // B" names); these lines ([rbln], [decode]) are added.
  std::string rbln_toml_;
  std::string cluster_toml_;  // more [cluster] lines (key_file, accept_key_files)
  std::map<std::string, NodePorts> ports_;
  std::map<std::string, std::unique_ptr<Child>> nodes_;
  std::string warm_up_answer_ = "(none)";
};

// 20 story openings for stories15M: the prompts of the greedy-identity tests.
inline const std::vector<std::string>& story_prompts() {
  static const std::vector<std::string> p = {
      "Once upon a time",
      "The little dog",
      "Tom and Sue went to the park",
      "There was a big red ball",
      "One day, a cat",
      "Lily wanted to bake a cake",
      "The sun was shining and",
      "Ben had a toy car",
      "In a small house lived",
      "The bird sang a song",
      "Mom said it was time for bed",
      "A little boy named Tim",
      "The tree was very tall",
      "Sam found a shiny rock",
      "It was a rainy day",
      "The girl liked to draw",
      "Once there was a fish",
      "The bear was hungry",
      "Anna and her friend",
      "The old man smiled",
  };
  return p;
}

inline nlohmann::json completion_body(const std::string& prompt, int max_tokens, bool stream,
                                      int logprobs = 0) {
  nlohmann::json body = {
      {"model", "stories15M"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
  if (logprobs > 0) body["logprobs"] = logprobs;
  if (stream) {
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
  }
  return body;
}

struct Completion {
  std::string text, error;  // error: transport or HTTP failure, described
  nlohmann::json usage;
  double ttft_ms = 0;  // streaming only: request sent -> first non-empty text
};

inline Completion complete(uint16_t port, const std::string& prompt, int max_tokens,
                           const std::string& cache_salt = "") {
  nlohmann::json body = completion_body(prompt, max_tokens, false);
  if (!cache_salt.empty()) body["cache_salt"] = cache_salt;
  auto r = http::post(port, "/v1/completions", body.dump(), 60000ms);
  Completion c;
  if (!r.ok() || r.status != 200) {
    c.error = "status " + std::to_string(r.status) + " " + r.error + " " + r.body;
    return c;
  }
  nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.contains("choices")) {
    c.error = "bad body: " + r.body;
    return c;
  }
  c.text = j["choices"][0]["text"].get<std::string>();
  c.usage = j.value("usage", nlohmann::json::object());
  return c;
}

}  // namespace tandem::testing
