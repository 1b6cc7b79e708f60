#include "sim/base/yaml_reader.h"

#include <yaml-cpp/eventhandler.h>

#include <sstream>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "sim/base/csv.h"
#include "sim/base/parse_number.h"

namespace tandem {

namespace {
// The field is the overridden key or inside it.
bool within(const std::string& path, const std::string& key) {
  return path == key || path.starts_with(key + ".") || path.starts_with(key + "[");
}
// ... or, for an error about a path that could not be set, above it.
bool related(const std::string& path, const std::string& key) {
  return within(path, key) || (!path.empty() && key.starts_with(path + "."));
}
}  // namespace

bool Field::from_override() const {
  for (const auto& k : src_->override_keys)
    if (within(path_, k)) return true;
  return false;
}

Field Field::prefer_overrides(const std::vector<std::vector<std::string>>& groups) const {
  if (!is_map()) return *this;
  int overridden = -1, present = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    int from_set = 0, from_file = 0;
    for (const std::string& k : groups[g])
      if (has(k)) ++((*this)[k].from_override() ? from_set : from_file);
    if (from_set + from_file == 0) continue;
    ++present;
    if (from_set > 0 && from_file > 0) return *this;  // a group given half in each place: not ours to settle
    if (from_set > 0) {
      if (overridden >= 0) return *this;  // two ways given with --set
      overridden = int(g);
    }
  }
  if (overridden < 0 || present < 2) return *this;
  YAML::Node copy = YAML::Clone(node_);
  for (size_t g = 0; g < groups.size(); ++g)
    if (int(g) != overridden)
      for (const std::string& k : groups[g]) copy.remove(k);
  return with_node(copy);
}

std::string Field::where() const {
  for (size_t i = 0; i < src_->override_keys.size(); ++i)
    if (related(path_, src_->override_keys[i])) return fmt::format("{}: --set {}", src_->file, src_->override_texts[i]);
  YAML::Mark m = node_.IsDefined() ? node_.Mark() : parent_mark_;
  if (m.is_null()) m = parent_mark_;
  if (m.is_null()) return src_->file;
  return fmt::format("{}:{}:{}", src_->file, m.line + 1, m.column + 1);
}

void Field::fail(const std::string& what) const {
  throw InputError(fmt::format("{}: field '{}': {}", where(), path_, what));
}

void Field::expect_map(const std::vector<const char*>& allowed) const {
  if (!node_.IsMap()) fail("expected a mapping");
  std::vector<std::string> seen;
  for (const auto& kv : node_) {
    if (!kv.first.IsScalar()) Field(kv.first, path_, src_, node_.Mark()).fail("a key must be a plain name");
    const std::string key = kv.first.Scalar();
    if (std::find(seen.begin(), seen.end(), key) != seen.end())
      Field(kv.first, path_.empty() ? key : path_ + "." + key, src_, node_.Mark()).fail("given twice");
    seen.push_back(key);
    bool ok = false;
    for (const char* a : allowed) ok = ok || key == a;
    if (!ok) {
      std::string known;
      for (const char* a : allowed) known.append(known.empty() ? "" : ", ").append(a);
      Field(kv.first, path_.empty() ? key : path_ + "." + key, src_, node_.Mark())
          .fail(fmt::format("unknown field (known here: {})", known));
    }
    // `key:` with nothing after it (or `key: ~`) is a mistake, not a request for the default.
    if (kv.second.IsNull())
      Field(kv.second, path_.empty() ? key : path_ + "." + key, src_, kv.first.Mark())
          .fail("empty (give a value, or remove the key for the default)");
  }
}

Field Field::operator[](const std::string& key) const {
  YAML::Node child(YAML::NodeType::Undefined);  // a missing key: not the same as an explicit null
  const YAML::Node& cnode = node_;              // const access never inserts
  if (cnode.IsMap()) {
    for (const auto& kv : cnode)                              // by hand: yaml-cpp's lookup converts every key, and a
      if (kv.first.IsScalar() && kv.first.Scalar() == key) {  // non-scalar key would throw
        child = kv.second;
        break;
      }
  }
  return Field(child, path_.empty() ? key : path_ + "." + key, src_, node_.IsDefined() ? node_.Mark() : parent_mark_);
}

void Field::refuse_tags(int64_t max_nodes) const {
  int64_t budget = max_nodes;
  refuse_tags_at(0, budget);
}

void Field::refuse_tags_at(int depth, int64_t& budget) const {
  if (depth > 32) fail("nested too deeply (an alias inside its own anchor?)");
  if (--budget < 0) fail("more values than the text holds: aliases ('*name') expand it too far");
  const std::string& tag = node_.Tag();
  // yaml-cpp: "?" for a plain node, "!" for a quoted scalar, "" for a null.
  if (!tag.empty() && tag != "?" && tag != "!")
    fail(fmt::format("YAML tags are not supported (remove '{}')",
                     tag.starts_with("tag:yaml.org,2002:") ? "!!" + tag.substr(18) : tag));
  if (node_.IsMap()) {
    for (const auto& kv : node_) {
      const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
      const std::string sub = path_.empty() ? key : path_ + "." + key;
      Field(kv.first, sub, src_, node_.Mark()).refuse_tags_at(depth + 1, budget);
      Field(kv.second, sub, src_, kv.first.Mark()).refuse_tags_at(depth + 1, budget);
    }
  } else if (node_.IsSequence()) {
    for (size_t i = 0; i < node_.size(); ++i)  // not items(): its copies of every element would be quadratic here
      Field(static_cast<const YAML::Node&>(node_)[i], fmt::format("{}[{}]", path_, i), src_, node_.Mark())
          .refuse_tags_at(depth + 1, budget);
  }
}

