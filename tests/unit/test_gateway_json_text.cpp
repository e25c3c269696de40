// Bodies that once killed a gateway preparer (an nlohmann exception escaped its handler):
// numbers beyond a double and ill-formed UTF-8. Each must be a 400 naming the problem and
// where it is, for every API, without an exception; valid non-ASCII text is still accepted.
#include <doctest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "actors/gateway/api_request.hpp"
#include "actors/gateway/json_text.hpp"

using namespace tandem::gateway;

namespace {

const std::vector<ApiKind> all_kinds = {ApiKind::chat_completions, ApiKind::completions,
                                        ApiKind::responses, ApiKind::messages,
                                        ApiKind::count_tokens};

// A valid body of `kind` with `extra` (`"key":value,`) spliced in first and `text` as its
// prompt (raw bytes inside a JSON string).
std::string body_of(ApiKind kind, const std::string& extra, const std::string& text = "hi") {
  switch (kind) {
    case ApiKind::chat_completions:
      return "{" + extra + R"("model":"m","messages":[{"role":"user","content":")" + text +
             "\"}]}";
    case ApiKind::completions:
      return "{" + extra + R"("model":"m","prompt":")" + text + "\"}";
    case ApiKind::responses:
      return "{" + extra + R"("model":"m","input":")" + text + "\"}";
    case ApiKind::messages:
    case ApiKind::count_tokens:
      return "{" + extra + R"("model":"m","max_tokens":10,"messages":[{"role":"user",)" +
             R"("content":")" + text + "\"}]}";
  }
  return "";
}

void check_400(ApiKind kind, const std::string& body, const std::string& part) {
  INFO("kind " << static_cast<int>(kind) << ", body: " << printable(body));
  ApiResult<GenerateSpec> r = parse_request(kind, body);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().http_status == 400);
  CHECK(r.error().type == "invalid_request_error");
  CHECK_MESSAGE(r.error().message.find(part) != std::string::npos, r.error().message);
  // The error body renders (valid UTF-8: no exception) in the API's shape.
  std::string rendered = render_error_body(kind, r.error());
  CHECK(nlohmann::json::parse(rendered, nullptr, false).is_object());
}

}  // namespace

TEST_CASE("json_text: numbers beyond a double are 400 in any field, with line and column") {
  for (ApiKind kind : all_kinds) {
    for (std::string extra : {R"("temperature":1e400,)", R"("max_tokens":1e400,)",
                              R"("top_p":-1e309,)", R"("seed":1E+999,)",
                              R"("metadata":{"x":[1,2,1e400]},)"}) {
      check_400(kind, body_of(kind, extra), "number out of range at line 1, column ");
    }
    // A 400-digit integer overflows a double too.
    check_400(kind, body_of(kind, "\"seed\":1" + std::string(400, '0') + ","),
              "number out of range");
  }
  auto where = check_json_text(R"({"temperature":1e400})");
  REQUIRE(where.has_value());
  CHECK(*where == "number out of range at line 1, column 16: 1e400 (beyond the range of a "
                  "double)");
  where = check_json_text("{\n  \"a\": 1,\n  \"b\": -2e400\n}");
  REQUIRE(where.has_value());
  CHECK(where->find("line 3, column 8: -2e400") != std::string::npos);
  // In range, tiny (underflows to 0) and numbers inside strings are fine.
  CHECK_FALSE(check_json_text(R"({"a":1.7e308,"b":-1e-400,"c":"1e400","d":[0,-0.5,2E3]})"));
}

TEST_CASE("json_text: ill-formed UTF-8 is 400 naming where; valid non-ASCII is accepted") {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"\xC0\xAF", "0xC0"},          // overlong '/'
      {"\xE0\x80\xAF", "0xE0"},      // overlong, 3 bytes
      {"\xF0\x80\x80\xAF", "0xF0"},  // overlong, 4 bytes
      {"\xED\xA0\x80", "0xED"},      // a UTF-16 surrogate encoded as UTF-8
      {"\xF4\x90\x80\x80", "0xF4"},  // above U+10FFFF
      {"\xFF", "0xFF"},
      {"\x80", "0x80"},              // a stray continuation byte
      {"ab\xC3", "0xC3"},            // truncated before the closing quote
      {"\xE2\x82", "0xE2"},
  };
  for (ApiKind kind : all_kinds) {
    for (const auto& [bytes, byte] : bad) {
      check_400(kind, body_of(kind, "", bytes), "invalid UTF-8 in string at line 1, column ");
      check_400(kind, body_of(kind, "", bytes), "(byte " + byte + ")");
    }
    // In a key, in the model name, and outside any string.
    check_400(kind, body_of(kind, "\"x\xC0\xAF\":1,"), "invalid UTF-8 in string");
    check_400(kind, "{\"model\":\"m\xC0\",}", "invalid UTF-8 in string");
    check_400(kind, "{\xC0\xAF}", "invalid UTF-8 at line 1, column 2");
    // Valid non-ASCII: 2, 3 and 4 byte sequences, and escapes of them.
    std::string fine = "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF \\u00e9 "
                       "\\ud83d\\ude00";
    ApiResult<GenerateSpec> ok = parse_request(kind, body_of(kind, "", fine));
    CHECK_MESSAGE(ok.ok(), (ok.ok() ? "" : ok.error().message));
  }
  auto where = check_json_text("{\"model\":\"m\",\n\"x\":\"ab\xC0\xAF\"}");
  REQUIRE(where.has_value());
  CHECK(*where == "invalid UTF-8 in string at line 2, column 8 (byte 0xC0)");
}

TEST_CASE("json_text: lone surrogates in \\u escapes are 400 from the parser") {
  for (ApiKind kind : all_kinds) {
    for (std::string text : {"\\ud800", "\\udc00", "a\\ud83dz", "\\ud83d\\u0041"}) {
      check_400(kind, body_of(kind, "", text), "not valid JSON");
      check_400(kind, body_of(kind, "", text), "surrogate");
    }
  }
}

TEST_CASE("json_text: a parse error quoting raw bytes stays valid UTF-8 in the message") {
  // Non-ASCII outside a string: the parser quotes the one byte it read (0xC3, alone not
  // UTF-8), which once made rendering the error body throw.
  std::string body = "{\"model\":\"m\",\xC3\xA9}";
  ApiResult<GenerateSpec> r = parse_request(ApiKind::chat_completions, body);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("not valid JSON") != std::string::npos);
  CHECK_MESSAGE(r.error().message.find("\\xC3") != std::string::npos, r.error().message);
  std::string rendered = render_error_body(ApiKind::chat_completions, r.error());
  CHECK(nlohmann::json::parse(rendered, nullptr, false).is_object());
  CHECK(printable("a\xC0z\n") == "a\\xC0z\\x0A");
}

TEST_CASE("json_text: an error message with invalid UTF-8 still renders (never throws)") {
  ApiError e = invalid_request("model", "model 'x\xC0' does not exist");
  for (ApiKind kind : all_kinds) {
    std::string rendered = render_error_body(kind, e);
    CHECK(nlohmann::json::parse(rendered, nullptr, false).is_object());
  }
}
