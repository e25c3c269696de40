#include "tools/text_codec.hpp"

#if TANDEM_HAVE_TEXT
#include <optional>

#include "runtime/text/stream_decoder.hpp"
#include "runtime/text/tokenizer.hpp"
#endif

namespace tandem::tools {

#if TANDEM_HAVE_TEXT
namespace {
class TextCodecImpl final : public TextCodec {
 public:
  explicit TextCodecImpl(std::unique_ptr<text::Tokenizer> tok) : tok_(std::move(tok)) {}
  std::vector<int32_t> encode(std::string_view text) override { return tok_->encode(text, true); }
  void begin_stream(int32_t prev_id) override { stream_.emplace(*tok_, prev_id); }
  std::string push(int32_t id) override {
    RT_ASSERT(stream_.has_value(), "push before begin_stream");
    return stream_->push(id);
  }
  std::string finish() override {
    RT_ASSERT(stream_.has_value(), "finish before begin_stream");
    return stream_->finish();
  }

 private:
  std::unique_ptr<text::Tokenizer> tok_;
  std::optional<text::StreamDecoder> stream_;
};
}  // namespace

Result<std::unique_ptr<TextCodec>> load_text_codec(const std::string& path) {
  auto tok = text::load_tokenizer(path);
  if (!tok) return tok.error();
  return std::unique_ptr<TextCodec>(std::make_unique<TextCodecImpl>(std::move(*tok)));
}
#else
Result<std::unique_ptr<TextCodec>> load_text_codec(const std::string& path) {
  return make_error(ErrorKind::unimplemented,
                    "no tokenizer in this build (runtime/text not built); cannot read " + path);
}
#endif

}  // namespace tandem::tools
