// Golden renders: one scripted event sequence through each API's renderer, streaming and not.
#include <doctest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "actors/gateway/api_request.hpp"
#include "actors/gateway/api_response.hpp"
#include "actors/gateway/output_parser.hpp"
#include "actors/gateway/renderers.hpp"
#include "actors/gateway/token_logprobs.hpp"
#include "tests/support/sse.hpp"

using namespace tandem::gateway;
using nlohmann::json;

namespace {

constexpr uint64_t seed = 42;

// reasoning, text in two pieces, one tool call in two argument pieces, stop, usage.
std::vector<GenEvent> script() {
  return {ReasoningDelta{"plan"},
          TextDelta{"Hel"},
          TextDelta{"lo"},
          ToolCallStart{0, "", "read"},
          ToolCallArgsDelta{0, "{\"path\":"},
          ToolCallArgsDelta{0, "\"a.c\"}"},
          Finish{FinishReason::stop, ""},
          UsageReport{Usage{100, 40, 20, 5}}};
}

RenderOptions options(bool stream) {
  RenderOptions o;
  o.model = "minimax-m2";
  o.created_s = 1700000000;
  o.stream = stream;
  o.include_usage = true;
  o.prompt_tokens = 100;
  o.cached_tokens = 40;
  return o;
}

std::string run(ApiKind kind, const RenderOptions& o, const std::vector<GenEvent>& events,
                std::string* body = nullptr) {
  IdGenerator ids(seed);
  std::unique_ptr<Renderer> r = make_renderer(kind, o, ids);
  std::string out = r->begin();
  for (const GenEvent& e : events) out += r->feed(e);
  CHECK(r->done());
  if (body != nullptr && r->error() == nullptr) *body = r->body();
  return out;
}

using tandem::testing::split_sse;
using tandem::testing::SseEvent;

}  // namespace

TEST_CASE("ids are deterministic per seed and carry their prefix") {
  IdGenerator a(7), b(7), c(8);
  std::string first = a.next("chatcmpl-");
  CHECK(first == b.next("chatcmpl-"));
  CHECK(first != c.next("chatcmpl-"));
  CHECK(first.rfind("chatcmpl-", 0) == 0);
  CHECK(first.size() == 9 + 24);
  CHECK(a.next("call_") != b.next("toolu_"));
}

TEST_CASE("chat completions: exact SSE stream") {
  IdGenerator ids(seed);
  std::string id = ids.next("chatcmpl-");
  std::string call_id = ids.next("call_");
  std::string head = R"({"choices":[{"delta":)";
  auto line = [&](const std::string& delta, const std::string& finish) {
    return "data: " + head + delta + R"(,"finish_reason":)" + finish +
           R"(,"index":0,"logprobs":null}],"created":1700000000,"id":")" + id +
           R"(","model":"minimax-m2","object":"chat.completion.chunk"})" + "\n\n";
  };
  std::string want =
      line(R"({"content":"","role":"assistant"})", "null") +
      line(R"({"reasoning_content":"plan"})", "null") + line(R"({"content":"Hel"})", "null") +
      line(R"({"content":"lo"})", "null") +
      line(R"({"tool_calls":[{"function":{"arguments":"","name":"read"},"id":")" + call_id +
               R"(","index":0,"type":"function"}]})",
           "null") +
      line(R"({"tool_calls":[{"function":{"arguments":"{\"path\":"},"index":0}]})", "null") +
      line(R"({"tool_calls":[{"function":{"arguments":"\"a.c\"}"},"index":0}]})", "null") +
      line("{}", R"("tool_calls")") + R"(data: {"choices":[],"created":1700000000,"id":")" + id +
      R"(","model":"minimax-m2","object":"chat.completion.chunk","usage":{"completion_tokens":20,)"
      R"("completion_tokens_details":{"reasoning_tokens":5},"prompt_tokens":100,)"
      R"("prompt_tokens_details":{"cached_tokens":40},"total_tokens":120}})" +
      "\n\ndata: [DONE]\n\n";
  CHECK(run(ApiKind::chat_completions, options(true), script()) == want);
}

