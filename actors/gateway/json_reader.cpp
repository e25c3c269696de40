#include "actors/gateway/json_reader.hpp"

#include <cstdint>

#include <cmath>
#include <cstdio>

namespace tandem::gateway {

ApiError invalid_request(std::string param, std::string message) {
  return ApiError{400, "invalid_request_error", std::move(param), "", std::move(message)};
}

ApiError unsupported(std::string param, std::string message) {
  return ApiError{400, "invalid_request_error", std::move(param), "unsupported_parameter",
                  std::move(message)};
}

std::string path_index(std::string_view base, size_t index) {
  return std::string(base) + "[" + std::to_string(index) + "]";
}

std::string path_key(std::string_view base, std::string_view key) {
  if (base.empty()) return std::string(key);
  return std::string(base) + "." + std::string(key);
}

std::string json_type_name(const json& value) {
  if (value.is_boolean()) return "boolean";
  if (value.is_number()) return "number";
  return value.type_name();  // "null", "object", "array", "string"
}

std::string number_text(double value) {
  if (std::isfinite(value) && value == std::floor(value) && std::fabs(value) < 1e15) {
    return std::to_string(static_cast<int64_t>(value));
  }
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

const ApiError& FieldReader::error() const {
  RT_ASSERT(error_.has_value(), "FieldReader::error() without an error");
  return *error_;
}

void FieldReader::fail(ApiError error) {
  RT_ASSERT(!error.message.empty(), "an ApiError needs a message");
  if (!error_) error_ = std::move(error);
}

void FieldReader::fail_invalid(std::string param, std::string message) {
  fail(invalid_request(std::move(param), std::move(message)));
}

namespace {
// The value at obj[key], or nullptr when obj is not an object, the key is absent or null.
const json* lookup(const json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}
}  // namespace

#define TANDEM_READ_PRELUDE(kind_text, test)                                  \
  if (failed()) return {};                                                    \
  const json* v = lookup(obj, key);                                           \
  if (v == nullptr) return {};                                                \
  if (!(test)) {                                                              \
    std::string p = path_key(base, key);                                      \
    fail_invalid(p, p + " must be " kind_text ", got " + json_type_name(*v)); \
    return {};                                                                \
  }

std::optional<std::string> FieldReader::string(const json& obj, std::string_view key,
                                               std::string_view base) {
  TANDEM_READ_PRELUDE("a string", v->is_string())
  return v->get<std::string>();
}

std::optional<bool> FieldReader::boolean(const json& obj, std::string_view key,
                                         std::string_view base) {
  TANDEM_READ_PRELUDE("a boolean", v->is_boolean())
  return v->get<bool>();
}

std::optional<double> FieldReader::number(const json& obj, std::string_view key,
                                          std::string_view base) {
  TANDEM_READ_PRELUDE("a number", v->is_number())
  return v->get<double>();
}

std::optional<int64_t> FieldReader::integer(const json& obj, std::string_view key,
                                            std::string_view base) {
  TANDEM_READ_PRELUDE("an integer", v->is_number())
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)) {
    // Read as int64 it would wrap negative ("must be >= 1, got -1" for 2^64-1).
    std::string p = path_key(base, key);
    fail_invalid(p, p + " must be an integer in [-2^63, 2^63), got " +
                        std::to_string(v->get<uint64_t>()));
    return {};
  }
  if (v->is_number_integer()) return v->get<int64_t>();
  double d = v->get<double>();
  if (d != std::floor(d) || std::fabs(d) > 9.0e18) {
    std::string p = path_key(base, key);
    fail_invalid(p, p + " must be an integer, got " + number_text(d));
    return {};
  }
  return static_cast<int64_t>(d);
}

const json* FieldReader::object(const json& obj, std::string_view key, std::string_view base) {
  TANDEM_READ_PRELUDE("an object", v->is_object())
  return v;
}

const json* FieldReader::array(const json& obj, std::string_view key, std::string_view base) {
  TANDEM_READ_PRELUDE("an array", v->is_array())
  return v;
}

#undef TANDEM_READ_PRELUDE

const json* FieldReader::required(const json& obj, std::string_view key, std::string_view base) {
  if (failed()) return nullptr;
  const json* v = lookup(obj, key);
  if (v == nullptr) {
    std::string p = path_key(base, key);
    fail_invalid(p, p + " is required");
  }
  return v;
}

std::optional<double> FieldReader::number_in(const json& obj, std::string_view key,
                                             std::string_view base, double lo, double hi) {
  std::optional<double> v = number(obj, key, base);
  if (!v) return v;
  if (!(*v >= lo && *v <= hi)) {
    std::string p = path_key(base, key);
    fail_invalid(p, p + " must be in [" + number_text(lo) + ", " + number_text(hi) + "], got " +
                        number_text(*v));
    return {};
  }
  return v;
}

}  // namespace tandem::gateway
