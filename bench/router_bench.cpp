#include "bench/router_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>

#include "actors/router/router_core.hpp"
#include "runtime/base/mix.hpp"

namespace tandem::bench {
namespace {

using router::InstanceId;
using router::InstanceLoad;
using router::InstanceRole;
using router::PickRequest;
using router::RouterConfig;
using router::RouterCore;
using Clock = std::chrono::steady_clock;


// Stand-in for the gateway's chained block hashes (same shape: 32 bytes, chained).
std::vector<kv::BlockHash> chain(uint64_t salt, uint32_t blocks) {
  std::vector<kv::BlockHash> out(blocks);
  uint64_t previous = salt;
  for (uint32_t i = 0; i < blocks; ++i) {
    for (size_t word = 0; word < 4; ++word) {
      uint64_t part = mix64(previous * 31 + salt + word);
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

// A random cyclic permutation of 16M slots (64 MiB): following it from any slot visits
// every slot, each load depending on the one before (Sattolo's algorithm; seeded).
class MemoryChase {
 public:
  MemoryChase() : next_(uint32_t{1} << 24) {
    for (uint32_t i = 0; i < next_.size(); ++i) next_[i] = i;
    uint64_t state = 0x5eed;
    for (uint32_t i = static_cast<uint32_t>(next_.size()) - 1; i > 0; --i) {
      state = mix64(state);
      std::swap(next_[i], next_[state % i]);
    }
  }
  // Follows `loads` links from the current slot; returns where it ended (keeps it live).
  uint32_t run(uint32_t loads) {
    uint32_t at = at_;
    for (uint32_t i = 0; i < loads; ++i) at = next_[at];
    at_ = at;
    return at;
  }

 private:
  std::vector<uint32_t> next_;
  uint32_t at_ = 0;
};

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

// Times decide() and record() of one pick separately; `samples` keeps decide, record and
// their sum per pick, `recorded_blocks` the blocks the pick newly recorded.
struct PickTimer {
  explicit PickTimer(MemoryChase& chase) : chase(chase) {}
  MemoryChase& chase;
  std::vector<double> decide_us, record_us, total_us, reference_us;
  uint64_t recorded_blocks = 0;
  double record_sum_us = 0;

  router::Pick run(RouterCore& core, const PickRequest& request, bool keep) {
    Clock::time_point start = Clock::now();
    auto pick = core.decide(request);
    Clock::time_point decided = Clock::now();
    RT_ASSERT(pick.ok(), pick.error().describe());
    core.record(request, *pick);
    Clock::time_point recorded = Clock::now();
    if (!keep) return *pick;
    Clock::time_point reference_start = Clock::now();
    uint32_t end = chase.run(kReferenceLoads);
    Clock::time_point reference_end = Clock::now();
    RT_ASSERT(end < (uint32_t{1} << 24), end);
    reference_us.push_back(
        std::chrono::duration<double, std::micro>(reference_end - reference_start).count());
    double decide = std::chrono::duration<double, std::micro>(decided - start).count();
    double record = std::chrono::duration<double, std::micro>(recorded - decided).count();
    decide_us.push_back(decide);
    record_us.push_back(record);
    total_us.push_back(decide + record);
    record_sum_us += record;
    auto blocks = static_cast<uint64_t>(request.block_hashes.size());
    recorded_blocks += blocks - pick->decode_cached_blocks;
    if (pick->prefill) recorded_blocks += blocks - pick->prefill_cached_blocks;
    return *pick;
  }

  void fill(RouterBenchScenario& scenario) {
    RT_ASSERT(!total_us.empty());
    RT_ASSERT(decide_us.size() == total_us.size());
    double sum_us = 0;
    for (double us : total_us) sum_us += us;
    auto at = [](std::vector<double>& v, double q) {
      std::sort(v.begin(), v.end());
      return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
    };
    scenario.decide_p50_us = at(decide_us, 0.50);
    scenario.decide_p99_us = at(decide_us, 0.99);
    scenario.record_p50_us = at(record_us, 0.50);
    scenario.record_p99_us = at(record_us, 0.99);
    scenario.reference_p50_us = at(reference_us, 0.50);
    scenario.reference_p99_us = at(reference_us, 0.99);
    scenario.p50_us = at(total_us, 0.50);
    scenario.p99_us = at(total_us, 0.99);
    scenario.max_us = total_us.back();
    scenario.recorded_blocks_count = recorded_blocks;
    scenario.record_ns_per_block =
        recorded_blocks == 0 ? 0 : 1e3 * record_sum_us / static_cast<double>(recorded_blocks);
    scenario.picks_per_s = sum_us > 0 ? 1e6 * static_cast<double>(total_us.size()) / sum_us : 0;
  }
};

// The heartbeat view is restored (untimed) so every pick sees the same loads.
void restore_loads(RouterCore& core, const router::Pick& pick) {
  RT_ASSERT(core.update_load(pick.decode, load_of(pick.decode.value)).ok());
  if (pick.prefill) {
    RT_ASSERT(core.update_load(*pick.prefill, load_of(pick.prefill->value)).ok());
  }
}

RouterBenchScenario time_picks(MemoryChase& chase, RouterCore& core,
                               const RouterBenchOptions& options,
                               const std::vector<kv::BlockHash>& prompt, std::string name,
                               const std::vector<uint32_t>& lengths) {
  RouterBenchScenario scenario;
  scenario.name = std::move(name);
  scenario.match_lengths_distinct =
      static_cast<uint32_t>(std::set<uint32_t>(lengths.begin(), lengths.end()).size());
  PickRequest request{prompt, options.prompt_tokens};
  PickTimer timer(chase);
  timer.decide_us.reserve(options.picks_count);
  timer.record_us.reserve(options.picks_count);
  timer.total_us.reserve(options.picks_count);
  for (uint32_t i = 0; i < options.picks_count + 100; ++i) {  // 100 untimed warm-up picks
    restore_loads(core, timer.run(core, request, i >= 100));
  }
  timer.fill(scenario);
  return scenario;
}

// Agent sessions: every turn resends the history plus ~1,250 new tokens (previous answer +
// tool output), so each pick records that many new blocks on the instances it picks.
RouterBenchScenario time_turns(MemoryChase& chase, RouterCore& core,
                               const RouterBenchOptions& options,
                               std::span<const kv::BlockHash> system) {
  RouterBenchScenario scenario;
  uint32_t new_blocks = std::max<uint32_t>(1, 1250 / options.block_tokens);
  scenario.name = "turn+" + std::to_string(new_blocks);
  uint32_t blocks_max = static_cast<uint32_t>(options.prompt_tokens / options.block_tokens);
  uint32_t turns = std::min<uint32_t>(options.picks_count, 5000);
  PickTimer timer(chase);
  std::vector<kv::BlockHash> session;
  for (uint32_t turn = 0, session_index = 0; turn < turns; ++turn) {
    if (session.size() + new_blocks > blocks_max || session.empty()) {
      session.assign(system.begin(), system.end());  // a new session
      ++session_index;
    }
    session = extend(session, 77000 + session_index * 1000 + turn, new_blocks);
    uint64_t tokens = uint64_t{session.size()} * options.block_tokens;
    restore_loads(core, timer.run(core, PickRequest{session, tokens}, true));
  }
  timer.fill(scenario);
  return scenario;
}

void time_cold_picks(MemoryChase& chase, RouterCore& core, const RouterBenchOptions& options,
                     RouterBenchResult& result) {
  constexpr uint32_t cold_picks = 10;
  uint32_t blocks = static_cast<uint32_t>(options.prompt_tokens / options.block_tokens);
  PickTimer timer(chase);
  for (uint32_t i = 0; i < cold_picks; ++i) {
    auto prompt = chain(5000 + i, blocks);
    timer.run(core, PickRequest{prompt, options.prompt_tokens}, true);
  }
  double decide_sum = 0, total_sum = 0;
  for (double us : timer.decide_us) decide_sum += us;
  for (double us : timer.total_us) total_sum += us;
  result.cold_pick_us = total_sum / cold_picks;
  result.cold_decide_us = decide_sum / cold_picks;
  result.cold_record_ns_per_block =
      1e3 * timer.record_sum_us / static_cast<double>(std::max<uint64_t>(1, timer.recorded_blocks));
}

}  // namespace

RouterBenchResult run_router_bench(const RouterBenchOptions& options) {
  RT_ASSERT(options.instances_count >= 2 && options.block_tokens >= 1, options.instances_count);
  RT_ASSERT(options.picks_count >= 1, options.picks_count);
  RouterBenchResult result;
  result.block_tokens = options.block_tokens;
  result.blocks_count = static_cast<uint32_t>(options.prompt_tokens / options.block_tokens);
  auto prompt = chain(42, result.blocks_count);
  MemoryChase chase;
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
    result.scenarios.push_back(time_picks(chase, core, options, prompt, "typical", lengths));
    std::span<const kv::BlockHash> system(prompt.data(), system_blocks);
    result.scenarios.push_back(time_turns(chase, core, options, system));
  }
  {  // spread: every instance a different leading-hit length (bisection's worst case)
    std::vector<uint32_t> lengths(options.instances_count);
    for (uint32_t i = 0; i < options.instances_count; ++i) {
      lengths[i] = static_cast<uint32_t>(uint64_t{blocks} * (i + 1) / options.instances_count);
    }
    RouterCore core = make_core(options);
    warm(core, options, prompt, lengths);
    result.scenarios.push_back(time_picks(chase, core, options, prompt, "spread", lengths));
    time_cold_picks(chase, core, options, result);
  }
  RT_ASSERT(result.scenarios.size() == 3);
  return result;
}

std::string describe(const RouterBenchResult& result) {
  std::string out;
  char line[320];
  std::snprintf(line, sizeof(line),
                "router pick: block %u tokens, %u hashes per prompt, %zu blocks indexed\n",
                result.block_tokens, result.blocks_count, result.index_nodes_count);
  out += line;
  out += "  scenario  distinct   decide us (p50/p99)   record us (p50/p99)  record ns/block"
         "   pick us (p50/p99/max)     picks/s   reference us (p50/p99)\n";
  for (const RouterBenchScenario& s : result.scenarios) {
    std::snprintf(line, sizeof(line),
                  "  %-8s  %8u %10.2f %10.2f %10.2f %10.2f %16.0f %8.2f %8.2f %8.1f %11.0f"
                  " %10.2f %10.2f\n",
                  s.name.c_str(), s.match_lengths_distinct, s.decide_p50_us, s.decide_p99_us,
                  s.record_p50_us, s.record_p99_us, s.record_ns_per_block, s.p50_us, s.p99_us,
                  s.max_us, s.picks_per_s, s.reference_p50_us, s.reference_p99_us);
    out += line;
  }
  std::snprintf(line, sizeof(line),
                "  cold pick (every block new, P/D both learn it): %.1f us = decide %.1f us + "
                "record %.0f ns/block\n",
                result.cold_pick_us, result.cold_decide_us, result.cold_record_ns_per_block);
  out += line;
  std::snprintf(line, sizeof(line),
                "  reference: %u dependent loads at random in 64 MiB, timed between the picks "
                "(this machine's memory latency and preemption meanwhile)\n",
                kReferenceLoads);
  out += line;
  return out;
}

}  // namespace tandem::bench
