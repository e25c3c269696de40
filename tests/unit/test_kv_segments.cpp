// The KV block as segments (devices/kv_segments.hpp): the copies planned between a pipeline
// stage's or a per-layer cache's pool and a whole-model block-major pool move every part to
// its place (checked byte by byte through real buffers), and every mismatch is refused naming
// both values before a byte moves.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "devices/kv_segments.hpp"

using namespace tandem::devices;

namespace {

KvLayout layout(uint32_t layers, uint32_t blocks, KvOrder order = KvOrder::block_major,
                uint32_t layer_first = 0) {
  KvLayout l;
  l.block_tokens = 4;
  l.blocks_total = blocks;
  l.layers = layers;
  l.kv_heads = 2;
  l.head_dim = 3;
  l.element_bytes = 2;
  l.order = order;
  l.layer_first = layer_first;
  return l;
}

// A pool whose every byte says which (block, model layer, part) it belongs to.
std::vector<uint8_t> marked_pool(const KvLayout& l) {
  std::vector<uint8_t> pool(l.pool_bytes(), 0xee);
  for (uint32_t b = 0; b < l.blocks_total; ++b) {
    for (uint32_t layer = 0; layer < l.layers; ++layer) {
      for (KvPart part : {KvPart::k, KvPart::v}) {
        uint8_t mark = static_cast<uint8_t>(b * 64 + (l.layer_first + layer) * 2 +
                                            static_cast<uint32_t>(part));
        std::memset(pool.data() + l.offset_bytes(b, layer, part), mark, l.part_bytes());
      }
    }
  }
  return pool;
}

KvSource source_of(const KvLayout& l, uint32_t block) {
  return {l, block_segments(l, block), l.pool_bytes()};
}

// Carries out `copies` from the source pools into `dst_pool`.
void apply(const std::vector<KvCopy>& copies, const std::vector<std::vector<uint8_t>>& pools,
           std::vector<uint8_t>& dst_pool) {
  for (const KvCopy& c : copies) {
    REQUIRE(c.src_offset + c.bytes <= pools[c.source].size());
    REQUIRE(c.dst_offset + c.bytes <= dst_pool.size());
    std::memcpy(dst_pool.data() + c.dst_offset, pools[c.source].data() + c.src_offset, c.bytes);
  }
}

// Block `block` of `dst_pool` holds, in every part, the mark of (src_block, layer, part).
void check_block(const KvLayout& l, const std::vector<uint8_t>& pool, uint32_t block,
                 uint32_t src_block) {
  for (uint32_t layer = 0; layer < l.layers; ++layer) {
    for (KvPart part : {KvPart::k, KvPart::v}) {
      uint8_t want = static_cast<uint8_t>(src_block * 64 + (l.layer_first + layer) * 2 +
                                          static_cast<uint32_t>(part));
      const uint8_t* p = pool.data() + l.offset_bytes(block, layer, part);
      for (uint64_t i = 0; i < l.part_bytes(); ++i) {
        REQUIRE_MESSAGE(p[i] == want, "layer ", layer, " part ", static_cast<int>(part), " byte ",
                        i);
      }
    }
  }
}

std::string plan_error(std::span<const KvSource> sources, const KvLayout& dst) {
  auto plan = plan_block_copy(sources, dst, 0);
  REQUIRE_FALSE(plan.ok());
  return plan.error().describe();
}

}  // namespace

TEST_CASE("kv segments: a block-major block is one segment, a layer-major one 2 * layers") {
  KvLayout b = layout(3, 5);
  auto one = block_segments(b, 2);
  REQUIRE(one.size() == 1);
  CHECK(one[0] == KvSegment{0, KvPart::k, 6, 2 * b.block_bytes()});
  KvLayout l = layout(3, 5, KvOrder::layer_major, 4);
  auto runs = block_segments(l, 2);
  REQUIRE(runs.size() == 6);
  CHECK(runs[0] == KvSegment{4, KvPart::k, 1, 2 * l.part_bytes()});
  CHECK(runs[1] == KvSegment{4, KvPart::v, 1, (5 + 2) * l.part_bytes()});
  CHECK(runs[5] == KvSegment{6, KvPart::v, 1, (5 * 5 + 2) * l.part_bytes()});
  CHECK(l.pool_bytes() == b.pool_bytes());
}

