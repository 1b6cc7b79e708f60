#include "sim/base/csv.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "sim/base/parse_number.h"

namespace tandem {

void split_csv_line(const std::string& line, std::vector<std::string>& out) {
  out.clear();
  size_t start = 0;
  for (;;) {
    const size_t comma = line.find(',', start);
    std::string f = line.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t a = f.find_first_not_of(" \t\r"), b = f.find_last_not_of(" \t\r");
    out.push_back(a == std::string::npos ? std::string() : f.substr(a, b - a + 1));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
}

void require_regular_file(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) throw InputError(fmt::format("{}: cannot open file (no such file)", path));
  if (!std::filesystem::is_regular_file(st)) throw InputError(fmt::format("{}: not a regular file", path));
}

CsvFile::CsvFile(const std::string& path) : path_(path) {
  require_regular_file(path);
  in_.open(path);
  if (!in_) throw InputError(fmt::format("{}: cannot open file", path));
  std::string line;
  while (std::getline(in_, line)) {
    ++line_;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (line_ == 1 && line.size() >= 3 && line.compare(0, 3, "\xEF\xBB\xBF") == 0) line.erase(0, 3);  // BOM
    split_csv_line(line, header_);
    // A repeated column would be read from its first copy and the other ignored: refused.
    std::unordered_map<std::string_view, size_t> seen;
    for (size_t i = 0; i < header_.size(); ++i) {
      if (header_[i].empty()) continue;
      const auto [it, fresh] = seen.emplace(header_[i], i);
      if (!fresh)
        throw InputError(fmt::format("{}:{}: column '{}' appears twice in the header (columns {} and {})", path, line_,
                                     header_[i], it->second + 1, i + 1));
    }
    return;
  }
  throw InputError(fmt::format("{}: empty file (expected a header row)", path));
}

size_t CsvFile::column_index(const std::string& name) const {
  for (size_t i = 0; i < header_.size(); ++i)
    if (header_[i] == name) return i;
  return npos;
}

std::string CsvFile::header_text() const {
  std::string s;
  for (const auto& h : header_) s.append(s.empty() ? "" : ",").append(h);
  return s;
}

bool CsvFile::next(std::vector<std::string>& row) {
  std::string line;
  while (std::getline(in_, line)) {
    ++line_;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    split_csv_line(line, row);
    if (row.size() != header_.size())
      throw InputError(fmt::format("{}:{}: expected {} fields ({}), got {}", path_, line_, header_.size(),
                                   header_text(), row.size()));
    return true;
  }
  return false;
}

void CsvFile::fail(size_t col, const std::string& what) const {
  throw InputError(
      fmt::format("{}:{}: column '{}': {}", path_, line_, col < header_.size() ? header_[col] : "?", what));
}

double CsvFile::number(const std::vector<std::string>& row, size_t col, double lo, double hi) const {
  const std::string& s = row[col];
  double v = 0;
  if (!parse_double(s, v)) fail(col, fmt::format("expected a number, got '{}'", s));
  if (v < lo || v > hi) fail(col, fmt::format("{} is out of range [{}, {}]", s, lo, hi));
  return v;
}

}  // namespace tandem
