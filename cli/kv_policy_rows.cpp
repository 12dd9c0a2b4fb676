// `kvsim serve simulate --kv-policy`: a compression config's measured bytes and fidelity, read
// from the rows of sweep and verify result files.
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "cli/options.h"
#include "cli/serve_commands.h"
#include "core/error.h"
#include "policies/params.h"
#include "results/sweep_file.h"
#include "results/verify_file.h"

namespace kvsim::cli {

namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

struct Spec {
  std::string policy;
  std::map<std::string, std::string> params;
  double budget = 0;
};

// POLICY[:key=value,...]@BUDGET: the policy spec grammar is policies/params.h's; this adds the budget.
Spec parse_spec(const std::string& text) {
  const auto at = text.rfind('@');
  if (at == std::string::npos || at == 0)
    throw Error("--kv-policy '" + text + "': expected POLICY[:key=value,...]@BUDGET (e.g. snapkv@0.25) or none");
  Spec s;
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
  try {
    std::tie(s.policy, s.params) = split_policy_spec(text.substr(0, at));
  } catch (const Error& e) {
    throw Error("--kv-policy '" + text + "': " + e.what());
  }
  return s;
}

// A result row's params column ("k=v,k=v") in the same grammar.
std::map<std::string, std::string> parse_params(const std::string& params, const std::string& where) {
  if (params.empty()) return {};
  try {
    return split_policy_spec("policy:" + params).second;
  } catch (const Error& e) {
    throw FormatError(where + ": column 'params': " + e.what());
  }
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

// What a sweep or verify row says of one config: its bytes and fidelity.
struct Measured {
  std::string policy, params, where;
  double budget = 0, compressed_bytes = 0, budget_bytes = 0;
  double est_kl = kNan, mean_kl = kNan;             // sweep rows
  double live_kl = kNan, top1 = kNan, task = kNan;  // verify rows
};

std::vector<Measured> measured_rows(const std::string& path) {
  std::vector<Measured> out;
  if (results::is_verify_file(path)) {
    for (const auto& r : results::read_verify_file(path).rows)
      out.push_back({r.policy, r.params, path + ":" + std::to_string(r.line), r.budget, r.compressed_bytes,
                     r.budget_bytes, kNan, kNan, r.live_kl, r.top1, r.task_score});
  } else {
    for (const auto& r : results::read_sweep_file(path).rows)
      out.push_back({r.policy, r.params, path + ":" + std::to_string(r.line), r.budget, r.compressed_bytes,
                     r.budget_bytes, r.est_kl.value_or(kNan), r.mean_kl});
  }
  return out;
}

void add_file(const std::string& path, const Spec& spec, const std::string& spec_budget,
              std::map<std::string, Sum>& by_label) {
  for (const Measured& m : measured_rows(path)) {
    const std::map<std::string, std::string> params = parse_params(m.params, m.where);
    if (!matches(spec, m.policy, params, m.budget)) continue;
    // One key per config however a file spells it: parameters in order, the spec's budget.
    std::string key = m.policy;
    for (const auto& [k, v] : params) key += (key.size() == m.policy.size() ? ":" : ",") + k + "=" + v;
    Sum& s = by_label[key];
    if (s.label.empty()) s.label = m.policy + (m.params.empty() ? "" : ":" + m.params) + "@" + spec_budget;
    const double full = m.budget_bytes / m.budget;
    if (!(full > 0)) throw Error(m.where + ": budget_bytes " + std::to_string(m.budget_bytes) + "; expected > 0");
    s.bytes += m.compressed_bytes;
    s.full += full;
    ++s.rows;
    auto add = [](double x, double& sum, std::int64_t& n) {
      if (std::isfinite(x)) {
        sum += x;
        ++n;
      }
    };
    add(m.live_kl, s.live, s.n_live);
    add(m.top1, s.top1, s.n_top1);
    add(m.task, s.task, s.n_task);
    add(m.est_kl, s.est, s.n_est);
    add(m.mean_kl, s.kl, s.n_kl);
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
