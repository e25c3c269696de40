// KvEventReporter: a prefill/decode shell tells every router which blocks left its prefix
// cache, in frames that fit the manifest's frame_bytes_max, and nothing else.
#include <doctest.h>

#include <caf/all.hpp>

#include <chrono>
#include <set>
#include <string>

#include "actors/common/shell.hpp"
#include "kvstore/prefix_cache.hpp"
#include "messages/convert.hpp"
#include "tests/support/local_bridge.hpp"
#include "tests/support/process.hpp"

using namespace tandem;
using namespace std::chrono_literals;

namespace {

// Two routers (the reporter sends to each), the smallest frames the manifest allows.
const std::string manifest_text = R"([cluster]
name = "kv-events"
[fabric]
frame_bytes_max = 4096
[model]
name = "tiny"
path = "models/tiny"
[[node]]
name = "a"
host = "127.0.0.1"
fabric_port = FABRIC_PORT
admin_port = 17200
http_port = 8000
  [[node.instance]]
  role = "gateway"
  name = "gw"
  [[node.instance]]
  role = "router"
  name = "r1"
  [[node.instance]]
  role = "router"
  name = "r2"
  [[node.instance]]
  role = "decode"
  name = "dec"
  executor = "ex"
  [[node.instance]]
  role = "executor"
  name = "ex"
  device = "cpu"
  devices = [0]
)";

kv::BlockHash hash_of(uint32_t i) {
  kv::BlockHash h;
  for (int b = 0; b < 4; ++b) h.bytes[b] = static_cast<uint8_t>(i >> (8 * b));
  h.bytes[31] = 0x5a;
  return h;
}

struct Received {
  size_t frames = 0, largest_frame_bytes = 0;
  std::multiset<kv::BlockHash> removed;
  std::string instance;
  bool stored_listed = false;
  size_t stored_count = 0;
  bool first_cleared = false;      // the first frame said allCleared (a snapshot)
  bool numbered_in_order = true;   // sequences 1, 2, 3, ... continuing from `after`
  uint64_t last_sequence = 0;
};

// Reads what arrived at one router's stand-in until `quiet` passes without a frame.
Received drain(caf::scoped_actor& router, std::chrono::milliseconds quiet, uint64_t after = 0) {
  Received got;
  got.last_sequence = after;
  bool more = true;
  while (more) {
    router->receive(
        [&](const runtime::InboundFrame& in) {
          auto body = in.frame->envelope().getBody();
          REQUIRE(body.which() == wire::Envelope::Body::KV_EVENTS);
          auto ev = body.getKvEvents();
          if (got.frames == 0) got.first_cleared = ev.getAllCleared();
          got.numbered_in_order = got.numbered_in_order && ev.getSequence() == got.last_sequence + 1;
          got.last_sequence = ev.getSequence();
          got.stored_count += ev.getStored().size();
          ++got.frames;
          got.largest_frame_bytes = std::max(got.largest_frame_bytes, in.frame->size_bytes());
          got.instance = ev.getInstance();
          got.stored_listed = got.stored_listed || ev.getStored().size() > 0;
          auto hashes = messages::get_hashes(ev.getRemoved());
          REQUIRE(hashes.ok());
          got.removed.insert(hashes->begin(), hashes->end());
        },
        caf::after(quiet) >> [&] { more = false; });
  }
  return got;
}

}  // namespace

TEST_CASE("KvEventReporter sends a snapshot, then evictions, to every router, in frames that fit") {
  std::string text = manifest_text;
  text.replace(text.find("FABRIC_PORT"), 11, std::to_string(testing::free_port()));
  config::Manifest manifest = testing::parse_manifest_or_fail(text);
  caf::actor_system_config cfg;
  caf::actor_system system{testing::tandem_actor_config(cfg)};
  testing::LocalBridge local(manifest, "a");
  caf::scoped_actor r1{system}, r2{system};
  local.bridge->register_actor({"a", "router", "r1"}, caf::actor_cast<caf::actor>(r1));
  local.bridge->register_actor({"a", "router", "r2"}, caf::actor_cast<caf::actor>(r2));
  local.bridge->set_ready();
  obs::Registry registry;
  actors::ShellContext ctx{&manifest, local.bridge.get(), local.log, &registry, {}};
  messages::ActorName self{"a", "decode", "dec"};
  actors::KvEventReporter reporter(ctx, self);

  // 300 blocks enter the cache and become evictable; the first flush is a snapshot of them.
  constexpr uint32_t blocks = 300;
  kv::PrefixCache cache(blocks, 16);
  auto first = cache.acquire({}, blocks);
  REQUIRE(first.ok());
  for (uint32_t i = 0; i < blocks; ++i) {
    REQUIRE(cache.commit(first->fresh[i], hash_of(i)) == kv::CommitOutcome::stored);
  }
  cache.release(first->fresh);
  reporter.flush(cache);
  CHECK_FALSE(cache.has_events());
  uint64_t snapshot_last = 0;
  for (caf::scoped_actor* router : {&r1, &r2}) {
    Received snap = drain(*router, 200ms);
    CHECK(snap.first_cleared);
    CHECK(snap.stored_count == blocks);
    CHECK(snap.removed.empty());
    CHECK(snap.numbered_in_order);
    CHECK(snap.largest_frame_bytes <= manifest.fabric.frame_bytes_max);
    snapshot_last = snap.last_sequence;
  }
  CHECK(reporter.removed_count() == 0);

  // A request takes 250 fresh blocks: 250 cached blocks are evicted and reported.
  auto second = cache.acquire({}, 250);
  REQUIRE(second.ok());
  reporter.flush(cache);
  CHECK(reporter.removed_count() == 250);
  for (caf::scoped_actor* router : {&r1, &r2}) {
    Received got = drain(*router, 300ms, snapshot_last);
    CHECK(got.numbered_in_order);
    CHECK_FALSE(got.first_cleared);
    CHECK(got.removed.size() == 250);
    CHECK(std::set<kv::BlockHash>(got.removed.begin(), got.removed.end()).size() == 250);
    for (const auto& h : got.removed) CHECK(h.bytes[31] == 0x5a);
    CHECK(got.frames >= 3);  // ~76 hashes fit a 4 KiB frame
    CHECK(got.largest_frame_bytes <= manifest.fabric.frame_bytes_max);
    CHECK(got.instance == "a/decode/dec");
    CHECK_FALSE(got.stored_listed);
  }
  // Nothing new: flushing again sends nothing.
  reporter.flush(cache);
  CHECK(drain(r1, 200ms).frames == 0);
  cache.release(second->fresh);
}
