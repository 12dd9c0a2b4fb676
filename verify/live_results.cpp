#include "verify/live_results.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include "core/error.h"
#include "sim/csv.h"

namespace kvsim {

namespace {

// The next CSV record: lines joined while a quoted field is still open.
bool next_record(std::istream& in, std::string& record, int& line) {
  record.clear();
  std::string part;
  bool any = false;
  while (std::getline(in, part)) {
    ++line;
    if (!any && (part.empty() || part[0] == '#')) continue;
    record += any ? "\n" + part : part;
    any = true;
    if (std::count(record.begin(), record.end(), '"') % 2 == 0) return true;
  }
  return any;
}

}  // namespace

LiveResults read_verify_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open the verify results");
  const std::vector<std::string> required = {"request", "mode", "policy", "params", "budget", "live_kl", "top1", "task_score"};
  std::map<std::string, std::size_t> col;
  LiveResults out;
  std::string record;
  int line = 0;
  while (next_record(in, record, line)) {
    const auto f = parse_csv_line(record);
    if (col.empty()) {
      for (std::size_t i = 0; i < f.size(); ++i) col[f[i]] = i;
      for (const auto& r : required)
        if (!col.count(r))
          throw FormatError(path + ":" + std::to_string(line) + ": header has no column '" + r +
                            "' (expected a kvsim verify result file with columns " + csv_line(required) + ", ...)");
      continue;
    }
    const std::string where = path + ":" + std::to_string(line);
    if (f.size() != col.size())
      throw FormatError(where + ": " + std::to_string(f.size()) + " fields, expected " + std::to_string(col.size()));
    auto number = [&](const std::string& name) {
      const std::string& s = f[col.at(name)];
      if (s == "nan") return std::nan("");
      try {
        std::size_t used = 0;
        const double v = std::stod(s, &used);
        if (used == s.size()) return v;
      } catch (const std::exception&) {
      }
      throw FormatError(where + ": column '" + name + "' is '" + s + "', expected a number");
    };
    const std::string mode = f[col.at("mode")];
    if (out.mode.empty()) out.mode = mode;
    if (mode != out.mode)
      throw FormatError(where + ": mode '" + mode + "' after rows of '" + out.mode + "'; one file holds one mode");
    LiveRow r{f[col.at("request")], f[col.at("policy")], f[col.at("params")], number("budget"), number("live_kl"),
              number("top1"), number("task_score")};
    if (!std::isfinite(r.live_kl) || r.live_kl < 0)
      throw FormatError(where + ": column 'live_kl' is '" + f[col.at("live_kl")] + "', expected a number >= 0");
    out.rows.push_back(std::move(r));
  }
  if (out.rows.empty()) throw FormatError(path + ": no result rows (expected a kvsim verify result file)");
  return out;
}

}  // namespace kvsim
