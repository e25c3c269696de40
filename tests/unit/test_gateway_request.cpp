// Request parsing and validation for the four APIs; error bodies; the context-length check.
#include <doctest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "actors/gateway/api_request.hpp"

using namespace tandem::gateway;
using json = nlohmann::ordered_json;  // as tandem::gateway::json: key order as sent

namespace {

struct BadCase {
  ApiKind kind;
  std::string body;
  std::string param;
  std::string message_part;  // a piece of the message that must appear
  std::string code = "";
};

const ApiKind chat = ApiKind::chat_completions;
const ApiKind completions = ApiKind::completions;
const ApiKind responses = ApiKind::responses;
const ApiKind messages = ApiKind::messages;

const std::string M = R"("model":"m",)";
const std::string U = R"("messages":[{"role":"user","content":"hi"}])";
const std::string T =
    R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])";
const std::string AU = R"("model":"m","max_tokens":100,)";

std::vector<BadCase> bad_cases() {
  return {
      // ---- chat completions ----
      {chat, "{not json", "", "not valid JSON"},
      // Malformed JSON says where: line, column and what was expected.
      {chat, "{\"model\":\"m\",\n \"messages\": [", "",
       "request body is not valid JSON: parse error at line 2, column 15"},
      {chat, "[1,2]", "", "must be a JSON object"},
      {chat, "{" + U + "}", "model", "model is required"},
      {chat, "{" + M + R"("messages":[]})", "messages", "at least one"},
      {chat, "{" + M + R"("messages":"hi"})", "messages", "must be an array"},
      {chat, "{" + M + R"("messages":[{"role":"wizard","content":"x"}]})", "messages[0].role",
       "got 'wizard'"},
      {chat, "{" + M + R"("messages":[{"role":"user","content":5}]})", "messages[0].content",
       "must be a string or an array"},
      {chat, "{" + M + R"("messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
       "messages[0].content[0].type", "not supported", "unsupported_parameter"},
      {chat, "{" + M + R"("messages":[{"role":"user"}]})", "messages[0].content", "required"},
      {chat, "{" + M + R"("messages":[{"role":"tool","content":"r"}]})", "messages[0].tool_call_id",
       "required"},
      {chat,
       "{" + M +
           R"("messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function",)"
           R"("function":{"name":"f","arguments":"[1]"}}]}]})",
       "messages[0].tool_calls[0].function.arguments", "JSON object"},
      {chat, "{" + M + U + R"(,"temperature":-1})", "temperature",
       "temperature must be in [0, 2], got -1"},
      {chat, "{" + M + U + R"(,"temperature":"hot"})", "temperature", "must be a number"},
      {chat, "{" + M + U + R"(,"top_p":0})", "top_p", "(0, 1]"},
      {chat, "{" + M + U + R"(,"top_k":-5})", "top_k", "got -5"},
      {chat, "{" + M + U + R"(,"min_p":1.5})", "min_p", "[0, 1]"},
      {chat, "{" + M + U + R"(,"presence_penalty":3})", "presence_penalty", "[-2, 2]"},
      {chat, "{" + M + U + R"(,"repetition_penalty":0})", "repetition_penalty", "> 0"},
      {chat, "{" + M + U + R"(,"n":2})", "n", "n must be 1", "unsupported_parameter"},
      {chat, "{" + M + U + R"(,"max_tokens":0})", "max_tokens", ">= 1, got 0"},
      {chat, "{" + M + U + R"(,"max_tokens":10,"max_completion_tokens":20})", "max_tokens",
       "contradicts max_completion_tokens"},
      {chat, "{" + M + U + R"(,"seed":1.5})", "seed", "must be an integer"},
      {chat, "{" + M + U + R"(,"stop":["a",""]})", "stop[1]", "non-empty"},
      {chat, "{" + M + U + R"(,"top_logprobs":3})", "top_logprobs", "requires logprobs"},
      {chat, "{" + M + U + R"(,"stream_options":{"include_usage":true}})", "stream_options",
       "only allowed when stream"},
      {chat, "{" + M + U + R"(,"stream":"yes"})", "stream", "must be a boolean"},
      {chat, "{" + M + U + R"(,"tools":[{"type":"retrieval"}]})", "tools[0].type",
       "must be 'function'", "unsupported_parameter"},
      {chat, "{" + M + U + R"(,"tools":[{"type":"function","function":{"description":"x"}}]})",
       "tools[0].function.name", "required"},
      {chat,
       "{" + M + U + R"(,"tools":[{"type":"function","function":{"name":"f","parameters":1}}]})",
       "tools[0].function.parameters", "JSON Schema object"},
      {chat, "{" + M + U + R"(,"tool_choice":"required"})", "tool_choice", "requires tools"},
      {chat,
       "{" + M + U + "," + T + R"(,"tool_choice":{"type":"function","function":{"name":"g"}}})",
       "tool_choice", "'g'"},
      {chat, "{" + M + U + "," + T + R"(,"tool_choice":"sometimes"})", "tool_choice",
       "'sometimes'"},
      // ---- completions ----
      {completions, "{" + M + R"("max_tokens":5})", "prompt", "required"},
      {completions, "{" + M + R"("prompt":""})", "prompt", "must not be empty"},
      {completions, "{" + M + R"("prompt":["a","b"]})", "prompt", "batches",
       "unsupported_parameter"},
      {completions, "{" + M + R"("prompt":[1,-2,3]})", "prompt[1]", "token id"},
      {completions, "{" + M + R"("prompt":{"text":"x"}})", "prompt", "must be a string"},
      {completions, "{" + M + R"("prompt":"x","best_of":3})", "best_of", "must be 1",
       "unsupported_parameter"},
      {completions, "{" + M + R"("prompt":"x","logprobs":9})", "logprobs", "[0, 5]"},
      {completions, "{" + M + R"("prompt":"x","suffix":"y"})", "suffix", "not supported",
       "unsupported_parameter"},
      // ---- responses ----
      {responses, "{" + M + R"("input":"hi","previous_response_id":"resp_1"})",
       "previous_response_id", "not supported", "unsupported_parameter"},
      {responses, "{" + M + R"("instructions":"x"})", "input", "required"},
      {responses, "{" + M + R"("input":7})", "input", "must be a string or an array"},
      {responses, "{" + M + R"("input":[{"type":"item_reference","id":"x"}]})", "input[0].type",
       "not supported", "unsupported_parameter"},
      {responses, "{" + M + R"("input":[{"type":"function_call","name":"f","arguments":"{}"}]})",
       "input[0].call_id", "required"},
      {responses,
       "{" + M + R"("input":[{"type":"function_call","call_id":"c","name":"f","arguments":"x"}]})",
       "input[0].arguments", "JSON object"},
      {responses, "{" + M + R"("input":[{"type":"function_call_output","call_id":"c"}]})",
       "input[0].output", "required"},
      {responses, "{" + M + R"("input":[{"role":"user","content":[{"type":"input_image"}]}]})",
       "input[0].content[0].type", "not supported", "unsupported_parameter"},
      {responses, "{" + M + R"("input":[{"role":"critic","content":"x"}]})", "input[0].role",
       "'critic'"},
      {responses, "{" + M + R"("input":"hi","tools":[{"type":"function"}]})", "tools[0].name",
       "required"},
      {responses, "{" + M + R"("input":"hi","max_output_tokens":-3})", "max_output_tokens", ">= 1"},
      {responses, "{" + M + R"("input":"hi","reasoning":"high"})", "reasoning",
       "must be an object"},
      // ---- anthropic messages ----
      {messages, "{" + M + U + "}", "max_tokens", "max_tokens is required"},
      {messages, "{" + AU + R"("messages":[{"role":"tool","content":"x"}]})", "messages[0].role",
       "'user', 'assistant' or 'system'"},
      {chat, "{" + M + U + R"(,"max_tokens":18446744073709551615})", "max_tokens",
       "in [-2^63, 2^63), got 18446744073709551615"},
      {messages, "{" + AU + R"("messages":[{"role":"user","content":[{"type":"image"}]}]})",
       "messages[0].content[0].type", "not supported", "unsupported_parameter"},
      {messages,
       "{" + AU +
           R"("messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f",)"
           R"("input":"x"}]}]})",
       "messages[0].content[0].input", "must be an object"},
      {messages, "{" + AU + R"("messages":[{"role":"user","content":[{"type":"tool_result"}]}]})",
       "messages[0].content[0].tool_use_id", "required"},
      {messages,
       "{" + AU + R"("messages":[{"role":"user","content":[{"type":"tool_use","id":"t"}]}]})",
       "messages[0].content[0].type", "not allowed in a user message"},
      {messages, "{" + AU + U + R"(,"system":[{"type":"image"}]})", "system[0].type",
       "not supported", "unsupported_parameter"},
      {messages, "{" + AU + U + R"(,"tools":[{"name":"f"}]})", "tools[0].input_schema", "required"},
      {messages, "{" + AU + U + R"(,"temperature":1.5})", "temperature", "[0, 1], got 1.5"},
      {messages, "{" + AU + U + R"(,"stop_sequences":"END"})", "stop_sequences",
       "array of strings"},
      {messages, "{" + AU + U + R"(,"thinking":{"type":"enabled","budget_tokens":10}})",
       "thinking.budget_tokens", ">= 1024"},
      {messages, "{" + AU + U + R"(,"thinking":{"type":"enabled","budget_tokens":2000}})",
       "thinking.budget_tokens", "less than max_tokens"},
      {messages, "{" + AU + U + R"(,"tool_choice":{"type":"any"}})", "tool_choice",
       "requires tools"},
      {messages, "{" + AU + U + R"(,"tool_choice":{"type":"sometimes"}})", "tool_choice.type",
       "'sometimes'"},
      // ---- fields accepted and ignored are still type-checked (issue 12) ----
      {chat, "{" + M + U + R"(,"user":5})", "user", "user must be a string, got number"},
      {chat, "{" + M + U + R"(,"metadata":"x"})", "metadata", "metadata must be an object"},
      {chat, "{" + M + U + R"(,"parallel_tool_calls":"yes"})", "parallel_tool_calls",
       "must be a boolean, got string"},
      {chat, "{" + M + U + R"(,"store":1})", "store", "must be a boolean"},
      {chat, "{" + M + U + R"(,"seed":1.5})", "seed", "must be an integer, got 1.5"},
      {chat, "{" + M + U + R"(,"seed":"7"})", "seed", "must be an integer, got string"},
      {chat, "{" + M + U + R"(,"speculative":"off"})", "speculative",
       "must be a boolean, got string"},
      {chat, "{" + M + U + R"(,"service_tier":1})", "service_tier", "must be a string"},
      {chat, "{" + M + U + R"(,"prompt_cache_key":[]})", "prompt_cache_key", "must be a string"},
      {chat, "{" + M + U + R"(,"response_format":"json"})", "response_format",
       "must be an object"},
      {chat, "{" + M + U + R"(,"logit_bias":[1]})", "logit_bias", "must be an object"},
      {completions, R"({"model":"m","prompt":"x","user":{}})", "user", "must be a string"},
      {responses, R"({"model":"m","input":"x","user":1})", "user", "must be a string"},
      {responses, R"({"model":"m","input":"x","metadata":[]})", "metadata", "must be an object"},
      {responses, R"({"model":"m","input":"x","parallel_tool_calls":0})", "parallel_tool_calls",
       "must be a boolean"},
      {responses, R"({"model":"m","input":"x","store":"false"})", "store", "must be a boolean"},
      {responses, R"({"model":"m","input":"x","truncation":true})", "truncation",
       "must be a string"},
      {responses, R"({"model":"m","input":"x","max_tool_calls":2.5})", "max_tool_calls",
       "must be an integer"},
      {responses, R"({"model":"m","input":"x","service_tier":5})", "service_tier",
       "must be a string"},
      {messages, "{" + AU + U + R"(,"metadata":"x"})", "metadata", "must be an object"},
      {messages, "{" + AU + U + R"(,"metadata":{"user_id":5}})", "metadata.user_id",
       "must be a string"},
      {messages, "{" + AU + U + R"(,"top_k":1.5})", "top_k", "must be an integer"},
      {messages, "{" + AU + U + R"(,"top_k":"5"})", "top_k", "must be an integer"},
      {messages, "{" + AU + U + R"(,"service_tier":1})", "service_tier", "must be a string"},
      // ---- malformed Anthropic tools are 400s, never dropped ----
      {messages, "{" + AU + U + R"(,"tools":{"name":"f"}})", "tools", "must be an array"},
      {messages, "{" + AU + U + R"(,"tools":[{"input_schema":{"type":"object"}}]})",
       "tools[0].name", "required"},
      {messages, "{" + AU + U + R"(,"tools":[{"name":"f","input_schema":"object"}]})",
       "tools[0].input_schema", "must be an object"},
      {messages, "{" + AU + U + R"(,"tools":[{"name":5,"input_schema":{}}]})", "tools[0].name",
       "must be a string"},
      {messages, "{" + AU + U + R"(,"tools":["f"]})", "tools[0]", "must be an object"},
      // An OpenAI-shaped tool sent to /v1/messages is a mistake, not a server tool.
      {messages,
       "{" + AU + U +
           R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{}}}]})",
       "tools[0].name", "required"},
      {messages, "{" + AU + U + R"(,"tools":[{"type":"function","name":"f"}]})",
       "tools[0].type", "must be 'custom' or a server tool type"},
      {messages, "{" + AU + U + R"(,"tools":[{"type":"web_search_20250305"}]})",
       "tools[0].name", "required"},
  };
}

}  // namespace

