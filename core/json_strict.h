// JSON parsing that refuses what nlohmann::json accepts silently: a key given twice in one
// object (nlohmann keeps the last one). Used for every JSON input: Mooncake trace lines,
// checkpoint config.json and safetensors headers, summary.json.
#pragma once
#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace tandem {

struct JsonDuplicateKey : std::runtime_error {
  explicit JsonDuplicateKey(const std::string& key) : std::runtime_error(key), key(key) {}
  std::string key;
};

// Throws JsonDuplicateKey for a repeated key, nlohmann::json::exception for invalid JSON
// (including a number out of double's range, e.g. 1e999).
inline nlohmann::json parse_json_strict(std::string_view text) {
  using E = nlohmann::json::parse_event_t;
  std::vector<std::unordered_set<std::string>> open;  // keys seen in each object being parsed
  auto cb = [&](int, E ev, nlohmann::json& v) {
    if (ev == E::object_start) {
      open.emplace_back();
    } else if (ev == E::object_end) {
      if (!open.empty()) open.pop_back();
    } else if (ev == E::key && !open.empty()) {
      const std::string& k = v.get_ref<const std::string&>();
      if (!open.back().insert(k).second) throw JsonDuplicateKey(k);
    }
    return true;
  };
  return nlohmann::json::parse(text, cb);
}

// The node at a dotted path ("ttft_ms.p99") of nested objects; nullptr where a part is absent.
inline const nlohmann::json* json_at_path(const nlohmann::json& j, std::string_view dotted) {
  const nlohmann::json* cur = &j;
  size_t start = 0;
  for (;;) {
    const size_t dot = dotted.find('.', start);
    const std::string key(dotted.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (!cur->is_object() || !cur->contains(key)) return nullptr;
    cur = &(*cur)[key];
    if (dot == std::string_view::npos) return cur;
    start = dot + 1;
  }
}

}  // namespace tandem
