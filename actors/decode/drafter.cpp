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
    case SpecMethod::eagle3:
      return "eagle3";
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
  auto bad_real = [](const char* key, double value, const char* rule) {
    return make_error(ErrorKind::invalid, std::string("speculative.") + key + " = " +
                                              std::to_string(value) + " " + rule);
  };
  if (!(row_cost > 0 && row_cost <= 4)) return bad_real("row_cost", row_cost, "is outside (0, 4]");
  for (size_t i = 0; i < batch_row_costs.size(); ++i) {
    const auto& [b, cost] = batch_row_costs[i];
    if (b < 1 || (i > 0 && b <= batch_row_costs[i - 1].first)) {
      return bad("batch_row_costs", b, "is not a batch size above the one before");
    }
    if (!(cost > 0 && cost <= 4)) return bad_real("batch_row_costs", cost, "is outside (0, 4]");
  }
  if (!(alpha_initial > 0 && alpha_initial < 1)) {
    return bad_real("alpha_initial", alpha_initial, "is outside (0, 1)");
  }
  if (!(alpha_weight > 0 && alpha_weight <= 1)) {
    return bad_real("alpha_weight", alpha_weight, "is outside (0, 1]");
  }
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

using Proposer = std::variant<NgramProposer, SuffixProposer, ModelDrafts>;

Proposer make_proposer(const SpecConfig& config, const SpecShared& shared) {
  RT_ASSERT(config.validate().ok() && config.method != SpecMethod::none);
  if (config.method == SpecMethod::ngram) return Proposer(std::in_place_index<0>, config.ngram);
  if (config.method == SpecMethod::eagle3) return Proposer(std::in_place_index<2>);
  return Proposer(std::in_place_index<1>, config.suffix, shared.suffix_cache());
}

}  // namespace

Drafter::Drafter(const SpecConfig& config, const SpecShared& shared)
    : k_max_(config.draft_tokens_max), row_cost_(config.row_cost), alpha_(config.alpha_initial),
      weight_(config.alpha_weight), batch_costs_(config.batch_row_costs),
      proposer_(make_proposer(config, shared)) {}

double Drafter::batch_cost(uint32_t batch) const {
  if (batch_costs_.empty()) return batch_row_cost(row_cost_, batch);
  const double b = std::max<uint32_t>(batch, 1);
  if (b <= batch_costs_.front().first) return batch_costs_.front().second;
  for (size_t i = 1; i < batch_costs_.size(); ++i) {
    const auto& [b1, c1] = batch_costs_[i];
    if (b <= b1) {
      const auto& [b0, c0] = batch_costs_[i - 1];
      return c0 + (c1 - c0) * (b - b0) / double(b1 - b0);
    }
  }
  return batch_costs_.back().second;
}

uint32_t Drafter::best_k(double alpha, double row_cost, uint32_t proposed) {
  uint32_t best = 0;
  double best_ratio = 1.0, tokens = 1.0, term = 1.0;
  for (uint32_t k = 1; k <= proposed; ++k) {
    term *= alpha;
    tokens += term;
    double ratio = tokens / (1.0 + row_cost * k);
    if (ratio > best_ratio) {
      best = k;
      best_ratio = ratio;
    }
  }
  return best;
}

void Drafter::learn(double outcome) { alpha_ += weight_ * (outcome - alpha_); }

void Drafter::append(std::span<const int32_t> tokens) {
  std::visit([tokens](auto& p) { p.append(tokens); }, proposer_);
}

double Drafter::batch_row_cost(double row_cost, uint32_t batch) {
  const double b = std::max<uint32_t>(batch, 1);
  return b * row_cost / (1.0 + row_cost * (b - 1.0));
}

std::vector<int32_t> Drafter::propose(uint32_t limit, uint32_t batch) {
  unsent_first_.reset();
  uint32_t k = std::min(k_max_, limit);
  if (k == 0) return {};
  std::vector<int32_t> proposal;
  if (const auto* ngram = std::get_if<NgramProposer>(&proposer_)) {
    proposal = ngram->propose(k);
  } else if (const auto* model = std::get_if<ModelDrafts>(&proposer_)) {
    proposal = model->propose(k);
  } else {
    proposal = std::get<SuffixProposer>(proposer_).propose(k).tokens;
  }
  if (proposal.empty()) return proposal;
  const int32_t first = proposal[0];
  proposal.resize(best_k(alpha_, batch_cost(batch),
                         static_cast<uint32_t>(proposal.size())));
  if (proposal.empty()) unsent_first_ = first;  // checked against the step's token
  return proposal;
}

void Drafter::on_verified(uint32_t drafted, uint32_t accepted) {
  RT_ASSERT(drafted > 0 && accepted <= drafted, drafted, accepted);
  for (uint32_t i = 0; i < accepted; ++i) learn(1.0);
  if (accepted < drafted) learn(0.0);
  unsent_first_.reset();
}

void Drafter::observe(int32_t next) {
  if (unsent_first_) {
    bool hit = *unsent_first_ == next;
    learn(hit ? 1.0 : 0.0);
    if (hit) probe_interval_ = 1, probe_wait_ = 0;
  }
  unsent_first_.reset();
}

size_t Drafter::context_size() const {
  if (const auto* model = std::get_if<ModelDrafts>(&proposer_)) return model->size();
  if (const auto* ngram = std::get_if<NgramProposer>(&proposer_)) return ngram->tokens().size();
  return std::get<SuffixProposer>(proposer_).tokens().size();
}

uint32_t Drafter::model_tokens_wanted(uint32_t limit, uint32_t batch) {
  uint32_t k = std::min(k_max_, limit);
  if (k == 0) return 0;
  if (uint32_t pays = best_k(alpha_, batch_cost(batch), k); pays > 0) {
    probe_interval_ = 1;
    probe_wait_ = 0;
    return pays;
  }
  if (probe_wait_ > 0) {
    --probe_wait_;
    return 0;
  }
  probe_wait_ = probe_interval_ - 1;
  probe_interval_ = std::min(probe_interval_ * 2, probe_interval_max);
  return 1;
}

void Drafter::set_model_drafts(std::vector<int32_t> drafts) {
  auto* model = std::get_if<ModelDrafts>(&proposer_);
  RT_ASSERT(model != nullptr, "model drafts for a drafter of another method");
  model->set(std::move(drafts));
}

}  // namespace tandem::decode
