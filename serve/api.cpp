#include "serve/api.h"

#include <fmt/format.h>

#include "serve/tokenizer.h"

namespace tandem::serve {

using nlohmann::json;

std::string ApiError::body() const {
  json e = {
      {"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)}, {"code", status}};
  return json{{"error", e}}.dump();
}

namespace {

struct Refusal {
  ApiError e;
};
[[noreturn]] void refuse(std::string param, std::string message) {
  throw Refusal{{400, std::move(message), std::move(param)}};
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "a list";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a number";
    default: return "an integer";
  }
}

bool get_bool(const json& o, const char* key, bool fallback) {
  const auto it = o.find(key);
  if (it == o.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) refuse(key, fmt::format("'{}' must be a boolean, not {}", key, type_name(*it)));
  return it->get<bool>();
}

std::optional<int64_t> get_int(const json& o, const char* key) {
  const auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) refuse(key, fmt::format("'{}' must be an integer, not {}", key, type_name(*it)));
  return it->get<int64_t>();
}

std::optional<double> get_number(const json& o, const char* key) {
  const auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) refuse(key, fmt::format("'{}' must be a number, not {}", key, type_name(*it)));
  return it->get<double>();
}

std::vector<Token> token_ids(const json& list, const ApiLimits& limits) {
  std::vector<Token> ids;
  ids.reserve(list.size());
  for (const json& t : list) {
    if (!t.is_number_integer())
      refuse("prompt", fmt::format("a prompt's token ids must be integers, not {}", type_name(t)));
    const int64_t v = t.get<int64_t>();
    if (v < 0 || v >= limits.vocab)
      refuse("prompt", fmt::format("token id {} is outside the model's vocabulary [0, {})", v, limits.vocab));
    ids.push_back(Token(v));
  }
  return ids;
}

// prompt: a string, a list of token ids, or a list of either.
std::vector<std::vector<Token>> prompts_of(const json& p, const ApiLimits& limits) {
  std::vector<std::vector<Token>> out;
  if (p.is_string()) {
    out.push_back(encode_text(p.get_ref<const std::string&>()));
  } else if (p.is_array() && !p.empty() && p.front().is_number_integer()) {
    out.push_back(token_ids(p, limits));
  } else if (p.is_array() && !p.empty()) {
    if (int64_t(p.size()) > limits.max_prompts)
      refuse("prompt", fmt::format("{} prompts in one request; at most {}", p.size(), limits.max_prompts));
    for (const json& one : p) {
      if (one.is_string())
        out.push_back(encode_text(one.get_ref<const std::string&>()));
      else if (one.is_array())
        out.push_back(token_ids(one, limits));
      else
        refuse("prompt",
               fmt::format("each prompt of a list must be a string or a list of token ids, not {}", type_name(one)));
    }
  } else {
    refuse("prompt", fmt::format("'prompt' must be a string, a list of token ids, or a list of either, not {}",
                                 p.is_array() ? "an empty list" : type_name(p)));
  }
  return out;
}

std::vector<Token> chat_prompt(const json& msgs) {
  if (!msgs.is_array() || msgs.empty())
    refuse("messages", fmt::format("'messages' must be a non-empty list, not {}",
                                   msgs.is_array() ? "an empty list" : type_name(msgs)));
  std::vector<ChatMessage> ms;
  for (const json& m : msgs) {
    if (!m.is_object()) refuse("messages", fmt::format("each message must be an object, not {}", type_name(m)));
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) refuse("messages", "each message needs a 'role' string");
    ChatMessage cm{role->get<std::string>(), {}};
    const auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
    } else if (content->is_string()) {
      cm.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (const json& part : *content) {
        const bool text_part = part.is_object() && part.contains("type") && part["type"].is_string() &&
                               part["type"].get_ref<const std::string&>() == "text" && part.contains("text") &&
                               part["text"].is_string();
        if (!text_part)
          refuse("messages", "a message's content parts must be {\"type\": \"text\", \"text\": STRING} (text only)");
        cm.content += part["text"].get<std::string>();
      }
    } else {
      refuse("messages", fmt::format("a message's 'content' must be a string or a list of text parts, not {}",
                                     type_name(*content)));
    }
    ms.push_back(std::move(cm));
  }
  return encode_text(apply_chat_template(ms));
}

}  // namespace