TEST_CASE("kv segments: equal block-major pools copy a block in one read") {
  KvLayout src = layout(4, 6), dst = layout(4, 9);
  auto pool = marked_pool(src);
  std::vector<KvSource> sources{source_of(src, 5)};
  auto plan = plan_block_copy(sources, dst, 7);
  REQUIRE(plan.ok());
  REQUIRE(plan.value().size() == 1);
  CHECK(plan.value()[0] ==
        KvCopy{0, 5 * src.block_bytes(), 7 * dst.block_bytes(), dst.block_bytes()});
  std::vector<uint8_t> out(dst.pool_bytes(), 0);
  apply(plan.value(), {pool}, out);
  check_block(dst, out, 7, 5);
}

TEST_CASE("kv segments: a prefill pipelined over four devices fills a whole-model decode block") {
  // PP4: each stage's pool holds 2 of the 8 layers, block-major; decode holds all 8.
  std::vector<KvLayout> stages;
  std::vector<std::vector<uint8_t>> pools;
  std::vector<KvSource> sources;
  for (uint32_t s = 0; s < 4; ++s) {
    stages.push_back(layout(2, 6, KvOrder::block_major, s * 2));
    pools.push_back(marked_pool(stages.back()));
    sources.push_back(source_of(stages.back(), 3));
  }
  KvLayout dst = layout(8, 10);
  auto plan = plan_block_copy(sources, dst, 1);
  REQUIRE(plan.ok());
  CHECK(plan.value().size() == 4);  // one read per stage
  std::vector<uint8_t> out(dst.pool_bytes(), 0);
  apply(plan.value(), pools, out);
  check_block(dst, out, 1, 3);

  // And back: a decode stage of layers [4, 6) reads only its slice of a whole-model block.
  KvLayout whole = layout(8, 6);
  auto whole_pool = marked_pool(whole);
  KvLayout slice = layout(2, 4, KvOrder::block_major, 4);
  std::vector<KvSource> one{source_of(whole, 2)};
  auto part = plan_block_copy(one, slice, 0);
  REQUIRE(part.ok());
  REQUIRE(part.value().size() == 1);
  std::vector<uint8_t> slice_pool(slice.pool_bytes(), 0);
  apply(part.value(), {whole_pool}, slice_pool);
  check_block(slice, slice_pool, 0, 2);
}

TEST_CASE("kv segments: a per-layer (layer-major) cache moves part by part into block-major") {
  KvLayout src = layout(3, 5, KvOrder::layer_major);
  auto pool = marked_pool(src);
  KvLayout dst = layout(3, 4);
  std::vector<KvSource> sources{source_of(src, 4)};
  auto plan = plan_block_copy(sources, dst, 2);
  REQUIRE(plan.ok());
  CHECK(plan.value().size() == 6);  // no two parts adjacent in the source
  std::vector<uint8_t> out(dst.pool_bytes(), 0);
  apply(plan.value(), {pool}, out);
  check_block(dst, out, 2, 4);
  // And the other way.
  KvLayout back = layout(3, 5, KvOrder::layer_major);
  auto dst_pool = marked_pool(dst);
  std::vector<KvSource> from_dst{source_of(dst, 2)};
  auto again = plan_block_copy(from_dst, back, 0);
  REQUIRE(again.ok());
  std::vector<uint8_t> back_pool(back.pool_bytes(), 0);
  apply(again.value(), {dst_pool}, back_pool);
  check_block(back, back_pool, 0, 2);
}

