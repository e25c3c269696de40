// The sim device's view of the served model's chat format (devices::SimMarkup): the token ids
// of its reasoning markers and of the tool-call markers it must never write.
#pragma once

#include "config/manifest.hpp"
#include "devices/device.hpp"
#include "runtime/base/result.hpp"
#include "runtime/text/chat.hpp"
#include "runtime/text/tokenizer.hpp"

namespace tandem::actors {

// Markers as the tokenizer encodes them (no bos):
//   minimax-m2: close "</think>" (the generation prompt opens <think>); banned
//               "<minimax:tool_call>", "</minimax:tool_call>", "<think>", and the turn
//               markers "]~!b[", "]~b]" (a model does not write them inside an answer);
//   chatml:     open "<think>", close "</think>"; banned "<tool_call>", "</tool_call>",
//               "<|im_start|>", "<|im_end|>";
//   plain:      nothing.
// Pure given the tokenizer.
devices::SimMarkup sim_markup_for(text::ChatFormat format, const text::Tokenizer& tokenizer);

// For an executor with device "sim": resolves [model] chat_format (auto reads the model's
// tokenizer_config.json), loads the model's tokenizer and calls sim_markup_for. Blocking file
// I/O: call at startup. Errors: the tokenizer's or chat format's (naming the file); invalid
// when `sim_params` sets reasoning_share and the format has no reasoning (the key would do
// nothing).
Result<devices::SimMarkup> load_sim_markup(const config::ModelSection& model,
                                           const devices::SimParams& sim_params);

}  // namespace tandem::actors
