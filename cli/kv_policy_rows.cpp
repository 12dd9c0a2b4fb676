// `kvsim serve simulate --kv-policy`: a compression config's measured bytes and fidelity, read
// from the rows of sweep and verify result files.
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "cli/options.h"
#include "cli/serve_commands.h"
#include "core/error.h"
#include "sim/csv.h"

namespace kvsim::cli {

namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

struct Spec {
  std::string policy;
  std::map<std::string, std::string> params;
  double budget = 0;
};

Spec parse_spec(const std::string& text) {
  const auto at = text.rfind('@');
  if (at == std::string::npos || at == 0)
    throw Error("--kv-policy '" + text + "': expected POLICY[:key=value,...]@BUDGET (e.g. snapkv@0.25) or none");
  Spec s;
  std::string head = text.substr(0, at);
  try {
    std::size_t used = 0;
    s.budget = std::stod(text.substr(at + 1), &used);
    if (used != text.size() - at - 1) throw std::invalid_argument("tail");
  } catch (const std::exception&) {
    throw Error("--kv-policy '" + text + "': budget '" + text.substr(at + 1) + "' is not a number");
  }
  if (!(s.budget > 0 && s.budget <= 1))
    throw Error("--kv-policy '" + text + "': budget " + text.substr(at + 1) +
                "; expected a share of the bytes in (0, 1]");
  const auto colon = head.find(':');
  s.policy = head.substr(0, colon);
  if (colon != std::string::npos)
    for (const std::string& kv : split(head.substr(colon + 1), ',')) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos) throw Error("--kv-policy '" + text + "': parameter '" + kv + "' is not key=value");
      s.params[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  return s;
}

std::map<std::string, std::string> parse_params(const std::string& params) {
  std::map<std::string, std::string> out;
  for (const std::string& kv : split(params, ',')) {
    const auto eq = kv.find('=');
    if (eq != std::string::npos) out[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return out;
}

bool matches(const Spec& s, const std::string& policy, const std::map<std::string, std::string>& params,
             double budget) {
  if (policy != s.policy || std::abs(budget - s.budget) > 1e-9) return false;
  for (const auto& [k, v] : s.params) {
    const auto it = params.find(k);
    if (it == params.end() || it->second != v) return false;
  }
  return true;
}

struct Sum {
  std::string label;  // as the first matching row spells it
  double bytes = 0, full = 0;
  std::int64_t rows = 0;
  double est = 0, kl = 0, live = 0, top1 = 0, task = 0;
  std::int64_t n_est = 0, n_kl = 0, n_live = 0, n_top1 = 0, n_task = 0;
};

void add_file(const std::string& path, const Spec& spec, const std::string& spec_budget,
              std::map<std::string, Sum>& by_label) {
  CsvReader csv(path, {"policy", "params", "budget", "compressed_bytes", "budget_bytes"},
                "a kvsim sweep or verify result file");
  const bool live = csv.has("live_kl");
  while (csv.next()) {
    const std::string policy = csv.text("policy");
    const std::map<std::string, std::string> params = parse_params(csv.text("params"));
    const double budget = csv.number("budget");
    if (!matches(spec, policy, params, budget)) continue;
    // One key per config however a file spells it: parameters in order, the spec's budget.
    std::string key = policy;
    for (const auto& [k, v] : params) key += (key.size() == policy.size() ? ":" : ",") + k + "=" + v;
    Sum& s = by_label[key];
    if (s.label.empty())
      s.label = policy + (csv.text("params").empty() ? "" : ":" + csv.text("params")) + "@" + spec_budget;
    const double full = csv.number("budget_bytes") / budget;
    if (!(full > 0)) throw Error(csv.where() + ": budget_bytes " + csv.text("budget_bytes") + "; expected > 0");
    s.bytes += csv.number("compressed_bytes");
    s.full += full;
    ++s.rows;
    auto add = [&](const char* column, double& sum, std::int64_t& n) {
      if (csv.has(column) && !csv.text(column).empty() && std::isfinite(csv.number(column))) {
        sum += csv.number(column);
        ++n;
      }
    };
    if (live) {
      add("live_kl", s.live, s.n_live);
      add("top1", s.top1, s.n_top1);
      add("task_score", s.task, s.n_task);
    } else {
      add("est_kl", s.est, s.n_est);
      add("mean_kl", s.kl, s.n_kl);
    }
  }
}

double mean(double sum, std::int64_t n) { return n ? sum / static_cast<double>(n) : kNan; }

}  // namespace

std::vector<KvPolicyRow> read_kv_policies(const std::string& specs, const std::vector<std::string>& files) {
  std::vector<KvPolicyRow> out;
  for (const std::string& text : split(specs, ';')) {
    KvPolicyRow row{text, "none", 1.0, 0, kNan, kNan, kNan, kNan, kNan};
    if (text == "none" || text == "full") {
      out.push_back(row);
      continue;
    }
    if (files.empty())
      throw Error("--kv-policy '" + text + "' needs --kv-results (sweep or verify CSVs that measured it)");
    const Spec spec = parse_spec(text);
    std::map<std::string, Sum> by_label;
    const std::string spec_budget = text.substr(text.rfind('@') + 1);
    for (const std::string& f : files) add_file(f, spec, spec_budget, by_label);
    std::string all;
    for (const std::string& f : files) all += (all.empty() ? "" : ", ") + f;
    if (by_label.empty()) throw Error("--kv-policy '" + text + "': no row of " + all + " has this policy and budget");
    if (by_label.size() > 1) {
      std::string labels;
      for (const auto& [key, s] : by_label) labels += "\n  " + s.label;
      throw Error("--kv-policy '" + text + "' matches more than one config in " + all +
                  "; give its parameters:" + labels);
    }
    const Sum& s = by_label.begin()->second;
    row.label = s.label;
    row.ratio = s.bytes / s.full;
    row.rows = s.rows;
    row.est_kl = mean(s.est, s.n_est);
    row.mean_kl = mean(s.kl, s.n_kl);
    row.live_kl = mean(s.live, s.n_live);
    row.top1 = mean(s.top1, s.n_top1);
    row.task_score = mean(s.task, s.n_task);
    out.push_back(row);
  }
  return out;
}

}  // namespace kvsim::cli
