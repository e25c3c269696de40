// Chat Completions and Completions request parsing (declared in api_request.hpp).
#include "actors/gateway/api_request.hpp"
#include "actors/gateway/request_common.hpp"

namespace tandem::gateway {
namespace {

// function.arguments: a string holding a JSON object (or, leniently, the object itself).
std::string read_arguments(FieldReader& r, const json& function, const std::string& path) {
  std::string p = path_key(path, "arguments");
  const json* args = r.required(function, "arguments", path);
  if (args == nullptr) return {};
  if (args->is_object()) return args->dump();
  if (args->is_string()) {
    json parsed = json::parse(args->get<std::string>(), nullptr, false);
    if (!parsed.is_discarded() && parsed.is_object()) return args->get<std::string>();
  }
  r.fail_invalid(p, p + " must be a JSON object encoded as a string");
  return {};
}

void read_assistant_tool_calls(FieldReader& r, const json& m, const std::string& path,
                               ChatMessage& msg) {
  const json* calls = r.array(m, "tool_calls", path);
  if (calls == nullptr) return;
  std::string calls_path = path_key(path, "tool_calls");
  for (size_t i = 0; i < calls->size() && !r.failed(); ++i) {
    std::string p = path_index(calls_path, i);
    const json& call = (*calls)[i];
    if (!call.is_object()) return r.fail_invalid(p, p + " must be an object");
    auto type = r.string(call, "type", p);
    if (type && *type != "function") {
      return r.fail(unsupported(path_key(p, "type"),
                                path_key(p, "type") + " must be 'function', got '" + *type + "'"));
    }
    ToolCall tc;
    tc.id = r.string(call, "id", p).value_or("");
    r.required(call, "function", p);
    const json* function = r.object(call, "function", p);
    if (function == nullptr) return;
    std::string fp = path_key(p, "function");
    r.required(*function, "name", fp);
    tc.name = r.string(*function, "name", fp).value_or("");
    tc.arguments_json = read_arguments(r, *function, fp);
    msg.tool_calls.push_back(std::move(tc));
  }
}

ChatMessage read_chat_message(FieldReader& r, const json& m, const std::string& path) {
  ChatMessage msg;
  if (!m.is_object()) {
    r.fail_invalid(path, path + " must be an object, got " + json_type_name(m));
    return msg;
  }
  r.required(m, "role", path);
  std::string role = r.string(m, "role", path).value_or("");
  if (r.failed()) return msg;
  if (role == "system" || role == "developer") {
    msg.role = ChatRole::system;
  } else if (role == "user") {
    msg.role = ChatRole::user;
  } else if (role == "assistant") {
    msg.role = ChatRole::assistant;
  } else if (role == "tool") {
    msg.role = ChatRole::tool;
  } else {
    r.fail_invalid(path_key(path, "role"), path_key(path, "role") +
                                               " must be one of system, developer, user, "
                                               "assistant, tool; got '" +
                                               role + "'");
    return msg;
  }
  std::string content_path = path_key(path, "content");
  if (msg.role != ChatRole::assistant) r.required(m, "content", path);
  if (!r.failed() && m.contains("content")) {
    msg.content = read_text_content(r, m["content"], content_path, {"text"});
  }
  if (msg.role == ChatRole::assistant) {
    if (auto v = r.string(m, "reasoning_content", path)) msg.reasoning = *v;
    if (auto v = r.string(m, "reasoning", path)) msg.reasoning = *v;
    read_assistant_tool_calls(r, m, path, msg);
  }
  if (msg.role == ChatRole::tool) {
    r.required(m, "tool_call_id", path);
    msg.tool_call_id = r.string(m, "tool_call_id", path).value_or("");
    msg.name = r.string(m, "name", path).value_or("");
  }
  return msg;
}

void read_chat_tools(FieldReader& r, const json& root, GenerateSpec& spec) {
  const json* tools = r.array(root, "tools", "");
  if (tools == nullptr) return;
  for (size_t i = 0; i < tools->size() && !r.failed(); ++i) {
    std::string p = path_index("tools", i);
    const json& tool = (*tools)[i];
    if (!tool.is_object()) return r.fail_invalid(p, p + " must be an object");
    std::string type = r.string(tool, "type", p).value_or("function");
    if (type != "function") {
      return r.fail(unsupported(path_key(p, "type"),
                                path_key(p, "type") + " must be 'function', got '" + type + "'"));
    }
    r.required(tool, "function", p);
    const json* function = r.object(tool, "function", p);
    if (function == nullptr) return;
    std::string fp = path_key(p, "function");
    r.required(*function, "name", fp);
    if (r.failed()) return;
    auto find = [function](const char* key) -> const json* {
      auto it = function->find(key);
      return it == function->end() ? nullptr : &*it;
    };
    std::string t =
        neutral_tool_json(r, (*function)["name"], find("description"), find("parameters"), fp);
    if (!r.failed()) spec.conversation.tools_json.push_back(std::move(t));
  }
}

void read_openai_tool_choice(FieldReader& r, const json& root, GenerateSpec& spec) {
  if (r.failed() || !root.contains("tool_choice") || root["tool_choice"].is_null()) return;
  const json& choice = root["tool_choice"];
  if (choice.is_string()) {
    std::string c = choice.get<std::string>();
    if (c == "auto")
      spec.tool_choice.mode = ToolChoiceMode::automatic;
    else if (c == "none")
      spec.tool_choice.mode = ToolChoiceMode::none;
    else if (c == "required")
      spec.tool_choice.mode = ToolChoiceMode::required;
    else
      return r.fail_invalid("tool_choice",
                            "tool_choice must be 'none', 'auto', 'required' "
                            "or a named function, got '" +
                                c + "'");
  } else if (choice.is_object()) {
    // Chat: {"type":"function","function":{"name":..}}; Responses: {"type":"function","name"}.
    const json* function = r.object(choice, "function", "tool_choice");
    const json& holder = function != nullptr ? *function : choice;
    std::string hp = function != nullptr ? "tool_choice.function" : "tool_choice";
    r.required(holder, "name", hp);
    spec.tool_choice = {ToolChoiceMode::named, r.string(holder, "name", hp).value_or("")};
  } else {
    return r.fail_invalid(
        "tool_choice", "tool_choice must be a string or an object, got " + json_type_name(choice));
  }
  bool needs_tools = spec.tool_choice.mode == ToolChoiceMode::required ||
                     spec.tool_choice.mode == ToolChoiceMode::named;
  if (needs_tools && spec.conversation.tools_json.empty()) {
    return r.fail_invalid("tool_choice", "tool_choice requires tools, but none were given");
  }
  check_named_tool(r, spec, "tool_choice");
}

}  // namespace

// Shared with the Responses parser (same tool_choice shapes).
void read_tool_choice_openai(FieldReader& r, const json& root, GenerateSpec& spec) {
  read_openai_tool_choice(r, root, spec);
}

ApiResult<GenerateSpec> parse_chat_request(std::string_view body) {
  FieldReader r;
  GenerateSpec spec;
  spec.api = ApiKind::chat_completions;
  std::optional<json> root_opt = parse_body(r, body);
  if (!root_opt) return r.error();
  const json& root = *root_opt;
  read_model(r, root, spec);
  r.required(root, "messages", "");
  const json* messages = r.array(root, "messages", "");
  if (messages != nullptr && messages->empty()) {
    r.fail_invalid("messages", "messages must contain at least one message");
  }
  for (size_t i = 0; messages != nullptr && i < messages->size() && !r.failed(); ++i) {
    spec.conversation.messages.push_back(
        read_chat_message(r, (*messages)[i], path_index("messages", i)));
  }
  read_chat_tools(r, root, spec);
  read_openai_tool_choice(r, root, spec);
  read_sampling(r, root, 2.0, spec.sampling);
  read_logprobs_chat(r, root, spec.sampling);
  read_stop(r, root, "stop", spec.sampling);
  read_max_tokens(r, root, "max_completion_tokens", spec);
  read_max_tokens(r, root, "max_tokens", spec);
  read_stream_and_salt(r, root, spec);
  if (auto v = r.string(root, "reasoning_effort", "")) spec.reasoning.effort = *v;
  check_ignored_fields(r, root,
                       {{"user", JsonKind::string},
                        {"metadata", JsonKind::object},
                        {"parallel_tool_calls", JsonKind::boolean},
                        {"store", JsonKind::boolean},
                        {"service_tier", JsonKind::string},
                        {"prompt_cache_key", JsonKind::string},
                        {"safety_identifier", JsonKind::string},
                        {"response_format", JsonKind::object},
                        {"logit_bias", JsonKind::object},
                        {"modalities", JsonKind::array},
                        {"prediction", JsonKind::object},
                        {"audio", JsonKind::object},
                        {"verbosity", JsonKind::string},
                        {"web_search_options", JsonKind::object}});
  if (r.failed()) return r.error();
  fill_tool_names(spec.conversation);
  RT_ASSERT(!spec.conversation.messages.empty(), "validated above");
  RT_ASSERT(!spec.model.empty(), "validated above");
  return spec;
}

namespace {

bool read_token_ids(FieldReader& r, const json& ids, const std::string& path,
                    std::vector<int64_t>& out) {
  for (size_t i = 0; i < ids.size(); ++i) {
    const json& id = ids[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0) {
      r.fail_invalid(path_index(path, i),
                     path_index(path, i) + " must be a non-negative integer token id");
      return false;
    }
    out.push_back(id.get<int64_t>());
  }
  return true;
}

void read_prompt(FieldReader& r, const json& root, GenerateSpec& spec) {
  const json* prompt = r.required(root, "prompt", "");
  if (prompt == nullptr) return;
  const json* one = prompt;
  std::string p = "prompt";
  if (prompt->is_array() && !prompt->empty() && !(*prompt)[0].is_number()) {
    if (prompt->size() != 1) {
      return r.fail(unsupported("prompt",
                                "prompt must be one prompt (batches are not "
                                "supported), got " +
                                    std::to_string(prompt->size())));
    }
    one = &(*prompt)[0];
    p = "prompt[0]";
  }
  if (one->is_string()) {
    spec.prompt_kind = PromptKind::text;
    spec.prompt_text = one->get<std::string>();
    if (spec.prompt_text.empty()) r.fail_invalid(p, p + " must not be empty");
  } else if (one->is_array()) {
    spec.prompt_kind = PromptKind::token_ids;
    if (one->empty()) return r.fail_invalid(p, p + " must not be empty");
    read_token_ids(r, *one, p, spec.prompt_token_ids);
  } else {
    r.fail_invalid(p,
                   p + " must be a string or an array of token ids, got " + json_type_name(*one));
  }
}

void read_completion_extras(FieldReader& r, const json& root, GenerateSpec& spec) {
  if (auto v = r.boolean(root, "echo", "")) spec.echo = *v;
  if (auto v = r.string(root, "suffix", ""); v && !v->empty()) {
    r.fail(unsupported("suffix", "suffix is not supported"));
  }
  if (auto v = r.integer(root, "best_of", ""); v && *v != 1) {
    r.fail(unsupported("best_of", "best_of must be 1, got " + std::to_string(*v)));
  }
  if (auto v = r.integer(root, "logprobs", "")) {
    if (*v < 0 || *v > 5) {
      return r.fail_invalid("logprobs", "logprobs must be in [0, 5], got " + std::to_string(*v));
    }
    spec.sampling.logprobs = true;
    spec.sampling.top_logprobs = *v;
  }
}

}  // namespace

ApiResult<GenerateSpec> parse_completion_request(std::string_view body) {
  FieldReader r;
  GenerateSpec spec;
  spec.api = ApiKind::completions;
  std::optional<json> root_opt = parse_body(r, body);
  if (!root_opt) return r.error();
  const json& root = *root_opt;
  read_model(r, root, spec);
  read_prompt(r, root, spec);
  read_sampling(r, root, 2.0, spec.sampling);
  read_completion_extras(r, root, spec);
  read_stop(r, root, "stop", spec.sampling);
  read_max_tokens(r, root, "max_tokens", spec);
  read_stream_and_salt(r, root, spec);
  check_ignored_fields(r, root, {{"user", JsonKind::string}, {"logit_bias", JsonKind::object}});
  if (r.failed()) return r.error();
  if (!spec.max_tokens) {
    spec.max_tokens = 16;  // the OpenAI Completions default
    spec.max_tokens_param = "max_tokens";
  }
  RT_ASSERT(spec.prompt_kind != PromptKind::conversation, "completions take a raw prompt");
  RT_ASSERT(!spec.prompt_text.empty() || !spec.prompt_token_ids.empty(), "validated above");
  return spec;
}

}  // namespace tandem::gateway
