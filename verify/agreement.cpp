#include "verify/agreement.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <ostream>
#include <set>
#include <tuple>

#include "core/error.h"
#include "core/csv.h"

namespace kvsim {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Average ranks (ties share the mean of their positions).
std::vector<double> ranks(const std::vector<double>& x) {
  std::vector<std::size_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return x[a] < x[b]; });
  std::vector<double> r(x.size());
  for (std::size_t i = 0; i < order.size();) {
    std::size_t j = i;
    while (j + 1 < order.size() && x[order[j + 1]] == x[order[i]]) ++j;
    for (std::size_t k = i; k <= j; ++k) r[order[k]] = 0.5 * static_cast<double>(i + j) + 1.0;
    i = j + 1;
  }
  return r;
}

// Pairs where both values are finite.
std::pair<std::vector<double>, std::vector<double>> finite_pairs(const std::vector<double>& a,
                                                                 const std::vector<double>& b) {
  std::vector<double> x, y;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::isfinite(a[i]) && std::isfinite(b[i])) {
      x.push_back(a[i]);
      y.push_back(b[i]);
    }
  return {x, y};
}

std::string num(double x) {
  if (!std::isfinite(x)) return "nan";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", x);
  return buf;
}

}  // namespace

double spearman(const std::vector<double>& a0, const std::vector<double>& b0) {
  const auto [a, b] = finite_pairs(a0, b0);
  if (a.size() < 3) return kNaN;
  const auto ra = ranks(a), rb = ranks(b);
  const double n = static_cast<double>(a.size());
  const double ma = std::accumulate(ra.begin(), ra.end(), 0.0) / n, mb = std::accumulate(rb.begin(), rb.end(), 0.0) / n;
  double sab = 0, saa = 0, sbb = 0;
  for (std::size_t i = 0; i < ra.size(); ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : kNaN;
}

double kendall_tau_b(const std::vector<double>& a0, const std::vector<double>& b0) {
  const auto [a, b] = finite_pairs(a0, b0);
  if (a.size() < 3) return kNaN;
  double concordant = 0, discordant = 0, ties_a = 0, ties_b = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t j = i + 1; j < a.size(); ++j) {
      const double da = a[i] - a[j], db = b[i] - b[j];
      if (da == 0 && db == 0) continue;
      if (da == 0)
        ++ties_a;
      else if (db == 0)
        ++ties_b;
      else if ((da > 0) == (db > 0))
        ++concordant;
      else
        ++discordant;
    }
  const double denom = std::sqrt((concordant + discordant + ties_a) * (concordant + discordant + ties_b));
  return denom > 0 ? (concordant - discordant) / denom : kNaN;
}

namespace {

// The k smallest of v (NaN last), as indices.
std::set<std::size_t> top_indices(const std::vector<double>& v, int k) {
  std::vector<std::size_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) {
    if (std::isnan(v[a]) || std::isnan(v[b])) return !std::isnan(v[a]) && std::isnan(v[b]);
    return v[a] < v[b];
  });
  return std::set<std::size_t>(idx.begin(), idx.begin() + k);
}

// Spearman within each budget group of configs (ranking policies at one budget): the mean over
// groups where it is defined, and the worst.
std::pair<double, double> within_budget_spearman(const std::vector<double>& x, const std::vector<double>& live_kl,
                                                 const std::vector<double>& budgets) {
  double sum = 0, worst = kNaN;
  int groups = 0;
  for (double b : std::set<double>(budgets.begin(), budgets.end())) {
    std::vector<double> xb, yb;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (budgets[i] == b) {
        xb.push_back(x[i]);
        yb.push_back(live_kl[i]);
      }
    const double r = spearman(xb, yb);
    if (std::isfinite(r)) {
      sum += r;
      ++groups;
      worst = std::isfinite(worst) ? std::min(worst, r) : r;
    }
  }
  return {groups ? sum / groups : kNaN, worst};
}

}  // namespace

