#pragma once
// Minimal RFC 4180 CSV: fields with commas, quotes or newlines are quoted; '#' lines are comments.
#include <string>
#include <vector>

namespace kvsim {

std::string csv_field(const std::string& s);
std::string csv_line(const std::vector<std::string>& fields);
// Splits one line (no embedded newlines) into fields, undoing the quoting.
std::vector<std::string> parse_csv_line(const std::string& line);

}  // namespace kvsim
