// tandem/text (internal): the merge loop shared by the BPE and SentencePiece backends.
//
// Repeatedly merges the adjacent pair with the lowest priority value (ties: leftmost),
// exactly like the reference loops that rescan the whole word each step, but in
// O(n log n) with a heap and lazy invalidation.
#pragma once

#include <cstdint>
#include <optional>
#include <queue>
#include <vector>

#include "runtime/base/assert.hpp"

namespace tandem::text::detail {

struct MergeCandidate {
  double priority = 0;  // lower merges first
  int32_t merged_id = -1;
};

// `lookup(left_id, right_id) -> std::optional<MergeCandidate>`.
template <class Lookup>
void merge_symbols(std::vector<int32_t>& ids, const Lookup& lookup) {
  const std::size_t count = ids.size();
  if (count < 2) return;
  struct Entry {
    double priority;
    std::size_t left_index;
    int32_t left_id;
    int32_t right_id;
    int32_t merged_id;
    bool operator>(const Entry& other) const {
      if (priority != other.priority) return priority > other.priority;
      return left_index > other.left_index;
    }
  };
  constexpr std::size_t none = SIZE_MAX;
  std::vector<std::size_t> next(count), prev(count);
  for (std::size_t i = 0; i < count; ++i) {
    next[i] = i + 1 < count ? i + 1 : none;
    prev[i] = i == 0 ? none : i - 1;
  }
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push = [&heap, &ids, &next, &lookup](std::size_t left) {
    if (left == none || next[left] == none) return;
    const std::optional<MergeCandidate> found = lookup(ids[left], ids[next[left]]);
    if (found) heap.push({found->priority, left, ids[left], ids[next[left]], found->merged_id});
  };
  for (std::size_t i = 0; i + 1 < count; ++i) push(i);
  std::vector<bool> alive(count, true);
  while (!heap.empty()) {
    const Entry top = heap.top();
    heap.pop();
    const std::size_t left = top.left_index;
    if (!alive[left] || ids[left] != top.left_id) continue;
    const std::size_t right = next[left];
    if (right == none || ids[right] != top.right_id) continue;
    RT_ASSERT(alive[right], "merge: next of a live symbol is dead", left, right);
    ids[left] = top.merged_id;
    alive[right] = false;
    next[left] = next[right];
    if (next[right] != none) prev[next[right]] = left;
    push(prev[left]);
    push(left);
  }
  std::size_t out = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (alive[i]) ids[out++] = ids[i];
  }
  RT_ASSERT(out >= 1 && out <= count, "merge produced no symbols", out, count);
  ids.resize(out);
}

}  // namespace tandem::text::detail