TEST_CASE("chat completions: no usage chunk unless asked; non-stream body") {
  RenderOptions o = options(true);
  o.include_usage = false;
  std::vector<SseEvent> events = split_sse(run(ApiKind::chat_completions, o, script()));
  CHECK(events.back().data == "[DONE]");
  CHECK(json::parse(events[events.size() - 2].data)["choices"][0]["finish_reason"] == "tool_calls");
  std::string body;
  CHECK(run(ApiKind::chat_completions, options(false), script(), &body).empty());
  json b = json::parse(body);
  CHECK(b["object"] == "chat.completion");
  CHECK(b["id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
  const json& m = b["choices"][0]["message"];
  CHECK(m["role"] == "assistant");
  CHECK(m["content"] == "Hello");
  CHECK(m["reasoning_content"] == "plan");
  CHECK(m["tool_calls"][0]["function"]["arguments"] == R"({"path":"a.c"})");
  CHECK(m["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0) == 0);
  CHECK(b["choices"][0]["finish_reason"] == "tool_calls");
  CHECK(b["usage"]["prompt_tokens_details"]["cached_tokens"] == 40);
  CHECK(b["usage"]["total_tokens"] == 120);
}

TEST_CASE("chat completions: an error mid-stream is an error chunk, then [DONE]") {
  std::vector<GenEvent> events = {
      TextDelta{"Hi"},
      StreamError{ApiError{503, "overloaded_error", "", "", "decode instance lost"}}};
  std::vector<SseEvent> sse = split_sse(run(ApiKind::chat_completions, options(true), events));
  REQUIRE(sse.size() == 4);
  json err = json::parse(sse[2].data);
  CHECK(err["error"]["message"] == "decode instance lost");
  CHECK(err["error"]["type"] == "overloaded_error");
  CHECK(sse[3].data == "[DONE]");
}

TEST_CASE("completions: stream with echo, length finish, usage; non-stream body") {
  RenderOptions o = options(true);
  o.echo_text = "Once";
  std::vector<GenEvent> events = {TextDelta{" upon"}, TextDelta{" a"},
                                  Finish{FinishReason::length, ""}, UsageReport{{4, 0, 2, 0}}};
  std::vector<SseEvent> sse = split_sse(run(ApiKind::completions, o, events));
  REQUIRE(sse.size() == 6);
  std::string text;
  for (size_t i = 0; i < 4; ++i) {
    json c = json::parse(sse[i].data);
    CHECK(c["object"] == "text_completion");
    text += c["choices"][0]["text"].get<std::string>();
  }
  CHECK(text == "Once upon a");
  CHECK(json::parse(sse[3].data)["choices"][0]["finish_reason"] == "length");
  CHECK(json::parse(sse[4].data)["usage"]["completion_tokens"] == 2);
  CHECK(sse[5].data == "[DONE]");
  std::string body;
  o.stream = false;
  run(ApiKind::completions, o, events, &body);
  json b = json::parse(body);
  CHECK(b["choices"][0]["text"] == "Once upon a");
  CHECK(b["choices"][0]["finish_reason"] == "length");
  CHECK(b["id"].get<std::string>().rfind("cmpl-", 0) == 0);
}

TEST_CASE("responses: named events in order with increasing sequence_number") {
  std::vector<SseEvent> sse = split_sse(run(ApiKind::responses, options(true), script()));
  std::vector<std::string> want = {
      "response.created", "response.in_progress",
      // reasoning item
      "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
      "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
      // message item
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.delta", "response.output_text.done", "response.content_part.done",
      "response.output_item.done",
      // function call item
      "response.output_item.added", "response.function_call_arguments.delta",
      "response.function_call_arguments.delta", "response.function_call_arguments.done",
      "response.output_item.done", "response.completed"};
  REQUIRE(sse.size() == want.size());
  for (size_t i = 0; i < sse.size(); ++i) {
    json d = json::parse(sse[i].data);
    CHECK(sse[i].name == want[i]);
    CHECK(d["type"] == want[i]);
    CHECK(d["sequence_number"] == i);
  }
  json created = json::parse(sse[0].data)["response"];
  CHECK(created["status"] == "in_progress");
  CHECK(created["id"].get<std::string>().rfind("resp_", 0) == 0);
  json text_done = json::parse(sse[12].data);
  CHECK(text_done["text"] == "Hello");
  CHECK(text_done["output_index"] == 1);
  json args_done = json::parse(sse[18].data);
  CHECK(args_done["arguments"] == R"({"path":"a.c"})");
  CHECK(args_done["output_index"] == 2);
  json fc = json::parse(sse[19].data)["item"];
  CHECK(fc["type"] == "function_call");
  CHECK(fc["name"] == "read");
  CHECK(fc["call_id"].get<std::string>().rfind("call_", 0) == 0);
  CHECK(fc["status"] == "completed");
  json done = json::parse(sse.back().data)["response"];
  CHECK(done["status"] == "completed");
  REQUIRE(done["output"].size() == 3);
  CHECK(done["output"][0]["type"] == "reasoning");
  CHECK(done["output"][0]["content"][0]["text"] == "plan");
  CHECK(done["output"][1]["content"][0]["type"] == "output_text");
  CHECK(done["output"][1]["content"][0]["text"] == "Hello");
  CHECK(done["usage"]["input_tokens"] == 100);
  CHECK(done["usage"]["input_tokens_details"]["cached_tokens"] == 40);
  CHECK(done["usage"]["output_tokens_details"]["reasoning_tokens"] == 5);
  CHECK(done["usage"]["total_tokens"] == 120);
}

TEST_CASE("responses: non-stream object equals the streamed final one; length -> incomplete") {
  std::string body;
  CHECK(run(ApiKind::responses, options(false), script(), &body).empty());
  std::vector<SseEvent> sse = split_sse(run(ApiKind::responses, options(true), script()));
  CHECK(json::parse(body) == json::parse(sse.back().data)["response"]);
  std::vector<GenEvent> cut = {TextDelta{"abc"}, Finish{FinishReason::length, ""},
                               UsageReport{{3, 0, 3, 0}}};
  std::vector<SseEvent> inc = split_sse(run(ApiKind::responses, options(true), cut));
  CHECK(inc.back().name == "response.incomplete");
  json r = json::parse(inc.back().data)["response"];
  CHECK(r["status"] == "incomplete");
  CHECK(r["incomplete_details"]["reason"] == "max_output_tokens");
  std::vector<SseEvent> err =
      split_sse(run(ApiKind::responses, options(true),
                    {TextDelta{"a"}, StreamError{invalid_request("", "boom")}}));
  CHECK(err.back().name == "error");
  json e = json::parse(err.back().data);
  CHECK(e["message"] == "boom");
  CHECK(e["sequence_number"] == err.size() - 1);
}

TEST_CASE("anthropic messages: exact SSE stream") {
  IdGenerator ids(seed);
  std::string id = ids.next("msg_");
  std::string tool_id = ids.next("toolu_");
  auto ev = [](const std::string& name, const std::string& data) {
    return "event: " + name + "\ndata: " + data + "\n\n";
  };
  std::string want =
      ev("message_start",
         R"({"message":{"content":[],"id":")" + id +
             R"(","model":"minimax-m2","role":"assistant","stop_reason":null,)"
             R"("stop_sequence":null,"type":"message","usage":{"cache_creation_input_tokens":0,)"
             R"("cache_read_input_tokens":40,"input_tokens":60,"output_tokens":0}},)"
             R"("type":"message_start"})") +
      ev("content_block_start",
         R"({"content_block":{"signature":"","thinking":"","type":"thinking"},"index":0,)"
         R"("type":"content_block_start"})") +
      ev("content_block_delta", R"({"delta":{"thinking":"plan","type":"thinking_delta"},"index":0,)"
                                R"("type":"content_block_delta"})") +
      ev("content_block_stop", R"({"index":0,"type":"content_block_stop"})") +
      ev("content_block_start",
         R"({"content_block":{"text":"","type":"text"},"index":1,"type":"content_block_start"})") +
      ev("content_block_delta",
         R"({"delta":{"text":"Hel","type":"text_delta"},"index":1,"type":"content_block_delta"})") +
      ev("content_block_delta",
         R"({"delta":{"text":"lo","type":"text_delta"},"index":1,"type":"content_block_delta"})") +
      ev("content_block_stop", R"({"index":1,"type":"content_block_stop"})") +
      ev("content_block_start", R"({"content_block":{"id":")" + tool_id +
                                    R"(","input":{},"name":"read","type":"tool_use"},"index":2,)"
                                    R"("type":"content_block_start"})") +
      ev("content_block_delta",
         R"({"delta":{"partial_json":"{\"path\":","type":"input_json_delta"},"index":2,)"
         R"("type":"content_block_delta"})") +
      ev("content_block_delta",
         R"({"delta":{"partial_json":"\"a.c\"}","type":"input_json_delta"},"index":2,)"
         R"("type":"content_block_delta"})") +
      ev("content_block_stop", R"({"index":2,"type":"content_block_stop"})") +
      ev("message_delta",
         R"({"delta":{"stop_reason":"tool_use","stop_sequence":null},"type":"message_delta",)"
         R"("usage":{"cache_creation_input_tokens":0,"cache_read_input_tokens":40,)"
         R"("input_tokens":60,"output_tokens":20}})") +
      ev("message_stop", R"({"type":"message_stop"})");
  CHECK(run(ApiKind::messages, options(true), script()) == want);
}

