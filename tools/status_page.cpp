#include "tools/status_page.hpp"

#include <nlohmann/json.hpp>

#include "runtime/base/assert.hpp"
#include "runtime/client/client.hpp"
#include "tools/cluster_status.hpp"

namespace tandem::tools {

StatusSampler::StatusSampler(const config::Manifest& manifest, std::string bind_host,
                             std::chrono::milliseconds interval, size_t samples_max,
                             std::chrono::milliseconds idle_stop)
    : manifest_(manifest),
      bind_host_(std::move(bind_host)),
      interval_(interval),
      idle_stop_(idle_stop),
      samples_max_(samples_max) {
  RT_ASSERT(interval_.count() > 0 && samples_max_ >= 1, interval_.count(), samples_max_);
}

StatusSampler::~StatusSampler() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string StatusSampler::history_json() {
  std::lock_guard lock(mu_);
  last_asked_ = std::chrono::steady_clock::now();
  if (!running_ && !stopping_) {
    if (thread_.joinable()) thread_.join();  // an idle-stopped one
    running_ = true;
    thread_ = std::thread([this] { run(); });
  }
  std::string out = "{\"cluster\":" +
                    nlohmann::json(manifest_.cluster.name)
                        .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
                    ",\"interval_ms\":" + std::to_string(interval_.count());
  if (!error_.empty())
    out += ",\"error\":" +
           nlohmann::json(error_).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  out += ",\"samples\":[";
  bool first = true;
  for (const auto& [t_ms, status] : samples_) {
    out += (first ? "" : ",") + std::string("{\"t_ms\":") + std::to_string(t_ms) +
           ",\"status\":" + status + "}";
    first = false;
  }
  return out + "]}";
}

void StatusSampler::run() {
  std::unique_ptr<runtime::ClusterClient> client;
  std::unique_lock lock(mu_);
  while (!stopping_) {
    if (std::chrono::steady_clock::now() - last_asked_ > idle_stop_) break;
    lock.unlock();
    std::string error, status;
    if (!client) {
      auto made = runtime::ClusterClient::connect(manifest_, bind_host_);
      if (made.ok()) {
        client = std::move(made).value();
      } else {
        error = "the status client cannot join the cluster: " + made.error().describe();
      }
    }
    // A failure while gathering (whatever the nodes answered) costs this sample, never the node.
    try {
      if (client) status = status_json(gather_status(*client, manifest_, std::chrono::seconds(1)));
    } catch (const std::exception& e) {
      error = std::string("gathering the status failed: ") + e.what();
    }
    int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    lock.lock();
    error_ = error;
    if (!status.empty()) samples_.emplace_back(now_ms, std::move(status));
    while (samples_.size() > samples_max_) samples_.pop_front();
    RT_ASSERT(samples_.size() <= samples_max_, samples_.size());
    cv_.wait_for(lock, interval_, [this] { return stopping_; });
  }
  running_ = false;
}

std::string status_page_html() {
  return R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Tandem status</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:16px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 4px} h2{font-size:15px;margin:18px 0 6px}
#summary{color:#555} #error{color:#b00020}
table{border-collapse:collapse;background:#fff;box-shadow:0 1px 2px #0002}
th,td{padding:3px 10px;text-align:left;border-bottom:1px solid #eee;white-space:nowrap}
th{background:#f0f0f0;font-weight:600}
tr.draining td{background:#fff3cd} tr.down td,tr.unreachable td{background:#f8d7da}
.charts{display:flex;flex-wrap:wrap;gap:12px}
.chart{background:#fff;box-shadow:0 1px 2px #0002;padding:6px}
.chart .title{font-weight:600;font-size:13px}
.legend span{margin-right:10px;font-size:12px}
</style></head><body>
<h1>Tandem cluster <span id="cluster"></span></h1>
<div id="summary">loading...</div><div id="error"></div>
<h2>Nodes</h2><table id="nodes"></table>
<h2>Instances</h2><table id="instances"></table>
<h2>Gateways (TTFT and ITL over the last minute)</h2><table id="gateways"></table>
<div id="errors"></div>
<h2>Last minutes</h2>
<div class="charts">
<div class="chart" id="chart-ttft"></div><div class="chart" id="chart-throughput"></div>
<div class="chart" id="chart-hit"></div><div class="chart" id="chart-load"></div>
</div>
<script>
"use strict";
const byId = (id) => document.getElementById(id);
const colors = ["#1f77b4","#ff7f0e","#2ca02c","#d62728","#9467bd","#8c564b","#e377c2","#7f7f7f"];
function table(id, header, rows, rowClass) {
  const t = byId(id);
  t.replaceChildren();
  const head = t.insertRow();
  for (const h of header) { const th = document.createElement("th"); th.textContent = h; head.appendChild(th); }
  rows.forEach((r, i) => {
    const tr = t.insertRow();
    if (rowClass) tr.className = rowClass(i);
    for (const c of r) tr.insertCell().textContent = c;
  });
}
const ms = (s) => (s === null || s === undefined) ? "-" : (s * 1000).toFixed(s < 0.01 ? 1 : 0);
const pct = (f) => (f === null || f === undefined) ? "-" : (f * 100).toFixed(1) + "%";
function chart(id, title, unit, series) {
  const el = byId(id), W = 460, H = 150, L = 44, B = 18;
  const svgns = "http://www.w3.org/2000/svg";
  el.replaceChildren();
  const t = document.createElement("div"); t.className = "title"; t.textContent = title + " (" + unit + ")";
  el.appendChild(t);
  const pts = series.flatMap((s) => s.points);
  const svg = document.createElementNS(svgns, "svg");
  svg.setAttribute("width", W); svg.setAttribute("height", H);
  el.appendChild(svg);
  if (pts.length === 0) { const n = document.createElement("div"); n.textContent = "no data yet"; el.appendChild(n); return; }
  const t0 = Math.min(...pts.map((p) => p[0])), t1 = Math.max(...pts.map((p) => p[0]), t0 + 1);
  const vmax = Math.max(...pts.map((p) => p[1])) || 1;  // all zero: a 0..1 axis
  const x = (tm) => L + (W - L - 6) * (tm - t0) / (t1 - t0);
  const y = (v) => H - B - (H - B - 6) * v / vmax;
  const text = (tx, ty, s) => { const e = document.createElementNS(svgns, "text"); e.setAttribute("x", tx); e.setAttribute("y", ty); e.setAttribute("font-size", "10"); e.textContent = s; svg.appendChild(e); };
  text(2, 12, vmax.toPrecision(3)); text(2, H - B, "0");
  text(L, H - 4, ((t1 - t0) / 1000).toFixed(0) + " s shown");
  const axis = document.createElementNS(svgns, "path");
  axis.setAttribute("d", `M${L} 4 V${H - B} H${W}`); axis.setAttribute("stroke", "#999"); axis.setAttribute("fill", "none");
  svg.appendChild(axis);
  const legend = document.createElement("div"); legend.className = "legend";
  series.forEach((s, i) => {
    const c = colors[i % colors.length];
    const line = document.createElementNS(svgns, "polyline");
    line.setAttribute("points", s.points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" "));
    line.setAttribute("fill", "none"); line.setAttribute("stroke", c); line.setAttribute("stroke-width", "1.5");
    svg.appendChild(line);
    const span = document.createElement("span"); span.style.color = c; span.textContent = "\u25A0 " + s.name;
    legend.appendChild(span);
  });
  el.appendChild(legend);
}
function series(samples, keyOf, listOf, valueOf) {
  const by = new Map();
  samples.forEach((s, i) => {
    for (const item of listOf(s.status)) {
      const v = valueOf(item, i);
      if (v === null || v === undefined || !isFinite(v)) continue;
      const k = keyOf(item);
      if (!by.has(k)) by.set(k, []);
      by.get(k).push([s.t_ms, v]);
    }
  });
  return [...by.entries()].map(([name, points]) => ({ name, points }));
}
function render(h) {
  byId("cluster").textContent = h.cluster;
  byId("error").textContent = h.error || "";
  const samples = h.samples || [];
  if (samples.length === 0) { byId("summary").textContent = "collecting the first sample..."; return; }
  const last = samples[samples.length - 1].status;
  byId("summary").textContent = `${last.nodes_up}/${last.nodes.length} nodes up; updated ` +
      new Date(samples[samples.length - 1].t_ms).toLocaleTimeString();
  table("nodes", ["node", "address", "state", "uptime"], last.nodes.map((n) => [n.name, n.address, n.state, n.uptime]),
        (i) => last.nodes[i].state.startsWith("up") ? "" : "down");
  table("instances", ["instance", "state", "waiting", "running", "KV blocks used", "prefix hit rate"],
        last.instances.map((n) => [n.name, n.state, n.waiting, n.running, n.kv_blocks_used + "/" + n.kv_blocks_total, pct(n.prefix_hit_rate)]),
        (i) => last.instances[i].state.split(/[ :,]/)[0]);
  table("gateways", ["gateway", "running", "queued", "TTFT p50 / p90 ms", "ITL p50 / p90 ms", "first tokens"],
        last.gateways.map((g) => [g.node + "/" + g.instance, g.running, g.waiting, ms(g.ttft_p50_s) + " / " + ms(g.ttft_p90_s),
                                  ms(g.itl_p50_s) + " / " + ms(g.itl_p90_s), g.first_tokens_1m]));
  const errs = Object.entries(last.errors_by_type || {});
  byId("errors").textContent = "Errors since start: " + (errs.length ? errs.map(([k, v]) => k + " " + v).join(", ") : "none");
  const gw = (s) => s.gateways, inst = (s) => s.instances;
  chart("chart-ttft", "TTFT p50", "ms", series(samples, (g) => g.node + "/" + g.instance, gw, (g) => g.ttft_p50_s === null ? null : g.ttft_p50_s * 1000));
  chart("chart-throughput", "Output throughput", "tokens/s", series(samples, (g) => g.node + "/" + g.instance, gw, (g, i) => {
    if (i === 0) return null;
    const prev = samples[i - 1].status.gateways.find((p) => p.node === g.node && p.instance === g.instance);
    const dt = (samples[i].t_ms - samples[i - 1].t_ms) / 1000;
    return prev && dt > 0 ? Math.max(0, g.generation_tokens_total - prev.generation_tokens_total) / dt : null;
  }));
  chart("chart-hit", "Prefix hit rate", "%", series(samples, (n) => n.name, inst, (n) => n.prefix_hit_rate === null ? null : n.prefix_hit_rate * 100));
  chart("chart-load", "Load (waiting + running)", "requests", series(samples, (n) => n.name, inst, (n) => {
    const w = parseFloat(n.waiting), r = parseFloat(n.running);
    return isFinite(w) && isFinite(r) ? w + r : null;
  }));
}
async function refresh() {
  try {
    const r = await fetch("/status.json", { cache: "no-store" });
    render(await r.json());
  } catch (e) {
    byId("error").textContent = "cannot read /status.json: " + e;
  }
  setTimeout(refresh, 1000);
}
refresh();
</script></body></html>
)HTML";
}

}  // namespace tandem::tools
