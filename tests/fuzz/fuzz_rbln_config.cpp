// Fuzz target: rbln_config.json, the config beside an operator's compiled graphs
// (devices/rbln/rbln_artifact.hpp), read by every rbln executor at start and by `tandem check`.
// Input: the file's bytes. parse_artifact_config never throws or crashes; what it accepts holds
// every invariant the device relies on (sizes > 0, max_seq_len a multiple of the block size and
// within max_position, the chunk a multiple of 64, >= 2 blocks, buckets ascending in [1, 4096],
// element bytes 1, 2 or 4, pipeline stages splitting the layers with no buckets, ranks <= 32);
// written back by artifact_config_json it parses to the same artifact; and the manifest it
// describes passes check_artifact.
//   libFuzzer: build-fuzz/tests/fuzz_rbln_config (tests/fuzz/README.md)
//   here: build/tests/fuzz_rbln_config_replay tests/fuzz/corpus/rbln_config (a test)
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "devices/rbln/rbln_artifact.hpp"

namespace {

void require(bool condition) {
  if (!condition) std::abort();  // a finding: the fuzzer (or the replay test) reports it
}

// The written form is the artifact's canonical form (every field it reads).
bool same(const tandem::devices::rbln::RblnArtifact& a,
          const tandem::devices::rbln::RblnArtifact& b) {
  namespace rb = tandem::devices::rbln;
  return a.dir == b.dir && rb::artifact_config_json(a) == rb::artifact_config_json(b);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace rb = tandem::devices::rbln;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = rb::parse_artifact_config(text, "/fuzz");
  if (!parsed.ok()) {
    require(!parsed.error().describe().empty());
    return 0;
  }
  const rb::RblnArtifact& a = parsed.value();
  require(a.block_tokens > 0 && a.max_seq_len > 0 && a.prefill_chunk > 0);
  require(a.max_seq_len % a.block_tokens == 0 && a.table_blocks() >= 1);
  require(a.max_seq_len <= a.model.max_position);
  require(a.prefill_chunk % 64 == 0);
  require(a.kv_blocks >= 2);
  require(a.kv_element_bytes == 1 || a.kv_element_bytes == 2 || a.kv_element_bytes == 4);
  // A pipelined prefill: stages splitting the layers, no decode graphs, one rank; otherwise
  // decode buckets. Ranks in [1, 32], their bit in a 64-bit mask.
  require(a.stages >= 1 && a.stage_layers.size() == a.stages && a.ranks >= 1 && a.ranks <= 32);
  uint64_t layers = 0;
  for (uint32_t l : a.stage_layers) {
    require(l >= 1);
    layers += l;
  }
  require(layers == a.model.layers);
  for (uint32_t s = 0; s < a.stages; ++s) require(a.stage_first_layer(s) < a.model.layers);
  require(a.stages > 1 ? a.buckets.empty() && a.ranks == 1 : !a.buckets.empty());
  for (size_t i = 0; i < a.buckets.size(); ++i) {
    require(a.buckets[i] >= 1 && a.buckets[i] <= 4096);
    if (i > 0) require(a.buckets[i] > a.buckets[i - 1]);
    require(a.bucket_for(a.buckets[i]) == a.buckets[i]);
  }
  if (!a.buckets.empty()) require(a.bucket_for(a.buckets.back() + 1) == 0);
  auto again = rb::parse_artifact_config(rb::artifact_config_json(a).dump(), "/fuzz");
  require(again.ok() && same(a, again.value()));
  rb::ArtifactExpect expect{a.model_name,      {},
                            a.block_tokens,    a.max_seq_len,
                            a.devices_total(), a.buckets.empty() ? 0 : a.buckets.back(),
                            a.kv_blocks - 1};
  require(rb::check_artifact(a, expect).ok());
  return 0;
}