TEST_CASE("anthropic messages: non-stream body, stop_sequence, error event") {
  std::string body;
  run(ApiKind::messages, options(false), script(), &body);
  json b = json::parse(body);
  CHECK(b["type"] == "message");
  REQUIRE(b["content"].size() == 3);
  CHECK(b["content"][0] == json{{"type", "thinking"}, {"thinking", "plan"}, {"signature", ""}});
  CHECK(b["content"][1] == json{{"type", "text"}, {"text", "Hello"}});
  CHECK(b["content"][2]["input"] == json{{"path", "a.c"}});
  CHECK(b["stop_reason"] == "tool_use");
  CHECK(b["usage"]["cache_read_input_tokens"] == 40);
  std::vector<GenEvent> stop = {TextDelta{"x"}, Finish{FinishReason::stop_string, "</end>"},
                                UsageReport{{5, 0, 1, 0}}};
  run(ApiKind::messages, options(false), stop, &body);
  b = json::parse(body);
  CHECK(b["stop_reason"] == "stop_sequence");
  CHECK(b["stop_sequence"] == "</end>");
  std::vector<GenEvent> length = {TextDelta{"x"}, Finish{FinishReason::length, ""},
                                  UsageReport{{5, 0, 1, 0}}};
  run(ApiKind::messages, options(false), length, &body);
  CHECK(json::parse(body)["stop_reason"] == "max_tokens");
  std::vector<SseEvent> err = split_sse(
      run(ApiKind::messages, options(true),
          {TextDelta{"a"}, StreamError{ApiError{503, "overloaded_error", "", "", "no decode"}}}));
  CHECK(err.back().name == "error");
  json e = json::parse(err.back().data);
  CHECK(e["type"] == "error");
  CHECK(e["error"]["type"] == "overloaded_error");
  CHECK(e["error"]["message"] == "no decode");
  CHECK(render_count_tokens(321) == R"({"input_tokens":321})");
}

