// tandem/gateway (internal): pieces shared by the request parsers of api_request_*.cpp.
// All of them record the first error in the FieldReader and return early once it failed.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "actors/gateway/api_types.hpp"
#include "actors/gateway/json_reader.hpp"

namespace tandem::gateway {

// Parses the body; not JSON or not an object -> error (param empty). nullopt on error.
std::optional<json> parse_body(FieldReader& reader, std::string_view body);

// model: required string.
void read_model(FieldReader& reader, const json& root, GenerateSpec& spec);
// temperature (max `temperature_max`), top_p, top_k, min_p, penalties, seed; n must be 1.
void read_sampling(FieldReader& reader, const json& root, double temperature_max,
                   SamplingSpec& sampling);
// Chat-style logprobs (boolean) and top_logprobs ([0, 20], only with logprobs).
void read_logprobs_chat(FieldReader& reader, const json& root, SamplingSpec& sampling);
// A string or an array of strings at root[key] into `stop`.
void read_stop(FieldReader& reader, const json& root, std::string_view key, SamplingSpec& sampling);
// One max-tokens field: integer >= 1; a second field that disagrees is contradictory.
void read_max_tokens(FieldReader& reader, const json& root, std::string_view key,
                     GenerateSpec& spec);
// stream, stream_options.include_usage (only with stream), cache_salt.
void read_stream_and_salt(FieldReader& reader, const json& root, GenerateSpec& spec);

// A function tool in the neutral shape {"type":"function","function":{name,description,
// parameters}}; `path` names the tool for errors.
std::string neutral_tool_json(FieldReader& reader, const json& name, const json* description,
                              const json* parameters, const std::string& path);
// tool_choice "auto"/"none"/"required" or a named tool (already decoded by the caller);
// checks a named tool exists in spec.conversation.tools_json.
void check_named_tool(FieldReader& reader, const GenerateSpec& spec, const std::string& path);

// OpenAI tool_choice (Chat and Responses shapes); requires tools for required/named.
void read_tool_choice_openai(FieldReader& reader, const json& root, GenerateSpec& spec);

// Text of a content given as a string or an array of text parts whose type is one of
// `text_types` ("text", "input_text", ...); other part types -> unsupported naming the part.
std::string read_text_content(FieldReader& reader, const json& content, const std::string& path,
                              std::initializer_list<std::string_view> text_types);

// A field the API defines that Tandem accepts and ignores, with the type the API gives it.
enum class JsonKind { string, boolean, integer, number, object, array };
struct TypedField {
  std::string_view key;
  JsonKind kind;
};
// Each of `fields` present (not null) in root must have its type: a wrong one is a 400
// naming the field ("user must be a string, got number").
void check_ignored_fields(FieldReader& reader, const json& root,
                          std::initializer_list<TypedField> fields);

// Fills tool messages' `name` from the assistant tool call with the same id (when found).
void fill_tool_names(Conversation& conversation);

}  // namespace tandem::gateway
