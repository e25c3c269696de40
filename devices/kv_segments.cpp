#include "devices/kv_segments.hpp"

#include <algorithm>

#include "runtime/base/assert.hpp"

namespace tandem::devices {

std::string_view to_string(KvOrder order) {
  return order == KvOrder::layer_major ? "layer-major" : "block-major";
}

std::string_view to_string(KvInner inner) {
  return inner == KvInner::head_slot_dim ? "head-slot-dim" : "slot-head-dim";
}

std::vector<KvSegment> block_segments(const KvLayout& layout, uint32_t block) {
  RT_ASSERT(block < layout.blocks_total, block, layout.blocks_total);
  if (layout.order == KvOrder::block_major) {
    return {{layout.layer_first, KvPart::k, layout.layers * 2,
             layout.offset_bytes(block, 0, KvPart::k)}};
  }
  std::vector<KvSegment> out;
  out.reserve(size_t{layout.layers} * 2);
  for (uint32_t layer = 0; layer < layout.layers; ++layer) {
    for (KvPart part : {KvPart::k, KvPart::v}) {
      out.push_back({layout.layer_first + layer, part, 1, layout.offset_bytes(block, layer, part)});
    }
  }
  return out;
}

namespace {

std::string part_name(uint64_t model_index) {
  return "layer " + std::to_string(model_index / 2) + (model_index % 2 == 0 ? " K" : " V");
}

Status check_shape(uint32_t i, const KvLayout& src, const KvLayout& dst) {
  auto differs = [&](const char* what, uint64_t theirs, uint64_t ours) {
    return make_error(ErrorKind::invalid, "KV source " + std::to_string(i) + ": " + what + " " +
                                              std::to_string(theirs) + ", ours " +
                                              std::to_string(ours));
  };
  if (src.block_tokens != dst.block_tokens) {
    return differs("block_tokens", src.block_tokens, dst.block_tokens);
  }
  if (src.kv_heads != dst.kv_heads) return differs("kv_heads", src.kv_heads, dst.kv_heads);
  if (src.head_dim != dst.head_dim) return differs("head_dim", src.head_dim, dst.head_dim);
  if (src.element_bytes != dst.element_bytes) {
    return differs("element_bytes", src.element_bytes, dst.element_bytes);
  }
  if (src.inner != dst.inner) {
    return make_error(ErrorKind::invalid, "KV source " + std::to_string(i) + ": parts in " +
                                              std::string(to_string(src.inner)) + " order, ours " +
                                              std::string(to_string(dst.inner)) +
                                              " (not a byte copy)");
  }
  if (src.layers == 0) {
    return make_error(ErrorKind::invalid, "KV source " + std::to_string(i) + ": no layers");
  }
  return {};
}

}  // namespace

Result<std::vector<KvCopy>> plan_block_copy(std::span<const KvSource> sources, const KvLayout& dst,
                                            uint32_t dst_block) {
  RT_ASSERT(dst_block < dst.blocks_total, dst_block, dst.blocks_total);
  struct From {
    uint32_t source = 0;
    uint64_t offset = 0;
    bool set = false;
  };
  uint64_t dst_first = uint64_t{dst.layer_first} * 2;
  uint64_t dst_end = dst_first + uint64_t{dst.layers} * 2;  // model part indexes [first, end)
  std::vector<From> from(size_t{dst.layers} * 2);
  uint64_t part_bytes = dst.part_bytes();
  for (uint32_t i = 0; i < sources.size(); ++i) {
    const KvSource& src = sources[i];
    if (Status shape = check_shape(i, src.layout, dst); !shape.ok()) return shape.error();
    auto bad = [&](const std::string& what) {
      return make_error(ErrorKind::invalid, "KV source " + std::to_string(i) + ": " + what);
    };
    if (src.segments.size() > size_t{src.layout.layers} * 2) {
      return bad(std::to_string(src.segments.size()) + " segments for " +
                 std::to_string(src.layout.layers) + " layers");
    }
    uint64_t src_first = uint64_t{src.layout.layer_first} * 2;
    uint64_t src_end = src_first + uint64_t{src.layout.layers} * 2;
    for (const KvSegment& seg : src.segments) {
      uint64_t first = uint64_t{seg.layer} * 2 + static_cast<uint32_t>(seg.part);
      if (seg.parts == 0 || first < src_first || seg.parts > src_end - std::min(first, src_end)) {
        return bad("a segment of " + std::to_string(seg.parts) + " parts from " + part_name(first) +
                   " is outside its layers [" + std::to_string(src.layout.layer_first) + ", " +
                   std::to_string(src.layout.layer_first + src.layout.layers) + ")");
      }
      uint64_t bytes = seg.parts * part_bytes;
      if (seg.offset_bytes > src.length_bytes || bytes > src.length_bytes - seg.offset_bytes) {
        return bad("a segment at byte " + std::to_string(seg.offset_bytes) + " of " +
                   std::to_string(bytes) + " bytes runs past its " +
                   std::to_string(src.length_bytes) + "-byte pool");
      }
      for (uint32_t j = 0; j < seg.parts; ++j) {
        uint64_t model_index = first + j;
        if (model_index < dst_first || model_index >= dst_end) continue;  // not ours
        From& f = from[model_index - dst_first];
        if (f.set) return bad(part_name(model_index) + " is in two source segments");
        f = {i, seg.offset_bytes + j * part_bytes, true};
      }
    }
  }
  std::vector<KvCopy> copies;
  for (uint64_t index = 0; index < from.size(); ++index) {
    const From& f = from[index];
    if (!f.set) {
      return make_error(ErrorKind::invalid,
                        "KV transfer: " + part_name(dst_first + index) + " is in no source");
    }
    uint64_t dst_offset = dst.offset_bytes(dst_block, static_cast<uint32_t>(index / 2),
                                           static_cast<KvPart>(index % 2));
    if (!copies.empty()) {
      KvCopy& last = copies.back();
      if (last.source == f.source && last.src_offset + last.bytes == f.offset &&
          last.dst_offset + last.bytes == dst_offset) {
        last.bytes += part_bytes;
        continue;
      }
    }
    copies.push_back({f.source, f.offset, dst_offset, part_bytes});
  }
  return copies;
}

void append_run(std::vector<KvRun>& runs, KvRun run) {
  if (!runs.empty() && runs.back().offset + runs.back().bytes == run.offset) {
    runs.back().bytes += run.bytes;
  } else {
    runs.push_back(run);
  }
}

std::vector<KvRun> written_runs(const KvLayout& layout, std::span<const uint32_t> table,
                                uint32_t first, uint32_t end) {
  RT_ASSERT(layout.inner == KvInner::slot_head_dim);
  std::vector<KvRun> runs;
  if (first >= end) return runs;
  const uint32_t bt = layout.block_tokens;
  RT_ASSERT(table.size() * uint64_t{bt} >= end, table.size(), end);
  const uint64_t row = uint64_t{layout.kv_heads} * layout.head_dim * layout.element_bytes;
  for (uint32_t b = first / bt; b <= (end - 1) / bt; ++b) {
    const uint32_t block = table[b];
    RT_ASSERT(block < layout.blocks_total, block, layout.blocks_total);
    const uint32_t s0 = std::max(first, b * bt) - b * bt;
    const uint32_t s1 = std::min(end, (b + 1) * bt) - b * bt;
    for (uint32_t layer = 0; layer < layout.layers; ++layer) {
      for (KvPart part : {KvPart::k, KvPart::v}) {
        append_run(runs, {layout.slot_offset_bytes(block, layer, part, s0), (s1 - s0) * row});
      }
    }
  }
  return runs;
}

std::vector<KvCopy> slice_runs(const KvLayout& whole, const KvLayout& slice,
                               std::span<const KvRun> runs) {
  RT_ASSERT(whole.order == KvOrder::block_major && slice.order == KvOrder::block_major);
  RT_ASSERT(whole.part_bytes() == slice.part_bytes() && whole.inner == slice.inner);
  RT_ASSERT(slice.layer_first >= whole.layer_first &&
                slice.layer_first + slice.layers <= whole.layer_first + whole.layers,
            slice.layer_first, slice.layers, whole.layer_first, whole.layers);
  const uint64_t pb = whole.part_bytes(), whole_bb = whole.block_bytes();
  const uint64_t slice_bb = slice.block_bytes();
  std::vector<KvCopy> copies;
  for (const KvRun& run : runs) {
    for (uint64_t at = run.offset, end = run.offset + run.bytes; at < end;) {
      const uint64_t block = at / whole_bb, within = at % whole_bb;
      const uint64_t part = within / pb, part_off = within % pb;
      const uint64_t piece = std::min(end - at, pb - part_off);
      RT_ASSERT(block < whole.blocks_total && block < slice.blocks_total, block);
      const uint64_t layer = whole.layer_first + part / 2;
      if (layer >= slice.layer_first && layer < slice.layer_first + slice.layers) {
        const uint64_t dst =
            block * slice_bb + ((layer - slice.layer_first) * 2 + part % 2) * pb + part_off;
        KvCopy* last = copies.empty() ? nullptr : &copies.back();
        if (last && last->src_offset + last->bytes == at && last->dst_offset + last->bytes == dst) {
          last->bytes += piece;
        } else {
          copies.push_back({0, at, dst, piece});
        }
      }
      at += piece;
    }
  }
  return copies;
}

}  // namespace tandem::devices
