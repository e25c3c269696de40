// Loaders for byte-level BPE files: HF tokenizer.json and GPT-2 encoder.json + vocab.bpe.
#include <nlohmann/json.hpp>

#include "runtime/base/assert.hpp"
#include "runtime/text/bpe_spec.hpp"
#include "runtime/text/bpe_tokenizer.hpp"

namespace tandem::text {
namespace {

using detail::AddedTokenSpec;
using detail::BpeSpec;
using detail::PreTokenizerStep;
using nlohmann::json;

Error unsupported(std::string_view source_name, const std::string& what) {
  return make_error(ErrorKind::unimplemented, std::string(source_name) + ": " + what);
}

Error malformed(std::string_view source_name, const std::string& what) {
  return make_error(ErrorKind::invalid, std::string(source_name) + ": " + what);
}

std::string type_of(const json& node) {
  return node.is_object() && node.contains("type") && node["type"].is_string()
             ? node["type"].get<std::string>()
             : std::string("(no type)");
}

bool flag(const json& node, const char* key, bool fallback) {
  return node.contains(key) && node[key].is_boolean() ? node[key].get<bool>() : fallback;
}

Status parse_normalizer(const json& node, BpeSpec& spec) {
  if (node.is_null()) return {};
  const std::string type = type_of(node);
  if (type == "NFC") {
    spec.nfc = true;
    return {};
  }
  if (type == "Sequence" && node.contains("normalizers") && node["normalizers"].is_array()) {
    for (const json& child : node["normalizers"]) {
      if (Status status = parse_normalizer(child, spec); !status) return status;
    }
    return {};
  }
  return unsupported(spec.source_name, "normalizer type '" + type +
                                           "' is not supported (only NFC and Sequence of NFC)");
}

Status parse_pre_tokenizer(const json& node, BpeSpec& spec) {
  if (node.is_null()) return {};
  const std::string type = type_of(node);
  if (type == "Sequence" && node.contains("pretokenizers") && node["pretokenizers"].is_array()) {
    for (const json& child : node["pretokenizers"]) {
      if (Status status = parse_pre_tokenizer(child, spec); !status) return status;
    }
    return {};
  }
  PreTokenizerStep step;
  if (type == "ByteLevel") {
    step.type = PreTokenizerStep::Type::byte_level;
    step.add_prefix_space = flag(node, "add_prefix_space", true);
    step.use_regex = flag(node, "use_regex", true);
  } else if (type == "Split") {
    const json& pattern = node.at("pattern");
    if (pattern.contains("Regex")) {
      step.pattern = pattern["Regex"].get<std::string>();
    } else if (pattern.contains("String")) {
      step.pattern = "\\Q" + pattern["String"].get<std::string>() + "\\E";
    } else {
      return malformed(spec.source_name,
                       "Split pre-tokenizer pattern has neither Regex nor String");
    }
    const std::string behavior = node.value("behavior", std::string("Isolated"));
    if (flag(node, "invert", false)) {
      return unsupported(spec.source_name, "Split pre-tokenizer with invert=true");
    }
    if (behavior == "Isolated") {
      step.type = PreTokenizerStep::Type::split_isolated;
    } else if (behavior == "Removed") {
      step.type = PreTokenizerStep::Type::split_removed;
    } else {
      return unsupported(spec.source_name, "Split pre-tokenizer behavior '" + behavior + "'");
    }
  } else {
    return unsupported(spec.source_name, "pre-tokenizer type '" + type + "' is not supported");
  }
  spec.pre_tokenizer.push_back(std::move(step));
  return {};
}

Status parse_model(const json& model, BpeSpec& spec) {
  if (!model.is_object()) return malformed(spec.source_name, "'model' is missing or not an object");
  const std::string type = model.contains("type") ? type_of(model) : std::string("BPE");
  if (type != "BPE") {
    return unsupported(spec.source_name,
                       "model type '" + type + "' is not supported (only byte-level BPE)");
  }
  if (flag(model, "byte_fallback", false)) {
    return unsupported(spec.source_name, "BPE with byte_fallback (SentencePiece-style BPE)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty()) {
      return unsupported(spec.source_name, std::string("BPE with ") + key);
    }
  }
  spec.ignore_merges = flag(model, "ignore_merges", false);
  const json& vocab = model.at("vocab");
  if (!vocab.is_object()) return malformed(spec.source_name, "model.vocab is not an object");
  spec.vocab.reserve(vocab.size());
  for (const auto& [text, id] : vocab.items()) {
    if (!id.is_number_integer()) return malformed(spec.source_name, "vocab id of '" + text + "'");
    spec.vocab.emplace_back(text, id.get<int32_t>());
  }
  const json& merges = model.at("merges");
  if (!merges.is_array()) return malformed(spec.source_name, "model.merges is not an array");
  spec.merges.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const json& merge = merges[rank];
    if (merge.is_array() && merge.size() == 2) {  // newer format: ["a", "b"]
      spec.merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
      continue;
    }
    const std::string line = merge.is_string() ? merge.get<std::string>() : std::string();
    const std::size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || line.find(' ', space + 1) != line.npos ||
        space + 1 == line.size()) {
      return malformed(spec.source_name, "merge " + std::to_string(rank) +
                                             " is not \"a b\" or "
                                             "[\"a\", \"b\"]: " +
                                             merge.dump());
    }
    spec.merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  return {};
}

Status parse_added_tokens(const json& added, BpeSpec& spec) {
  if (added.is_null()) return {};
  if (!added.is_array()) return malformed(spec.source_name, "added_tokens is not an array");
  for (const json& token : added) {
    AddedTokenSpec entry;
    entry.id = token.at("id").get<int32_t>();
    entry.content = token.at("content").get<std::string>();
    entry.special = flag(token, "special", false);
    entry.lstrip = flag(token, "lstrip", false);
    entry.rstrip = flag(token, "rstrip", false);
    spec.added_tokens.push_back(std::move(entry));
  }
  return {};
}

// bos_token / eos_token in tokenizer_config.json: a string, {"content": ...} or null.
std::optional<std::string> config_token(const json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const json& value = config[key];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  return std::nullopt;
}

Status parse_hf_spec(std::string_view tokenizer_json, std::optional<std::string_view> config_json,
                     BpeSpec& spec) {
  const json root = json::parse(tokenizer_json);
  if (!root.is_object()) return malformed(spec.source_name, "top level is not a JSON object");
  if (Status status = parse_model(root.contains("model") ? root["model"] : json(), spec); !status) {
    return status;
  }
  if (Status status = parse_normalizer(root.value("normalizer", json()), spec); !status) {
    return status;
  }
  if (Status status = parse_pre_tokenizer(root.value("pre_tokenizer", json()), spec); !status) {
    return status;
  }
  const bool byte_level = std::any_of(
      spec.pre_tokenizer.begin(), spec.pre_tokenizer.end(),
      [](const PreTokenizerStep& step) { return step.type == PreTokenizerStep::Type::byte_level; });
  if (!byte_level) return unsupported(spec.source_name, "BPE without a ByteLevel pre-tokenizer");
  const json decoder = root.value("decoder", json());
  if (!decoder.is_null() && type_of(decoder) != "ByteLevel") {
    return unsupported(spec.source_name,
                       "decoder type '" + type_of(decoder) + "' is not supported (only ByteLevel)");
  }
  if (Status status = parse_added_tokens(root.value("added_tokens", json()), spec); !status) {
    return status;
  }
  if (config_json) {
    const json config = json::parse(*config_json);
    spec.bos_token = config_token(config, "bos_token");
    spec.eos_token = config_token(config, "eos_token");
  }
  return {};
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> parse_hf_tokenizer(std::string_view tokenizer_json,
                                                      std::string_view source_name,
                                                      std::optional<std::string_view> config_json) {
  BpeSpec spec;
  spec.kind = TokenizerKind::hf_byte_level_bpe;
  spec.source_name = std::string(source_name);
  try {
    if (Status status = parse_hf_spec(tokenizer_json, config_json, spec); !status) {
      return status.error();
    }
  } catch (const json::exception& e) {
    return malformed(source_name, std::string("malformed JSON: ") + e.what());
  }
  return detail::build_bpe_tokenizer(std::move(spec));
}

Result<std::unique_ptr<Tokenizer>> parse_gpt2_tokenizer(std::string_view encoder_json,
                                                        std::string_view vocab_bpe,
                                                        std::string_view source_name) {
  BpeSpec spec;
  spec.kind = TokenizerKind::gpt2_bpe;
  spec.source_name = std::string(source_name);
  try {
    const json encoder = json::parse(encoder_json);
    if (!encoder.is_object()) return malformed(source_name, "encoder.json is not a JSON object");
    for (const auto& [text, id] : encoder.items()) spec.vocab.emplace_back(text, id.get<int32_t>());
  } catch (const json::exception& e) {
    return malformed(source_name, std::string("encoder.json: malformed JSON: ") + e.what());
  }
  std::size_t line_start = 0;
  std::size_t line_number = 0;
  while (line_start < vocab_bpe.size()) {
    std::size_t line_end = vocab_bpe.find('\n', line_start);
    if (line_end == std::string_view::npos) line_end = vocab_bpe.size();
    const std::string_view line = vocab_bpe.substr(line_start, line_end - line_start);
    ++line_number;
    line_start = line_end + 1;
    if (line.empty() || line.starts_with("#version")) continue;
    const std::size_t space = line.find(' ');
    if (space == 0 || space == line.npos || line.find(' ', space + 1) != line.npos) {
      return malformed(source_name, "vocab.bpe line " + std::to_string(line_number) +
                                        " is not two tokens separated by one space");
    }
    spec.merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  spec.pre_tokenizer.push_back(
      PreTokenizerStep{PreTokenizerStep::Type::byte_level, "", false, true});
  constexpr std::string_view end_of_text = "<|endoftext|>";
  for (const auto& [text, id] : spec.vocab) {
    if (text == end_of_text) spec.added_tokens.push_back({id, text, true, false, false});
  }
  spec.bos_token = std::string(end_of_text);
  spec.eos_token = std::string(end_of_text);
  RT_ASSERT(spec.kind == TokenizerKind::gpt2_bpe, "kind set above");
  return detail::build_bpe_tokenizer(std::move(spec));
}

}  // namespace tandem::text