TEST_CASE("invalid requests: 400 invalid_request_error naming the field, for every API") {
  std::vector<BadCase> cases = bad_cases();
  CHECK(cases.size() >= 25);
  for (const BadCase& c : cases) {
    INFO("body: " << c.body);
    ApiResult<GenerateSpec> r = parse_request(c.kind, c.body);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().http_status == 400);
    CHECK(r.error().type == "invalid_request_error");
    CHECK(r.error().param == c.param);
    CHECK(r.error().code == c.code);
    CHECK(r.error().message.find(c.message_part) != std::string::npos);
  }
}

TEST_CASE("ignored fields with the right type are accepted; server tools are skipped") {
  CHECK(parse_request(chat, "{" + M + U +
                                R"(,"user":"u","metadata":{"k":"v"},"parallel_tool_calls":false,)"
                                R"("store":false,"seed":3,"service_tier":"auto",)"
                                R"("response_format":{"type":"text"},"logit_bias":null})")
            .ok());
  CHECK(parse_request(responses, R"({"model":"m","input":"x","user":"u","metadata":{},)"
                                 R"("parallel_tool_calls":true,"store":false,"truncation":"auto",)"
                                 R"("max_tool_calls":3,"text":{"format":{"type":"text"}}})")
            .ok());
  auto spec = parse_request(
      messages, "{" + AU + U +
                    R"(,"metadata":{"user_id":"u"},"top_k":5,"service_tier":"auto","tools":[)"
                    R"({"type":"web_search_20250305","name":"web_search","max_uses":5},)"
                    R"({"name":"f","input_schema":{"type":"object"}}]})");
  REQUIRE(spec.ok());
  CHECK(spec.value().conversation.tools_json.size() == 1);  // the server tool is ignored
}

