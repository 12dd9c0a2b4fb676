#include "verify/verify_run.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <set>
#include <sstream>

#include "model/gguf.h"
#include "core/error.h"
#include "policies/registry.h"
#include "results/sweep_file.h"
#include "results/verify_file.h"
#include "sim/sweep.h"
#include "traces/trace_reader.h"
#include "verify/agreement.h"
#include "verify/calibrate.h"
#include "verify/sweep_results.h"

namespace kvsim {

namespace {

std::string num(double x) {
  if (std::isnan(x)) return "nan";
  std::ostringstream os;
  os.precision(9);
  os << x;
  return os.str();
}

// The sweep's top configs by offline mean KL (averaged over its requests), compressed ones only.
std::vector<ReplayConfig> top_configs(const std::vector<OfflineRow>& rows, int top) {
  std::map<std::tuple<std::string, std::string, double>, std::pair<double, int>> mean;
  for (const auto& r : rows) {
    if (!(r.budget < 1.0)) continue;
    auto& m = mean[{r.policy, r.params, r.budget}];
    m.first += r.metrics.at("mean_kl");
    ++m.second;
  }
  std::vector<std::pair<double, std::tuple<std::string, std::string, double>>> ranked;
  for (const auto& [key, m] : mean) ranked.push_back({m.first / m.second, key});
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<ReplayConfig> out;
  for (const auto& [kl, key] : ranked) {
    if (static_cast<int>(out.size()) >= top) break;
    const auto& [policy, params, budget] = key;
    PolicyInstance inst = PolicyRegistry::instance().create(params.empty() ? policy : policy + ":" + params);
    out.push_back({inst.name, inst.params, std::shared_ptr<const Policy>(std::move(inst.policy)), budget});
  }
  return out;
}

// The traces a sweep ran on must come from a model of the verified geometry.
void check_geometry(const std::vector<OfflineRow>& rows, const std::string& csv, const ModelGeometry& g,
                    const std::string& model, std::ostream& progress) {
  std::set<std::string> traces;
  for (const auto& r : rows) traces.insert(r.trace);
  for (const auto& t : traces) {
    std::string path = t;
    if (!std::filesystem::exists(path)) path = (std::filesystem::path(csv).parent_path() / t).string();
    if (!std::filesystem::exists(path)) {
      progress << "verify: warning: trace " << t << " listed in " << csv
               << " is not found; its geometry is not checked\n";
      continue;
    }
    const TraceReader reader(path);
    const ModelGeometry& m = reader.geometry();
    if (!same_kv_shape(m, g))
      throw Error(csv + ": its trace " + t + " has " + kv_shape(m) + ", but the model " + model + " has " +
                  kv_shape(g) + " (a sweep of another model?)");
  }
}

// The compression schedule and budget semantics a sweep ran with (point in schema-1 sweeps
// written before budget semantics existed; a file without a configuration line: the defaults).
std::pair<std::int64_t, BudgetRule> sweep_schedule(const std::string& csv) {
  const std::optional<results::SweepConfig> c = results::read_sweep_config(csv);
  if (!c) return {0, BudgetRule{}};
  const std::optional<BudgetRule> rule = budget_rule_from_name(c->budget_semantics);
  if (!rule)
    throw Error(csv + ": config field 'budget_semantics' is \"" + c->budget_semantics +
                "\", expected \"point\" or \"peak/N\" (N >= 1)");
  return {c->compress_every, *rule};
}

}  // namespace

namespace {

// A verify of a sweep's configs runs them as the sweep did: its one mode, its compression
// schedule and budget semantics (a flag that says otherwise is refused), on its requests.
void adopt_sweep_settings(const std::string& offline_csv, const std::vector<OfflineRow>& offline,
                          const VerifySpec& spec, const std::vector<CaptureRequest>& requests, VerifyOptions& live) {
  std::set<std::string> modes;
  for (const auto& r : offline) modes.insert(r.mode);
  if (modes.size() != 1) throw Error(offline_csv + ": rows of several modes; verify one mode at a time");
  const ReplayMode mode = parse_mode(*modes.begin());
  if (spec.mode_given && mode != live.mode)
    throw Error(offline_csv + ": the sweep ran " + mode_name(mode) + ", but --mode is " + mode_name(live.mode));
  live.mode = mode;
  const auto [every, rule] = sweep_schedule(offline_csv);
  if (spec.compress_every_given && every != live.compress_every)
    throw Error(offline_csv + ": the sweep cut the cache every " + std::to_string(every) +
                " prompt tokens (compress_every in its config), but --compress-every is " +
                std::to_string(live.compress_every));
  live.compress_every = every;
  if (spec.budget_rule_given && rule.name() != live.budget_rule.name())
    throw Error(offline_csv + ": the sweep held its budgets as " + rule.name() +
                " (budget_semantics in its config), but --budget-semantics/--reapply-every ask for " +
                live.budget_rule.name());
  live.budget_rule = rule;
  std::set<std::string> ids;
  for (const auto& r : requests) ids.insert(r.id);
  if (std::none_of(offline.begin(), offline.end(), [&](const OfflineRow& r) { return ids.count(r.request) > 0; }))
    throw Error(offline_csv + ": none of its requests is in " + spec.tasks_path +
                " (verify the tasks the sweep's traces were captured from)");
}

// The verify CSV's head: the run's configuration (results/verify_file.h).
results::VerifyConfig verify_config(const VerifySpec& spec, const VerifyOptions& live, const LiveVerifier& verifier) {
  results::VerifyConfig c;
  c.model = spec.model_path, c.tasks = spec.tasks_path, c.mode = mode_name(live.mode);
  c.max_new = live.max_new, c.min_new = live.min_new, c.weights = weight_format_name(live.weights);
  c.queries = live.all_queries ? "all" : "eval";
  c.prefill_chunk = live.prefill_chunk, c.compress_every = live.compress_every;
  c.budget_semantics = live.budget_rule.name(), c.device = verifier.device();
  c.policy_steps = verifier.rules_in_engine() ? "engine" : "host";
  return c;
}

// One (request, config) row of the verify CSV.
std::string verify_row(const CaptureRequest& r, const VerifyOptions& live, const ReplayConfig& c,
                       const LiveConfigResult& x, const LiveRequestResult& res) {
  results::VerifyRow v;
  v.request = r.id, v.task = r.task, v.mode = mode_name(live.mode);
  v.policy = c.policy, v.params = c.params, v.budget = c.budget;
  v.budget_tokens = x.budget_tokens, v.kept_fraction = x.kept_fraction;
  v.compressed_bytes = x.compressed_bytes, v.budget_bytes = x.budget_bytes, v.steps = x.steps;
  v.live_kl = x.mean_kl, v.max_kl = x.max_kl, v.top1 = x.top1, v.ppl = x.ppl, v.reference_ppl = res.reference_ppl;
  v.task_score = x.task_score, v.reference_task_score = res.reference_task_score;
  v.same_tokens = x.same_tokens, v.seconds = x.seconds, v.policy_steps = x.policy_steps;
  v.position_fallback = x.position_fallback, v.budget_semantics = live.budget_rule.name();
  v.decode_peak_bytes = x.decode_peak_bytes, v.generated = x.generated;
  return results::verify_row_line(v);
}

// Per (budget, policy label), the live means the table prints.
struct LiveMean {
  double kl = 0, top1 = 0, ppl_ratio = 0, task = 0, kept = 0;
  int n = 0, n_task = 0;
};

void add_to_summary(LiveMean& m, const LiveConfigResult& x, const LiveRequestResult& res) {
  m.kl += x.mean_kl;
  m.top1 += x.top1;
  m.ppl_ratio += x.ppl / res.reference_ppl;
  m.kept += x.kept_fraction;
  if (std::isfinite(x.task_score)) {
    m.task += x.task_score;
    ++m.n_task;
  }
  ++m.n;
}

// A chunk-reuse way as the CSV names it: policy chunk_reuse, its way as parameters, budget 1.
ReplayConfig reuse_config(const ReuseConfig& w) { return ReplayConfig{"chunk_reuse", w.params(), nullptr, 1.0}; }

// The ranked table: per budget, the policies by live KL.
void print_live_table(const std::map<std::pair<double, std::string>, LiveMean>& summary, std::ostream& out) {
  std::vector<std::pair<std::pair<double, std::string>, LiveMean>> rows(summary.begin(), summary.end());
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a.first.first != b.first.first ? a.first.first < b.first.first
                                          : a.second.kl / a.second.n < b.second.kl / b.second.n;
  });
  char buf[200];
  std::snprintf(buf, sizeof buf, "%-8s%-44s%8s%10s%8s%10s%8s%6s\n", "budget", "policy (live)", "kept", "KL", "top1",
                "ppl/ref", "task", "reqs");
  out << buf;
  double last = -1;
  for (const auto& [key, m] : rows) {
    if (key.first != last && last >= 0) out << "\n";
    last = key.first;
    std::string label = table_label(key.second);
    if (label.size() > 42) label = label.substr(0, 39) + "...";
    std::snprintf(buf, sizeof buf, "%-8.3g%-44s%8.3f%10.4f%8.3f%10.4f%8s%6d\n", key.first, label.c_str(), m.kept / m.n,
                  m.kl / m.n, m.top1 / m.n, m.ppl_ratio / m.n,
                  m.n_task ? num(m.task / m.n_task).substr(0, 6).c_str() : "-", m.n);
    out << buf;
  }
}

}  // namespace

