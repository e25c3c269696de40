// A KV block descriptor on the wire (actors/common/shell.hpp: fill_block_descriptor,
// read_block_descriptor) carries the pool's layout and the block's segments, so the reader
// plans its reads from what the writer's pool is (devices/kv_segments.hpp): block-major pools
// as one run, layer-major ones part by part; a descriptor that lies about them is refused.
#include <capnp/message.h>
#include <doctest.h>

#include "actors/common/shell.hpp"

using namespace tandem;
using devices::KvLayout;
using devices::KvOrder;

namespace {

KvLayout pool_layout(KvOrder order) {
  KvLayout l;
  l.block_tokens = 16;
  l.blocks_total = 5;
  l.layers = 3;
  l.kv_heads = 2;
  l.head_dim = 8;
  l.element_bytes = 4;
  l.order = order;
  return l;
}

actors::RemoteBlock round_trip(const KvLayout& l, uint32_t block) {
  capnp::MallocMessageBuilder message;
  auto d = message.initRoot<wire::BlockDescriptor>();
  runtime::RemoteRegionRef region{4096, l.pool_bytes(), 77};
  actors::fill_block_descriptor(d, "peer:1", region, uint64_t{block} * l.block_bytes(), nullptr, l);
  return actors::read_block_descriptor(d.asReader());
}

KvLayout ours() {
  KvLayout l = pool_layout(KvOrder::block_major);
  l.blocks_total = 9;
  return l;
}

Result<std::vector<devices::KvCopy>> plan(const actors::RemoteBlock& rb) {
  return devices::plan_block_copy(std::span<const devices::KvSource>(&rb.source, 1), ours(), 4);
}

}  // namespace

TEST_CASE("kv descriptor: a block-major block travels as one run and is read in one copy") {
  KvLayout l = pool_layout(KvOrder::block_major);
  auto rb = round_trip(l, 3);
  CHECK(rb.address == "peer:1");
  CHECK(rb.offset_bytes == 3 * l.block_bytes());
  CHECK(rb.length_bytes == l.block_bytes());
  CHECK(rb.source.length_bytes == l.pool_bytes());
  CHECK(rb.source.segments == devices::block_segments(l, 3));
  KvLayout read = rb.source.layout;
  read.blocks_total = l.blocks_total;  // not on the wire
  CHECK(read == l);
  auto p = plan(rb);
  REQUIRE(p.ok());
  REQUIRE(p.value().size() == 1);
  CHECK(p.value()[0] ==
        devices::KvCopy{0, 3 * l.block_bytes(), 4 * ours().block_bytes(), l.block_bytes()});
}

TEST_CASE("kv descriptor: a layer-major block travels part by part and is read part by part") {
  KvLayout l = pool_layout(KvOrder::layer_major);
  auto rb = round_trip(l, 2);
  CHECK(rb.source.layout.order == KvOrder::layer_major);
  REQUIRE(rb.source.segments.size() == 6);
  CHECK(rb.source.segments == devices::block_segments(l, 2));
  auto p = plan(rb);
  REQUIRE(p.ok());
  REQUIRE(p.value().size() == 6);
  for (uint32_t i = 0; i < 6; ++i) {
    auto part = static_cast<devices::KvPart>(i % 2);
    CHECK(p.value()[i].src_offset == l.offset_bytes(2, i / 2, part));
    CHECK(p.value()[i].dst_offset == ours().offset_bytes(4, i / 2, part));
  }
}

TEST_CASE("kv descriptor: what a peer may send wrong is refused by the plan, not trusted") {
  KvLayout l = pool_layout(KvOrder::block_major);
  capnp::MallocMessageBuilder message;
  auto d = message.initRoot<wire::BlockDescriptor>();
  runtime::RemoteRegionRef region{0, l.pool_bytes(), 1};
  actors::fill_block_descriptor(d, "peer:1", region, l.block_bytes(), nullptr, l);

  // No segments (a writer that lists none): one block-major run at offsetBytes.
  d.initSegments(0);
  auto legacy = actors::read_block_descriptor(d.asReader());
  REQUIRE(legacy.source.segments.size() == 1);
  CHECK(legacy.source.segments[0].offset_bytes == l.block_bytes());
  CHECK(plan(legacy).ok());

  // A part that is neither K nor V.
  auto segs = d.initSegments(1);
  segs[0].setLayer(0);
  segs[0].setPart(5);
  segs[0].setParts(6);
  auto bad_part = plan(actors::read_block_descriptor(d.asReader()));
  REQUIRE_FALSE(bad_part.ok());
  CHECK(bad_part.error().describe().find("a segment of 0 parts") != std::string::npos);

  // More segments than parts (read no further than one past them).
  segs = d.initSegments(100000);
  auto many = actors::read_block_descriptor(d.asReader());
  CHECK(many.source.segments.size() == 7);
  auto p = plan(many);
  REQUIRE_FALSE(p.ok());
  CHECK(p.error().describe() == "invalid: KV source 0: 7 segments for 3 layers");

  // An order this build does not know.
  actors::fill_block_descriptor(d, "peer:1", region, l.block_bytes(), nullptr, l);
  d.getLayout().setOrder(9);
  auto unknown = plan(actors::read_block_descriptor(d.asReader()));
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().describe() == "invalid: KV source 0: no layers");

  // Another inner order.
  d.getLayout().setOrder(0);
  d.getLayout().setInner(1);
  auto inner = plan(actors::read_block_descriptor(d.asReader()));
  REQUIRE_FALSE(inner.ok());
  CHECK(inner.error().describe().find("parts in head-slot-dim order, ours slot-head-dim") !=
        std::string::npos);
}
