// tandem/gateway (internal): typed, path-aware reads of request JSON.
//
// A FieldReader remembers the FIRST error (an ApiError naming the field's path) and from then
// on every read returns an empty value, so a parser can read a whole object and check
// failed() once per step without exceptions. Keys that are absent or JSON null read as unset.
// Lifetimes: returned pointers borrow from the json passed in.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "actors/gateway/api_types.hpp"

namespace tandem::gateway {

using json = nlohmann::ordered_json;

// "messages" + 2 -> "messages[2]"; "messages[2]" + "content" -> "messages[2].content".
std::string path_index(std::string_view base, size_t index);
std::string path_key(std::string_view base, std::string_view key);

class FieldReader {
 public:
  bool failed() const { return error_.has_value(); }
  const ApiError& error() const;
  // Records `error` unless one is already recorded.
  void fail(ApiError error);
  void fail_invalid(std::string param, std::string message);

  // Each reads obj[key] at path `base`.key. Absent/null -> nullopt (or nullptr).
  // Wrong type -> records "<path> must be <kind>, got <json type>".
  std::optional<std::string> string(const json& obj, std::string_view key, std::string_view base);
  std::optional<bool> boolean(const json& obj, std::string_view key, std::string_view base);
  std::optional<double> number(const json& obj, std::string_view key, std::string_view base);
  std::optional<int64_t> integer(const json& obj, std::string_view key, std::string_view base);
  const json* object(const json& obj, std::string_view key, std::string_view base);
  const json* array(const json& obj, std::string_view key, std::string_view base);
  // Present and not null: returns the value, else records "<path> is required".
  const json* required(const json& obj, std::string_view key, std::string_view base);

  // Number in [lo, hi]; message "<path> must be in [lo, hi], got v".
  std::optional<double> number_in(const json& obj, std::string_view key, std::string_view base,
                                  double lo, double hi);

 private:
  std::optional<ApiError> error_;
};

// The JSON type name used in messages ("string", "number", "object", ...).
std::string json_type_name(const json& value);
// A short number text for messages: 2, 0.5, -1.
std::string number_text(double value);

}  // namespace tandem::gateway