double run_verify(const VerifySpec& spec, std::ostream& out, std::ostream& progress) {
  if (!spec.force && std::filesystem::exists(spec.out_csv))
    throw Error(spec.out_csv + ": file exists; refusing to overwrite it (pass --force to replace)");
  const auto requests = read_capture_requests(spec.tasks_path);
  VerifyOptions live = spec.live;
  std::vector<OfflineRow> offline;
  std::vector<std::string> fitted_on;  // the estimator's calibration requests, left out of the agreement
  const std::string offline_csv = spec.from_sweep.empty() ? spec.offline_csv : spec.from_sweep;
  if (!offline_csv.empty()) {
    offline = read_sweep_csv(offline_csv);
    if (!spec.offline_detail.empty()) add_sweep_detail(offline, spec.offline_detail);
    fitted_on = apply_estimator_file(offline, spec.estimator, spec.offline_detail);
    adopt_sweep_settings(offline_csv, offline, spec, requests, live);
  }
  std::vector<ReplayConfig> configs;
  if (!spec.from_sweep.empty()) {
    if (spec.top < 1) throw Error("--top must be >= 1");
    configs = top_configs(offline, spec.top);
  } else if (!spec.policies.empty()) {
    SweepSpec s;
    s.policies = spec.policies;
    s.budgets = spec.budgets;
    configs = expand_configs(s);
  }

  const GgufFile gguf(spec.model_path);
  LiveVerifier verifier(gguf, live);
  if (!offline.empty()) check_geometry(offline, offline_csv, verifier.geometry(), spec.model_path, progress);

  const std::string tmp = spec.out_csv + ".partial";
  std::ofstream csv(tmp);
  if (!csv) throw Error(tmp + ": cannot write");
  csv << results::verify_file_head(verify_config(spec, live, verifier));
  const bool tty = spec.progress && ::isatty(2);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<LiveRow> live_rows;
  std::map<std::pair<double, std::string>, LiveMean> summary;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const CaptureRequest& r = requests[i];
    if (spec.progress)
      progress << (tty ? "\r" : "") << "verify: request " << i + 1 << "/" << requests.size() << " (" << r.id << ", "
               << configs.size() + spec.reuse.size() << " configs)" << (tty ? "   " : "\n") << std::flush;
    const LiveRequestResult res = verifier.run(r, configs, spec.reuse);
    for (std::size_t p = 0; p < spec.reuse.size(); ++p) {  // after the configs' results
      const LiveConfigResult& x = res.configs[configs.size() + p];
      csv << verify_row(r, live, reuse_config(spec.reuse[p]), x, res) << "\n";
      add_to_summary(summary[{1.0, "chunk_reuse:" + spec.reuse[p].label()}], x, res);
    }
    for (std::size_t p = 0; p < configs.size(); ++p) {
      const ReplayConfig& c = configs[p];
      const LiveConfigResult& x = res.configs[p];
      csv << verify_row(r, live, c, x, res) << "\n";
      live_rows.push_back({r.id, c.policy, c.params, c.budget, x.mean_kl, x.top1, x.task_score});
      add_to_summary(summary[{c.budget, PolicyRegistry::instance().compact_label(c.policy, c.params)}], x, res);
    }
    csv.flush();
  }
  if (tty) progress << "\n";
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  csv.close();
  if (!csv) throw Error(tmp + ": write failed");
  std::filesystem::rename(tmp, spec.out_csv);

  print_live_table(summary, out);
  out << spec.out_csv << ": " << requests.size() << " requests x " << configs.size() + spec.reuse.size()
      << " configs, live in " << seconds << " s\n";
  if (!offline.empty()) {
    const AgreementReport rep =
        agreement(offline, live_rows, offline_metric_names(!spec.offline_detail.empty()), 5, fitted_on);
    out << "\n";
    print_agreement(rep, out);
    if (!spec.agreement_csv.empty()) write_agreement_csv(rep, spec.agreement_csv);
  }
  return seconds;
}

}  // namespace kvsim
