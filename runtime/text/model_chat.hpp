// tandem/text: which chat format a served model uses, from its manifest [model] section.
//
// chat_format = "plain" | "chatml" | "minimax-m2" in the manifest wins. "auto" (the default)
// detects it from the tokenizer_config.json that sits with the model: inside the model
// directory (HF checkpoint), or beside the model file (llama2.c .bin). No such file, or one
// without a chat_template -> plain (see detect_chat_format_from_config in chat.hpp).
// Reads at most one small file; call it at startup, not per request.
#pragma once

#include <filesystem>

#include "config/manifest.hpp"
#include "runtime/base/result.hpp"
#include "runtime/text/chat.hpp"

namespace tandem::text {

// The tokenizer_config.json path for a model path (a directory or a file).
// Precondition (asserted): model_path is not empty.
std::filesystem::path tokenizer_config_path(const std::filesystem::path& model_path);

// Errors: invalid when auto-detecting and tokenizer_config.json exists but is not valid
// JSON or has a malformed chat_template (the message names the file). An explicit format
// never touches the file system.
Result<ChatFormat> chat_format_for(const config::ModelSection& model);

}  // namespace tandem::text