AgreementReport agreement(const std::vector<OfflineRow>& offline, const std::vector<LiveRow>& live,
                          const std::vector<std::string>& all_metrics, int top_k,
                          const std::vector<std::string>& exclude, int wider_k) {
  std::vector<std::string> metrics;
  for (const auto& m : all_metrics)
    if (std::any_of(offline.begin(), offline.end(), [&](const OfflineRow& r) { return r.metrics.count(m) > 0; }))
      metrics.push_back(m);
  const std::set<std::string> skip(exclude.begin(), exclude.end());
  std::set<std::string> excluded;
  using Key = std::tuple<std::string, std::string, double>;  // policy, params, budget
  std::map<std::pair<Key, std::string>, const OfflineRow*> off;
  for (const auto& r : offline) off[{{r.policy, r.params, r.budget}, r.request}] = &r;
  struct Sums {
    std::map<std::string, double> offline;
    double kl = 0, task = 0;
    int n = 0, n_task = 0;
  };
  std::map<Key, Sums> by_config;
  std::set<std::string> requests;
  for (const auto& l : live) {
    if (!(l.budget < 1.0)) continue;
    if (skip.count(l.request)) {
      excluded.insert(l.request);
      continue;
    }
    const Key key{l.policy, l.params, l.budget};
    const auto it = off.find({key, l.request});
    if (it == off.end()) continue;
    Sums& s = by_config[key];
    for (const auto& m : metrics) {
      const auto mv = it->second->metrics.find(m);
      s.offline[m] += mv == it->second->metrics.end() ? kNaN : mv->second;
    }
    s.kl += l.live_kl;
    if (std::isfinite(l.task_score)) {
      s.task += l.task_score;
      ++s.n_task;
    }
    ++s.n;
    requests.insert(l.request);
  }
  if (by_config.size() < 3 && !excluded.empty() && requests.empty())
    throw Error(
        "agreement: every live request was left out (the estimator was fitted on them); give the live "
        "results of held-out requests");
  if (by_config.size() < 3)
    throw Error(
        "agreement: " + std::to_string(by_config.size()) +
        " compressed configs were run both offline and live on the same requests; need at least 3 (same request "
        "ids, policy parameters and budgets on both sides)");
  AgreementReport rep;
  rep.configs = static_cast<int>(by_config.size());
  rep.requests = static_cast<int>(requests.size());
  rep.top_k = std::min<int>(top_k, rep.configs);
  rep.wider_k = std::min<int>(std::max(wider_k, rep.top_k), rep.configs);
  rep.excluded.assign(excluded.begin(), excluded.end());
  std::vector<double> live_kl, task, budgets;
  for (const auto& [key, s] : by_config) {
    live_kl.push_back(s.kl / s.n);
    task.push_back(s.n_task ? s.task / s.n_task : kNaN);
    budgets.push_back(std::get<2>(key));
  }
  const auto live_top = top_indices(live_kl, rep.top_k);
  for (const auto& m : metrics) {
    std::vector<double> x;
    for (const auto& [key, s] : by_config) x.push_back(s.offline.at(m) / s.n);
    AgreementRow row;
    row.metric = m;
    row.spearman_kl = spearman(x, live_kl);
    row.kendall_kl = kendall_tau_b(x, live_kl);
    row.spearman_task = spearman(x, task);
    row.kendall_task = kendall_tau_b(x, task);
    std::tie(row.within_budget_spearman_kl, row.within_budget_min_spearman_kl) =
        within_budget_spearman(x, live_kl, budgets);
    const auto off_top = top_indices(x, rep.top_k), off_wider = top_indices(x, rep.wider_k);
    int hit = 0, wide = 0;
    for (auto i : live_top) {
      hit += off_top.count(i) ? 1 : 0;
      wide += off_wider.count(i) ? 1 : 0;
    }
    row.top_recall = static_cast<double>(hit) / rep.top_k;
    row.top_in_wider = static_cast<double>(wide) / rep.top_k;
    rep.rows.push_back(row);
  }
  return rep;
}

void write_agreement_csv(const AgreementReport& r, const std::string& path) {
  results::AgreementFile f;
  f.configs = r.configs, f.requests = r.requests, f.excluded = static_cast<int>(r.excluded.size());
  f.top_k = r.top_k, f.wider_k = r.wider_k, f.rows = r.rows;
  std::ofstream out(path);
  if (!out) throw Error(path + ": cannot write the agreement report");
  out << results::agreement_file_text(f);
  if (!out) throw Error(path + ": write failed");
}

void print_agreement(const AgreementReport& r, std::ostream& os) {
  char buf[200];
  os << "agreement of the offline ranking with the live one (" << r.configs << " compressed configs, " << r.requests
     << " requests";
  if (!r.excluded.empty())
    os << ", held out: the " << r.excluded.size() << " requests the estimator was fitted on left out";
  os << "; offline metrics larger = worse, so a good predictor correlates positively with live KL and "
        "negatively with the task score; per budget: mean and worst)\n";
  const std::string k = std::to_string(r.top_k), wide = "top" + k + "/" + std::to_string(r.wider_k);
  std::snprintf(buf, sizeof buf, "%-16s%10s%10s%12s%12s%11s%11s%8s%9s\n", "offline metric", "rho(KL)", "tau(KL)",
                "rho/budget", "worst/bud.", "rho(task)", "tau(task)", ("top" + k).c_str(), wide.c_str());
  os << buf;
  for (const auto& x : r.rows) {
    std::snprintf(buf, sizeof buf, "%-16s%10s%10s%12s%12s%11s%11s%8s%9s\n", x.metric.c_str(),
                  num(x.spearman_kl).c_str(), num(x.kendall_kl).c_str(), num(x.within_budget_spearman_kl).c_str(),
                  num(x.within_budget_min_spearman_kl).c_str(), num(x.spearman_task).c_str(),
                  num(x.kendall_task).c_str(), num(x.top_recall).c_str(), num(x.top_in_wider).c_str());
    os << buf;
  }
}

}  // namespace kvsim
