#include "cli/options.h"

#include <filesystem>
#include <streambuf>

#include "core/error.h"

namespace kvsim::cli {

void add_output_flags(boost::program_options::options_description& desc) {
  if (!desc.find_nothrow("force", false)) desc.add_options()("force", "replace existing output files");
  if (!desc.find_nothrow("quiet", false))
    desc.add_options()("quiet,q", "no progress lines or notes (results still print)");
}

void refuse_overwrite(const std::string& path, bool force) {
  if (!force && !path.empty() && std::filesystem::exists(path))
    throw Error(path + ": file exists; refusing to overwrite it (pass --force to replace)");
}

void quiet_stderr() {
  struct Discard : std::streambuf {
    int overflow(int c) override { return traits_type::not_eof(c); }
  };
  static Discard discard;
  std::cerr.rdbuf(&discard);
}

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