TEST_CASE("\"speculative\": false turns speculation off for the request, on every API") {
  auto chat = parse_chat_request("{" + M + U + R"(,"speculative":false})");
  REQUIRE(chat.ok());
  CHECK_FALSE(chat.value().sampling.speculative);
  auto plain = parse_chat_request("{" + M + U + "}");
  REQUIRE(plain.ok());
  CHECK(plain.value().sampling.speculative);
  auto completions =
      parse_request(ApiKind::completions, R"({"model":"m","prompt":"x","speculative":false})");
  REQUIRE(completions.ok());
  CHECK_FALSE(completions.value().sampling.speculative);
  auto responses =
      parse_request(ApiKind::responses, R"({"model":"m","input":"x","speculative":false})");
  REQUIRE(responses.ok());
  CHECK_FALSE(responses.value().sampling.speculative);
  auto messages = parse_request(ApiKind::messages, "{" + AU + U + R"(,"speculative":false})");
  REQUIRE(messages.ok());
  CHECK_FALSE(messages.value().sampling.speculative);
}

TEST_CASE("count_tokens does not require max_tokens; messages does") {
  std::string body = R"({"model":"m",)" + U + "}";
  CHECK(parse_request(ApiKind::count_tokens, body).ok());
  CHECK_FALSE(parse_request(ApiKind::messages, body).ok());
}

