#include "runtime/text/model_chat.hpp"

#include <system_error>

#include "runtime/base/assert.hpp"

namespace tandem::text {

std::filesystem::path tokenizer_config_path(const std::filesystem::path& model_path) {
  RT_ASSERT(!model_path.empty(), "tokenizer_config_path: empty model path");
  std::error_code ec;
  bool is_dir = std::filesystem::is_directory(model_path, ec);
  std::filesystem::path dir = is_dir ? model_path : model_path.parent_path();
  std::filesystem::path out = dir / "tokenizer_config.json";
  RT_ASSERT(out.filename() == "tokenizer_config.json", "tokenizer_config_path result");
  return out;
}

Result<ChatFormat> chat_format_for(const config::ModelSection& model) {
  switch (model.chat_format) {
    case config::ChatFormat::plain:
      return ChatFormat::plain;
    case config::ChatFormat::chatml:
      return ChatFormat::chatml;
    case config::ChatFormat::minimax_m2:
      return ChatFormat::minimax_m2;
    case config::ChatFormat::auto_detect:
      break;
  }
  RT_ASSERT(model.chat_format == config::ChatFormat::auto_detect, "chat format",
            static_cast<int>(model.chat_format));
  if (model.path.empty()) {
    return make_error(ErrorKind::invalid,
                      "model.chat_format = auto needs model.path to find tokenizer_config.json");
  }
  return detect_chat_format_from_config(tokenizer_config_path(model.path));
}

}  // namespace tandem::text
