// The OpenAI request bodies tandem serve takes (POST /v1/completions, /v1/chat/completions), as
// `vllm bench serve` and the `openai` SDK send them, checked into one Ask, and the error object
// every refusal answers with. Parsing is a pure function of the body and the limits: the HTTP
// side calls it before anything is given to the engine.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/request.h"

namespace tandem::serve {

// An OpenAI-style error: HTTP status and {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // the request field at fault, "" when none
  std::string type = "invalid_request_error";
  std::string body() const;
};

struct ApiLimits {
  int32_t vocab = 0;          // token ids must be below it
  int32_t max_model_len = 0;  // chat's default max_tokens: what the context leaves
  int32_t max_prompts = 64;   // prompts in one completions request (a list of prompts)
  int64_t max_prompt_tokens = 1 << 20;
};

// One checked request: one engine request per prompt (choice index = position).
struct Ask {
  bool chat = false;
  std::vector<std::vector<Token>> prompts;
  int32_t max_tokens = 16;
  bool stream = false;
  bool include_usage = false;
  bool return_token_ids = false;  // vLLM's extension: each choice's token_ids
  std::string model;
};

std::variant<Ask, ApiError> parse_ask(std::string_view body, bool chat, const ApiLimits& limits);

}  // namespace tandem::serve
