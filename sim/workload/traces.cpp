#include "sim/workload/traces.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/json_strict.h"
#include "sim/base/csv.h"

namespace tandem {

namespace {
int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {  // H. Hinnant's algorithm
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

int64_t length_field(const CsvFile& csv, const std::vector<std::string>& row, size_t col) {
  const double v = csv.number(row, col, 0, 1e9);
  if (v != std::floor(v)) csv.fail(col, fmt::format("expected a whole number of tokens, got '{}'", row[col]));
  return static_cast<int64_t>(v);
}

size_t need_column(const CsvFile& csv, const char* name) {
  const size_t c = csv.column_index(name);
  if (c == CsvFile::npos)
    throw InputError(fmt::format("{}:1: missing column '{}' (header: {})", csv.path(), name, csv.header_text()));
  return c;
}

// prompt_token_ids: the prompt's ids, space-separated, exactly num_prefill_tokens of them.
void read_token_ids(const CsvFile& csv, const std::vector<std::string>& row, size_t col, int64_t prompt_len,
                    std::vector<Token>& pool) {
  const std::string& f = row[col];
  const size_t begin = pool.size();
  size_t i = 0;
  while (i < f.size()) {
    if (f[i] == ' ') {
      ++i;
      continue;
    }
    int64_t v = 0;
    const size_t start = i;
    while (i < f.size() && f[i] >= '0' && f[i] <= '9' && v <= INT32_MAX) v = v * 10 + (f[i++] - '0');
    if (i == start || v > INT32_MAX || (i < f.size() && f[i] != ' '))
      csv.fail(col, fmt::format("expected token ids (integers in 0..{}) separated by spaces, got '{}'", INT32_MAX,
                                f.substr(start, std::min<size_t>(f.find(' ', start) - start, 40))));
    pool.push_back(Token(v));
  }
  if (int64_t(pool.size() - begin) != prompt_len)
    csv.fail(col, fmt::format("{} token ids, but num_prefill_tokens is {}", pool.size() - begin, prompt_len));
}

std::vector<TraceRow> read_csv_trace(const TraceSpec& t, std::vector<Token>& token_pool) {
  const bool azure = t.format == TraceSpec::Format::Azure;
  CsvFile csv(t.path);
  const size_t c_t = need_column(csv, azure ? "TIMESTAMP" : "arrived_at");
  const size_t c_in = need_column(csv, azure ? "ContextTokens" : "num_prefill_tokens");
  const size_t c_out = need_column(csv, azure ? "GeneratedTokens" : "num_decode_tokens");
  const size_t c_ids = azure ? CsvFile::npos : csv.column_index("prompt_token_ids");
  std::vector<TraceRow> rows;
  std::vector<std::string> row;
  while (csv.next(row)) {
    double ts = 0;
    if (azure) {
      if (!parse_timestamp(row[c_t], ts))
        csv.fail(c_t, fmt::format("expected 'YYYY-MM-DD HH:MM:SS.fff', got '{}'", row[c_t]));
    } else {
      ts = csv.number(row, c_t, 0, 1e12);
    }
    rows.push_back({ts, length_field(csv, row, c_in), length_field(csv, row, c_out)});
    rows.back().line = csv.line();
    if (c_ids != CsvFile::npos) {
      rows.back().tokens_begin = token_pool.size();
      rows.back().has_tokens = true;
      read_token_ids(csv, row, c_ids, rows.back().prompt_len, token_pool);
    }
  }
  return rows;
}

std::vector<TraceRow> read_mooncake(const TraceSpec& t, std::vector<int64_t>& pool) {
  require_regular_file(t.path);
  std::ifstream in(t.path);
  if (!in) throw InputError(fmt::format("{}: cannot open file", t.path));
  std::vector<TraceRow> rows;
  std::string line;
  int64_t lineno = 0;
  auto fail = [&](const char* field, const std::string& what) {
    throw InputError(fmt::format("{}:{}: field '{}': {}", t.path, lineno, field, what));
  };
  auto number = [&](const nlohmann::json& j, const char* field, bool integral) -> double {
    if (!j.contains(field)) fail(field, "missing");
    const auto& v = j[field];
    if (!v.is_number()) fail(field, fmt::format("expected a number, got {}", v.dump()));
    const double d = v.get<double>();
    if (d < 0 || (integral && d != std::floor(d)))
      fail(field, fmt::format("expected a non-negative {}, got {}", integral ? "integer" : "number", v.dump()));
    if (d > (integral ? 1e9 : 1e15))
      fail(field, fmt::format("{} is out of range [0, {}]", v.dump(), integral ? "1e9" : "1e15"));
    return d;
  };
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = parse_json_strict(line);
    } catch (const JsonDuplicateKey& e) {
      fail(e.key.c_str(), "given twice in this row");
    } catch (const nlohmann::json::exception& e) {  // parse errors, and numbers past double's range (1e999)
      throw InputError(fmt::format("{}:{}: invalid JSON: {}", t.path, lineno, e.what()));
    }
    if (!j.is_object()) throw InputError(fmt::format("{}:{}: expected a JSON object", t.path, lineno));
    const double ts = number(j, "timestamp", false) / 1000.0;
    TraceRow r{ts, static_cast<int64_t>(number(j, "input_length", true)),
               static_cast<int64_t>(number(j, "output_length", true))};
    if (j.contains("hash_ids")) {
      const auto& h = j["hash_ids"];
      if (!h.is_array()) fail("hash_ids", "expected a list of non-negative integers");
      // One id per hash block of the prompt: more would name blocks the prompt does not have.
      const int64_t blocks = (r.prompt_len + t.hash_block_size - 1) / t.hash_block_size;
      if (int64_t(h.size()) > blocks)
        fail("hash_ids", fmt::format("{} ids, but input_length {} spans only {} block(s) of hash_block_size {}",
                                     h.size(), r.prompt_len, blocks, t.hash_block_size));
      r.hash_begin = static_cast<uint32_t>(pool.size());
      for (const auto& x : h) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0)
          fail("hash_ids", fmt::format("expected non-negative integers, got {}", x.dump()));
        pool.push_back(x.get<int64_t>());
      }
      r.hash_count = static_cast<uint32_t>(h.size());
    }
    rows.push_back(r);
  }
  return rows;
}
}  // namespace

