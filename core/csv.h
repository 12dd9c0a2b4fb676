#pragma once
// Minimal RFC 4180 CSV: fields with commas, quotes or newlines are quoted; '#' lines are comments.
#include <cstdint>
#include <istream>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kvsim {

std::string csv_field(const std::string& s);
std::string csv_line(const std::vector<std::string>& fields);
// A number as every result file writes it: 9 significant digits (reads back to the same text).
std::string csv_number(double x);
// A field as an integer: FormatError naming `where` and `column` unless it is a whole number in
// int64's range (a double such as 5e47 is never cast unchecked).
std::int64_t csv_integer(const std::string& text, const std::string& column, const std::string& where);
// Splits one line (no embedded newlines) into fields, undoing the quoting.
std::vector<std::string> parse_csv_line(const std::string& line);

// Reads a CSV with a header line, record by record: '#' lines are skipped and a quoted field may
// span lines. Errors name the file, the line and the column (`what` says which file was
// expected, e.g. "a kvsim sweep result file").
class CsvReader {
 public:
  CsvReader(const std::string& path, const std::vector<std::string>& required, const std::string& what);
  // The same over text already read (`name` stands for the file in errors).
  CsvReader(std::unique_ptr<std::istream> in, const std::string& name, const std::vector<std::string>& required,
            const std::string& what);
  ~CsvReader();
  bool next();  // the next record; false at the end of the file
  bool has(const std::string& column) const { return col_.count(column) > 0; }
  std::vector<std::string> columns() const;              // the header's names, in file order
  const std::string& record() const { return record_; }  // the current record as the file holds it
  const std::string& text(const std::string& column) const;
  double number(const std::string& column) const;         // "nan" reads as NaN
  std::int64_t integer(const std::string& column) const;  // csv_integer
  // The same for a column a file may lack (older files): `fallback` when it has none.
  std::string text_or(const std::string& column, const std::string& fallback = "") const;
  double number_or(const std::string& column, double fallback) const;
  std::int64_t integer_or(const std::string& column, std::int64_t fallback) const;
  int line() const { return line_; }
  std::string where() const { return path_ + ":" + std::to_string(line_); }

 private:
  bool read_record(std::string& record);
  std::string path_;
  std::unique_ptr<std::istream> in_;
  std::map<std::string, std::size_t> col_;
  void read_header(const std::vector<std::string>& required, const std::string& what);
  std::vector<std::string> fields_;
  std::string record_;
  int line_ = 0;
};

}  // namespace kvsim