TEST_CASE("non-stream error: the renderer exposes it for render_error_body") {
  IdGenerator ids(1);
  std::unique_ptr<Renderer> r = make_renderer(ApiKind::chat_completions, options(false), ids);
  CHECK(r->begin().empty());
  CHECK(r->feed(TextDelta{"a"}).empty());
  CHECK(r->feed(Finish{FinishReason::error, ""}).empty());
  CHECK(r->done());
  REQUIRE(r->error() != nullptr);
  CHECK(r->error()->http_status == 500);
  json body = json::parse(render_error_body(ApiKind::chat_completions, *r->error()));
  CHECK(body["error"]["type"] == "api_error");
}

TEST_CASE("parser events drive a renderer: MiniMax output to an Anthropic message") {
  OutputParser parser(OutputParserConfig{true, true, ToolCallFormat::minimax_m2, {}});
  IdGenerator ids(3);
  std::unique_ptr<Renderer> r = make_renderer(ApiKind::messages, options(false), ids);
  CHECK(r->begin().empty());
  std::string output =
      "check the dir</think>\n\nListing.<minimax:tool_call><invoke name=\"ls\">"
      "<parameter name=\"dir\">src</parameter></invoke></minimax:tool_call>";
  for (size_t i = 0; i < output.size(); i += 5) {
    for (const GenEvent& e : parser.feed(output.substr(i, 5))) r->feed(e);
  }
  for (const GenEvent& e : parser.finish()) r->feed(e);
  r->feed(Finish{FinishReason::stop, ""});
  r->feed(UsageReport{{10, 0, 12, 4}});
  json b = json::parse(r->body());
  REQUIRE(b["content"].size() == 3);
  CHECK(b["content"][0]["thinking"] == "check the dir");
  CHECK(b["content"][1]["text"] == "Listing.");
  CHECK(b["content"][2]["name"] == "ls");
  CHECK(b["content"][2]["input"] == json{{"dir", "src"}});
  CHECK(b["content"][2]["id"].get<std::string>().rfind("toolu_", 0) == 0);
  CHECK(b["stop_reason"] == "tool_use");
}

TEST_CASE("text cut inside a UTF-8 character renders (replaced), never throws") {
  std::vector<GenEvent> events = {TextDelta{"\xED\x95"}, Finish{FinishReason::stop, ""},
                                  UsageReport{{1, 0, 1, 0}}};
  std::vector<SseEvent> sse = split_sse(run(ApiKind::chat_completions, options(true), events));
  CHECK(json::parse(sse[1].data)["choices"][0]["delta"]["content"] == "\xEF\xBF\xBD");
  std::string body;
  run(ApiKind::messages, options(false), events, &body);
  CHECK(json::parse(body)["content"][0]["text"] == "\xEF\xBF\xBD");
}

// ---------------- logprobs ----------------

namespace {

TokenLogprobs lp(std::string token, double logprob, std::vector<TokenAlternative> top = {}) {
  return TokenLogprobs{std::move(token), logprob, std::move(top)};
}

// Three tokens: "Hi" (text released at once), " th" + "ere" (released together, as when a
// stop-string prefix is held back), then the EOS ("" text) whose logprob comes at Finish.
std::vector<GenEvent> logprob_script() {
  return {LogprobsDelta{{lp("Hi", -0.5, {{"Hi", -0.5}, {"Ho", -1.25}})}},
          TextDelta{"Hi"},
          LogprobsDelta{{lp(" th", -0.25, {{" th", -0.25}, {" t\xc3", -2.0}})}},
          LogprobsDelta{{lp("ere", -1.0, {{"ere", -1.0}, {"en", -3.5}})}},
          TextDelta{" there"},
          LogprobsDelta{{lp("", -0.125, {{"", -0.125}, {"!", -4.0}})}},
          Finish{FinishReason::stop, ""},
          UsageReport{Usage{10, 0, 4, 0}}};
}

RenderOptions logprob_options(bool stream) {
  RenderOptions o = options(stream);
  o.logprobs = true;
  return o;
}

std::vector<json> data_chunks(const std::string& sse) {
  std::vector<json> out;
  for (const SseEvent& e : split_sse(sse)) {
    if (e.data != "[DONE]") out.push_back(json::parse(e.data));
  }
  return out;
}

}  // namespace