bool parse_timestamp(const std::string& s, double& seconds) {
  // The exact shape first: sscanf alone would take signs, extra spaces, "nan", "inf" and hex.
  size_t i = 0;
  const auto digits = [&](size_t lo, size_t hi) {
    size_t n = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i, ++n;
    return n >= lo && n <= hi;
  };
  const auto sep = [&](char c) { return i < s.size() && s[i++] == c; };
  if (!(digits(4, 4) && sep('-') && digits(1, 2) && sep('-') && digits(1, 2) && sep(' ') && digits(1, 2) && sep(':') &&
        digits(1, 2) && sep(':') && digits(1, 2)))
    return false;
  if (i < s.size() && !(sep('.') && digits(1, 64) && i == s.size())) return false;
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, n = 0;
  double sec = 0;
  if (std::sscanf(s.c_str(), "%d-%d-%d %d:%d:%lf%n", &y, &mo, &d, &h, &mi, &sec, &n) != 6 ||
      static_cast<size_t>(n) != s.size())
    return false;
  static const int days_in[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (y < 1 || y > 9999 || mo < 1 || mo > 12 || h < 0 || h > 23 || mi < 0 || mi > 59 || !(sec >= 0 && sec < 61))
    return false;
  const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  if (d < 1 || d > days_in[mo - 1] + (mo == 2 && leap)) return false;
  seconds = static_cast<double>(days_from_civil(y, unsigned(mo), unsigned(d))) * 86400.0 + h * 3600.0 + mi * 60.0 + sec;
  return true;
}

std::vector<TraceRow> read_trace(const TraceSpec& t, std::vector<int64_t>& hash_pool) {
  std::vector<Token> token_pool;
  return read_trace(t, hash_pool, token_pool);
}

std::vector<TraceRow> read_trace(const TraceSpec& t, std::vector<int64_t>& hash_pool, std::vector<Token>& token_pool) {
  std::vector<TraceRow> rows =
      t.format == TraceSpec::Format::Mooncake ? read_mooncake(t, hash_pool) : read_csv_trace(t, token_pool);
  // Offsets from the earliest request (rows need not be sorted; none is dropped for that).
  double first = INFINITY;
  for (const TraceRow& r : rows) first = std::min(first, r.t_s);
  for (TraceRow& r : rows) r.t_s -= first;
  return rows;
}

}  // namespace tandem
