// Minimal CSV reading for traces and length files: a header row, comma-separated fields,
// no quoting (none of the supported formats quote). Errors name file, line and column.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace tandem {

class CsvFile {
 public:
  static constexpr size_t npos = static_cast<size_t>(-1);
  explicit CsvFile(const std::string& path);
  size_t column_index(const std::string& name) const;
  std::string header_text() const;
  // Next data row (blank lines skipped). False at end of file.
  bool next(std::vector<std::string>& row);
  int64_t line() const { return line_; }
  const std::string& path() const { return path_; }
  // Field `col` of `row` as a number in [lo, hi]; errors name file:line and the column.
  double number(const std::vector<std::string>& row, size_t col, double lo, double hi) const;
  [[noreturn]] void fail(size_t col, const std::string& what) const;

 private:
  std::string path_;
  std::ifstream in_;
  std::vector<std::string> header_;
  int64_t line_ = 0;
};

void split_csv_line(const std::string& line, std::vector<std::string>& out);

// Throws InputError unless `path` is a readable regular file (not a folder, not a device
// like /dev/zero that never ends).
void require_regular_file(const std::string& path);

}  // namespace tandem