TEST_CASE("chat logprobs: OpenAI shape in the body and aligned with each stream chunk") {
  std::string body;
  run(ApiKind::chat_completions, logprob_options(false), logprob_script(), &body);
  json b = json::parse(body);
  const json& l = b["choices"][0]["logprobs"];
  CHECK(l["refusal"].is_null());
  REQUIRE(l["content"].size() == 4);  // every generated token, the EOS included
  CHECK(l["content"][0] == json::parse(R"({"token":"Hi","logprob":-0.5,"bytes":[72,105],
      "top_logprobs":[{"token":"Hi","logprob":-0.5,"bytes":[72,105]},
                      {"token":"Ho","logprob":-1.25,"bytes":[72,111]}]})"));
  // A token cut inside a UTF-8 character: the string is replaced, the bytes are exact.
  CHECK(l["content"][1]["top_logprobs"][1]["bytes"] == json::parse("[32,116,195]"));
  CHECK(l["content"][3]["token"] == "");
  CHECK(l["content"][3]["bytes"] == json::array());

  auto chunks = data_chunks(run(ApiKind::chat_completions, logprob_options(true),
                                logprob_script()));
  // role, "Hi", " there", finish, usage
  REQUIRE(chunks.size() == 5);
  CHECK(chunks[0]["choices"][0]["logprobs"]["content"] == json::array());
  CHECK(chunks[1]["choices"][0]["delta"]["content"] == "Hi");
  REQUIRE(chunks[1]["choices"][0]["logprobs"]["content"].size() == 1);
  CHECK(chunks[1]["choices"][0]["logprobs"]["content"][0] == l["content"][0]);
  CHECK(chunks[2]["choices"][0]["delta"]["content"] == " there");
  CHECK(chunks[2]["choices"][0]["logprobs"]["content"] ==
        json::array({l["content"][1], l["content"][2]}));
  CHECK(chunks[3]["choices"][0]["finish_reason"] == "stop");
  CHECK(chunks[3]["choices"][0]["logprobs"]["content"] == json::array({l["content"][3]}));
  CHECK(chunks[4]["choices"].empty());
}

TEST_CASE("chat without logprobs keeps logprobs null") {
  std::string body;
  std::vector<GenEvent> events = {TextDelta{"Hi"}, Finish{FinishReason::stop, ""},
                                  UsageReport{Usage{1, 0, 1, 0}}};
  run(ApiKind::chat_completions, options(false), events, &body);
  CHECK(json::parse(body)["choices"][0]["logprobs"].is_null());
  for (const json& c : data_chunks(run(ApiKind::chat_completions, options(true), events))) {
    if (!c["choices"].empty()) CHECK(c["choices"][0]["logprobs"].is_null());
  }
}

TEST_CASE("completions logprobs: tokens, token_logprobs, top dicts, text_offset after echo") {
  RenderOptions o = logprob_options(false);
  o.echo_text = "Say";
  std::string body;
  run(ApiKind::completions, o, logprob_script(), &body);
  const json l = json::parse(body)["choices"][0]["logprobs"];
  CHECK(l["tokens"] == json::parse(R"(["Hi"," th","ere",""])"));
  CHECK(l["token_logprobs"] == json::parse("[-0.5,-0.25,-1.0,-0.125]"));
  CHECK(l["top_logprobs"][0] == json::parse(R"({"Hi":-0.5,"Ho":-1.25})"));
  CHECK(l["top_logprobs"][3] == json::parse(R"({"":-0.125,"!":-4.0})"));
  CHECK(l["text_offset"] == json::parse("[3,5,8,11]"));  // bytes; "Say" comes first

  o.stream = true;
  auto chunks = data_chunks(run(ApiKind::completions, o, logprob_script()));
  // echo, "Hi", " there", finish, usage
  REQUIRE(chunks.size() == 5);
  CHECK(chunks[0]["choices"][0]["logprobs"]["tokens"] == json::array());
  CHECK(chunks[1]["choices"][0]["logprobs"]["tokens"] == json::parse(R"(["Hi"])"));
  CHECK(chunks[2]["choices"][0]["logprobs"]["tokens"] == json::parse(R"([" th","ere"])"));
  CHECK(chunks[2]["choices"][0]["logprobs"]["text_offset"] == json::parse("[5,8]"));
  CHECK(chunks[3]["choices"][0]["logprobs"]["token_logprobs"] == json::parse("[-0.125]"));
}