std::variant<Ask, ApiError> parse_ask(std::string_view body, bool chat, const ApiLimits& limits) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) return ApiError{400, "the request body is not valid JSON", ""};
  if (!j.is_object())
    return ApiError{400, fmt::format("the request body must be a JSON object, not {}", type_name(j)), ""};
  try {
    Ask a;
    a.chat = chat;
    if (const auto m = j.find("model"); m != j.end() && !m->is_null()) {
      if (!m->is_string()) refuse("model", fmt::format("'model' must be a string, not {}", type_name(*m)));
      a.model = m->get<std::string>();
    }
    if (chat) {
      if (!j.contains("messages")) refuse("messages", "'messages' is required");
      a.prompts.push_back(chat_prompt(j["messages"]));
    } else {
      if (!j.contains("prompt")) refuse("prompt", "'prompt' is required");
      a.prompts = prompts_of(j["prompt"], limits);
    }
    for (const auto& p : a.prompts)
      if (int64_t(p.size()) > limits.max_prompt_tokens)
        refuse(chat ? "messages" : "prompt",
               fmt::format("a prompt of {} tokens; at most {}", p.size(), limits.max_prompt_tokens));
    std::optional<int64_t> max_tokens = get_int(j, chat ? "max_completion_tokens" : "max_tokens");
    const char* max_key = chat && max_tokens ? "max_completion_tokens" : "max_tokens";
    if (chat && !max_tokens) max_tokens = get_int(j, "max_tokens");
    if (!max_tokens) {  // as vLLM: 16 for completions, what the context leaves for chat
      max_tokens = chat ? std::max<int64_t>(1, limits.max_model_len - int64_t(a.prompts[0].size())) : 16;
    }
    if (*max_tokens < 1) refuse(max_key, fmt::format("'{}' must be at least 1, not {}", max_key, *max_tokens));
    if (*max_tokens > limits.max_model_len)
      refuse(max_key, fmt::format("'{}' is {}: more than the model's context ({} tokens, prompt included)", max_key,
                                  *max_tokens, limits.max_model_len));
    a.max_tokens = int32_t(*max_tokens);
    a.stream = get_bool(j, "stream", false);
    if (const auto so = j.find("stream_options"); so != j.end() && !so->is_null()) {
      if (!so->is_object())
        refuse("stream_options", fmt::format("'stream_options' must be an object, not {}", type_name(*so)));
      if (!a.stream) refuse("stream_options", "'stream_options' is only allowed with 'stream': true");
      a.include_usage = get_bool(*so, "include_usage", false);
    }
    get_bool(j, "ignore_eos", false);  // tandem always ignores EOS (dummy weights): accepted either way
    a.return_token_ids = get_bool(j, "return_token_ids", false);
    if (const auto t = get_number(j, "temperature"); t && *t != 0.0)
      refuse("temperature", fmt::format("temperature {}: tandem samples greedily, so only 0 is served", *t));
    if (const auto n = get_int(j, "n"); n && *n != 1) refuse("n", fmt::format("n {}: only n = 1 is served", *n));
    if (const auto b = get_int(j, "best_of"); b && *b != 1) refuse("best_of", "only best_of = 1 is served");
    if (const auto r = get_number(j, "repetition_penalty"); r && *r != 1.0)
      refuse("repetition_penalty", "tandem samples greedily: only repetition_penalty 1 is served");
    for (const char* key : {"logprobs", "top_logprobs", "stop", "tools", "response_format", "logit_bias", "suffix"})
      if (const auto it = j.find(key); it != j.end() && !it->is_null() && !(it->is_boolean() && !it->get<bool>()) &&
                                       !(it->is_array() && it->empty()))
        refuse(key, fmt::format("'{}' is not served by tandem (it emulates timing with dummy weights)", key));
    if (get_bool(j, "echo", false)) refuse("echo", "'echo' is not served");
    return a;
  } catch (const Refusal& r) {
    return r.e;
  } catch (const json::exception& e) {  // a shape no check above expected: still the client's input
    return ApiError{400, fmt::format("the request body has a field of an unexpected type: {}", e.what()), ""};
  }
}

}  // namespace tandem::serve
