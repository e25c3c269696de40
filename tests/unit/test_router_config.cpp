// actors::router_config: the manifest's [router] section as the router core's config, shared
// by the router actor and `tandem sim --manifest`.
#include <doctest.h>

#include <string>
#include <variant>

#include "actors/router/router_actor.hpp"
#include "config/manifest.hpp"
#include "tests/support/process.hpp"

using namespace tandem;

namespace {

config::Manifest load(const std::string& path) {
  auto loaded = config::load_manifest(path);
  if (const auto* errors = std::get_if<config::ManifestErrors>(&loaded)) {
    FAIL(errors->describe());
  }
  return std::get<config::Manifest>(loaded);
}

}  // namespace

TEST_CASE("router_config takes [router] and sizes the index to the manifest's instances") {
  auto m = load(testing::source_root() + "/config/examples/target-4p4d.toml");
  router::RouterConfig c = actors::router_config(m);
  CHECK(c.policy == router::Policy::prefix_aware);
  CHECK(c.weight_prefix == m.router.weight_prefix);
  CHECK(c.weight_queue == m.router.weight_queue);
  CHECK(c.weight_kv_usage == m.router.weight_kv_usage);
  CHECK(c.load_imbalance_max == m.router.load_imbalance_max);
  CHECK(c.prefill_by_work == m.router.prefill_by_work);
  CHECK(c.tier2_weight == m.router.tier2_weight);
  CHECK(c.tier2_remote_weight == m.router.tier2_remote_weight);
  CHECK(c.tier2_index_blocks_max == m.router.tier2_index_blocks_max);
  CHECK(c.disaggregate_tokens_min == m.router.disaggregate_tokens_min);
  // The router matches 512-token sub-blocks of the 4096-token blocks ([model] default).
  CHECK(m.model.sub_block_tokens == 512);
  CHECK(c.block_tokens == 512);
  CHECK(c.sub_blocks_per_block == 8);
  CHECK(c.prefix_index_blocks_max == 8 * m.router.prefix_index_blocks_max);
  // 4 prefill + 4 decode instances: one 64-bit holder word per indexed block, not 1024.
  CHECK(c.instances_max == 8);
  CHECK(router::validate(c).ok());
  // The same cluster name gives the same seed (the random policy replays).
  CHECK(actors::router_config(m).seed == c.seed);
}
