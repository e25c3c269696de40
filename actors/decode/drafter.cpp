#include "actors/decode/drafter.hpp"

#include <algorithm>
#include <string>

#include "runtime/base/assert.hpp"

namespace tandem::decode {

std::string_view to_string(SpecMethod method) {
  switch (method) {
    case SpecMethod::none:
      return "none";
    case SpecMethod::ngram:
      return "ngram";
    case SpecMethod::suffix:
      return "suffix";
  }
  return "?";
}

Status SpecConfig::validate() const {
  auto bad = [](const char* key, uint32_t value, const char* rule) {
    return make_error(ErrorKind::invalid, std::string("speculative.") + key + " = " +
                                              std::to_string(value) + " " + rule);
  };
  if (draft_tokens_max < 1 || draft_tokens_max > 16) {
    return bad("draft_tokens_max", draft_tokens_max, "is outside 1..16");
  }
  if (batch_max < 1) return bad("batch_max", batch_max, "is below 1");
  if (method == SpecMethod::ngram) {
    if (Status s = ngram.validate(); !s.ok()) return s;
  }
  if (method == SpecMethod::suffix) {
    if (Status s = suffix.validate(); !s.ok()) return s;
  }
  return {};
}

SpecShared::SpecShared(const SpecConfig& config) {
  if (config.method == SpecMethod::suffix) cache_ = std::make_unique<SuffixCache>(config.suffix);
}

void SpecShared::add_output(std::vector<int32_t> output) {
  if (cache_ && !output.empty()) cache_->add(std::move(output));
}

namespace {

std::variant<NgramProposer, SuffixProposer> make_proposer(const SpecConfig& config,
                                                          const SpecShared& shared) {
  RT_ASSERT(config.validate().ok() && config.method != SpecMethod::none);
  if (config.method == SpecMethod::ngram) {
    return std::variant<NgramProposer, SuffixProposer>(std::in_place_index<0>, config.ngram);
  }
  return std::variant<NgramProposer, SuffixProposer>(std::in_place_index<1>, config.suffix,
                                                     shared.suffix_cache());
}

}  // namespace

Drafter::Drafter(const SpecConfig& config, const SpecShared& shared)
    : k_max_(config.draft_tokens_max), k_(config.draft_tokens_max),
      proposer_(make_proposer(config, shared)) {}

void Drafter::append(std::span<const int32_t> tokens) {
  std::visit([tokens](auto& p) { p.append(tokens); }, proposer_);
}

std::vector<int32_t> Drafter::propose(uint32_t limit) const {
  uint32_t k = std::min(k_, limit);
  if (k == 0) return {};
  if (const auto* ngram = std::get_if<NgramProposer>(&proposer_)) return ngram->propose(k);
  return std::get<SuffixProposer>(proposer_).propose(k).tokens;
}

void Drafter::on_verified(uint32_t drafted, uint32_t accepted) {
  RT_ASSERT(drafted > 0 && accepted <= drafted, drafted, accepted);
  k_ = accepted == drafted ? std::min(k_max_, drafted + 1) : accepted + 1;
}

size_t Drafter::context_size() const {
  return std::visit([](const auto& p) { return p.tokens().size(); }, proposer_);
}

}  // namespace tandem::decode
