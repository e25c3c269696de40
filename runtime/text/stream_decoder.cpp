#include "runtime/text/stream_decoder.hpp"

#include "runtime/base/assert.hpp"
#include "runtime/text/utf8.hpp"

namespace tandem::text {

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, std::optional<int32_t> prev_id)
    : tokenizer_(tokenizer), prev_id_(prev_id) {}

std::string StreamDecoder::push(int32_t id) {
  held_ += tokenizer_.decode_piece(prev_id_, id);
  prev_id_ = id;
  const std::size_t ready_bytes = utf8::emittable_prefix_bytes(held_);
  RT_ASSERT(ready_bytes <= held_.size(), ready_bytes, held_.size());
  std::string out = utf8::sanitize(std::string_view(held_).substr(0, ready_bytes));
  held_.erase(0, ready_bytes);
  RT_ASSERT(held_.size() <= 3, "held more than one incomplete character", held_.size());
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = utf8::sanitize(held_);
  held_.clear();
  RT_ASSERT(utf8::is_valid(out), "finish emits valid UTF-8");
  return out;
}

}  // namespace tandem::text
