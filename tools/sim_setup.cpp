#include "tools/sim_setup.hpp"

#include "actors/decode/spec_manifest.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>
#include <variant>

#include "actors/router/router_actor.hpp"
#include "config/manifest.hpp"

namespace tandem::tools {

cli::Flags sim_flags() {
  cli::Flags f("tandem sim [FLAGS]",
               "Simulates a Tandem cluster under virtual time: the real router, prefill and "
               "decode schedulers and prefix caches in one deterministic event loop, with step "
               "times from the sim device's timing model. Same seed, same output.");
  f.flag("manifest", "FILE",
         "take instance counts, [router], [prefill], [decode], [sim] and "
         "[model] block_tokens / sub_block_tokens / max_model_tokens from this manifest")
      .flag("prefill", "N", "prefill instances (without --manifest)", "4")
      .flag("decode", "N", "decode instances (without --manifest)", "4")
      .flag("aggregated", "", "every instance prefills and decodes (prefill + decode of them)")
      .flag("policy", "NAME", "router policy: prefix-aware, round-robin or random")
      .flag("prefill-weighted", "",
            "router: prefill instance by the weighted score, not by least estimated work")
      .flag("weight-prefix", "X", "router prefix-affinity weight (default: manifest's, else 1)")
      .flag("prefill-load-imbalance-max", "X",
            "the same bound for prefill instances (default: manifest's, else none)")
      .flag("load-imbalance-max", "X",
            "router bounded load: an instance at >= (1 + X) x mean load is not picked "
            "(default: manifest's, else 0.5; 'inf' = no bound)")
      .flag("seed", "N", "seed of the workload and the router (default: a fresh one, printed)")
      .flag("workload", "NAME", "agentic, random or shared-prefix", "agentic")
      .flag("trace", "FILE", "replay a JSONL trace (token-id prompts) instead of generating")
      .flag("sessions", "N", "agentic: sessions in flight (concurrency)", "8")
      .flag("sessions-total", "N", "agentic: sessions generated (default: 4 x --sessions)")
      .flag("requests", "N", "random / shared-prefix: requests generated", "256")
      .flag("duration-s", "S", "simulated seconds after which no request is sent", "3600")
      .flag("link-gb-per-s", "GB", "prefill -> decode KV link bandwidth, GB/s", "25")
      .flag("load-report-ms", "MS",
            "instances report load to the router every MS (the real shells: 100); "
            "0 = after every change", "100")
      .flag("block-tokens", "N", "KV block tokens (default: manifest's, else 512)")
      .flag("kv-index", "MODE",
            "router device index: approximate (records picks) or precise (from the caches' "
            "events, checked against every cache at the end); default: manifest's")
      .flag("sub-block-tokens", "N",
            "prefix-cache match granularity, dividing the block (default: manifest's, else "
            "the block; 0 = the block)")
      .flag("kv-blocks", "N", "KV pool blocks per instance (0: from the timing model)", "0")
      .flag("speculative", "METHOD",
            "decode drafts with none, ngram, suffix or eagle3 (default: the manifest's "
            "[speculative])")
      .flag("spec-acceptance", "P",
            "each draft token is accepted with probability P (default: the decode device's "
            "copy_probability)")
      .flag("json", "FILE", "write the result as JSON (deterministic) to FILE")
      .flag("timelines", "", "include every request's timeline in the JSON")
      .flag("svg-dir", "DIR", "write the TTFT plots (CDF, over time, vs context) as SVG to DIR")
      .flag("faults", "SPEC",
            "inject faults, e.g. crash:decode-1@30s+10s,partition:prefill-0/decode-2@5s+2s,"
            "slow:decode-0x4@0s+60s,random:crash=0.01 (tools/sim/README.md)")
      .flag("heartbeat-ms", "MS", "membership heartbeat interval (default: manifest's, else 200)")
      .flag("heartbeat-misses", "N", "missed heartbeats before a peer is down (default 5)")
      .flag("prefill-timeout-ms", "MS", "decode's remote prefill timeout (default 30000)")
      .flag("request-timeout-ms", "MS", "the gateway's no-progress timeout (default 600000)")
      .flag("tier2", "on|off",
            "model tier 2 (a kv-offload per prefill instance's node; default: the manifest's "
            "kv_offload.enabled, else off)")
      .flag("tier2-capacity-gb", "GB",
            "tier-2 capacity per node (default: the manifest's kv_offload.capacity_bytes when "
            "enabled there, else 1000)")
      .flag("tier2-read-gb-per-s", "GB", "tier-2 disk read bandwidth per node", "7")
      .flag("tier2-write-gb-per-s", "GB", "tier-2 disk write bandwidth per node", "5")
      .flag("tier2-lookup-rtt-ms", "MS", "a tier-2 lookup's round trip with nothing to read",
            "0.2")
      .flag("tier2-sub-blocks", "on|off",
            "tier 2 keeps prompts' trailing partial blocks (with sub-blocks; off: whole blocks "
            "only; default: the manifest's kv_offload.partial_blocks, else on)")
      .flag("swarm", "K", "run K seeds (from --seed), each a random cluster, workload and faults")
      .flag("swarm-case", "", "run the swarm's case of --seed (the replay of a swarm seed)");
  return f;
}

namespace {

std::string read_file(const std::string& path, bool* ok) {
  std::ifstream in(path, std::ios::binary);
  *ok = static_cast<bool>(in);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The sim parameters of `role`'s instances: their executors' [sim] plus own values. The
// simulator models one set per role, so executors of one role that differ are an error
// (naming the two instances and the first key they differ in). No instance: [sim].
std::optional<devices::sim::SimParams> role_sim_params(const config::Manifest& m,
                                                       config::Role role,
                                                       const std::string& path) {
  std::optional<std::map<std::string, double>> first;
  std::string first_name;
  std::string role_name(config::to_string(role));
  for (const auto& [node, instance] : m.instances_of(role)) {
    const config::Instance* executor = m.find_executor(instance->executor);
    RT_ASSERT(executor != nullptr, "the manifest checked executor references", instance->name);
    std::map<std::string, double> merged = m.sim_params(*executor);
    if (!first) {
      first = std::move(merged);
      first_name = instance->name;
      continue;
    }
    if (merged == *first) continue;
    std::string key;
    for (const auto& [k, v] : merged) {
      auto it = first->find(k);
      if (it == first->end() || it->second != v) key = k;
      if (!key.empty()) break;
    }
    for (const auto& [k, v] : *first) {
      if (key.empty() && merged.count(k) == 0) key = k;
    }
    std::fprintf(stderr,
                 "tandem sim: %s: %s instances '%s' and '%s' run executors with different sim "
                 "parameters (first difference: '%s'); tandem sim models one set per role\n",
                 path.c_str(), role_name.c_str(), first_name.c_str(), instance->name.c_str(),
                 key.c_str());
    return std::nullopt;
  }
  if (!first) first = std::map<std::string, double>(m.sim.params.begin(), m.sim.params.end());
  auto params = devices::sim::params_from_map(*first);
  if (!params) {
    std::fprintf(stderr, "tandem sim: %s: %s instances' sim parameters: %s\n", path.c_str(),
                 role_name.c_str(), params.error().message.c_str());
    return std::nullopt;
  }
  return *params;
}

// Applies a manifest's sections; false (after printing why) on a bad manifest.
// `tier2_capacity_bytes`: the manifest's kv_offload.capacity_bytes when tier 2 is on there
// (tier2_flags turns it into blocks once the block size is final), else 0.
bool apply_manifest(const std::string& path, sim::ClusterSimConfig& c,
                    double* tier2_capacity_bytes) {
  auto loaded = config::load_manifest(path);
  if (const auto* errors = std::get_if<config::ManifestErrors>(&loaded)) {
    std::fprintf(stderr, "tandem sim: %s", errors->describe().c_str());
    return false;
  }
  const auto& m = std::get<config::Manifest>(loaded);
  c.prefill_count = static_cast<uint32_t>(m.instances_of(config::Role::prefill).size());
  c.decode_count = static_cast<uint32_t>(m.instances_of(config::Role::decode).size());
  c.router = actors::router_config(m);  // the sim sets its seed and block size itself
  c.block_tokens = m.model.block_tokens;
  c.sub_block_tokens = m.model.sub_block_tokens;
  c.precise_index = m.router.kv_index == config::KvIndexMode::precise;
  c.max_model_tokens = m.model.max_model_tokens;
  c.prefill_queue_max = m.prefill.queue_max;
  c.prefill_running_max = m.prefill.running_max;
  c.prefill_held_max = m.prefill.held_max;
  c.prefill_step_tokens_max = m.prefill.step_tokens_max;
  c.prefill_hold_timeout_ms = m.prefill.hold_timeout_ms;
  c.decode_waiting_max = m.decode.waiting_max;
  c.decode_seqs_max = m.decode.seqs_max;
  c.decode_step_tokens_max = m.decode.step_tokens_max;
  c.heartbeat_interval_ms = m.membership.heartbeat_interval_ms;
  c.heartbeat_miss_max = m.membership.heartbeat_miss_max;
  c.prefill_timeout_ms = m.decode.prefill_timeout_ms;
  c.request_timeout_ms = m.gateway.request_timeout_ms;
  auto decode = role_sim_params(m, config::Role::decode, path);
  auto prefill = decode ? role_sim_params(m, config::Role::prefill, path) : std::nullopt;
  if (!decode || !prefill) return false;
  c.decode_device = *decode;
  c.spec = decode::spec_config(m.speculative);
  c.spec_acceptance = decode->copy_probability;
  c.prefill_device = m.instances_of(config::Role::prefill).empty() ? *decode : *prefill;
  const config::KvOffloadSection& k = m.kv_offload;
  c.tier2.enabled = k.enabled;
  *tier2_capacity_bytes = k.enabled ? static_cast<double>(k.capacity_bytes) : 0.0;
  c.tier2.staging_blocks = k.staging_blocks;
  c.tier2.stores_max = k.stores_max;
  c.tier2.lookups_max = k.lookups_max;
  c.tier2.lookup_blocks_max = k.lookup_blocks_max;
  c.tier2.lookup_timeout_ms = k.lookup_timeout_ms;
  c.tier2.hold_timeout_ms = k.hold_timeout_ms;
  c.tier2.sub_blocks = k.partial_blocks;
  return true;
}

bool parse_policy(const std::string& name, router::Policy* out) {
  for (auto p :
       {router::Policy::prefix_aware, router::Policy::round_robin, router::Policy::random}) {
    if (router::to_string(p) == name) {
      *out = p;
      return true;
    }
  }
  std::fprintf(stderr, "tandem sim: --policy: unknown '%s' (prefix-aware, round-robin, random)\n",
               name.c_str());
  return false;
}

// Reads an integer flag in [lo, hi]; prints an error naming it otherwise.
bool get_u32(const cli::Flags& f, const std::string& name, uint32_t lo, uint32_t hi,
             uint32_t* out) {
  auto v = f.get_int(name);
  if (!v) return false;
  if (*v < lo || *v > hi) {
    std::fprintf(stderr, "tandem sim: --%s: %lld is outside %u..%u\n", name.c_str(),
                 static_cast<long long>(*v), lo, hi);
    return false;
  }
  *out = static_cast<uint32_t>(*v);
  return true;
}

// --tier2 and its bandwidths; the capacity (--tier2-capacity-gb, else the manifest's
// `manifest_bytes`, else 1000 GB) in blocks of the config's final block size.
bool tier2_flags(const cli::Flags& f, double manifest_bytes, sim::ClusterSimConfig& c) {
  if (f.has("tier2")) {
    std::string v = f.get("tier2");
    if (v != "on" && v != "off") {
      std::fprintf(stderr, "tandem sim: --tier2: expected on or off, got '%s'\n", v.c_str());
      return false;
    }
    c.tier2.enabled = v == "on";
  }
  double block_bytes = double(c.block_tokens) * c.prefill_device.kv_bytes_per_token;
  if (c.tier2.enabled) {
    double bytes = manifest_bytes > 0 ? manifest_bytes : 1000e9;
    std::string source = manifest_bytes > 0 ? "kv_offload.capacity_bytes" : "--tier2-capacity-gb";
    if (f.has("tier2-capacity-gb")) {
      auto given = f.get_double("tier2-capacity-gb");
      if (!given) return false;
      bytes = *given * 1e9;
      source = "--tier2-capacity-gb";
    }
    double blocks = bytes / block_bytes;
    if (!(blocks >= 1) || blocks > 16e6) {
      std::fprintf(stderr,
                   "tandem sim: %s: %g GB is %.3g blocks of %.3g MB; expected 1 .. 16e6 "
                   "blocks\n",
                   source.c_str(), bytes / 1e9, blocks, block_bytes / 1e6);
      return false;
    }
    c.tier2.capacity_blocks = static_cast<uint32_t>(blocks);
  }
  if (!f.has("tier2-sub-blocks")) {
  } else if (std::string v = f.get("tier2-sub-blocks"); v != "on" && v != "off") {
    std::fprintf(stderr, "tandem sim: --tier2-sub-blocks: expected on or off, got '%s'\n",
                 v.c_str());
    return false;
  } else {
    c.tier2.sub_blocks = v == "on";
  }
  auto read = f.get_double("tier2-read-gb-per-s");
  auto write = f.get_double("tier2-write-gb-per-s");
  auto rtt = f.get_double("tier2-lookup-rtt-ms");
  if (!read || !write || !rtt) return false;
  for (auto [flag, v, zero_ok] : {std::tuple<const char*, double, bool>{"tier2-read-gb-per-s", *read, false},
                                  {"tier2-write-gb-per-s", *write, false},
                                  {"tier2-lookup-rtt-ms", *rtt, true}}) {
    if (!std::isfinite(v) || v < 0 || (v == 0 && !zero_ok)) {
      std::fprintf(stderr, "tandem sim: --%s: expected a %s number, got %g\n", flag,
                   zero_ok ? "finite, non-negative" : "positive", v);
      return false;
    }
  }
  c.tier2.read_bytes_per_s = *read * 1e9;
  c.tier2.write_bytes_per_s = *write * 1e9;
  c.tier2.lookup_rtt_ms = *rtt;
  if (c.tier2.enabled && c.prefill_count == 0) {
    std::fprintf(stderr, "tandem sim: --tier2 on: tier 2 is read by prefill instances; an "
                         "aggregated cluster has none\n");
    return false;
  }
  return true;
}

bool build_config(const cli::Flags& f, sim::ClusterSimConfig& c) {
  c.block_tokens = 512;
  double tier2_capacity_bytes = 0;
  if (f.has("manifest")) {
    if (!apply_manifest(f.get("manifest"), c, &tier2_capacity_bytes)) return false;
  } else if (!get_u32(f, "prefill", 0, 65535, &c.prefill_count) ||
             !get_u32(f, "decode", 1, 65535, &c.decode_count)) {
    return false;
  }
  if (f.has("aggregated")) {
    c.decode_count += c.prefill_count;
    c.prefill_count = 0;
  }
  if (f.has("policy") && !parse_policy(f.get("policy"), &c.router.policy)) return false;
  if (f.has("load-imbalance-max")) {
    auto imbalance = f.get_double("load-imbalance-max");
    if (!imbalance) return false;
    c.router.load_imbalance_max = *imbalance;
  }
  if (f.has("prefill-weighted")) c.router.prefill_by_work = false;
  if (f.has("weight-prefix")) {
    auto weight = f.get_double("weight-prefix");
    if (!weight) return false;
    c.router.weight_prefix = *weight;
  }
  if (f.has("prefill-load-imbalance-max")) {
    auto imbalance = f.get_double("prefill-load-imbalance-max");
    if (!imbalance) return false;
    c.router.prefill_load_imbalance_max = *imbalance;
  }
  if (f.has("block-tokens")) {
    if (!get_u32(f, "block-tokens", 1, 1u << 20, &c.block_tokens)) return false;
    c.sub_block_tokens = std::min(c.hash_tokens(), c.block_tokens);
  }
  if (f.has("kv-index")) {
    std::string mode = f.get("kv-index");
    if (mode != "approximate" && mode != "precise") {
      std::fprintf(stderr, "tandem sim: --kv-index %s: expected approximate or precise\n",
                   mode.c_str());
      return false;
    }
    c.precise_index = mode == "precise";
  }
  if (f.has("sub-block-tokens")) {
    if (!get_u32(f, "sub-block-tokens", 0, 1u << 20, &c.sub_block_tokens)) return false;
    if (c.hash_tokens() > c.block_tokens || c.block_tokens % c.hash_tokens() != 0) {
      std::fprintf(stderr, "tandem sim: --sub-block-tokens %u must divide the block size (%u)\n",
                   c.sub_block_tokens, c.block_tokens);
      return false;
    }
  }
  if (!get_u32(f, "kv-blocks", 0, 1u << 24, &c.kv_blocks)) return false;
  if (f.has("speculative")) {
    std::string method = f.get("speculative");
    if (method == "none") {
      c.spec.method = decode::SpecMethod::none;
    } else if (method == "ngram") {
      c.spec.method = decode::SpecMethod::ngram;
    } else if (method == "suffix") {
      c.spec.method = decode::SpecMethod::suffix;
    } else if (method == "eagle3") {
      c.spec.method = decode::SpecMethod::eagle3;
    } else {
      std::fprintf(stderr, "tandem sim: --speculative %s: expected none, ngram, suffix or eagle3\n",
                   method.c_str());
      return false;
    }
  }
  if (f.has("spec-acceptance")) {
    auto p = f.get_double("spec-acceptance");
    if (!p || !(*p >= 0 && *p <= 1)) {
      std::fprintf(stderr, "tandem sim: --spec-acceptance: a probability in [0, 1]\n");
      return false;
    }
    c.spec_acceptance = *p;
  }
  if (!get_u32(f, "sessions", 1, 1u << 20, &c.sessions_in_flight)) return false;
  auto duration_s = f.get_double("duration-s");
  auto link = f.get_double("link-gb-per-s");
  auto report_ms = f.get_double("load-report-ms");
  if (!duration_s || !link || !report_ms) return false;
  c.load_report_interval_ms = *report_ms;
  if (f.has("faults")) {
    auto plan = sim::parse_faults(f.get("faults"));
    if (!plan) {
      std::fprintf(stderr, "tandem sim: %s\n", plan.error().message.c_str());
      return false;
    }
    c.faults = std::move(plan).value();
  }
  for (auto [flag, out] : {std::pair<const char*, double*>{"heartbeat-ms", &c.heartbeat_interval_ms},
                           {"prefill-timeout-ms", &c.prefill_timeout_ms},
                           {"request-timeout-ms", &c.request_timeout_ms}}) {
    if (!f.has(flag)) continue;
    auto v = f.get_double(flag);
    if (!v) return false;
    *out = *v;
  }
  if (f.has("heartbeat-misses") &&
      !get_u32(f, "heartbeat-misses", 1, 1000, &c.heartbeat_miss_max)) {
    return false;
  }
  c.duration_ms = *duration_s * 1e3;
  c.link_bytes_per_s = *link * 1e9;
  if (!tier2_flags(f, tier2_capacity_bytes, c)) return false;
  if (Status s = c.validate(); !s) {
    std::fprintf(stderr, "tandem sim: %s\n", s.error().message.c_str());
    return false;
  }
  return true;
}

Result<std::vector<workload::Request>> make_workload(const cli::Flags& f,
                                                     const sim::ClusterSimConfig& c) {
  if (f.has("trace")) {
    bool ok = false;
    std::string text = read_file(f.get("trace"), &ok);
    if (!ok) return make_error(ErrorKind::invalid, "--trace: cannot read " + f.get("trace"));
    auto requests = workload::read_jsonl(text);
    if (!requests) {
      return make_error(ErrorKind::invalid, f.get("trace") + ": " + requests.error().message);
    }
    return requests;
  }
  std::string name = f.get("workload");
  uint32_t count = 0;
  if (name == "agentic") {
    workload::AgenticParams p;
    p.seed = c.seed;
    p.sessions_in_flight = c.sessions_in_flight;
    p.sessions_count = c.sessions_in_flight * 4;
    if (f.has("sessions-total") && !get_u32(f, "sessions-total", 1, 1u << 24, &p.sessions_count)) {
      return make_error(ErrorKind::invalid, "--sessions-total");
    }
    p.context_tokens_max = c.max_model_tokens;
    return workload::generate_agentic(p);
  }
  if (!get_u32(f, "requests", 1, 1u << 24, &count)) {
    return make_error(ErrorKind::invalid, "--requests");
  }
  if (name == "random") {
    workload::RandomParams p;
    p.seed = c.seed;
    p.requests_count = count;
    return workload::generate_random(p);
  }
  if (name == "shared-prefix") {
    workload::SharedPrefixParams p;
    p.seed = c.seed;
    p.prompts_per_group = std::max(1u, count / p.groups_count);
    return workload::generate_shared_prefix(p);
  }
  return make_error(ErrorKind::invalid,
                    "--workload: unknown '" + name + "' (agentic, random, shared-prefix)");
}

}  // namespace

std::optional<SimRun> prepare_sim(const cli::Flags& flags, uint64_t seed) {
  SimRun run;
  run.config.seed = seed;
  if (!build_config(flags, run.config)) return std::nullopt;
  run.config.router.seed = seed;
  auto requests = make_workload(flags, run.config);
  if (!requests) {
    std::fprintf(stderr, "tandem sim: %s\n", requests.error().message.c_str());
    return std::nullopt;
  }
  run.requests = std::move(requests).value();
  return run;
}

}  // namespace tandem::tools
