// Fuzz target: the gateway's request path from raw body bytes (STYLE.md §8, issue 12). For each
// API the body goes through the byte checks (json_text) and the parser; an error must render
// as a valid JSON error body in that API's shape, and a parse must never throw or crash.
//   libFuzzer: clang++ -std=c++20 -fsanitize=fuzzer,address -I. -I build ... (docs/STATUS.md)
//   here: build/tests/fuzz_gateway_request_replay tests/fuzz/corpus/gateway_request (a test)
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "actors/gateway/api_request.hpp"
#include "actors/gateway/json_text.hpp"

namespace {

void require(bool condition) {
  if (!condition) std::abort();  // a finding: the fuzzer (or the replay test) reports it
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::gateway;
  std::string_view body(reinterpret_cast<const char*>(data), size);
  (void)check_json_text(body);
  for (ApiKind kind : {ApiKind::chat_completions, ApiKind::completions, ApiKind::responses,
                       ApiKind::messages, ApiKind::count_tokens}) {
    ApiResult<GenerateSpec> spec = parse_request(kind, body);
    if (spec.ok()) {
      require(spec.value().api == kind);
      continue;
    }
    require(!spec.error().message.empty());
    auto rendered = nlohmann::json::parse(render_error_body(kind, spec.error()), nullptr, false);
    require(rendered.is_object());
    const bool anthropic = kind == ApiKind::messages || kind == ApiKind::count_tokens;
    require(anthropic ? rendered.value("type", "") == "error" : rendered.contains("error"));
  }
  return 0;
}