std::vector<Field> Field::items() const {
  if (!node_.IsSequence()) fail("expected a list");
  std::vector<Field> out;
  for (size_t i = 0; i < node_.size(); ++i)
    out.emplace_back(static_cast<const YAML::Node&>(node_)[i], fmt::format("{}[{}]", path_, i), src_, node_.Mark());
  return out;
}

std::string Field::as_string() const {
  if (!present()) fail("missing");
  if (!node_.IsScalar()) fail("expected a single value");
  return node_.Scalar();
}

double Field::as_double(double lo, double hi) const {
  const std::string s = as_string();
  double v = 0;
  if (!parse_double(s, v)) fail(fmt::format("expected a number, got '{}'", s));
  if (v < lo || v > hi) fail(fmt::format("{} is out of range [{}, {}]", s, lo, hi));
  return v;
}

int64_t Field::as_int(int64_t lo, int64_t hi) const {
  const std::string s = as_string();
  if (s.empty()) fail("expected an integer, got ''");  // std::stoll would leave `used` at 0 == size()
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size()) {
    // Accept integral values written in exponent form (1e6), nothing fractional.
    double d = 0;
    try {
      d = std::stod(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != s.size() || d != std::floor(d) || std::fabs(d) > 9e18)
      fail(fmt::format("expected an integer, got '{}'", s));
    v = static_cast<long long>(d);
  }
  if (v < lo || v > hi) fail(fmt::format("{} is out of range [{}, {}]", s, lo, hi));
  return v;
}

bool Field::as_bool() const {
  const std::string s = as_string();
  if (s == "true" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "no" || s == "off") return false;
  fail(fmt::format("expected true or false, got '{}'", s));
}

// An optional key that is there but empty (`key:` or `key: ~`) is a mistake, not a request
// for the default: nothing silently falls back.
static void refuse_null(const Field& f) {
  if (f.node().IsDefined() && f.node().IsNull()) f.fail("empty (give a value, or remove the key for the default)");
}
double Field::get_double(const std::string& key, double dflt, double lo, double hi) const {
  Field f = (*this)[key];
  refuse_null(f);
  return f.present() ? f.as_double(lo, hi) : dflt;
}
int64_t Field::get_int(const std::string& key, int64_t dflt, int64_t lo, int64_t hi) const {
  Field f = (*this)[key];
  refuse_null(f);
  return f.present() ? f.as_int(lo, hi) : dflt;
}
std::string Field::get_string(const std::string& key, const std::string& dflt) const {
  Field f = (*this)[key];
  refuse_null(f);
  if (!f.present()) return dflt;
  std::string v = f.as_string();
  if (v.empty()) f.fail("an empty string (give a value, or remove the key for the default)");
  return v;
}

// The one rule for relative paths: in a file, from that file's folder; in a --set value, from
// the current directory (where the command was typed, as the shell completes it).
std::string Field::as_path() const {
  namespace fs = std::filesystem;
  const fs::path p = as_string();
  if (p.is_absolute() || from_override()) return p.string();
  return (fs::path(src_->file).parent_path() / p).lexically_normal().string();
}

void Field::require_file(const std::string& path, const std::string& what) const {
  namespace fs = std::filesystem;
  try {
    require_regular_file(path);
  } catch (const InputError& e) {
    std::string msg = what.empty() ? e.what() : what + ": " + e.what();
    if (!fs::path(as_string()).is_absolute()) {
      std::error_code ec;
      msg += fmt::format(" (looked for {}: a relative path {})", fs::absolute(path, ec).lexically_normal().string(),
                         from_override() ? "in a --set value is taken from the current directory"
                                         : fmt::format("is taken from the folder of {}", src_->file));
    }
    fail(msg);
  }
}

namespace {
// Counts document starts and remembers where each began; the content is not built.
struct DocumentStarts final : YAML::EventHandler {
  std::vector<YAML::Mark> starts;
  void OnDocumentStart(const YAML::Mark& m) override { starts.push_back(m); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};
}  // namespace

YAML::Node load_one_document(const std::string& text, std::optional<YAML::Mark>* second) {
  YAML::Node first = YAML::Load(text);
  second->reset();
  // A second document starts after a '---' or a '...' marker: text with neither has one
  // document, and is not parsed a second time (half of a workload's parse).
  if (text.find("---") == std::string::npos && text.find("...") == std::string::npos) return first;
  // Look for a second document with the event parser, two documents at most. On input where
  // yaml-cpp makes no progress (it reports the same document again and again), the repeated
  // start is not a second document.
  std::stringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts d;
  for (int i = 0; i < 2 && parser.HandleNextDocument(d); ++i) {}
  if (d.starts.size() >= 2) {
    const YAML::Mark& a = d.starts[0];
    const YAML::Mark& b = d.starts[1];
    if (b.pos != a.pos || b.line != a.line || b.column != a.column) *second = b;
  }
  return first;
}

YAML::Node load_yaml_file_document(const std::string& text, const std::string& path, const char* what) {
  try {
    std::optional<YAML::Mark> second;
    YAML::Node root = load_one_document(text, &second);
    if (second)
      throw InputError(fmt::format("{}:{}:{}: a second YAML document ('---'); {} is one document", path,
                                   second->line + 1, second->column + 1, what));
    return root;
  } catch (const YAML::Exception& e) {
    throw InputError(fmt::format("{}:{}:{}: invalid YAML: {}", path, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
}

}  // namespace tandem
