#include "bench/router_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>

#include "actors/router/router_core.hpp"

namespace tandem::bench {
namespace {

using router::InstanceId;
using router::InstanceLoad;
using router::InstanceRole;
using router::PickRequest;
using router::RouterConfig;
using router::RouterCore;
using Clock = std::chrono::steady_clock;

uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Stand-in for the gateway's chained block hashes (same shape: 32 bytes, chained).
std::vector<kv::BlockHash> chain(uint64_t salt, uint32_t blocks) {
  std::vector<kv::BlockHash> out(blocks);
  uint64_t previous = salt;
  for (uint32_t i = 0; i < blocks; ++i) {
    for (size_t word = 0; word < 4; ++word) {
      uint64_t part = mix(previous * 31 + salt + word);
      std::memcpy(out[i].bytes.data() + 8 * word, &part, 8);
    }
    std::memcpy(&previous, out[i].bytes.data(), 8);
  }
  return out;
}

// `prefix` followed by `blocks` new blocks chained onto it.
std::vector<kv::BlockHash> extend(std::span<const kv::BlockHash> prefix, uint64_t salt,
                                  uint32_t blocks) {
  std::vector<kv::BlockHash> out(prefix.begin(), prefix.end());
  std::vector<kv::BlockHash> tail = chain(salt ^ (out.empty() ? 0 : out.back().prefix64()), blocks);
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
}

InstanceLoad load_of(uint32_t instance) {
  return InstanceLoad{instance % 3, instance % 5, 1000 + 37 * instance, 10000};
}

RouterCore make_core(const RouterBenchOptions& options) {
  RouterConfig config;
  config.block_tokens = options.block_tokens;
  config.instances_max = std::max<uint32_t>(options.instances_count, 1);
  RouterCore core(config);
  for (uint32_t i = 0; i < options.instances_count; ++i) {
    auto role = i % 2 == 0 ? InstanceRole::decode : InstanceRole::prefill;
    RT_ASSERT(core.add_instance(InstanceId{i}, role).ok(), i);
    RT_ASSERT(core.update_load(InstanceId{i}, load_of(i)).ok(), i);
  }
  return core;
}

// Instance i holds the first lengths[i] blocks of the prompt plus unrelated filler.
void warm(RouterCore& core, const RouterBenchOptions& options,
          const std::vector<kv::BlockHash>& prompt, const std::vector<uint32_t>& lengths) {
  for (uint32_t i = 0; i < options.instances_count; ++i) {
    auto filler = chain(1000 + i, options.filler_blocks);
    RT_ASSERT(core.kv_stored(InstanceId{i}, std::nullopt, filler).ok(), i);
    std::span<const kv::BlockHash> held(prompt.data(), lengths[i]);
    RT_ASSERT(core.kv_stored(InstanceId{i}, std::nullopt, held).ok(), i);
  }
}

RouterBenchScenario time_picks(RouterCore& core, const RouterBenchOptions& options,
                               const std::vector<kv::BlockHash>& prompt, std::string name,
                               const std::vector<uint32_t>& lengths) {
  RouterBenchScenario scenario;
  scenario.name = std::move(name);
  scenario.match_lengths_distinct =
      static_cast<uint32_t>(std::set<uint32_t>(lengths.begin(), lengths.end()).size());
  PickRequest request{prompt, options.prompt_tokens};
  std::vector<double> samples_us;
  samples_us.reserve(options.picks_count);
  double total_us = 0;
  for (uint32_t i = 0; i < options.picks_count + 100; ++i) {  // 100 untimed warm-up picks
    Clock::time_point start = Clock::now();
    auto pick = core.pick(request);
    Clock::time_point end = Clock::now();
    RT_ASSERT(pick.ok(), pick.error().describe());
    // The heartbeat view is restored (untimed) so every pick sees the same loads.
    RT_ASSERT(core.update_load(pick->decode, load_of(pick->decode.value)).ok());
    if (pick->prefill) {
      RT_ASSERT(core.update_load(*pick->prefill, load_of(pick->prefill->value)).ok());
    }
    if (i < 100) continue;
    double us = std::chrono::duration<double, std::micro>(end - start).count();
    samples_us.push_back(us);
    total_us += us;
  }
  std::sort(samples_us.begin(), samples_us.end());
  auto at = [&](double q) { return samples_us[static_cast<size_t>(q * (samples_us.size() - 1))]; };
  scenario.p50_us = at(0.50);
  scenario.p99_us = at(0.99);
  scenario.max_us = samples_us.back();
  scenario.picks_per_s = total_us > 0 ? 1e6 * static_cast<double>(samples_us.size()) / total_us : 0;
  return scenario;
}

// Agent sessions: every turn resends the history plus ~1,250 new tokens (previous answer +
// tool output), so each pick records that many new blocks on the instances it picks.
RouterBenchScenario time_turns(RouterCore& core, const RouterBenchOptions& options,
                               std::span<const kv::BlockHash> system) {
  RouterBenchScenario scenario;
  uint32_t new_blocks = std::max<uint32_t>(1, 1250 / options.block_tokens);
  scenario.name = "turn+" + std::to_string(new_blocks);
  uint32_t blocks_max = static_cast<uint32_t>(options.prompt_tokens / options.block_tokens);
  uint32_t turns = std::min<uint32_t>(options.picks_count, 5000);
  std::vector<double> samples_us;
  std::vector<kv::BlockHash> session;
  double total_us = 0;
  for (uint32_t turn = 0, session_index = 0; turn < turns; ++turn) {
    if (session.size() + new_blocks > blocks_max || session.empty()) {
      session.assign(system.begin(), system.end());  // a new session
      ++session_index;
    }
    session = extend(session, 77000 + session_index * 1000 + turn, new_blocks);
    uint64_t tokens = uint64_t{session.size()} * options.block_tokens;
    Clock::time_point start = Clock::now();
    auto pick = core.pick(PickRequest{session, tokens});
    double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    RT_ASSERT(pick.ok(), pick.error().describe());
    RT_ASSERT(core.update_load(pick->decode, load_of(pick->decode.value)).ok());
    if (pick->prefill) {
      RT_ASSERT(core.update_load(*pick->prefill, load_of(pick->prefill->value)).ok());
    }
    samples_us.push_back(us);
    total_us += us;
  }
  std::sort(samples_us.begin(), samples_us.end());
  auto at = [&](double q) { return samples_us[static_cast<size_t>(q * (samples_us.size() - 1))]; };
  scenario.p50_us = at(0.50);
  scenario.p99_us = at(0.99);
  scenario.max_us = samples_us.back();
  scenario.picks_per_s = 1e6 * static_cast<double>(samples_us.size()) / total_us;
  return scenario;
}

double cold_pick_us(RouterCore& core, const RouterBenchOptions& options) {
  constexpr uint32_t cold_picks = 10;
  uint32_t blocks = static_cast<uint32_t>(options.prompt_tokens / options.block_tokens);
  double total_us = 0;
  for (uint32_t i = 0; i < cold_picks; ++i) {
    auto prompt = chain(5000 + i, blocks);
    Clock::time_point start = Clock::now();
    auto pick = core.pick(PickRequest{prompt, options.prompt_tokens});
    total_us += std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    RT_ASSERT(pick.ok(), pick.error().describe());
  }
  return total_us / cold_picks;
}

}  // namespace

RouterBenchResult run_router_bench(const RouterBenchOptions& options) {
  RT_ASSERT(options.instances_count >= 2 && options.block_tokens >= 1, options.instances_count);
  RT_ASSERT(options.picks_count >= 1, options.picks_count);
  RouterBenchResult result;
  result.block_tokens = options.block_tokens;
  result.blocks_count = static_cast<uint32_t>(options.prompt_tokens / options.block_tokens);
  auto prompt = chain(42, result.blocks_count);
  uint32_t blocks = result.blocks_count;
  uint32_t system_blocks = std::min<uint32_t>(blocks, 8192 / options.block_tokens);
  {  // typical: every instance has the system prompt; 4 decode instances have it all
    std::vector<uint32_t> lengths(options.instances_count, system_blocks);
    for (uint32_t i = 0; i < std::min<uint32_t>(8, options.instances_count); i += 2) {
      lengths[i] = blocks;
    }
    RouterCore core = make_core(options);
    warm(core, options, prompt, lengths);
    result.index_nodes_count = core.index_nodes_count();
    result.scenarios.push_back(time_picks(core, options, prompt, "typical", lengths));
    std::span<const kv::BlockHash> system(prompt.data(), system_blocks);
    result.scenarios.push_back(time_turns(core, options, system));
  }
  {  // spread: every instance a different leading-hit length (bisection's worst case)
    std::vector<uint32_t> lengths(options.instances_count);
    for (uint32_t i = 0; i < options.instances_count; ++i) {
      lengths[i] = static_cast<uint32_t>(uint64_t{blocks} * (i + 1) / options.instances_count);
    }
    RouterCore core = make_core(options);
    warm(core, options, prompt, lengths);
    result.scenarios.push_back(time_picks(core, options, prompt, "spread", lengths));
    result.cold_pick_us = cold_pick_us(core, options);
  }
  RT_ASSERT(result.scenarios.size() == 3);
  return result;
}

std::string describe(const RouterBenchResult& result) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line),
                "router pick: block %u tokens, %u hashes per prompt, %zu blocks indexed\n",
                result.block_tokens, result.blocks_count, result.index_nodes_count);
  out += line;
  out += "  scenario  distinct-lengths   p50 us   p99 us   max us     picks/s\n";
  for (const RouterBenchScenario& s : result.scenarios) {
    std::snprintf(line, sizeof(line), "  %-8s  %16u %8.2f %8.2f %8.1f %11.0f\n", s.name.c_str(),
                  s.match_lengths_distinct, s.p50_us, s.p99_us, s.max_us, s.picks_per_s);
    out += line;
  }
  std::snprintf(line, sizeof(line), "  cold pick (every block new, P/D both learn it): %.1f us\n",
                result.cold_pick_us);
  out += line;
  return out;
}

}  // namespace tandem::bench
