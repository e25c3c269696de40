// The kv-offload staging core (actors/kv_offload/offload_core): slots are owned by exactly one
// store, write or lookup; a store never waits for a slot (drops); a lookup stages the longest
// believed prefix and cuts it at the first disk miss; holds expire; bounds refuse. And the
// operator's view (tier2_report): per-second rates, the `tier2` / verify / drop answers.
#include <doctest.h>

#include <algorithm>
#include <random>
#include <set>

#include "actors/kv_offload/offload_core.hpp"
#include "actors/kv_offload/tier2_report.hpp"

using namespace tandem;
using namespace tandem::kv_offload;
using namespace std::chrono_literals;

namespace {

kv::BlockHash hash_of(uint32_t n) {
  kv::BlockHash h;
  for (size_t i = 0; i < h.bytes.size(); ++i) h.bytes[i] = static_cast<uint8_t>((n * 131 + i) ^ n);
  h.bytes[0] = static_cast<uint8_t>(n);
  h.bytes[1] = static_cast<uint8_t>(n >> 8);
  return h;
}

std::vector<kv::BlockHash> hashes(uint32_t first, uint32_t count) {
  std::vector<kv::BlockHash> out;
  for (uint32_t i = 0; i < count; ++i) out.push_back(hash_of(first + i));
  return out;
}

OffloadConfig small(uint32_t slots) {
  OffloadConfig c;
  c.staging_blocks = slots;
  c.stores_max = 4;
  c.lookups_max = 2;
  c.lookup_blocks_max = 8;
  c.known_blocks_max = 1000;
  c.hold_timeout = 100ms;
  return c;
}

// Stores `hs` completely (grant, read ok, write ok) under `key`.
void store_all(OffloadCore& core, const RequestKey& key, const std::vector<kv::BlockHash>& hs) {
  auto grants = core.begin_store(key, hs);
  REQUIRE(grants.ok());
  std::optional<std::vector<StoreWrite>> writes;
  for (const auto& g : *grants) {
    auto done = core.store_read_done(key, g.slot, true);
    REQUIRE(done.ok());
    writes = *done;
  }
  if (grants->empty()) return;
  REQUIRE(writes.has_value());
  for (const auto& w : *writes) REQUIRE(core.store_written(w.slot, true).ok());
  core.check_invariants();
}

}  // namespace

TEST_CASE("offload: config bounds are validated, naming the key") {
  OffloadConfig c = small(4);
  CHECK(c.validate().ok());
  c.staging_blocks = 0;
  REQUIRE_FALSE(c.validate().ok());
  CHECK(c.validate().error().message.find("kv_offload.staging_blocks") != std::string::npos);
  c = small(4);
  c.hold_timeout = 0ms;
  CHECK(c.validate().error().message.find("kv_offload.hold_timeout_ms") != std::string::npos);
}

TEST_CASE("offload: a store grants a slot per new block, writes after every read, then held") {
  OffloadCore core(small(4));
  RequestKey key{"n/prefill/p", 1};
  auto hs = hashes(0, 3);
  auto grants = core.begin_store(key, hs);
  REQUIRE(grants.ok());
  REQUIRE(grants->size() == 3);
  CHECK(core.slots_free_count() == 1);
  core.check_invariants();
  // Not held before it is written: a lookup meanwhile finds nothing.
  CHECK_FALSE(core.believed_held(hs[0]));
  auto first = core.store_read_done(key, (*grants)[0].slot, true);
  REQUIRE(first.ok());
  CHECK_FALSE(first->has_value());  // two reads still in flight
  CHECK(core.store_read_done(key, (*grants)[1].slot, false).ok());  // one read fails
  auto last = core.store_read_done(key, (*grants)[2].slot, true);
  REQUIRE(last.ok());
  REQUIRE(last->has_value());
  REQUIRE((*last)->size() == 2);  // the failed one is not written
  CHECK(core.slots_free_count() == 2);
  core.check_invariants();
  for (const auto& w : **last) CHECK(core.store_written(w.slot, w.hash == hs[0]).ok());
  CHECK(core.believed_held(hs[0]));
  CHECK_FALSE(core.believed_held(hs[1]));  // its read failed
  CHECK_FALSE(core.believed_held(hs[2]));  // its write failed
  CHECK(core.slots_free_count() == 4);
  CHECK(core.counters().stored_blocks == 1);
  CHECK(core.counters().store_read_failed_blocks == 1);
  CHECK(core.counters().store_write_failed_blocks == 1);
  CHECK_FALSE(core.store_written((*grants)[0].slot, true).ok());  // no write in flight there
  core.check_invariants();
}

