#include "cli/options.h"
#include "core/error.h"

namespace kvsim::cli {

std::vector<std::string> split_policies(const std::string& s) {
  std::vector<std::string> out;
  for (const auto& part : split(s, ';')) {
    for (const auto& tok : split(part, ',')) {
      const bool is_param = tok.find('=') != std::string::npos && tok.find(':') == std::string::npos;
      if (is_param && !out.empty())
        out.back() += (out.back().find(':') == std::string::npos ? ":" : ",") + tok;
      else
        out.push_back(tok);
    }
  }
  return out;
}

std::vector<double> parse_budgets(const std::string& s) {
  std::vector<double> out;
  for (const auto& b : split(s, ',')) {
    try {
      std::size_t used = 0;
      out.push_back(std::stod(b, &used));
      if (used != b.size()) throw std::invalid_argument(b);
    } catch (const std::exception&) {
      throw Error("--budgets: '" + b + "' is not a number; expected fractions in (0, 1] like 0.1,0.25,0.5");
    }
  }
  return out;
}

}  // namespace kvsim::cli
