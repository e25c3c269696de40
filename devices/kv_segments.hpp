// A KV block as a list of segments, and the copies that move one block between pools of
// different layouts (devices/device.hpp: KvOrder, KvInner, layer_first).
//
// A transfer reads one block of the destination's layers from one or more sources: a decode
// instance's pool (all layers, block-major) filled from a prefill pipelined over four devices
// (four sources of a quarter of the layers each), or from a per-layer cache (layer-major).
// Every (layer, K|V) part of the destination must come from exactly one source segment whose
// part has the same shape (block tokens, kv heads, head dim, element bytes, inner order); the
// plan is then a list of byte copies, adjacent ones merged, which RMA reads (or memcpy) carry
// out. A mismatch is refused naming both values, before a byte moves. Pure.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "devices/device.hpp"
#include "runtime/base/result.hpp"

namespace tandem::devices {

// `parts` consecutive (layer, K|V) parts, in the order layer 0 K, layer 0 V, layer 1 K, ...,
// starting at (layer, part), contiguous from offset_bytes. Layers are model layers
// (KvLayout::layer_first counted in).
struct KvSegment {
  uint32_t layer = 0;
  KvPart part = KvPart::k;
  uint32_t parts = 1;
  uint64_t offset_bytes = 0;  // from the pool's (region's) base

  friend bool operator==(const KvSegment&, const KvSegment&) = default;
};

// Block `block` of `layout` as segments: one run of 2 * layers parts (block-major) or 2 * layers
// runs of one (layer-major). Asserts block < blocks_total.
std::vector<KvSegment> block_segments(const KvLayout& layout, uint32_t block);

// One source of a block transfer: the layout of its pool (the part shape and layer slice) and
// where the block's parts are in it.
struct KvSource {
  KvLayout layout;  // blocks_total need not be known
  std::vector<KvSegment> segments;
  uint64_t length_bytes = 0;  // of the pool (region) the segments' offsets are in
};

struct KvCopy {
  uint32_t source = 0;  // index into the sources
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t bytes = 0;

  friend bool operator==(const KvCopy&, const KvCopy&) = default;
};

// The copies that fill block `dst_block` of `dst` from `sources`, in destination order, merged
// where both sides run on. invalid naming the source and both values when a part's shape
// differs ("source 1: kv_heads 8, ours 4"), a segment names a layer outside its source's slice,
// a part of ours is in no segment or in two, or a segment runs past its source's pool.
Result<std::vector<KvCopy>> plan_block_copy(std::span<const KvSource> sources, const KvLayout& dst,
                                            uint32_t dst_block);

// A byte range of one pool.
struct KvRun {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  friend bool operator==(const KvRun&, const KvRun&) = default;
};

// Appends `run` to `runs`, extending the last one when `run` starts where it ends.
void append_run(std::vector<KvRun>& runs, KvRun run);

// The bytes a pass writes for positions [first, end) of a sequence with `table`: for every block
// those positions touch, each (layer, K|V) part's rows of those slots, in pool order, adjacent
// runs merged (positions filling whole blocks of a block-major pool come out as one run per
// block). For staging what a pass wrote between a device's KV and its host copy. Layouts with
// the slot_head_dim inner order only (a slot's row is contiguous); asserts it, that the table
// covers `end` and that its ids are < blocks_total.
std::vector<KvRun> written_runs(const KvLayout& layout, std::span<const uint32_t> table,
                                uint32_t first, uint32_t end);

// The bytes of `runs` (ranges of a pool laid out as `whole`) that belong to the layers of
// `slice` (a pipeline stage's pool: the same part shape, a sub-range of whole's model layers),
// as copies from whole's offsets (src_offset) to the slice's (dst_offset), in run order, adjacent
// ones merged; parts of other layers are left out. For staging a pass's writes between the host
// pool of a pipelined instance and its stages' KV buffers. Both layouts block-major; asserts
// it, the shapes, that the slice's layers lie in whole's and that the runs' blocks are below
// both blocks_total (the caller made the runs from whole).
std::vector<KvCopy> slice_runs(const KvLayout& whole, const KvLayout& slice,
                               std::span<const KvRun> runs);

// "block-major" / "layer-major", "slot-head-dim" / "head-slot-dim".
std::string_view to_string(KvOrder order);
std::string_view to_string(KvInner inner);

}  // namespace tandem::devices