TEST_CASE("kv segments: every mismatch is refused naming both values") {
  KvLayout dst = layout(4, 4);
  auto with = [&](auto change) {
    KvLayout src = layout(4, 4);
    change(src);
    return std::vector<KvSource>{source_of(src, 1)};
  };
  CHECK(plan_error(with([](KvLayout& l) { l.kv_heads = 4; }), dst) ==
        "invalid: KV source 0: kv_heads 4, ours 2");
  CHECK(plan_error(with([](KvLayout& l) { l.element_bytes = 1; }), dst) ==
        "invalid: KV source 0: element_bytes 1, ours 2");
  CHECK(plan_error(with([](KvLayout& l) { l.block_tokens = 8; }), dst) ==
        "invalid: KV source 0: block_tokens 8, ours 4");
  CHECK(plan_error(with([](KvLayout& l) { l.head_dim = 4; }), dst) ==
        "invalid: KV source 0: head_dim 4, ours 3");
  CHECK(plan_error(with([](KvLayout& l) { l.inner = KvInner::head_slot_dim; }), dst) ==
        "invalid: KV source 0: parts in head-slot-dim order, ours slot-head-dim (not a byte "
        "copy)");

  // Layers: a stage missing, a stage twice, a segment outside its slice, past its pool.
  std::vector<KvSource> three;
  for (uint32_t s : {0u, 1u, 3u})
    three.push_back(source_of(layout(1, 2, KvOrder::block_major, s), 0));
  CHECK(plan_error(three, dst) == "invalid: KV transfer: layer 2 K is in no source");
  three.push_back(source_of(layout(1, 2, KvOrder::block_major, 1), 1));
  CHECK(plan_error(three, dst) == "invalid: KV source 3: layer 1 K is in two source segments");
  KvSource outside = source_of(layout(2, 2), 0);
  outside.segments[0].layer = 1;
  CHECK(plan_error(std::vector<KvSource>{outside}, dst) ==
        "invalid: KV source 0: a segment of 4 parts from layer 1 K is outside its layers [0, 2)");
  KvSource below = source_of(layout(2, 2, KvOrder::block_major, 2), 0);
  below.segments[0].layer = 1;
  CHECK(plan_error(std::vector<KvSource>{below}, dst).find("outside its layers [2, 4)") !=
        std::string::npos);
  KvSource past = source_of(layout(4, 2), 1);
  past.length_bytes -= 1;
  CHECK(plan_error(std::vector<KvSource>{past}, dst).find("runs past its") != std::string::npos);
  KvSource huge = source_of(layout(4, 2), 1);
  huge.segments[0].offset_bytes = ~uint64_t{0} - 3;  // no overflow
  CHECK(plan_error(std::vector<KvSource>{huge}, dst).find("runs past its") != std::string::npos);
  KvSource zero = source_of(layout(4, 2), 1);
  zero.segments[0].parts = 0;
  CHECK(plan_error(std::vector<KvSource>{zero}, dst).find("a segment of 0 parts") !=
        std::string::npos);
  CHECK(plan_error(std::vector<KvSource>{}, dst) ==
        "invalid: KV transfer: layer 0 K is in no source");
}

TEST_CASE("kv segments: written_runs covers exactly the rows of the positions a pass wrote") {
  const KvLayout l = layout(2, 8);  // row 12 bytes, part 48, block 192
  const std::vector<uint32_t> table{5, 2};
  // Two slots inside one block: one run per (layer, K|V) part.
  auto inside = written_runs(l, table, 1, 3);
  REQUIRE(inside.size() == 4);
  CHECK(inside[0] == KvRun{5 * 192 + 12, 24});
  CHECK(inside[3] == KvRun{5 * 192 + 2 * 48 + 48 + 12, 24});
  // Whole blocks merge into one run each.
  CHECK(written_runs(l, table, 0, 8) == std::vector<KvRun>{{5 * 192, 192}, {2 * 192, 192}});
  CHECK(written_runs(l, table, 4, 4).empty());
  // Every range: the runs are exactly the positions' rows, in order, none adjacent.
  for (uint32_t first = 0; first < 8; ++first) {
    for (uint32_t end = first + 1; end <= 8; ++end) {
      std::vector<int> want(l.pool_bytes(), 0), got(l.pool_bytes(), 0);
      for (uint32_t p = first; p < end; ++p) {
        for (uint32_t layer = 0; layer < 2; ++layer) {
          for (KvPart part : {KvPart::k, KvPart::v}) {
            uint64_t at = l.slot_offset_bytes(table[p / 4], layer, part, p % 4);
            for (uint64_t i = 0; i < 12; ++i) want[at + i] = 1;
          }
        }
      }
      auto runs = written_runs(l, table, first, end);
      for (size_t r = 0; r < runs.size(); ++r) {
        for (uint64_t i = 0; i < runs[r].bytes; ++i) ++got[runs[r].offset + i];
        if (r > 0) CHECK(runs[r - 1].offset + runs[r - 1].bytes != runs[r].offset);
      }
      CHECK_MESSAGE(got == want, "positions ", first, "..", end);
    }
  }
}

