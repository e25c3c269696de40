// tandem/actors/decode: the drafter a decode sequence speculates with (issue 14). Pure: no
// threads, clocks or I/O. It wraps one proposer (n-gram prompt lookup or suffix decoding),
// fed the sequence's context token by token, and sizes its drafts so that they pay:
//
//   alpha, the sequence's per-token acceptance rate, is a moving average over the draft
//   positions verification examined (accepted ones 1, the first rejected one 0), and over
//   steps that sent no draft, by checking the proposal's first token against the token the
//   step produced (so a sequence that stopped drafting notices when copying starts to pay).
//   Modelling acceptance as geometric, k drafts yield 1 + alpha + ... + alpha^k tokens for a
//   pass that costs 1 + row_cost * k one-row passes; the draft sent is the proposal's first k
//   tokens for the k in 0..min(proposal, draft_tokens_max) that maximizes the ratio (k = 0:
//   no draft this step). row_cost is the device's: about 0.35 for the cpu device here
//   (`tandem bench spec-decode` measures it), far less for an accelerator whose one-token
//   pass is memory-bound.
//
// The instance's shared state (the suffix cache of recent outputs) is SpecShared; a drafter
// only reads it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "actors/decode/ngram_proposer.hpp"
#include "actors/decode/suffix_tree.hpp"
#include "runtime/base/result.hpp"

namespace tandem::decode {

// eagle3: the drafts come from a draft model beside the device (devices/device.hpp DraftSeq);
// the shell hands them to the drafter after each step (ModelDrafts).
enum class SpecMethod { none, ngram, suffix, eagle3 };
std::string_view to_string(SpecMethod method);

struct SpecConfig {
  SpecMethod method = SpecMethod::none;
  uint32_t draft_tokens_max = 4;  // 1..16: k, at most
  // Speculation is off for a step when more sequences than this run: a large batch is
  // compute-bound, so extra rows cost about what they save. Drafts also use only the step's
  // token budget left after every running sequence's one token (DecodeScheduler).
  uint32_t batch_max = 32;        // >= 1
  double row_cost = 0.35;         // (0, 4]: one more row's cost, in one-row passes
  // Measured on the device (devices/pass_cost.hpp), by batch size b, increasing: what one
  // more row costs in a step of b sequences, in units of that step's cost per sequence (the
  // per-token row cost a draft is weighed against). Between two sizes it is interpolated,
  // past the last held. Empty: batch_row_cost(row_cost, b). A device whose extra rows are
  // cheap for one sequence (shared weights) but dear in a large batch (compute-bound) needs
  // these: one row_cost fitted to a single sequence drafts too much at 8 streams.
  std::vector<std::pair<uint32_t, double>> batch_row_costs;
  double alpha_initial = 0.5;     // (0, 1): a new sequence's acceptance rate
  double alpha_weight = 0.2;      // (0, 1]: the moving average's weight of each observation
  NgramConfig ngram;
  SuffixConfig suffix;
  // invalid, naming the key (speculative.<key>), its value and its rule.
  Status validate() const;
};

// What the instance's drafters share: the suffix cache of recent outputs.
class SpecShared {
 public:
  explicit SpecShared(const SpecConfig& config);
  // A finished sequence's generated tokens (suffix only; others ignore it).
  void add_output(std::vector<int32_t> output);
  const SuffixCache* suffix_cache() const { return cache_.get(); }

 private:
  std::unique_ptr<SuffixCache> cache_;
};

// A draft model's proposal for a sequence, valid for the context it was made at: the next
// token appended makes it stale.
class ModelDrafts {
 public:
  void append(std::span<const int32_t> tokens) {
    size_ += tokens.size();
    drafts_.clear();
  }
  void set(std::vector<int32_t> drafts) { drafts_ = std::move(drafts); }
  std::vector<int32_t> propose(uint32_t k) const {
    return {drafts_.begin(), drafts_.begin() + std::min<size_t>(k, drafts_.size())};
  }
  size_t size() const { return size_; }

 private:
  size_t size_ = 0;
  std::vector<int32_t> drafts_;
};

class Drafter {
 public:
  // Precondition (asserted): config.validate() ok and method != none; `shared` outlives it.
  Drafter(const SpecConfig& config, const SpecShared& shared);

  void append(std::span<const int32_t> tokens);
  // The draft to send (at most min(draft_tokens_max, limit) tokens; see above); may be empty.
  // An empty draft with a non-empty proposal is remembered for observe(). batch: the running
  // sequences the step holds; in a batch of b an extra row costs the others too, so k is
  // sized with batch_row_cost(row_cost, b) instead of row_cost.
  std::vector<int32_t> propose(uint32_t limit, uint32_t batch = 1);
  // A step of R rows costs about 1 + row_cost (R - 1) one-row passes. In a step of b
  // sequences, k more rows cost b * row_cost * k / (1 + row_cost (b - 1)) of the b tokens
  // the step makes without them: the per-token row cost k is weighed against (= row_cost
  // when b = 1; towards 1 as a large batch becomes compute-bound).
  static double batch_row_cost(double row_cost, uint32_t batch);
  // The per-token cost of one more row in a step of `batch` sequences, as drafts are sized:
  // from config.batch_row_costs when measured, else batch_row_cost(row_cost, batch).
  double batch_cost(uint32_t batch) const;
  // After verification: `accepted` of `drafted` (> 0) drafts were accepted.
  void on_verified(uint32_t drafted, uint32_t accepted);
  // After a step that sent no draft: the token it produced.
  void observe(int32_t next);
  double alpha() const { return alpha_; }
  size_t context_size() const;
  // eagle3: how many tokens to ask of the draft model for the next step (<= limit; 0: do
  // not ask). The k the sizing rule would send from a full proposal when that is > 0.
  // When drafts do not pay (k = 0) the model still costs a pass per step, so it is only
  // probed for one token (the shadow check's): every step at first, then at intervals that
  // double after each probe that misses, up to probe_interval_max steps; a probe that hits
  // (observe) brings it back to every step.
  static constexpr uint32_t probe_interval_max = 32;
  uint32_t model_tokens_wanted(uint32_t limit, uint32_t batch);
  // eagle3: the draft model's proposal for the current context. Precondition (asserted): the
  // method is eagle3.
  void set_model_drafts(std::vector<int32_t> drafts);
  // The k in [0, proposed] maximizing (1 + alpha + ... + alpha^k) / (1 + row_cost * k).
  static uint32_t best_k(double alpha, double row_cost, uint32_t proposed);

 private:
  void learn(double outcome);

  uint32_t k_max_;
  double row_cost_, alpha_, weight_;
  std::vector<std::pair<uint32_t, double>> batch_costs_;  // config.batch_row_costs
  std::optional<int32_t> unsent_first_;  // the first token of a proposal not sent
  uint32_t probe_interval_ = 1, probe_wait_ = 0;  // eagle3 (model_tokens_wanted)
  std::variant<NgramProposer, SuffixProposer, ModelDrafts> proposer_;
};

}  // namespace tandem::decode