TEST_CASE("responses logprobs: on output_text deltas, the done event and the content part") {
  std::vector<GenEvent> events = {LogprobsDelta{{lp("<think>", -0.1)}},
                                  ReasoningDelta{"hmm"},
                                  LogprobsDelta{{lp("Hi", -0.5, {{"Hi", -0.5}})}},
                                  TextDelta{"Hi"},
                                  LogprobsDelta{{lp("", -0.25, {{"", -0.25}})}},
                                  Finish{FinishReason::stop, ""},
                                  UsageReport{Usage{10, 0, 3, 0}}};
  std::string body;
  std::string sse = run(ApiKind::responses, logprob_options(true), events, &body);
  json hi = json::parse(R"({"token":"Hi","logprob":-0.5,"bytes":[72,105],
      "top_logprobs":[{"token":"Hi","logprob":-0.5,"bytes":[72,105]}]})");
  json eos = json::parse(R"({"token":"","logprob":-0.25,"bytes":[],
      "top_logprobs":[{"token":"","logprob":-0.25,"bytes":[]}]})");
  int deltas = 0, dones = 0;
  for (const SseEvent& e : split_sse(sse)) {
    json d = json::parse(e.data);
    if (e.name == "response.output_text.delta") {
      ++deltas;
      CHECK(d["logprobs"] == json::array({hi}));  // the reasoning token is not output_text
    }
    if (e.name == "response.output_text.done") {
      ++dones;
      CHECK(d["logprobs"] == json::array({hi, eos}));
    }
    if (e.name == "response.reasoning_text.delta") CHECK_FALSE(d.contains("logprobs"));
  }
  CHECK(deltas == 1);
  CHECK(dones == 1);
  json b = json::parse(body);
  REQUIRE(b["output"].size() == 2);
  CHECK(b["output"][1]["content"][0]["logprobs"] == json::array({hi, eos}));
  CHECK_FALSE(b["output"][0]["content"][0].contains("logprobs"));

  std::string plain;
  std::vector<GenEvent> no_lp = {TextDelta{"Hi"}, Finish{FinishReason::stop, ""},
                                 UsageReport{Usage{10, 0, 1, 0}}};
  run(ApiKind::responses, options(false), no_lp, &plain);
  CHECK_FALSE(json::parse(plain)["output"][0]["content"][0].contains("logprobs"));
}

TEST_CASE("anthropic ignores logprobs events") {
  std::string body;
  run(ApiKind::messages, logprob_options(false), logprob_script(), &body);
  json b = json::parse(body);
  CHECK(b["content"][0]["text"] == "Hi there");
  CHECK_FALSE(b.contains("logprobs"));
}

TEST_CASE("token_logprobs decodes each token and its alternatives after the previous token") {
  // A fake tokenizer: token n is "<n>", with a leading space unless at the start of text.
  DecodePieceFn piece = [](std::optional<int32_t> prev, int32_t id) {
    return std::string(prev ? " " : "") + "<" + std::to_string(id) + ">";
  };
  std::vector<tandem::devices::SampledToken> tokens(2);
  tokens[0].token = 5;
  tokens[0].logprob = -0.5f;
  tokens[0].top = {{5, -0.5f}, {6, -1.0f}};
  tokens[1].token = 7;
  tokens[1].logprob = 1e-7f;  // float slack above 0 is clamped
  std::optional<int32_t> prev;
  auto out = token_logprobs(tokens, prev, piece);
  REQUIRE(out.size() == 2);
  CHECK(out[0] == lp("<5>", -0.5, {{"<5>", -0.5}, {"<6>", -1.0}}));
  CHECK(out[1].token == " <7>");
  CHECK(out[1].logprob == 0.0);
  CHECK(out[1].top.empty());
  REQUIRE(prev.has_value());
  CHECK(*prev == 7);
}

TEST_CASE("responses request: include turns logprobs on; top_logprobs is range checked") {
  auto on = parse_request(ApiKind::responses, R"({"model":"m","input":"hi",
      "include":["message.output_text.logprobs"],"top_logprobs":3})");
  REQUIRE(on.ok());
  CHECK(on.value().sampling.logprobs);
  CHECK(on.value().sampling.top_logprobs == 3);
  auto off = parse_request(ApiKind::responses, R"({"model":"m","input":"hi","top_logprobs":3})");
  REQUIRE(off.ok());
  CHECK_FALSE(off.value().sampling.logprobs);
  auto bad = parse_request(ApiKind::responses, R"({"model":"m","input":"hi",
      "include":["message.output_text.logprobs"],"top_logprobs":21})");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().param == "top_logprobs");
}

