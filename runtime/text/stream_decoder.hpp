// tandem/text: incremental detokenization for streaming responses.
//
// Feed generated ids one at a time; each push() returns only text that is safe to send:
// never half a UTF-8 character (bytes of an incomplete character are held, at most 3),
// and with the tokenizer's leading-space rule applied relative to the previous token.
// Malformed bytes that can never complete become U+FFFD. One StreamDecoder per stream;
// it borrows the tokenizer, which must outlive it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/text/tokenizer.hpp"

namespace tandem::text {

class StreamDecoder {
 public:
  // `prev_id`: the token before the first pushed one (e.g. the last prompt token), or
  // nullopt when the stream starts the text (SentencePiece then drops a leading space).
  explicit StreamDecoder(const Tokenizer& tokenizer, std::optional<int32_t> prev_id = std::nullopt);

  // Text that became complete with this token (possibly empty).
  std::string push(int32_t id);

  // End of stream: returns the held bytes, an incomplete character as U+FFFD.
  std::string finish();

  std::size_t held_bytes() const { return held_.size(); }

 private:
  const Tokenizer& tokenizer_;
  std::optional<int32_t> prev_id_;
  std::string held_;
};

}  // namespace tandem::text
