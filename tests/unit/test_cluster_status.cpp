// `tandem shell` status: metrics text parsing and the one-screen view, from canned answers.
#include <doctest.h>

#include <nlohmann/json.hpp>

#include "tools/cluster_status.hpp"

using namespace tandem::tools;

TEST_CASE("parse_metrics reads samples with labels and skips the rest") {
  auto samples = parse_metrics(
      "# HELP x y\n# TYPE x counter\nx 3\ny{a=\"1\",b=\"q\\\"z\"} 2.5\nbroken{a=\"1\" 4\n"
      "nan_gauge{instance=\"g\"} NaN\n\nz{} 7\n{a=\"1\"} 3\n");
  REQUIRE(samples.size() == 4);
  CHECK(samples[0].name == "x");
  CHECK(samples[0].value == 3);
  CHECK(samples[1].labels.at("a") == "1");
  CHECK(samples[1].labels.at("b") == "q\"z");
  CHECK(samples[1].value == 2.5);
  CHECK(samples[2].name == "nan_gauge");
  CHECK(samples[3].name == "z");
}

TEST_CASE("status: nodes, instances with hit rate, gateways' last minute, tier 2, errors") {
  std::vector<std::vector<std::string>> nodes = {
      {"node", "address", "state", "uptime", "last heartbeat"},
      {"front", "127.0.0.1:1", "up (this node)", "1m", "-"},
      {"decode", "127.0.0.1:2", "up", "1m", "90ms"},
      {"prefill", "127.0.0.1:3", "down", "-", "12s"}};
  NodeAnswers front{"front",
                    {{"instance", "state", "waiting", "running", "kv", "total"}},
                    "tandem:time_to_first_token_recent_count{instance=\"gateway\"} 12\n"
                    "tandem:time_to_first_token_recent_seconds{instance=\"gateway\",quantile="
                    "\"0.5\"} 0.041\n"
                    "tandem:time_to_first_token_recent_seconds{instance=\"gateway\",quantile="
                    "\"0.9\"} 0.088\n"
                    "tandem:inter_token_latency_recent_seconds{instance=\"gateway\",quantile="
                    "\"0.5\"} NaN\n"
                    "tandem:num_requests_running{instance=\"gateway\"} 3\n"
                    "tandem:num_requests_waiting{instance=\"gateway\"} 1\n"
                    "tandem:request_errors_by_type_total{instance=\"gateway\",type="
                    "\"overloaded_error\"} 2\n"
                    "tandem:tier2_blocks_used{instance=\"kvo\"} 10\n"
                    "tandem:tier2_blocks_capacity{instance=\"kvo\"} 100\n"};
  NodeAnswers decode{"decode",
                     {{"instance", "state", "waiting", "running", "kv", "total"},
                      {"decode/decode/decode", "draining", "0", "2", "16", "64"}},
                     "tandem:prefix_cache_queries_total{instance=\"decode\"} 200\n"
                     "tandem:prefix_cache_hits_total{instance=\"decode\"} 150\n"};
  NodeAnswers prefill{"prefill",
                      {{"instance", "state", "waiting", "running", "kv", "total"},
                       {"prefill/prefill/prefill", "unreachable", "-", "-", "-", "-"}},
                      ""};
  ClusterStatus st = build_status("c3", nodes, {front, decode, prefill});
  CHECK(st.nodes_up == 2);
  REQUIRE(st.instances.size() == 2);
  CHECK(st.instances[0].state == "draining");
  REQUIRE(st.instances[0].prefix_hit_rate.has_value());
  CHECK(*st.instances[0].prefix_hit_rate == doctest::Approx(0.75));
  CHECK_FALSE(st.instances[1].prefix_hit_rate.has_value());
  REQUIRE(st.gateways.size() == 1);
  CHECK(st.gateways[0].running == 3);
  CHECK(st.gateways[0].waiting == 1);
  CHECK(*st.gateways[0].ttft_p90_s == doctest::Approx(0.088));
  CHECK_FALSE(st.gateways[0].itl_p50_s.has_value());  // NaN: none in the last minute
  CHECK(st.errors_by_type.at("overloaded_error") == 2);
  REQUIRE(st.tier2.size() == 1);
  CHECK(st.tier2[0].blocks_used == 10);

  std::string text = render_status(st);
  CHECK(text.find("cluster c3: 2/3 nodes up") != std::string::npos);
  CHECK(text.find("decode/decode/decode") != std::string::npos);
  CHECK(text.find("16/64 (25.0%)") != std::string::npos);
  CHECK(text.find("75.0%") != std::string::npos);
  CHECK(text.find("41/88") != std::string::npos);
  CHECK(text.find("overloaded_error 2") != std::string::npos);
  CHECK(text.find("front 10/100 blocks") != std::string::npos);
  CHECK(text.find("unreachable") != std::string::npos);

  auto j = nlohmann::json::parse(status_json(st));
  CHECK(j["nodes_up"] == 2);
  CHECK(j["instances"][0]["prefix_hit_rate"].get<double>() == doctest::Approx(0.75));
  CHECK(j["gateways"][0]["itl_p50_s"].is_null());
  CHECK(j["errors_by_type"]["overloaded_error"] == 2);
}