TEST_CASE("chat logprobs ride on reasoning and tool-call chunks too (every token listed)") {
  std::vector<GenEvent> events = {LogprobsDelta{{lp("<think>", -0.1)}},
                                  LogprobsDelta{{lp("hm", -0.2)}},
                                  ReasoningDelta{"hm"},
                                  LogprobsDelta{{lp("<tool>", -0.3)}},
                                  ToolCallStart{0, "call_1", "f"},
                                  LogprobsDelta{{lp("{}", -0.4)}},
                                  ToolCallArgsDelta{0, "{}"},
                                  Finish{FinishReason::stop, ""},
                                  UsageReport{Usage{5, 0, 4, 2}}};
  auto chunks = data_chunks(run(ApiKind::chat_completions, logprob_options(true), events));
  // role, reasoning, tool start, tool args, finish, usage
  REQUIRE(chunks.size() == 6);
  auto tokens = [&chunks](size_t i) {
    std::vector<std::string> out;
    for (const json& e : chunks[i]["choices"][0]["logprobs"]["content"]) out.push_back(e["token"]);
    return out;
  };
  CHECK(tokens(1) == std::vector<std::string>{"<think>", "hm"});
  CHECK(tokens(2) == std::vector<std::string>{"<tool>"});
  CHECK(tokens(3) == std::vector<std::string>{"{}"});
  CHECK(tokens(4).empty());
  std::string body;
  run(ApiKind::chat_completions, logprob_options(false), events, &body);
  CHECK(json::parse(body)["choices"][0]["logprobs"]["content"].size() == 4);
}

