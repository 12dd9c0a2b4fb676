#include "core/csv.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "core/error.h"

namespace kvsim {

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"') out += '"';
    out += ch;
  }
  return out + "\"";
}

std::string csv_number(double x) {
  std::ostringstream os;
  os << std::setprecision(9) << x;
  return os.str();
}

std::string csv_line(const std::vector<std::string>& fields) {
  std::string line;
  for (std::size_t i = 0; i < fields.size(); ++i) line += (i ? "," : "") + csv_field(fields[i]);
  return line;
}

std::vector<std::string> parse_csv_line(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char ch = line[i];
    if (quoted) {
      if (ch == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        out.back() += '"';
        ++i;
      } else if (ch == '"') {
        quoted = false;
      } else {
        out.back() += ch;
      }
    } else if (ch == '"') {
      quoted = true;
    } else if (ch == ',') {
      out.emplace_back();
    } else if (ch != '\r') {
      out.back() += ch;
    }
  }
  return out;
}

CsvReader::CsvReader(const std::string& path, const std::vector<std::string>& required, const std::string& what)
    : path_(path), in_(std::make_unique<std::ifstream>(path)) {
  if (!*in_) throw Error(path + ": cannot open (expected " + what + ")");
  read_header(required, what);
}

CsvReader::CsvReader(std::unique_ptr<std::istream> in, const std::string& name,
                     const std::vector<std::string>& required, const std::string& what)
    : path_(name), in_(std::move(in)) {
  read_header(required, what);
}

void CsvReader::read_header(const std::vector<std::string>& required, const std::string& what) {
  std::string record;
  if (!read_record(record)) throw FormatError(path_ + ": no header line (expected " + what + ")");
  const auto f = parse_csv_line(record);
  for (std::size_t i = 0; i < f.size(); ++i)
    if (!col_.emplace(f[i], i).second)
      throw FormatError(where() + ": column '" + f[i] + "' appears twice in the header (expected " + what + ")");
  for (const auto& r : required)
    if (!col_.count(r))
      throw FormatError(where() + ": header has no column '" + r + "' (expected " + what + " with columns " +
                        csv_line(required) + ", ...)");
}

std::vector<std::string> CsvReader::columns() const {
  std::vector<std::string> out(col_.size());
  for (const auto& [name, i] : col_) out[i] = name;
  return out;
}

CsvReader::~CsvReader() = default;

bool CsvReader::read_record(std::string& record) {
  record.clear();
  std::string part;
  bool any = false;
  while (std::getline(*in_, part)) {
    ++line_;
    if (!any && (part.empty() || part[0] == '#')) continue;
    record += any ? "\n" + part : part;
    any = true;
    if (std::count(record.begin(), record.end(), '"') % 2 == 0) return true;
  }
  return any;
}

bool CsvReader::next() {
  if (!read_record(record_)) return false;
  fields_ = parse_csv_line(record_);
  if (fields_.size() != col_.size())
    throw FormatError(where() + ": " + std::to_string(fields_.size()) + " fields, expected " +
                      std::to_string(col_.size()));
  return true;
}

const std::string& CsvReader::text(const std::string& column) const {
  const auto it = col_.find(column);
  if (it == col_.end()) throw FormatError(where() + ": no column '" + column + "'");
  return fields_[it->second];
}

double CsvReader::number(const std::string& column) const {
  const std::string& s = text(column);
  try {
    std::size_t used = 0;
    const double v = std::stod(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  throw FormatError(where() + ": column '" + column + "' is '" + s + "', expected a number");
}

std::int64_t CsvReader::integer(const std::string& column) const { return csv_integer(text(column), column, where()); }

std::string CsvReader::text_or(const std::string& column, const std::string& fallback) const {
  return has(column) ? text(column) : fallback;
}
double CsvReader::number_or(const std::string& column, double fallback) const {
  return has(column) ? number(column) : fallback;
}
std::int64_t CsvReader::integer_or(const std::string& column, std::int64_t fallback) const {
  return has(column) ? integer(column) : fallback;
}

std::int64_t csv_integer(const std::string& text, const std::string& column, const std::string& where) {
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  // 2^63 is exact in a double; every whole double below it in magnitude converts exactly.
  if (text.empty() || end != text.c_str() + text.size() || !(std::abs(x) < 9223372036854775808.0) || x != std::floor(x))
    throw FormatError(where + ": column '" + column + "' is '" + text + "', expected an integer");
  return static_cast<std::int64_t>(x);
}

}  // namespace kvsim