TEST_CASE("chat: a coding-agent request with tools, tool results and unknown fields") {
  std::string body = R"({
    "model": "minimax-m2", "stream": true, "stream_options": {"include_usage": true},
    "max_tokens": 32000, "temperature": 0.2, "top_p": 0.95, "top_k": 40, "min_p": 0.05,
    "seed": 7, "stop": "###", "tool_choice": "auto", "parallel_tool_calls": true,
    "reasoning_effort": "high", "prompt_cache_key": "abc", "metadata": {"x": 1}, "user": "u",
    "cache_salt": "tenant-1", "logprobs": true, "top_logprobs": 2,
    "tools": [{"type": "function", "function": {"name": "read", "description": "Read a file",
               "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}],
    "messages": [
      {"role": "developer", "content": "You are a coding agent."},
      {"role": "user",
       "content": [{"type": "text", "text": "open "}, {"type": "text", "text": "a.c"}]},
      {"role": "assistant", "content": null, "reasoning_content": "need the file",
       "tool_calls": [{"id": "call_1", "type": "function",
                       "function": {"name": "read", "arguments": "{\"path\":\"a.c\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "int main;"}
    ]})";
  ApiResult<GenerateSpec> r = parse_chat_request(body);
  REQUIRE(r.ok());
  const GenerateSpec& s = r.value();
  CHECK(s.model == "minimax-m2");
  CHECK(s.stream);
  CHECK(s.include_usage);
  CHECK(s.max_tokens == 32000);
  CHECK(s.max_tokens_param == "max_tokens");
  CHECK(s.sampling.temperature == doctest::Approx(0.2));
  CHECK(s.sampling.top_k == 40);
  CHECK(s.sampling.seed == 7u);
  CHECK(s.sampling.stop == std::vector<std::string>{"###"});
  CHECK(s.sampling.top_logprobs == 2);
  CHECK(s.cache_salt == "tenant-1");
  CHECK(s.reasoning.effort == "high");
  CHECK(s.tool_choice.mode == ToolChoiceMode::automatic);
  REQUIRE(s.conversation.messages.size() == 4);
  CHECK(s.conversation.messages[0].role == ChatRole::system);
  CHECK(s.conversation.messages[1].content == "open a.c");
  const ChatMessage& a = s.conversation.messages[2];
  CHECK(a.reasoning == "need the file");
  REQUIRE(a.tool_calls.size() == 1);
  CHECK(a.tool_calls[0] == ToolCall{"call_1", "read", R"({"path":"a.c"})"});
  CHECK(s.conversation.messages[3].name == "read");  // looked up by tool_call_id
  REQUIRE(s.conversation.tools_json.size() == 1);
  json tool = json::parse(s.conversation.tools_json[0]);
  CHECK(tool["function"]["name"] == "read");
  CHECK(tool["function"]["parameters"]["properties"]["path"]["type"] == "string");
}

TEST_CASE("completions: string, token ids, defaults") {
  ApiResult<GenerateSpec> text = parse_completion_request(R"({"model":"m","prompt":["Once"]})");
  REQUIRE(text.ok());
  CHECK(text.value().prompt_kind == PromptKind::text);
  CHECK(text.value().prompt_text == "Once");
  CHECK(text.value().max_tokens == 16);
  ApiResult<GenerateSpec> ids =
      parse_completion_request(R"({"model":"m","prompt":[1,2,3],"max_tokens":4,"echo":true})");
  REQUIRE(ids.ok());
  CHECK(ids.value().prompt_kind == PromptKind::token_ids);
  CHECK(ids.value().prompt_token_ids == std::vector<int64_t>{1, 2, 3});
  CHECK(ids.value().echo);
}

TEST_CASE("responses: items merge into turns; instructions; tools at top level") {
  std::string body = R"({
    "model": "m", "instructions": "Be brief.", "store": false, "stream": true,
    "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "low", "summary": "auto"},
    "max_output_tokens": 500, "parallel_tool_calls": false,
    "tool_choice": {"type": "function", "name": "sh"},
    "tools": [{"type": "function", "name": "sh", "parameters": {"type": "object"}},
              {"type": "web_search"}],
    "input": [
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ls"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "run ls"}],
       "encrypted_content": "zzz"},
      {"type": "function_call", "call_id": "call_9", "name": "sh", "arguments": "{\"cmd\":\"ls\"}"},
      {"type": "function_call_output", "call_id": "call_9", "output": "a.c"},
      {"role": "assistant", "content": [{"type": "output_text", "text": "a.c"}]},
      {"role": "user", "content": "thanks"}
    ]})";
  ApiResult<GenerateSpec> r = parse_responses_request(body);
  REQUIRE(r.ok());
  const GenerateSpec& s = r.value();
  CHECK(s.max_tokens == 500);
  CHECK(s.max_tokens_param == "max_output_tokens");
  CHECK(s.reasoning.effort == "low");
  CHECK(s.include == std::vector<std::string>{"reasoning.encrypted_content"});
  CHECK(s.tool_choice == ToolChoice{ToolChoiceMode::named, "sh"});
  CHECK(s.conversation.tools_json.size() == 1);  // web_search ignored
  const auto& m = s.conversation.messages;
  REQUIRE(m.size() == 6);
  CHECK(m[0].role == ChatRole::system);
  CHECK(m[0].content == "Be brief.");
  CHECK(m[1].content == "ls");
  CHECK(m[2].role == ChatRole::assistant);
  CHECK(m[2].reasoning == "run ls");
  REQUIRE(m[2].tool_calls.size() == 1);
  CHECK(m[2].tool_calls[0].id == "call_9");
  CHECK(m[3].role == ChatRole::tool);
  CHECK(m[3].name == "sh");
  CHECK(m[4].role == ChatRole::assistant);
  CHECK(m[4].content == "a.c");
  CHECK(m[5].content == "thanks");
}

TEST_CASE("anthropic: system blocks, tool_use/tool_result, thinking, stop_sequences") {
  std::string body = R"({
    "model": "m", "max_tokens": 4096, "stream": true, "metadata": {"user_id": "u"},
    "system": [{"type": "text", "text": "You code.", "cache_control": {"type": "ephemeral"}}],
    "thinking": {"type": "enabled", "budget_tokens": 2048}, "stop_sequences": ["</end>"],
    "tools": [{"name": "bash", "description": "run", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "tool", "name": "bash"},
    "messages": [
      {"role": "user", "content": "list files"},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "use ls", "signature": "s"},
        {"type": "redacted_thinking", "data": "xx"},
        {"type": "text", "text": "Running."},
        {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"cmd": "ls"}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1",
         "content": [{"type": "text", "text": "a.c"}]},
        {"type": "text", "text": "and now?"}]}
    ]})";
  ApiResult<GenerateSpec> r = parse_messages_request(body, ApiKind::messages);
  REQUIRE(r.ok());
  const GenerateSpec& s = r.value();
  CHECK(s.max_tokens == 4096);
  CHECK(s.reasoning.thinking_enabled == true);
  CHECK(s.reasoning.thinking_budget_tokens == 2048);
  CHECK(s.sampling.stop == std::vector<std::string>{"</end>"});
  CHECK(s.tool_choice == ToolChoice{ToolChoiceMode::named, "bash"});
  const auto& m = s.conversation.messages;
  REQUIRE(m.size() == 5);
  CHECK(m[0].role == ChatRole::system);
  CHECK(m[0].content == "You code.");
  CHECK(m[2].reasoning == "use ls");
  CHECK(m[2].content == "Running.");
  CHECK(m[2].tool_calls == std::vector<ToolCall>{{"toolu_1", "bash", R"({"cmd":"ls"})"}});
  CHECK(m[3].role == ChatRole::tool);
  CHECK(m[3].tool_call_id == "toolu_1");
  CHECK(m[3].name == "bash");
  CHECK(m[3].content == "a.c");
  CHECK(m[4].role == ChatRole::user);
  CHECK(m[4].content == "and now?");
}