TEST_CASE("completions logprobs: each top_logprobs dict lists the most probable key first") {
  // "b" is more probable than "a": a sorted (std::map) object would write "a" first.
  std::vector<TokenLogprobs> tokens = {{"b", -0.1, {{"b", -0.1}, {"a", -2.0}, {"c", -3.0}}}};
  std::vector<int64_t> offsets = {0};
  std::string text = completion_logprobs_json(tokens, offsets).dump();
  CHECK(text.find(R"({"b":-0.1,"a":-2.0,"c":-3.0})") != std::string::npos);
  // And in a rendered body: keys in the order the API documents (id, object, ...).
  RenderOptions o = logprob_options(false);
  std::string body;
  run(ApiKind::completions, o, logprob_script(), &body);
  CHECK(body.rfind(R"({"id":")", 0) == 0);
  CHECK(body.find(R"("tokens":)") < body.find(R"("token_logprobs":)"));
}

TEST_CASE("finish and usage chunks: the same bytes as the JSON objects they stand for") {
  // The chat and completions renderers write these around their variable parts; each must
  // equal the dump of the object it stands for: every finish reason, usage fields that differ
  // (a swapped field fails), a model name that needs escaping.
  using ojson = nlohmann::ordered_json;
  for (const std::string model : {"minimax-m2", "we\"ird\\model \xff"}) {
    RenderOptions o = options(true);
    o.model = model;
    for (FinishReason reason : {FinishReason::stop, FinishReason::length,
                                FinishReason::stop_string}) {
      CAPTURE(model);
      CAPTURE(static_cast<int>(reason));
      std::vector<GenEvent> events = {TextDelta{"hi"}, Finish{reason, ""},
                                      UsageReport{{97, 31, 13, 4}}};
      const char* want_reason = reason == FinishReason::length ? "length" : "stop";
      json usage = {{"prompt_tokens", 97},
                    {"completion_tokens", 13},
                    {"total_tokens", 110},
                    {"prompt_tokens_details", {{"cached_tokens", 31}}},
                    {"completion_tokens_details", {{"reasoning_tokens", 4}}}};
      IdGenerator probe(seed);
      std::string chat_id = probe.next("chatcmpl-");
      auto chat = split_sse(run(ApiKind::chat_completions, o, events));
      REQUIRE(chat.size() == 5);  // role, text, finish, usage, [DONE]
      json finish = {{"id", chat_id}, {"object", "chat.completion.chunk"},
                     {"created", 1700000000}, {"model", model},
                     {"choices", json::array({{{"index", 0}, {"delta", json::object()},
                                               {"logprobs", nullptr},
                                               {"finish_reason", want_reason}}})}};
      CHECK(chat[2].data == finish.dump(-1, ' ', false, json::error_handler_t::replace));
      json chat_usage = {{"id", chat_id}, {"object", "chat.completion.chunk"},
                         {"created", 1700000000}, {"model", model},
                         {"choices", json::array()}, {"usage", usage}};
      CHECK(chat[3].data == chat_usage.dump(-1, ' ', false, json::error_handler_t::replace));
      CHECK(chat[4].data == "[DONE]");
      IdGenerator probe2(seed);
      std::string cmpl_id = probe2.next("cmpl-");
      auto cmpl = split_sse(run(ApiKind::completions, o, events));
      REQUIRE(cmpl.size() == 4);  // text, finish, usage, [DONE]
      ojson cmpl_finish = {{"id", cmpl_id}, {"object", "text_completion"},
                           {"created", 1700000000}, {"model", model},
                           {"choices", ojson::array({{{"index", 0}, {"text", ""},
                                                      {"logprobs", nullptr},
                                                      {"finish_reason", want_reason}}})}};
      CHECK(cmpl[1].data == cmpl_finish.dump(-1, ' ', false, ojson::error_handler_t::replace));
      json cmpl_usage = {{"id", cmpl_id}, {"object", "text_completion"},
                         {"created", 1700000000}, {"model", model},
                         {"choices", json::array()}, {"usage", usage}};
      CHECK(cmpl[2].data == cmpl_usage.dump(-1, ' ', false, json::error_handler_t::replace));
      CHECK(cmpl[3].data == "[DONE]");
    }
  }
  for (const Usage& u : {Usage{0, 0, 0, 0}, Usage{1, 0, 2, 0}, Usage{123456789, 5, 7, 7}}) {
    CHECK(chat_usage_text(u) == chat_usage_json(u).dump());
  }
}

TEST_CASE("per-token chunks: the same bytes as the JSON object they stand for, any text") {
  // Quotes, backslashes, control characters, a DEL, unicode, an invalid UTF-8 byte (replaced),
  // a lone surrogate's bytes: chat and completions chunks are what serializing the full
  // object gives (the renderers write the per-token chunk around the escaped text).
  const std::vector<std::string> texts = {"plain", "\"quoted\" \\ back", "tab\tnl\ncr\r\x01\x1f",
                                          "\x7f del", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
                                          "bad \xff byte", "\xed\xa0\x80 surrogate", "</script>"};
  IdGenerator probe(seed);
  std::string chat_id = probe.next("chatcmpl-");
  IdGenerator probe2(seed);
  std::string cmpl_id = probe2.next("cmpl-");
  for (const std::string& text : texts) {
    CAPTURE(text);
    std::vector<GenEvent> events = {TextDelta{text}, ReasoningDelta{text},
                                    Finish{FinishReason::stop, ""}, UsageReport{{1, 0, 2, 0}}};
    auto chat = split_sse(run(ApiKind::chat_completions, options(true), events));
    REQUIRE(chat.size() >= 3);
    for (int i : {1, 2}) {
      const char* key = i == 1 ? "content" : "reasoning_content";
      json choice = {{"index", 0}, {"delta", {{key, text}}}, {"logprobs", nullptr},
                     {"finish_reason", nullptr}};
      json want = {{"id", chat_id}, {"object", "chat.completion.chunk"},
                   {"created", 1700000000}, {"model", "minimax-m2"},
                   {"choices", json::array({choice})}};
      CHECK(chat[size_t(i)].data == want.dump(-1, ' ', false, json::error_handler_t::replace));
    }
    auto cmpl = split_sse(run(ApiKind::completions, options(true), events));
    REQUIRE(cmpl.size() >= 2);
    using ojson = nlohmann::ordered_json;
    ojson choice = {{"index", 0}, {"text", text}, {"logprobs", nullptr},
                    {"finish_reason", nullptr}};
    ojson want = {{"id", cmpl_id}, {"object", "text_completion"}, {"created", 1700000000},
                  {"model", "minimax-m2"}, {"choices", ojson::array({choice})}};
    CHECK(cmpl[0].data == want.dump(-1, ' ', false, ojson::error_handler_t::replace));
    // Anthropic: the text delta (block 0) and the thinking delta (block 1, opened after the
    // text block closes), each byte-equal to the dump of its event object.
    std::vector<json> deltas;
    for (const SseEvent& e : split_sse(run(ApiKind::messages, options(true), events))) {
      if (e.name != "content_block_delta") continue;
      json d = json::parse(e.data);
      deltas.push_back(d);
      CHECK(e.data == d.dump(-1, ' ', false, json::error_handler_t::replace));
    }
    REQUIRE(deltas.size() == 2);
    // Responses: output_text and reasoning_text deltas, each byte-equal to its dump.
    size_t responses_deltas = 0;
    for (const SseEvent& e : split_sse(run(ApiKind::responses, options(true), events))) {
      if (e.name != "response.output_text.delta" && e.name != "response.reasoning_text.delta") {
        continue;
      }
      ++responses_deltas;
      json d = json::parse(e.data);
      CHECK(e.data == d.dump(-1, ' ', false, json::error_handler_t::replace));
      CHECK(d["delta"] == json::parse(json(text).dump(-1, ' ', false,
                                                      json::error_handler_t::replace)));
      CHECK(d["type"] == e.name);
      CHECK(d.contains("sequence_number"));
      CHECK(d.contains("logprobs") == (e.name == "response.output_text.delta"));
    }
    CHECK(responses_deltas == 2);
    json text_want = {{"type", "content_block_delta"}, {"index", 0},
                      {"delta", {{"type", "text_delta"}, {"text", text}}}};
    json thinking_want = {{"type", "content_block_delta"}, {"index", 1},
                          {"delta", {{"type", "thinking_delta"}, {"thinking", text}}}};
    CHECK(deltas[0].dump(-1, ' ', false, json::error_handler_t::replace) ==
          text_want.dump(-1, ' ', false, json::error_handler_t::replace));
    CHECK(deltas[1].dump(-1, ' ', false, json::error_handler_t::replace) ==
          thinking_want.dump(-1, ' ', false, json::error_handler_t::replace));
  }
}
