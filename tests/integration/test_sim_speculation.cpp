// The sim device as a speculating target (issue 14): a one-node sim cluster with suffix and
// n-gram drafting gives the same output as without, and its drafts are accepted where the
// sim's outputs copy their context (copy_probability), as counted on the decode instance.
// The sim device's next token depends only on the context and the executor's seed, so
// verification must reproduce the undrafted stream exactly.
#include <doctest.h>

#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/http_client.hpp"
#include "tests/support/process.hpp"
#include "tests/support/sim_cluster.hpp"

using namespace tandem::testing;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

struct Outputs {
  std::vector<std::string> texts;
  double drafts = 0, drafted = 0, accepted = 0;
};

uint16_t admin_port_of(const std::string& manifest) {
  std::smatch m;
  REQUIRE(std::regex_search(manifest, m, std::regex("admin_port = ([0-9]+)")));
  return static_cast<uint16_t>(std::stoi(m[1]));
}

// Each prompt asked twice (the second ask is what the drafters can copy), greedy.
Outputs serve(const std::string& extra, const std::vector<std::string>& prompts) {
  std::string dir = make_temp_dir("sim-spec");
  uint16_t http_port = free_port();
  std::string manifest = one_node_sim_manifest("sim-spec", http_port) + extra;
  // Outputs that end: 40 tokens each (the sim draws lengths; sigma 0 makes them the mean).
  manifest = std::regex_replace(manifest, std::regex("output_tokens_mean = 16384"),
                                "output_tokens_mean = 40");
  write_file(dir + "/cluster.toml", manifest);
  Child node({tandem_bin(), "node", "--manifest", dir + "/cluster.toml", "--node", "local"},
             dir + "/node.log");
  INFO("node log: " << node.log());
  REQUIRE(eventually(60s, [&] { return http::get(http_port, "/health").status == 200; }));
  Outputs out;
  for (int round = 0; round < 2; ++round) {
    for (const auto& p : prompts) {
      json body = {{"model", "stories15M"}, {"prompt", p}, {"max_tokens", 48},
                   {"temperature", 0}};
      auto r = http::post(http_port, "/v1/completions", body.dump(), 60000ms);
      REQUIRE_MESSAGE(r.status == 200, r.body);
      out.texts.push_back(json::parse(r.body)["choices"][0]["text"].get<std::string>());
    }
  }
  // No wait: decode exports a step's counters before the step's events leave
  // (actors/decode/decode_actor.cpp), so the last answer orders the scrape after them.
  auto metrics = http::get(admin_port_of(manifest), "/metrics");
  REQUIRE(metrics.status == 200);
  out.drafts = http::metric_sum(metrics.body, "tandem:spec_decode_num_drafts_total");
  out.drafted = http::metric_sum(metrics.body, "tandem:spec_decode_num_draft_tokens_total");
  out.accepted = http::metric_sum(metrics.body, "tandem:spec_decode_num_accepted_tokens_total");
  return out;
}

}  // namespace

TEST_CASE("sim device: suffix and n-gram drafts leave the output unchanged and are accepted "
          "where it copies") {
  std::vector<std::string> prompts;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back("def f" + std::to_string(i) + "(x):\n    return x * " + std::to_string(i) +
                      "\n\nprint(f" + std::to_string(i) + "(3))\n");
  }
  Outputs off = serve("", prompts);
  CHECK(off.drafts == 0);
  for (const char* method : {"suffix", "ngram"}) {
    Outputs on = serve(std::string("[speculative]\nmethod = \"") + method + "\"\n", prompts);
    MESSAGE(std::string(method), ": drafts ", on.drafts, ", draft tokens ", on.drafted, ", accepted ",
            on.accepted);
    REQUIRE(on.texts.size() == off.texts.size());
    for (size_t i = 0; i < off.texts.size(); ++i) {
      CHECK_MESSAGE(!off.texts[i].empty(), "request ", i);
      CHECK_MESSAGE(on.texts[i] == off.texts[i], std::string(method), " request ", i);
    }
    CHECK(on.drafts > 0);
    CHECK(on.accepted > 0);
    CHECK(on.accepted <= on.drafted);
  }
}
