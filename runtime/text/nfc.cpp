#include "runtime/text/nfc.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "runtime/base/assert.hpp"
#include "runtime/text/utf8.hpp"

namespace tandem::text {
namespace {

struct CombiningClass {
  char32_t code_point;
  uint8_t combining_class;
};
struct Decomposition {
  char32_t code_point;
  char32_t first;
  char32_t second;  // 0 for a singleton decomposition
};
struct Composition {
  char32_t first;
  char32_t second;
  char32_t composite;
};

#include "runtime/text/nfc_tables.inc"

// Hangul syllables are composed and decomposed algorithmically (Unicode 3.12).
constexpr char32_t hangul_s_base = 0xAC00, hangul_l_base = 0x1100, hangul_v_base = 0x1161,
                   hangul_t_base = 0x11A7;
constexpr char32_t hangul_l_count = 19, hangul_v_count = 21, hangul_t_count = 28;
constexpr char32_t hangul_n_count = hangul_v_count * hangul_t_count;
constexpr char32_t hangul_s_count = hangul_l_count * hangul_n_count;

uint8_t combining_class(char32_t code_point) {
  const auto* end = std::end(combining_classes);
  const auto* found = std::lower_bound(
      std::begin(combining_classes), end, code_point,
      [](const CombiningClass& entry, char32_t value) { return entry.code_point < value; });
  return found != end && found->code_point == code_point ? found->combining_class : 0;
}

const Decomposition* find_decomposition(char32_t code_point) {
  const auto* end = std::end(decompositions);
  const auto* found = std::lower_bound(
      std::begin(decompositions), end, code_point,
      [](const Decomposition& entry, char32_t value) { return entry.code_point < value; });
  return found != end && found->code_point == code_point ? found : nullptr;
}

bool is_composition_second(char32_t code_point) {
  if (code_point >= hangul_v_base && code_point < hangul_v_base + hangul_v_count) return true;
  if (code_point > hangul_t_base && code_point < hangul_t_base + hangul_t_count) return true;
  return std::binary_search(std::begin(composition_seconds), std::end(composition_seconds),
                            code_point);
}

// True when NFC could change text containing this code point.
bool needs_work(char32_t code_point) {
  if (code_point < 0x300) return false;
  return combining_class(code_point) != 0 || find_decomposition(code_point) != nullptr ||
         is_composition_second(code_point);
}

void decompose(char32_t code_point, std::vector<char32_t>& out) {
  if (code_point >= hangul_s_base && code_point < hangul_s_base + hangul_s_count) {
    const char32_t index = code_point - hangul_s_base;
    out.push_back(hangul_l_base + index / hangul_n_count);
    out.push_back(hangul_v_base + (index % hangul_n_count) / hangul_t_count);
    if (index % hangul_t_count != 0) out.push_back(hangul_t_base + index % hangul_t_count);
    return;
  }
  const Decomposition* found = find_decomposition(code_point);
  if (found == nullptr) {
    out.push_back(code_point);
    return;
  }
  RT_ASSERT(found->first != code_point, "self decomposition", uint32_t(code_point));
  decompose(found->first, out);
  if (found->second != 0) decompose(found->second, out);
}

// Canonical ordering: stable sort of each run of non-starters by combining class.
void reorder(std::vector<char32_t>& code_points) {
  std::size_t index = 0;
  while (index < code_points.size()) {
    if (combining_class(code_points[index]) == 0) {
      ++index;
      continue;
    }
    std::size_t run_end = index;
    while (run_end < code_points.size() && combining_class(code_points[run_end]) != 0) ++run_end;
    std::stable_sort(
        code_points.begin() + static_cast<std::ptrdiff_t>(index),
        code_points.begin() + static_cast<std::ptrdiff_t>(run_end),
        [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    index = run_end;
  }
}

char32_t compose_pair(char32_t first, char32_t second) {
  if (first >= hangul_l_base && first < hangul_l_base + hangul_l_count && second >= hangul_v_base &&
      second < hangul_v_base + hangul_v_count) {
    return hangul_s_base +
           ((first - hangul_l_base) * hangul_v_count + (second - hangul_v_base)) * hangul_t_count;
  }
  if (first >= hangul_s_base && first < hangul_s_base + hangul_s_count &&
      (first - hangul_s_base) % hangul_t_count == 0 && second > hangul_t_base &&
      second < hangul_t_base + hangul_t_count) {
    return first + (second - hangul_t_base);
  }
  const Composition key{first, second, 0};
  const auto* end = std::end(compositions);
  const auto* found = std::lower_bound(
      std::begin(compositions), end, key, [](const Composition& a, const Composition& b) {
        return a.first != b.first ? a.first < b.first : a.second < b.second;
      });
  if (found != end && found->first == first && found->second == second) return found->composite;
  return 0;
}

std::vector<char32_t> compose(const std::vector<char32_t>& decomposed) {
  std::vector<char32_t> result;
  result.reserve(decomposed.size());
  std::size_t starter_index = SIZE_MAX;
  for (const char32_t code_point : decomposed) {
    const uint8_t klass = combining_class(code_point);
    if (starter_index != SIZE_MAX) {
      const bool adjacent = starter_index + 1 == result.size();
      const uint8_t last_class = combining_class(result.back());
      const bool unblocked = adjacent || (last_class != 0 && last_class < klass);
      if (unblocked) {
        const char32_t composite = compose_pair(result[starter_index], code_point);
        if (composite != 0) {
          result[starter_index] = composite;
          continue;
        }
      }
    }
    if (klass == 0) starter_index = result.size();
    result.push_back(code_point);
  }
  RT_ASSERT(result.size() <= decomposed.size(), "composition grew the text");
  return result;
}

}  // namespace

std::string to_nfc(std::string_view text) {
  std::vector<char32_t> code_points;
  bool work = false;
  for (std::size_t offset = 0; offset < text.size();) {
    const utf8::Decoded decoded = utf8::decode_one(text, offset);
    RT_ASSERT(decoded.valid, "to_nfc needs valid UTF-8", offset);
    code_points.push_back(decoded.code_point);
    work = work || needs_work(decoded.code_point);
    offset += decoded.length_bytes;
  }
  if (!work) return std::string(text);
  std::vector<char32_t> decomposed;
  decomposed.reserve(code_points.size() + 8);
  for (const char32_t code_point : code_points) decompose(code_point, decomposed);
  reorder(decomposed);
  std::string out;
  out.reserve(text.size());
  for (const char32_t code_point : compose(decomposed)) utf8::append(out, code_point);
  RT_ASSERT(utf8::is_valid(out), "to_nfc produced invalid UTF-8");
  return out;
}

}  // namespace tandem::text
