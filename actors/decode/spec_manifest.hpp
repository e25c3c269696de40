// tandem/actors/decode: the manifest's [speculative] as the drafters' SpecConfig. Shared by the
// decode shell and `tandem sim` (one mapping, so the simulator speculates as a node would).
#pragma once

#include "actors/decode/drafter.hpp"
#include "config/manifest.hpp"

namespace tandem::decode {

inline SpecConfig spec_config(const config::SpeculativeSection& m) {
  SpecConfig c;
  switch (m.method) {
    case config::SpeculativeMethod::ngram: c.method = SpecMethod::ngram; break;
    case config::SpeculativeMethod::suffix: c.method = SpecMethod::suffix; break;
    case config::SpeculativeMethod::eagle3: c.method = SpecMethod::eagle3; break;
    case config::SpeculativeMethod::none: c.method = SpecMethod::none; break;
  }
  c.draft_tokens_max = m.draft_tokens_max;
  c.batch_max = m.batch_max;
  c.row_cost = m.row_cost;
  c.ngram = {m.ngram_match_min, m.ngram_match_max, m.ngram_candidates_max};
  c.suffix.depth_max = m.suffix_depth_max;
  c.suffix.probability_min = m.suffix_probability_min;
  c.suffix.match_factor = m.suffix_match_factor;
  c.suffix.request_nodes_max = m.suffix_request_nodes_max;
  c.suffix.cache_nodes_max = m.suffix_cache_nodes_max;
  c.suffix.cache_tokens_max = m.suffix_cache_tokens_max;
  return c;
}

}  // namespace tandem::decode
