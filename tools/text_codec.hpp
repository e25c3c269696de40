// The tiny text interface `tandem generate` needs: prompt -> ids, ids -> streamed text.
//
// Backed by runtime/text (tandem::text::load_tokenizer + StreamDecoder) when the build has
// it (meson defines TANDEM_HAVE_TEXT when `text_dep` exists); otherwise load_text_codec()
// returns unimplemented. Single owner, not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/result.hpp"

namespace tandem::tools {

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // Text -> ids, with the tokenizer's BOS first (when it has one).
  virtual std::vector<int32_t> encode(std::string_view text) = 0;
  // Starts a new output stream that follows token `prev_id` (the last prompt token).
  virtual void begin_stream(int32_t prev_id) = 0;
  // Text that became complete with `id` (never half a UTF-8 character; may be empty).
  virtual std::string push(int32_t id) = 0;
  // End of stream: whatever was held back.
  virtual std::string finish() = 0;
};

// path: a llama2.c tokenizer.bin, an HF tokenizer.json, or a directory holding one.
// Errors: not_found, invalid (corrupt file), unimplemented (no tokenizer in this build).
Result<std::unique_ptr<TextCodec>> load_text_codec(const std::string& path);

}  // namespace tandem::tools