// Issue 11: what coding agents send, never a 400.
TEST_CASE("agents: system/developer anywhere, items sent back, unimplemented top-level fields") {
  SUBCASE("anthropic: system entries inside messages, thinking of any type, extra fields") {
    std::string body = R"({
      "model": "m", "max_tokens": 32000, "stream": true,
      "system": [{"type": "text", "text": "A", "cache_control": {"type": "ephemeral"}},
                 {"type": "text", "text": "B"}],
      "thinking": {"type": "adaptive"}, "context_management": {"edits": []},
      "output_config": {"effort": "high"}, "metadata": {"user_id": "u"},
      "service_tier": "auto",
      "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi",
                                      "cache_control": {"type": "ephemeral"}}]},
        {"role": "system", "content": "late rule"},
        {"role": "assistant", "content": [
          {"type": "redacted_thinking", "data": "enc"},
          {"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": "file text", "cache_control": {"type": "x"}}]},
        {"role": "system", "content": [{"type": "text", "text": "later"}]}
      ]})";
    ApiResult<GenerateSpec> r = parse_messages_request(body, ApiKind::messages);
    REQUIRE_MESSAGE(r.ok(), r.error().message);
    const auto& m = r.value().conversation.messages;
    REQUIRE(m.size() == 6);
    CHECK(m[0].role == ChatRole::system);
    CHECK(m[0].content == "AB");
    CHECK(m[2].role == ChatRole::system);
    CHECK(m[2].content == "late rule");
    CHECK(m[3].tool_calls == std::vector<ToolCall>{{"t1", "Read", "{}"}});
    CHECK(m[4].role == ChatRole::tool);
    CHECK(m[4].content == "file text");
    CHECK(m[5].role == ChatRole::system);
    CHECK(m[5].content == "later");
    CHECK(r.value().reasoning.thinking_enabled == true);
    auto unknown = parse_messages_request(
        R"({"model":"m","max_tokens":9,"thinking":{"type":"someday"},)"
        R"("messages":[{"role":"user","content":"x"}]})", ApiKind::messages);
    REQUIRE(unknown.ok());
    CHECK(unknown.value().reasoning.thinking_enabled == true);
  }
  SUBCASE("responses: two developer items first, reasoning/custom tool items sent back") {
    std::string body = R"({
      "model": "m", "instructions": "I", "stream": true, "store": false,
      "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k",
      "client_metadata": {"a": "b"}, "service_tier": "auto", "text": {"verbosity": "low"},
      "parallel_tool_calls": true, "reasoning": {"effort": "high", "summary": "auto"},
      "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}},
                {"type": "custom", "name": "apply_patch"}],
      "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "D1"}]},
        {"type": "message", "role": "developer", "content": "D2"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"},
        {"type": "web_search_call", "id": "ws", "status": "completed"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Done.", "annotations": []}]},
        {"type": "message", "role": "system", "content": "S"}
      ]})";
    ApiResult<GenerateSpec> r = parse_responses_request(body);
    REQUIRE_MESSAGE(r.ok(), r.error().message);
    const auto& m = r.value().conversation.messages;
    REQUIRE(m.size() == 10);
    CHECK(m[0].content == "I");
    CHECK((m[1].role == ChatRole::system && m[1].content == "D1"));
    CHECK((m[2].role == ChatRole::system && m[2].content == "D2"));
    CHECK(m[3].role == ChatRole::user);
    CHECK(m[4].tool_calls == std::vector<ToolCall>{{"c1", "shell", "{}"}});
    CHECK((m[5].role == ChatRole::tool && m[5].name == "shell" && m[5].content == "ok"));
    CHECK(m[6].tool_calls == std::vector<ToolCall>{{"c2", "apply_patch",
                                                    R"({"input":"*** Begin"})"}});
    CHECK((m[7].role == ChatRole::tool && m[7].content == "done"));
    CHECK((m[8].role == ChatRole::assistant && m[8].content == "Done."));
    CHECK((m[9].role == ChatRole::system && m[9].content == "S"));
  }
  SUBCASE("chat: developer after the first message, tool messages, content null") {
    std::string body = R"({
      "model": "m", "stream": true, "stream_options": {"include_usage": true},
      "prompt_cache_key": "k", "metadata": {"x": "y"}, "store": false, "service_tier": "auto",
      "parallel_tool_calls": false, "reasoning_effort": "low", "user": "u",
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
      "messages": [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "u1"},
        {"role": "developer", "content": [{"type": "text", "text": "D"}]},
        {"role": "assistant", "content": null,
         "tool_calls": [{"id": "a", "type": "function",
                         "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": [{"type": "text", "text": "r"}]},
        {"role": "system", "content": "S2"}
      ]})";
    ApiResult<GenerateSpec> r = parse_chat_request(body);
    REQUIRE_MESSAGE(r.ok(), r.error().message);
    const auto& m = r.value().conversation.messages;
    REQUIRE(m.size() == 6);
    CHECK((m[2].role == ChatRole::system && m[2].content == "D"));
    CHECK((m[3].content.empty() && m[3].tool_calls.size() == 1));
    CHECK((m[4].role == ChatRole::tool && m[4].name == "f" && m[4].content == "r"));
    CHECK(m[5].role == ChatRole::system);
  }
}