TEST_CASE("offload: a store never waits: no slot or too many offers drops, held blocks skip") {
  OffloadCore core(small(2));
  auto grants = core.begin_store({"p", 1}, hashes(0, 5));
  REQUIRE(grants.ok());
  CHECK(grants->size() == 2);
  CHECK(core.counters().store_dropped_blocks == 3);
  // The same hashes offered again while in flight: skipped, not granted twice.
  auto again = core.begin_store({"p", 2}, hashes(0, 2));
  REQUIRE(again.ok());
  CHECK(again->empty());
  CHECK(core.counters().store_known_blocks == 2);
  CHECK_FALSE(core.begin_store({"p", 1}, hashes(9, 1)).ok());  // key in flight: invalid
  OffloadConfig one = small(8);
  one.stores_max = 1;
  OffloadCore bounded(one);
  REQUIRE(bounded.begin_store({"p", 1}, hashes(0, 1)).ok());
  auto refused = bounded.begin_store({"p", 2}, hashes(1, 1));
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().kind == ErrorKind::overloaded);
  bounded.check_invariants();
}

TEST_CASE("offload: a lookup stages the longest held prefix and cuts it at the first miss") {
  OffloadCore core(small(8));
  store_all(core, {"p", 1}, hashes(0, 5));
  auto asked = hashes(0, 7);  // blocks 5 and 6 were never stored
  RequestKey key{"n/prefill/q", 7};
  auto grants = core.begin_lookup(key, asked, 0ns);
  REQUIRE(grants.ok());
  REQUIRE(grants->size() == 5);
  for (uint32_t i = 0; i < 5; ++i) CHECK((*grants)[i].position == i);
  core.check_invariants();
  // Disk reads: position 2 is corrupt (a miss); 3 and 4 read fine but come after the cut.
  for (uint32_t i : {4u, 0u, 3u, 1u}) {
    auto r = core.lookup_read_done(key, i, true);
    REQUIRE(r.ok());
    CHECK_FALSE(r->has_value());
  }
  auto staged = core.lookup_read_done(key, 2, false);
  REQUIRE(staged.ok());
  REQUIRE(staged->has_value());
  CHECK((*staged)->size() == 2);
  CHECK_FALSE(core.believed_held(asked[2]));  // forgotten: the store dropped it
  CHECK(core.believed_held(asked[3]));
  CHECK(core.slots_free_count() == 6);
  core.check_invariants();
  CHECK(core.lookup_released(key).ok());
  CHECK(core.slots_free_count() == 8);
  CHECK_FALSE(core.lookup_released(key).ok());  // released twice: not_found
  CHECK(core.counters().lookup_hit_blocks == 2);
  CHECK(core.counters().lookup_miss_blocks == 1);
  core.check_invariants();
}

TEST_CASE("offload: a lookup that finds nothing holds nothing; bounds refuse") {
  OffloadCore core(small(8));
  auto none = core.begin_lookup({"q", 1}, hashes(0, 3), 0ns);
  REQUIRE(none.ok());
  CHECK(none->empty());
  CHECK(core.lookups_in_flight() == 0);
  store_all(core, {"p", 1}, hashes(0, 3));
  REQUIRE(core.begin_lookup({"q", 2}, hashes(0, 3), 0ns).ok());
  REQUIRE(core.begin_lookup({"q", 3}, hashes(0, 1), 0ns).ok());
  auto third = core.begin_lookup({"q", 4}, hashes(0, 1), 0ns);
  REQUIRE_FALSE(third.ok());
  CHECK(third.error().kind == ErrorKind::overloaded);  // lookups_max = 2
  CHECK_FALSE(core.begin_lookup({"q", 2}, hashes(0, 1), 0ns).ok());  // key in flight
  core.check_invariants();
}

TEST_CASE("offload: a staged lookup never released expires; one still reading does not") {
  OffloadCore core(small(8));
  store_all(core, {"p", 1}, hashes(0, 2));
  auto a = core.begin_lookup({"q", 1}, hashes(0, 2), 0ns);
  auto b = core.begin_lookup({"q", 2}, hashes(0, 1), 0ns);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  for (const auto& g : *a) REQUIRE(core.lookup_read_done({"q", 1}, g.position, true).ok());
  CHECK(core.expire(50ms).empty());  // within hold_timeout
  auto expired = core.expire(200ms);
  REQUIRE(expired.size() == 1);  // q/2 is still reading from disk: its slot stays owned
  CHECK(expired[0].request == 1);
  CHECK(core.counters().holds_expired == 1);
  CHECK(core.slots_free_count() == 7);
  CHECK_FALSE(core.lookup_released({"q", 1}).ok());
  core.check_invariants();
}

