// A checked view of a YAML node: every read names the field by its dotted path, and every
// error carries file:line:column (or the --set override it came from).
#pragma once
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

namespace tandem {

struct YamlSource {
  std::string file;
  std::vector<std::string> override_keys;   // dotted paths replaced by --set
  std::vector<std::string> override_texts;  // "key=value" as given, for messages
};

class Field {
 public:
  Field(YAML::Node node, std::string path, const YamlSource* src, YAML::Mark parent_mark = YAML::Mark::null_mark())
      : node_(std::move(node)), path_(std::move(path)), src_(src), parent_mark_(parent_mark) {}

  const std::string& path() const { return path_; }
  bool present() const { return node_.IsDefined() && !node_.IsNull(); }
  bool is_map() const { return node_.IsMap(); }
  bool is_seq() const { return node_.IsSequence(); }
  bool is_scalar() const { return node_.IsScalar(); }
  const YAML::Node& node() const { return node_; }

  // Where this field is: "file:line:col" or "--set key=value".
  std::string where() const;
  [[noreturn]] void fail(const std::string& what) const;

  // Map access. Reject keys outside `allowed` (the error lists the known ones).
  void expect_map(const std::vector<const char*>& allowed) const;
  Field operator[](const std::string& key) const;
  bool has(const std::string& key) const { return (*this)[key].present(); }
  std::vector<Field> items() const;  // sequence elements

  std::string as_string() const;
  double as_double(double lo, double hi) const;
  int64_t as_int(int64_t lo, int64_t hi) const;
  bool as_bool() const;
  // Optional reads: the default when absent.
  double get_double(const std::string& key, double dflt, double lo, double hi) const;
  int64_t get_int(const std::string& key, int64_t dflt, int64_t lo, int64_t hi) const;
  std::string get_string(const std::string& key, const std::string& dflt) const;
  // A path value, resolved against the workload file's folder (or the current folder for --set).
  std::string as_path() const;
  // The file at `path` (from as_path) must exist and be a regular file; else this field fails,
  // `what` first, and a relative path says where it was looked for and by which rule.
  void require_file(const std::string& path, const std::string& what = "") const;
  bool from_override() const;
  // Refuses YAML tags (`!!str 50`, `!foo 50`) anywhere in this field's tree, keys included:
  // a workload's values are plain, and a tag would be ignored without a word. Also refuses
  // nesting deeper than any workload needs (an alias inside its own anchor is endless), and
  // more than max_nodes nodes (aliases of aliases expand exponentially: "billion laughs").
  void refuse_tags(int64_t max_nodes) const;
  // Keys that exclude each other, in groups (each group one way to give a thing): when the keys
  // present of exactly one group all came from --set and those of the others all from the file,
  // this mapping without the file's others (a command line overrides the file); else itself, and
  // the caller's "not both" check names the clash.
  Field prefer_overrides(const std::vector<std::vector<std::string>>& groups) const;
  // The same field (path, source) over another node, e.g. a filtered copy.
  Field with_node(YAML::Node n) const { return Field(std::move(n), path_, src_, parent_mark_); }

 private:
  void refuse_tags_at(int depth, int64_t& budget) const;

  YAML::Node node_;
  std::string path_;
  const YamlSource* src_;
  YAML::Mark parent_mark_;
};

// The first YAML document of `text`; `second` is set to where a second document starts, if
// there is one (a workload, a profile or a --set value is one document). Use this, never
// YAML::LoadAll: yaml-cpp 0.7's LoadAll loops forever on some inputs (a lone ',').
// Throws YAML::Exception on invalid YAML.
YAML::Node load_one_document(const std::string& text, std::optional<YAML::Mark>* second);
// A file's one YAML document (a workload, a sweep): invalid YAML or a second document is an
// InputError naming path:line:column; `what` names the kind of file ("a workload").
YAML::Node load_yaml_file_document(const std::string& text, const std::string& path, const char* what);

}  // namespace tandem
