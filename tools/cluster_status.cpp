#include "tools/cluster_status.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/base/assert.hpp"

namespace tandem::tools {
namespace {

// name{a="x",b="y"}: the labels; false when malformed.
bool parse_labels(const std::string& text, std::map<std::string, std::string>& out) {
  size_t at = 0;
  while (at < text.size()) {
    size_t eq = text.find('=', at);
    if (eq == std::string::npos || eq + 1 >= text.size() || text[eq + 1] != '"') return false;
    std::string key = text.substr(at, eq - at);
    std::string value;
    size_t i = eq + 2;
    for (; i < text.size() && text[i] != '"'; ++i) {
      if (text[i] == '\\' && i + 1 < text.size()) {
        char next = text[++i];
        value += next == 'n' ? '\n' : next;
      } else {
        value += text[i];
      }
    }
    if (i >= text.size()) return false;
    out[key] = value;
    at = i + 1;
    if (at < text.size() && text[at] == ',') ++at;
  }
  return true;
}

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", fraction * 100);
  return buf;
}

std::string millis(const std::optional<double>& seconds) {
  if (!seconds) return "-";
  char buf[32];
  double ms = *seconds * 1000;
  std::snprintf(buf, sizeof buf, ms < 10 ? "%.1f" : "%.0f", ms);
  return buf;
}

std::optional<double> finite(double v) {
  return std::isfinite(v) ? std::optional<double>(v) : std::nullopt;
}

// Rows as aligned columns, two spaces apart.
std::string columns(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace

std::vector<MetricSample> parse_metrics(const std::string& text) {
  std::vector<MetricSample> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    size_t space = line.rfind(' ');
    if (space == std::string::npos || space == 0) continue;
    MetricSample s;
    std::string head = line.substr(0, space);
    size_t brace = head.find('{');
    if (brace != std::string::npos) {
      if (head.back() != '}') continue;
      if (!parse_labels(head.substr(brace + 1, head.size() - brace - 2), s.labels)) continue;
      head.resize(brace);
    }
    if (head.empty()) continue;  // `{a="b"} 1`: no metric name
    s.name = head;
    std::string value = line.substr(space + 1);
    char* end = nullptr;
    s.value = std::strtod(value.c_str(), &end);
    if (end == value.c_str()) continue;
    out.push_back(std::move(s));
  }
  return out;
}

ClusterStatus build_status(const std::string& cluster,
                           const std::vector<std::vector<std::string>>& nodes_rows,
                           const std::vector<NodeAnswers>& answers) {
  ClusterStatus st;
  st.cluster = cluster;
  for (size_t r = 1; r < nodes_rows.size(); ++r) {
    const auto& row = nodes_rows[r];
    if (row.size() < 4) continue;
    st.nodes.push_back({row[0], row[1], row[2], row[3]});
    if (row[2].rfind("up", 0) == 0) ++st.nodes_up;
  }
  for (const auto& a : answers) {
    auto samples = parse_metrics(a.metrics);
    auto value = [&](const std::string& name, const std::string& instance,
                     const std::string& quantile = "") -> std::optional<double> {
      for (const auto& s : samples) {
        if (s.name != name) continue;
        auto it = s.labels.find("instance");
        if (it == s.labels.end() || it->second != instance) continue;
        auto q = s.labels.find("quantile");
        if (!quantile.empty() && (q == s.labels.end() || q->second != quantile)) continue;
        return s.value;
      }
      return std::nullopt;
    };
    for (size_t r = 1; r < a.instances.size(); ++r) {
      const auto& row = a.instances[r];
      if (row.size() < 6) continue;
      ClusterStatus::Instance inst{row[0], row[1], row[2], row[3], row[4], row[5], std::nullopt};
      std::string short_name = row[0].substr(row[0].rfind('/') + 1);
      auto queries = value("tandem:prefix_cache_queries_total", short_name);
      auto hits = value("tandem:prefix_cache_hits_total", short_name);
      if (queries && hits && *queries > 0) inst.prefix_hit_rate = *hits / *queries;
      st.instances.push_back(std::move(inst));
    }
    for (const auto& s : samples) {
      auto it = s.labels.find("instance");
      std::string instance = it == s.labels.end() ? "" : it->second;
      if (s.name == "tandem:time_to_first_token_recent_count") {
        ClusterStatus::Gateway g{a.node, instance};
        g.running = value("tandem:num_requests_running", instance).value_or(0);
        g.waiting = value("tandem:num_requests_waiting", instance).value_or(0);
        auto q = [&](const char* name, const char* quantile) {
          auto v = value(name, instance, quantile);
          return v ? finite(*v) : std::nullopt;
        };
        g.ttft_p50_s = q("tandem:time_to_first_token_recent_seconds", "0.5");
        g.ttft_p90_s = q("tandem:time_to_first_token_recent_seconds", "0.9");
        g.itl_p50_s = q("tandem:inter_token_latency_recent_seconds", "0.5");
        g.itl_p90_s = q("tandem:inter_token_latency_recent_seconds", "0.9");
        g.first_tokens_1m = s.value;
        g.generation_tokens_total = value("tandem:generation_tokens_total", instance).value_or(0);
        st.gateways.push_back(std::move(g));
      } else if (s.name == "tandem:request_errors_by_type_total" && s.value > 0) {
        auto type = s.labels.find("type");
        st.errors_by_type[type == s.labels.end() ? "?" : type->second] += s.value;
      } else if (s.name == "tandem:tier2_blocks_capacity" && s.value > 0) {
        st.tier2.push_back(
            {a.node, instance, value("tandem:tier2_blocks_used", instance).value_or(0), s.value});
      }
    }
  }
  RT_ASSERT(st.nodes_up <= st.nodes.size(), st.nodes_up);
  return st;
}

std::string render_status(const ClusterStatus& st) {
  std::string out = "cluster " + st.cluster + ": " + std::to_string(st.nodes_up) + "/" +
                    std::to_string(st.nodes.size()) + " nodes up\n\n";
  std::vector<std::vector<std::string>> rows = {{"NODE", "ADDRESS", "STATE", "UPTIME"}};
  for (const auto& n : st.nodes) rows.push_back({n.name, n.address, n.state, n.uptime});
  out += columns(rows) + "\n";
  rows = {{"INSTANCE", "STATE", "WAITING", "RUNNING", "KV USED", "PREFIX HIT"}};
  for (const auto& i : st.instances) {
    std::string kv = i.kv_used + "/" + i.kv_total;
    double total = std::atof(i.kv_total.c_str());
    if (total > 0) kv += " (" + percent(std::atof(i.kv_used.c_str()) / total) + ")";
    rows.push_back({i.name, i.state, i.waiting, i.running, kv,
                    i.prefix_hit_rate ? percent(*i.prefix_hit_rate) : "-"});
  }
  if (st.instances.empty()) rows.push_back({"(no prefill or decode instance answered)"});
  out += columns(rows) + "\n";
  rows = {{"GATEWAY", "RUNNING", "QUEUED", "TTFT p50/p90 ms", "ITL p50/p90 ms", "FIRST TOKENS"}};
  for (const auto& g : st.gateways) {
    char running[32], waiting[32], first[32];
    std::snprintf(running, sizeof running, "%.0f", g.running);
    std::snprintf(waiting, sizeof waiting, "%.0f", g.waiting);
    std::snprintf(first, sizeof first, "%.0f", g.first_tokens_1m);
    rows.push_back({g.node + "/" + g.instance, running, waiting,
                    millis(g.ttft_p50_s) + "/" + millis(g.ttft_p90_s),
                    millis(g.itl_p50_s) + "/" + millis(g.itl_p90_s), first});
  }
  out += columns(rows) + "(latencies and first tokens: the last minute)\n";
  if (!st.tier2.empty()) {
    out += "\ntier 2:";
    for (const auto& t : st.tier2) {
      char buf[160];
      std::snprintf(buf, sizeof buf, " %s %.0f/%.0f blocks", t.node.c_str(), t.blocks_used,
                    t.blocks_capacity);
      out += buf;
    }
    out += "\n";
  }
  out += "\nerrors since start:";
  if (st.errors_by_type.empty()) out += " none";
  for (const auto& [type, count] : st.errors_by_type) {
    char buf[128];
    std::snprintf(buf, sizeof buf, " %s %.0f", type.c_str(), count);
    out += buf;
  }
  return out + "\n";
}

std::string status_json(const ClusterStatus& st) {
  using nlohmann::json;
  auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
  json j = {{"cluster", st.cluster}, {"nodes_up", st.nodes_up}};
  j["nodes"] = json::array();
  for (const auto& n : st.nodes) {
    j["nodes"].push_back(
        {{"name", n.name}, {"address", n.address}, {"state", n.state}, {"uptime", n.uptime}});
  }
  j["instances"] = json::array();
  for (const auto& i : st.instances) {
    j["instances"].push_back({{"name", i.name},
                              {"state", i.state},
                              {"waiting", i.waiting},
                              {"running", i.running},
                              {"kv_blocks_used", i.kv_used},
                              {"kv_blocks_total", i.kv_total},
                              {"prefix_hit_rate", opt(i.prefix_hit_rate)}});
  }
  j["gateways"] = json::array();
  for (const auto& g : st.gateways) {
    j["gateways"].push_back({{"node", g.node},
                             {"instance", g.instance},
                             {"running", g.running},
                             {"waiting", g.waiting},
                             {"ttft_p50_s", opt(g.ttft_p50_s)},
                             {"ttft_p90_s", opt(g.ttft_p90_s)},
                             {"itl_p50_s", opt(g.itl_p50_s)},
                             {"itl_p90_s", opt(g.itl_p90_s)},
                             {"first_tokens_1m", g.first_tokens_1m},
                             {"generation_tokens_total", g.generation_tokens_total}});
  }
  j["tier2"] = json::array();
  for (const auto& t : st.tier2) {
    j["tier2"].push_back({{"node", t.node},
                          {"instance", t.instance},
                          {"blocks_used", t.blocks_used},
                          {"blocks_capacity", t.blocks_capacity}});
  }
  j["errors_by_type"] = st.errors_by_type;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace tandem::tools