TEST_CASE("offload: random operations keep every slot owned by exactly one holder") {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    OffloadCore core(small(6));
    std::map<RequestKey, std::vector<StoreGrant>> stores;
    std::vector<std::pair<Slot, kv::BlockHash>> writes;
    std::map<RequestKey, std::vector<LookupGrant>> reading;
    std::set<RequestKey> staged;
    uint64_t next = 1;
    for (int step = 0; step < 400; ++step) {
      switch (rng() % 6) {
        case 0: {
          RequestKey key{"p", next++};
          auto g = core.begin_store(key, hashes(rng() % 12, 1 + rng() % 4));
          if (g.ok() && !g->empty()) stores[key] = *g;
          break;
        }
        case 1:
          if (!stores.empty()) {
            auto it = stores.begin();
            std::advance(it, rng() % stores.size());
            StoreGrant g = it->second.back();
            it->second.pop_back();
            auto done = core.store_read_done(it->first, g.slot, rng() % 4 != 0);
            REQUIRE(done.ok());
            if (done->has_value()) {
              for (const auto& w : **done) writes.push_back({w.slot, w.hash});
            }
            if (it->second.empty()) stores.erase(it);
          }
          break;
        case 2:
          if (!writes.empty()) {
            REQUIRE(core.store_written(writes.back().first, rng() % 5 != 0).ok());
            writes.pop_back();
          }
          break;
        case 3: {
          RequestKey key{"q", next++};
          auto g = core.begin_lookup(key, hashes(rng() % 12, 1 + rng() % 6),
                                     std::chrono::milliseconds(step));
          if (g.ok() && !g->empty()) reading[key] = *g;
          break;
        }
        case 4:
          if (!reading.empty()) {
            auto it = reading.begin();
            LookupGrant g = it->second.back();
            it->second.pop_back();
            auto done = core.lookup_read_done(it->first, g.position, rng() % 4 != 0);
            REQUIRE(done.ok());
            if (done->has_value() && !(*done)->empty()) staged.insert(it->first);
            if (it->second.empty()) reading.erase(it);
          }
          break;
        default:
          if (!staged.empty() && rng() % 2) {
            CHECK(core.lookup_released(*staged.begin()).ok());
            staged.erase(staged.begin());
          } else {
            for (const auto& k : core.expire(std::chrono::milliseconds(step))) staged.erase(k);
          }
      }
      core.check_invariants();
    }
  }
}

TEST_CASE("offload: blocks a verify or drop removed are no longer looked up") {
  OffloadCore core(small(8));
  store_all(core, {"p", 1}, hashes(0, 4));
  for (const auto& h : hashes(0, 4)) core.note_removed(h);  // `tier2 drop` took them all
  auto none = core.begin_lookup({"q", 1}, hashes(0, 4), 0ns);
  REQUIRE(none.ok());
  CHECK(none->empty());  // not staged, no disk read: the prompt is computed
  CHECK(core.known_count() == 0);
  store_all(core, {"p", 2}, hashes(0, 2));  // offered again: stored again
  auto again = core.begin_lookup({"q", 2}, hashes(0, 4), 0ns);
  REQUIRE(again.ok());
  CHECK(again->size() == 2);
  core.check_invariants();
}

TEST_CASE("tier2 report: rates cover the last full interval only") {
  RateWindow window(5s);
  CHECK_FALSE(window.rates().has_value());
  Tier2Counts c;
  window.sample(0s, c);
  c.hit_blocks = 10;
  c.written_bytes = 4000;
  window.sample(4s, c);
  CHECK_FALSE(window.rates().has_value());  // no interval has passed yet
  c.hit_blocks = 20;
  c.stored_blocks = 5;
  window.sample(5s, c);
  REQUIRE(window.rates().has_value());
  CHECK(window.rates()->over == 5s);
  CHECK(window.rates()->hit_blocks_per_s == doctest::Approx(4.0));
  CHECK(window.rates()->stored_blocks_per_s == doctest::Approx(1.0));
  CHECK(window.rates()->written_bytes_per_s == doctest::Approx(800.0));
  CHECK(window.rates()->miss_blocks_per_s == 0.0);
  c.hit_blocks = 26;
  window.sample(8s, c);  // inside the next interval: the last full one still shows
  CHECK(window.rates()->hit_blocks_per_s == doctest::Approx(4.0));
  window.sample(11s, c);  // 6 s since the boundary at 5 s: 6 more hits
  CHECK(window.rates()->over == 6s);
  CHECK(window.rates()->hit_blocks_per_s == doctest::Approx(1.0));
  CHECK(window.rates()->stored_blocks_per_s == 0.0);
}