TEST_CASE("error bodies: OpenAI shape and Anthropic shape") {
  ApiError e = invalid_request("temperature", "temperature must be in [0, 2], got -1");
  json openai = json::parse(render_error_body(ApiKind::chat_completions, e));
  CHECK(openai["error"]["message"] == e.message);
  CHECK(openai["error"]["type"] == "invalid_request_error");
  CHECK(openai["error"]["param"] == "temperature");
  CHECK(openai["error"]["code"].is_null());
  json anthropic = json::parse(render_error_body(ApiKind::messages, e));
  CHECK(anthropic["type"] == "error");
  CHECK(anthropic["error"]["type"] == "invalid_request_error");
  CHECK(anthropic["error"]["message"] == e.message);
  CHECK(anthropic_error_type(401) == "authentication_error");
  CHECK(anthropic_error_type(404) == "not_found_error");
  CHECK(anthropic_error_type(413) == "request_too_large");
  CHECK(anthropic_error_type(429) == "rate_limit_error");
  CHECK(anthropic_error_type(503) == "overloaded_error");
  CHECK(anthropic_error_type(500) == "api_error");
}

TEST_CASE("context length: reject with both numbers; unset max tokens fill the context") {
  GenerateSpec spec = parse_chat_request(R"({"model":"m",)" + U + R"(,"max_tokens":1000})").value();
  ApiResult<int64_t> too_long = check_context_length(spec, 204000, 204800);
  REQUIRE_FALSE(too_long.ok());
  CHECK(too_long.error().http_status == 400);
  CHECK(too_long.error().param == "max_tokens");
  CHECK(too_long.error().code == "context_length_exceeded");
  CHECK(too_long.error().message.find("204800") != std::string::npos);
  CHECK(too_long.error().message.find("205000") != std::string::npos);
  CHECK(too_long.error().message.find("204000 in the prompt") != std::string::npos);
  CHECK(check_context_length(spec, 203800, 204800).value() == 1000);
  GenerateSpec open = parse_chat_request(R"({"model":"m",)" + U + "}").value();
  CHECK(check_context_length(open, 800, 204800).value() == 204000);
  ApiResult<int64_t> full = check_context_length(open, 204800, 204800);
  REQUIRE_FALSE(full.ok());
  CHECK(full.error().param == "messages");
}

