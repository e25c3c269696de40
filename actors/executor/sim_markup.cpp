#include "actors/executor/sim_markup.hpp"

#include "runtime/text/model_chat.hpp"

namespace tandem::actors {

devices::SimMarkup sim_markup_for(text::ChatFormat format, const text::Tokenizer& tokenizer) {
  devices::SimMarkup markup;
  auto ids = [&tokenizer](std::string_view marker) {
    std::vector<int32_t> out = tokenizer.encode(marker, false);
    RT_ASSERT(!out.empty(), "a marker encodes to no token", marker);
    return out;
  };
  switch (format) {
    case text::ChatFormat::plain:
      break;
    case text::ChatFormat::minimax_m2:
      markup.reasoning_close = ids("</think>");
      markup.banned = {ids("<minimax:tool_call>"), ids("</minimax:tool_call>"), ids("<think>"),
                       ids("]~!b["), ids("]~b]")};
      break;
    case text::ChatFormat::chatml:
      markup.reasoning_open = ids("<think>");
      markup.reasoning_close = ids("</think>");
      markup.banned = {ids("<tool_call>"), ids("</tool_call>"), ids("<|im_start|>"),
                       ids("<|im_end|>")};
      break;
  }
  RT_ASSERT(markup.reasoning_open.empty() || !markup.reasoning_close.empty(), "markers");
  RT_ASSERT((format == text::ChatFormat::plain) == markup.reasoning_close.empty(), "reasoning");
  return markup;
}

Result<devices::SimMarkup> load_sim_markup(const config::ModelSection& model,
                                           const devices::SimParams& sim_params) {
  auto format = text::chat_format_for(model);
  if (!format) return format.error();
  if (*format == text::ChatFormat::plain) {
    if (sim_params.count("reasoning_share") != 0) {
      return make_error(ErrorKind::invalid,
                        "sim: reasoning_share applies to a chat format with reasoning (chatml, "
                        "minimax-m2); this model's chat format is plain ([model] chat_format)");
    }
    return devices::SimMarkup{};
  }
  auto tokenizer = text::load_tokenizer(model.path);
  if (!tokenizer) return tokenizer.error();
  return sim_markup_for(*format, **tokenizer);
}

}  // namespace tandem::actors