TEST_CASE("tier2 report: the status row fits its header; the text says state and counts") {
  Tier2Status s;
  s.node = "solo";
  s.instance = "kvo";
  s.state = Tier2State::open;
  s.io_mode = "direct";
  s.blocks_used = 11;
  s.blocks_capacity = 300;
  s.block_bytes = 1000;
  s.counts.lookups = 2;
  s.counts.hit_blocks = 9;
  s.counts.miss_blocks = 1;
  s.counts.stored_blocks = 11;
  s.counts.corrupt_dropped_blocks = 1;
  auto header = tier2_status_header();
  auto row = tier2_status_row(s);
  REQUIRE(row.size() == header.size());
  auto cell = [&](const std::string& column) {
    auto at = std::find(header.begin(), header.end(), column);
    REQUIRE(at != header.end());
    return row[static_cast<size_t>(at - header.begin())];
  };
  CHECK(cell("state") == "open");
  CHECK(cell("blocks used") == "11");
  CHECK(cell("bytes used") == "11000");
  CHECK(cell("hits") == "9");
  CHECK(cell("corrupt dropped") == "1");
  CHECK(cell("hits/s") == "-");  // no full interval yet
  std::string text = tier2_status_text(s);
  CHECK(text.find("solo/kv-offload/kvo: open, direct I/O\n") == 0);
  CHECK(text.find("blocks      11 used of 300 (11000 bytes)") != std::string::npos);
  CHECK(text.find("2: 9 blocks hit, 1 missed") != std::string::npos);
  CHECK(text.find("(no full interval yet)") != std::string::npos);

  s.rates = Tier2Rates{2s, 0.5, 1.5, 0, 2.0, 100.0, 200.0};
  row = tier2_status_row(s);
  CHECK(cell("hits/s") == "1.5");
  CHECK(cell("rate seconds") == "2.0");
  CHECK(tier2_status_text(s).find("1.5 hits") != std::string::npos);

  Tier2Status off;
  off.node = "solo";
  off.instance = "kvo";
  off.state = Tier2State::failed;
  off.why = "cannot register staging memory";
  row = tier2_status_row(off);
  CHECK(row.size() == header.size());
  CHECK(row[2] == "failed: cannot register staging memory");
  CHECK(row[3] == "-");
  CHECK(tier2_status_text(off).find("kvo: failed (cannot register staging memory)\n") !=
        std::string::npos);
}

TEST_CASE("tier2 report: verify and drop answers count what was checked and dropped") {
  Tier2VerifyOutcome v{"solo", "kvo", 12, 11, {{"short_read", 0}, {"io_error", 0}, {"checksum", 1}},
                       1500ms};
  CHECK(v.dropped_count() == 1);
  auto rows = tier2_verify_rows(v);
  REQUIRE(rows.size() == 2);
  REQUIRE(rows[0].size() == rows[1].size());
  CHECK(rows[0][2] == "checked");
  CHECK(rows[1][2] == "12");
  CHECK(rows[1][3] == "11");
  CHECK(rows[1][4] == "1");
  CHECK(rows[0][7] == "dropped checksum");
  CHECK(rows[1][7] == "1");
  CHECK(tier2_verify_text(v) ==
        "solo/kv-offload/kvo: verify checked 12 blocks in 1.500 s: 11 ok, 1 dropped "
        "(short_read 0, io_error 0, checksum 1)\n");
  Tier2DropOutcome d{"solo", "kvo", 40, 2, 3ms};
  rows = tier2_drop_rows(d);
  REQUIRE(rows.size() == 2);
  CHECK(rows[1][2] == "40");
  CHECK(rows[1][3] == "2");
  CHECK(tier2_drop_text(d).find("kvo: dropped 40 blocks in 0.003 s (2 of them pinned") !=
        std::string::npos);
}