TEST_CASE("context length: the capped-encode budget and the 400 for a prompt cut short") {
  GenerateSpec spec = parse_chat_request(R"({"model":"m",)" + U + R"(,"max_tokens":1000})").value();
  CHECK(prompt_tokens_max(spec, 204800) == 203800);
  // The budget is the largest prompt check_context_length accepts.
  CHECK(check_context_length(spec, prompt_tokens_max(spec, 204800), 204800).ok());
  CHECK_FALSE(check_context_length(spec, prompt_tokens_max(spec, 204800) + 1, 204800).ok());
  GenerateSpec open = parse_chat_request(R"({"model":"m",)" + U + "}").value();
  CHECK(prompt_tokens_max(open, 204800) == 204799);
  CHECK(check_context_length(open, prompt_tokens_max(open, 204800), 204800).ok());
  CHECK_FALSE(check_context_length(open, prompt_tokens_max(open, 204800) + 1, 204800).ok());
  GenerateSpec huge =
      parse_chat_request(R"({"model":"m",)" + U + R"(,"max_tokens":999999})").value();
  CHECK(prompt_tokens_max(huge, 204800) == 0);

  ApiError e = prompt_too_long(spec, 203900, 204800);
  CHECK(e.http_status == 400);
  CHECK(e.code == "context_length_exceeded");
  CHECK(e.param == "max_tokens");
  CHECK(e.message.find("maximum context length is 204800") != std::string::npos);
  CHECK(e.message.find("more than 203900 tokens") != std::string::npos);
  ApiError m = prompt_too_long(open, 300000, 204800);
  CHECK(m.param == "messages");
  CHECK(m.message.find("Shorten the prompt") != std::string::npos);
}