TEST_CASE("kv segments: slice_runs maps a whole pool's runs onto a pipeline stage's layers") {
  const KvLayout whole = layout(6, 5);                           // part 48, block 576
  const KvLayout stage = layout(2, 6, KvOrder::block_major, 3);  // layers 3..4, one more block
  const auto pool = marked_pool(whole);
  // Every range of positions of a two-block table, and whole blocks: each copy lands the whole
  // pool's bytes of the stage's layers in their place in the stage's pool, nothing else moves,
  // and every byte of those layers the runs cover is copied exactly once.
  const std::vector<uint32_t> table{4, 1};
  std::vector<std::vector<KvRun>> cases{{{4 * whole.block_bytes(), whole.block_bytes()}},
                                        {{0, whole.pool_bytes()}}};
  for (uint32_t first = 0; first < 8; ++first) {
    for (uint32_t end = first + 1; end <= 8; ++end)
      cases.push_back(written_runs(whole, table, first, end));
  }
  for (const auto& runs : cases) {
    std::vector<int> covered(whole.pool_bytes(), 0), copied(whole.pool_bytes(), 0);
    for (const KvRun& r : runs) {
      for (uint64_t i = 0; i < r.bytes; ++i) covered[r.offset + i] = 1;
    }
    std::vector<uint8_t> out(stage.pool_bytes(), 0xee);
    auto copies = slice_runs(whole, stage, runs);
    for (size_t c = 0; c < copies.size(); ++c) {
      const KvCopy& k = copies[c];
      REQUIRE(k.dst_offset + k.bytes <= out.size());
      std::memcpy(out.data() + k.dst_offset, pool.data() + k.src_offset, k.bytes);
      for (uint64_t i = 0; i < k.bytes; ++i) ++copied[k.src_offset + i];
      if (c > 0) {  // merged where both sides run on
        const KvCopy& p = copies[c - 1];
        CHECK_FALSE(
            (p.src_offset + p.bytes == k.src_offset && p.dst_offset + p.bytes == k.dst_offset));
      }
    }
    for (uint64_t at = 0; at < whole.pool_bytes(); ++at) {
      const uint64_t layer = at % whole.block_bytes() / whole.part_bytes() / 2;
      const bool ours = layer >= 3 && layer < 5;
      REQUIRE(copied[at] == (ours ? covered[at] : 0));
    }
    // Where bytes landed they carry the mark of the same (block, model layer, part).
    for (uint32_t b = 0; b < whole.blocks_total; ++b) {
      for (uint32_t layer = 0; layer < 2; ++layer) {
        for (KvPart part : {KvPart::k, KvPart::v}) {
          const uint8_t want =
              static_cast<uint8_t>(b * 64 + (3 + layer) * 2 + static_cast<uint32_t>(part));
          const uint8_t* p = out.data() + stage.offset_bytes(b, layer, part);
          for (uint64_t i = 0; i < stage.part_bytes(); ++i) REQUIRE((p[i] == want || p[i] == 0xee));
        }
      }
    }
  }
  // A whole block is one copy of the stage's contiguous layers.
  auto one =
      slice_runs(whole, stage, std::vector<KvRun>{{4 * whole.block_bytes(), whole.block_bytes()}});
  REQUIRE(one.size() == 1);
  CHECK(one[0] == KvCopy{0, 4 * 576 + 3 * 2 * 48, 4 * stage.block_bytes(), stage.block_bytes()});
}