TEST_CASE("offload: a lookup stages only the blocks its disk reads within the asker's budget") {
  constexpr uint64_t block = 100;  // bytes; the disk serves 1000 B/s: 0.1 s a block
  // An idle disk and 1 s of budget: 10 blocks; asked fewer: all of them.
  CHECK(blocks_within_budget(64, block, 1.0, 0, 1000) == 10);
  CHECK(blocks_within_budget(4, block, 1.0, 0, 1000) == 4);
  // 0.5 s of queue ahead: 5 blocks; a queue past the budget: none (the asker computes).
  CHECK(blocks_within_budget(64, block, 1.0, 500, 1000) == 5);
  CHECK(blocks_within_budget(64, block, 1.0, 1000, 1000) == 0);
  CHECK(blocks_within_budget(64, block, 1.0, 5000, 1000) == 0);
  // No budget, or a disk not measured yet: no limit.
  CHECK(blocks_within_budget(64, block, 0.0, 5000, 1000) == 64);
  CHECK(blocks_within_budget(64, block, 1.0, 5000, 0) == 64);
  // Nonsense never grants more than asked.
  CHECK(blocks_within_budget(3, block, 1e300, 0, 1e300) == 3);
  CHECK(blocks_within_budget(3, 0, 1.0, 0, 1000) == 3);
}

// Sub-blocks (issue 13): a prompt's prefix hashes q, k per block; q[k i + k - 1] is block i's.
TEST_CASE("offload: with sub-blocks a lookup stages the longest held partial where whole blocks stop") {
  const uint32_t k = 4;
  std::vector<kv::BlockHash> q = hashes(100, 4 * k + 3);  // 4 full blocks and 3 sub-blocks
  auto block = [&](uint32_t i) { return q[k * i + k - 1]; };
  std::vector<kv::BlockHash> whole;
  for (uint32_t i = 0; i < 4; ++i) whole.push_back(block(i));

  SUBCASE("a miss inside the asked blocks: its longest held sub-block prefix, longest first") {
    OffloadCore core(small(8));
    // Held: blocks 0 and 1, and block 2's prefixes of 1 and 2 sub-blocks (two turns of a
    // session that ended inside block 2), and block 3's whole block (unreachable: 2 lacks).
    store_all(core, {"p", 1}, {block(0), block(1), q[k * 2 + 0], q[k * 2 + 1], block(3)});
    auto grants = core.begin_lookup({"q", 1}, whole, 0ns, {q, k});
    REQUIRE(grants.ok());
    REQUIRE(grants->size() == 3);
    CHECK((*grants)[0].sub_blocks == 0);
    CHECK((*grants)[1].hash == block(1));
    CHECK((*grants)[2].position == 2);
    CHECK((*grants)[2].sub_blocks == 2);  // the longer of the two
    CHECK((*grants)[2].hash == q[k * 2 + 1]);
    for (uint32_t i = 0; i < 3; ++i) REQUIRE(core.lookup_read_done({"q", 1}, i, true).ok());
    CHECK(core.counters().lookup_partial_blocks == 1);
    CHECK(core.counters().lookup_hit_blocks == 3);
    CHECK(core.lookup_released({"q", 1}).ok());
    core.check_invariants();
  }
  SUBCASE("the trailing partial block after every whole one") {
    OffloadCore core(small(8));
    store_all(core, {"p", 1}, {block(0), block(1), block(2), block(3), q[k * 4 + 2], q[k * 4 + 0]});
    auto grants = core.begin_lookup({"q", 1}, whole, 0ns, {q, k});
    REQUIRE(grants.ok());
    REQUIRE(grants->size() == 5);
    CHECK((*grants)[4].position == 4);
    CHECK((*grants)[4].sub_blocks == 3);  // all three of the prompt's sub-blocks there
    CHECK(lookup_positions(whole, {q, k}) == 5);
    core.check_invariants();
  }
  SUBCASE("no partial when slots or lookup_blocks_max stopped the whole blocks") {
    OffloadCore core(small(2));  // two slots
    store_all(core, {"p", 1}, {block(0), block(1), block(2), q[k * 2 + 1]});
    auto grants = core.begin_lookup({"q", 1}, whole, 0ns, {q, k});
    REQUIRE(grants.ok());
    CHECK(grants->size() == 2);
    for (const auto& g : *grants) CHECK(g.sub_blocks == 0);
    // Cut to two positions (a budget): block 2's partial is not asked either.
    OffloadCore cut(small(8));
    store_all(cut, {"p", 1}, {block(0), q[k * 1 + 2]});
    std::vector<kv::BlockHash> w2 = whole, q2 = q;
    truncate_ask(w2, q2, k, 1);
    CHECK(w2.size() == 1);
    CHECK(q2.size() == k);
    auto one = cut.begin_lookup({"q", 2}, w2, 0ns, {q2, k});
    REQUIRE(one.ok());
    CHECK(one->size() == 1);
    core.check_invariants();
  }
  SUBCASE("a partial of the first position must be longer than what the asker holds of it") {
    OffloadCore core(small(8));
    // The asker's pool holds 2 sub-blocks of block 0; tier 2 holds 2 and 3 of it.
    store_all(core, {"p", 1}, {q[1], q[2]});
    auto longer = core.begin_lookup({"q", 1}, whole, 0ns, {q, k, 2});
    REQUIRE(longer.ok());
    REQUIRE(longer->size() == 1);
    CHECK((*longer)[0].sub_blocks == 3);
    // Holding 3 already: tier 2's 3 and 2 would be read for nothing.
    auto none = core.begin_lookup({"q", 2}, whole, 0ns, {q, k, 3});
    REQUIRE(none.ok());
    CHECK(none->empty());
    // `held` is of the first position only: past a whole block any partial helps.
    OffloadCore later(small(8));
    store_all(later, {"p", 1}, {block(0), q[k + 0]});
    auto after = later.begin_lookup({"q", 3}, whole, 0ns, {q, k, 3});
    REQUIRE(after.ok());
    REQUIRE(after->size() == 2);
    CHECK((*after)[1].sub_blocks == 1);
    // A partial must also add gain_min sub-blocks (its read costs a whole block's).
    REQUIRE(core.lookup_read_done({"q", 1}, 0, true).ok());
    REQUIRE(core.lookup_released({"q", 1}).ok());  // lookups_max: 2 in flight
    auto enough = core.begin_lookup({"q", 4}, whole, 0ns, {q, k, 1, 2});
    REQUIRE(enough.ok());
    REQUIRE(enough->size() == 1);
    CHECK((*enough)[0].sub_blocks == 3);  // adds 2
    REQUIRE(core.lookup_read_done({"q", 4}, 0, true).ok());
    REQUIRE(core.lookup_released({"q", 4}).ok());
    auto short_gain = core.begin_lookup({"q", 5}, whole, 0ns, {q, k, 2, 2});
    REQUIRE(short_gain.ok());
    CHECK(short_gain->empty());  // 3 adds only 1
    auto later_gain = later.begin_lookup({"q", 6}, whole, 0ns, {q, k, 0, 2});
    REQUIRE(later_gain.ok());
    CHECK(later_gain->size() == 1);  // block 1's 1-sub-block partial adds too little
    CHECK_FALSE(check_partial_ask(whole, {q, k, k}).ok());  // holding a whole block is no partial
    CHECK(check_partial_ask(whole, {q, k, k - 1}).ok());
    core.check_invariants();
    later.check_invariants();
  }
  SUBCASE("a partial after a miss is cut with the whole blocks") {
    OffloadCore core(small(8));
    store_all(core, {"p", 1}, {block(0), q[k * 1 + 0]});
    auto grants = core.begin_lookup({"q", 1}, whole, 0ns, {q, k});
    REQUIRE(grants.ok());
    REQUIRE(grants->size() == 2);
    REQUIRE(core.lookup_read_done({"q", 1}, 1, true).ok());
    auto staged = core.lookup_read_done({"q", 1}, 0, false);  // block 0 corrupt
    REQUIRE(staged.ok());
    REQUIRE(staged->has_value());
    CHECK((*staged)->empty());
    CHECK(core.counters().lookup_partial_blocks == 0);
    core.check_invariants();
  }
  SUBCASE("an ask whose sub-block hashes do not describe its blocks is invalid") {
    CHECK(check_partial_ask(whole, {q, k}).ok());
    CHECK(check_partial_ask(whole, {}).ok());
    std::vector<kv::BlockHash> wrong = whole;
    wrong[1] = q[k * 1];  // not block 1's hash
    auto bad = check_partial_ask(wrong, {q, k});
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.error().kind == ErrorKind::invalid);
    CHECK(bad.error().message.find("block hash 1") != std::string::npos);
    std::vector<kv::BlockHash> short_q(q.begin(), q.begin() + 3 * k);  // 3 blocks, 4 asked
    CHECK_FALSE(check_partial_ask(whole, {short_q, k}).ok());
    std::vector<kv::BlockHash> long_q = q;
    long_q.push_back(hash_of(999));  // a fifth whole block the ask does not name
    CHECK_FALSE(check_partial_ask(whole, {long_q, k}).ok());
  }
}
