#include "sim/sweep.h"

#include "kvcache/training_prompts.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <map>
#include <optional>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <sstream>

#include "core/csv.h"
#include "core/error.h"
#include "policies/registry.h"
#include "results/detail_file.h"
#include "sim/estimator.h"

namespace kvsim {

std::pair<int, int> parse_shard(const std::string& s) {
  const auto slash = s.find('/');
  int i = -1, n = 0;
  try {
    std::size_t a = 0, b = 0;
    if (slash != std::string::npos) {
      i = std::stoi(s.substr(0, slash), &a);
      n = std::stoi(s.substr(slash + 1), &b);
    }
    if (slash == std::string::npos || a != slash || b != s.size() - slash - 1) n = 0;
  } catch (const std::exception&) {
    n = 0;
  }
  if (n < 1 || i < 0 || i >= n) throw Error("--shard '" + s + "': expected i/n with 0 <= i < n (e.g. 0/4 ... 3/4)");
  return {i, n};
}

namespace {

std::string geometry_string(const ModelGeometry& g) {
  return std::to_string(g.n_layers) + " layers, " + std::to_string(g.n_q_heads) + " q heads, " +
         std::to_string(g.n_kv_heads) + " kv heads, head_dim " + std::to_string(g.head_dim);
}

using RequestKey = std::pair<std::string, std::string>;  // (trace, request)

// What --resume keeps of an earlier run: each finished request's rows, in the order they were
// written (which is the sweep's order).
struct ResumeState {
  std::vector<std::pair<RequestKey, std::vector<std::string>>> kept;
  std::set<RequestKey> done;
  void keep_only(const std::set<RequestKey>& keys) {
    std::erase_if(kept, [&](const auto& k) { return !keys.count(k.first); });
    std::erase_if(done, [&](const RequestKey& k) { return !keys.count(k); });
  }
};

// Groups rows by request in first-seen order; a request with every config row is finished.
ResumeState finished_requests(const std::vector<std::pair<RequestKey, std::string>>& rows, std::size_t per_request) {
  std::vector<RequestKey> order;
  std::map<RequestKey, std::vector<std::string>> by_request;
  for (const auto& [key, line] : rows) {
    auto& v = by_request[key];
    if (v.empty()) order.push_back(key);
    v.push_back(line);
  }
  ResumeState st;
  for (const auto& key : order)
    if (by_request[key].size() == per_request) {
      st.done.insert(key);
      st.kept.emplace_back(key, std::move(by_request[key]));
    }
  return st;
}

// Reads an existing result file for --resume: checks the configuration and keeps only the rows
// of requests whose every config row is present (a request cut short is redone).
ResumeState read_for_resume(const std::string& path, const results::SweepConfig& config,
                            std::size_t configs_per_request) {
  const results::SweepFile f = results::read_sweep_file(path, results::TornTail::Drop);
  if (!f.config) throw Error(path + ": --resume: no '# config:' line, expected a kvsim sweep result file");
  const std::string ours = results::sweep_config_text(config);
  if (f.config_text != ours)
    throw Error(path + ": --resume with a different configuration; the file was written for\n  " + f.config_text +
                "\nbut this run is\n  " + ours + "\n(use a new --out, or --force to replace it)");
  std::vector<std::pair<RequestKey, std::string>> rows;
  for (std::size_t i = 0; i < f.rows.size(); ++i) rows.push_back({{f.rows[i].trace, f.rows[i].request}, f.lines[i]});
  return finished_requests(rows, configs_per_request);
}

// The detail file's finished requests (every config's line), for --resume; a missing file has none.
ResumeState read_detail_for_resume(const std::string& path, const results::SweepConfig& config,
                                   std::size_t per_request) {
  if (!std::filesystem::exists(path)) return {};
  const results::DetailFile f = results::read_detail_file(path, results::TornTail::Drop);
  if (f.config_text != results::sweep_config_text(config))
    throw Error(path + ": --resume with a different configuration than this detail file's");
  std::vector<std::pair<RequestKey, std::string>> rows;
  for (std::size_t i = 0; i < f.rows.size(); ++i) rows.push_back({{f.rows[i].trace, f.rows[i].request}, f.lines[i]});
  return finished_requests(rows, per_request);
}

}  // namespace

SweepRequestRows finished_sweep_rows(const std::string& path, const results::SweepConfig& config,
                                     std::size_t per_request) {
  return read_for_resume(path, config, per_request).kept;
}

SweepRequestRows finished_detail_rows(const std::string& path, const results::SweepConfig& config,
                                      std::size_t per_request) {
  return read_detail_for_resume(path, config, per_request).kept;
}

std::vector<ReplayConfig> expand_configs(const SweepSpec& spec) {
  if (spec.policies.empty()) throw Error("no policies given (--policies name[:key=value,...],...)");
  if (spec.budgets.empty()) throw Error("no budgets given (--budgets 0.1,0.25,0.5)");
  for (double b : spec.budgets)
    if (!(b > 0 && b <= 1))
      throw Error("budget " + csv_number(b) + ": expected a fraction of the full KV bytes in (0, 1]");
  std::vector<ReplayConfig> out;
  for (const auto& p : spec.policies) {
    PolicyInstance inst = PolicyRegistry::instance().create(p);
    std::shared_ptr<const Policy> impl(std::move(inst.policy));
    if (!impl->respects_budget()) {
      out.push_back({inst.name, inst.params, impl, 1.0});
      continue;
    }
    for (double b : spec.budgets) out.push_back({inst.name, inst.params, impl, b});
  }
  return out;
}

results::SweepConfig sweep_config(const SweepSpec& spec, const std::vector<ReplayConfig>& configs,
                                  std::int64_t all_requests) {
  results::SweepConfig c;
  c.tool = std::string("kvsim sweep ") + KVSIM_VERSION_STRING;
  c.traces = spec.traces;
  c.mode = mode_name(spec.mode);
  c.compress_every = spec.compress_every;
  c.budget_semantics = spec.budget_rule.name();
  c.estimator = spec.estimator;
  c.budgets = spec.budgets;
  if (spec.shards > 1) {
    // With the whole sweep's request count, so a merge can tell a complete set of shards.
    c.shard = std::to_string(spec.shard) + "/" + std::to_string(spec.shards);
    c.shard_of_requests = all_requests;
  }
  for (const auto& r : configs) c.configs.emplace_back(r.label(), r.budget);
  return c;
}

namespace {

// Every trace of the sweep opened (each walked in a child first, traces/trace_probe.h: a file
// that crashes HDF5 stops the sweep naming it, before any in-process read) and checked: requests
// to replay, one model geometry, learned policies kept off their training prompts. Counts the
// requests into `total`; notes requests without checksums.
std::vector<std::unique_ptr<TraceReader>> open_traces(const SweepSpec& spec, const std::vector<ReplayConfig>& configs,
                                                      std::ostream& progress, std::int64_t& total) {
  std::vector<std::unique_ptr<TraceReader>> readers;
  for (const auto& path : spec.traces) {
    readers.push_back(std::make_unique<TraceReader>(path));
    const TraceReader& r = *readers.back();
    if (r.request_ids().empty())
      throw Error(path + ": no complete requests to replay (empty trace" +
                  (r.incomplete_request_ids().empty() ? std::string(")") : std::string(", only incomplete ones)")));
    if (!(r.geometry() == readers.front()->geometry()))
      throw Error(path + ": model geometry (" + geometry_string(r.geometry()) + ") differs from " +
                  spec.traces.front() + " (" + geometry_string(readers.front()->geometry()) +
                  "); one sweep compares configs on one model");
    total += static_cast<std::int64_t>(r.request_ids().size());  // this shard's share below
    const auto unchecked = std::count_if(r.request_ids().begin(), r.request_ids().end(),
                                         [&](const std::string& id) { return !r.checksummed(id); });
    if (unchecked > 0)
      progress << "note: " << path << ": " << unchecked << " of " << r.request_ids().size()
               << " requests carry no checksums (written before kvsim added them): damaged data there would go "
                  "unseen\n";
    if (!spec.allow_training_requests && kvcache::any_training_prompts(configs))  // else no header to read
      for (const auto& id : r.request_ids()) {
        const RequestHeader h = r.header(id);
        kvcache::check_training_prompts(
            configs, std::span<const std::int32_t>(h.tokens).first(static_cast<std::size_t>(h.n_prompt)),
            path + ": request '" + id + "'", false);
      }
  }

  return readers;
}

// The --estimator file, checked against the traces' layer count and the sweep's mode.
std::optional<Estimator> sweep_estimator(const SweepSpec& spec, int n_layers) {
  std::optional<Estimator> estimator;
  if (spec.estimator.empty()) return estimator;
  estimator = read_estimator(spec.estimator);
  if (estimator->weights.size() != static_cast<std::size_t>(n_layers))
    throw Error(spec.estimator + ": " + std::to_string(estimator->weights.size()) +
                " layer weights, but the traces' model has " + std::to_string(n_layers) +
                " layers (calibrated on another model?)");
  if (estimator->mode != mode_name(spec.mode))
    throw Error(spec.estimator + ": calibrated on " + estimator->mode + " runs, but this sweep is " +
                mode_name(spec.mode));
  return estimator;
}

// One replayed request's rows (and detail lines): one write per request, detail first, both
// flushed, so a kill leaves whole requests or a torn tail that --resume redoes.
void write_request(const SweepSpec& spec, const std::vector<ReplayConfig>& configs,
                   const std::optional<Estimator>& estimator, const std::string& trace, const std::string& id,
                   const RequestResult& res, std::ofstream& csv, std::ofstream& detail) {
  std::ostringstream rows;  // one write per request: a kill leaves whole requests or a torn tail
  for (std::size_t p = 0; p < configs.size(); ++p) {
    const ConfigResult& r = res.configs[p];
    results::SweepRow row;
    row.trace = trace, row.request = id, row.mode = mode_name(spec.mode);
    row.policy = configs[p].policy, row.params = configs[p].params, row.budget = configs[p].budget;
    row.budget_tokens = r.budget_tokens, row.kept_fraction = r.kept_fraction, row.mean_recall = r.mean_recall;
    row.mean_kl = r.mean_kl, row.p95_kl = r.p95_kl, row.mean_out_err = r.mean_err, row.p95_out_err = r.p95_err;
    row.compressed_bytes = r.compressed_bytes, row.budget_bytes = r.budget_bytes, row.peak_bytes = r.peak_bytes;
    row.final_bytes = r.final_bytes, row.footprint_byte_steps = r.footprint, row.host_bytes = r.host_bytes;
    row.eval_queries = res.eval_queries, row.rows = r.rows, row.keep_hash = r.keep_hash;
    row.position_fallback = r.position_fallback, row.budget_semantics = spec.budget_rule.name();
    row.decode_peak_bytes = r.decode_peak_bytes, row.mean_out_sq = r.mean_out_sq;
    if (estimator) row.est_kl = estimator->predict(r.layer_out_sq, spec.estimator);
    rows << results::sweep_row_line(row) << "\n";
    if (detail.is_open())
      detail << results::detail_row_line({trace, id, configs[p].label(), configs[p].budget, r.layer_recall, r.layer_kl,
                                          r.layer_err, r.layer_out_sq, r.layer_p95_kl, r.layer_p95_err, r.head_kl})
             << "\n";
  }
  if (detail.is_open()) detail.flush();  // detail first: resume redoes a request whose detail is torn
  csv << rows.str();
  csv.flush();  // a finished request is never lost
}

}  // namespace

std::vector<SweepSummaryRow> run_sweep(const SweepSpec& spec, std::ostream& progress) {
  if (spec.traces.empty()) throw Error("no trace files given");
  if (spec.out_csv.empty()) throw Error("no output file given (--out results.csv)");
  if (spec.shards < 1 || spec.shard < 0 || spec.shard >= spec.shards)
    throw Error("--shard " + std::to_string(spec.shard) + "/" + std::to_string(spec.shards) + ": expected 0 <= i < n");
  const std::vector<ReplayConfig> configs = expand_configs(spec);
  std::int64_t total_requests = 0;
  const std::vector<std::unique_ptr<TraceReader>> readers = open_traces(spec, configs, progress, total_requests);
  const std::optional<Estimator> estimator = sweep_estimator(spec, readers.front()->geometry().n_layers);
  const results::SweepConfig config = sweep_config(spec, configs, total_requests);
  if (spec.shards > 1) total_requests = (total_requests - spec.shard + spec.shards - 1) / spec.shards;
  ResumeState state, detail_state;
  const bool exists = std::filesystem::exists(spec.out_csv);
  if (exists && spec.resume) {
    state = read_for_resume(spec.out_csv, config, configs.size());
    if (!spec.detail_jsonl.empty()) {
      // A request is finished when its detail is whole too: a kill may fall between the files.
      detail_state = read_detail_for_resume(spec.detail_jsonl, config, configs.size());
      state.keep_only(detail_state.done);
    }
  } else if (exists && !spec.force) {
    throw Error(spec.out_csv + ": exists; pass --resume to continue that sweep or --force to replace it");
  }
  // (Re)write header + finished rows, atomically, then append as requests finish.
  {
    const std::string tmp = spec.out_csv + ".tmp";
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw Error(spec.out_csv + ": cannot write");
    out << results::sweep_file_head(config);
    for (const auto& [key, rows] : state.kept)
      for (const auto& l : rows) out << l << "\n";
    out.close();
    std::filesystem::rename(tmp, spec.out_csv);
  }
  std::ofstream csv(spec.out_csv, std::ios::app);
  std::ofstream detail;
  if (!spec.detail_jsonl.empty()) {
    // The detail of the finished requests, in the CSV's order, behind the same configuration line.
    std::map<RequestKey, const std::vector<std::string>*> lines_of;
    for (const auto& [key, rows] : detail_state.kept) lines_of[key] = &rows;
    detail.open(spec.detail_jsonl, std::ios::trunc);
    if (!detail) throw Error(spec.detail_jsonl + ": cannot write");
    detail << results::detail_file_head(config);
    for (const auto& [key, rows] : state.kept)
      for (const auto& l : *lines_of.at(key)) detail << l << "\n";
  }

  const bool tty = spec.progress && ::isatty(2);
  std::int64_t done = 0, k = 0;
  for (std::size_t t = 0; t < readers.size(); ++t) {
    const TraceReader& reader = *readers[t];
    const Replayer replayer(reader, spec.mode, configs, spec.compress_every, spec.budget_rule);
    for (const auto& id : reader.request_ids()) {
      if (k++ % spec.shards != spec.shard) continue;  // another shard's request
      ++done;
      if (state.done.count({spec.traces[t], id})) continue;
      if (spec.claim && !spec.claim(spec.traces[t], id)) continue;  // another process's
      if (spec.progress) {
        progress << (tty ? "\r" : "") << "sweep: request " << done << "/" << total_requests << " (" << spec.traces[t]
                 << " " << id << ", " << configs.size() << " configs)" << (tty ? "   " : "\n") << std::flush;
      }
      const RequestResult res = replayer.replay(id);
      write_request(spec, configs, estimator, spec.traces[t], id, res, csv, detail);
    }
  }
  if (tty) progress << "\n";
  csv.close();

  return summarize_sweep_csv(spec.out_csv);  // every row in the file, resumed ones included
}

std::vector<SweepSummaryRow> summarize_sweep_csv(const std::string& path) {
  std::map<std::pair<double, std::string>, SweepSummaryRow> agg;
  for (const results::SweepRow& r : results::read_sweep_file(path).rows) {
    const std::string label = PolicyRegistry::instance().compact_label(r.policy, r.params);
    SweepSummaryRow& s = agg[{r.budget, label}];
    s.label = label;
    s.budget = r.budget;
    s.mean_recall += r.mean_recall;
    s.mean_kl += r.mean_kl;
    s.p95_kl += r.p95_kl;
    s.mean_err += r.mean_out_err;
    s.kept_fraction += r.kept_fraction;
    ++s.requests;
  }
  std::vector<SweepSummaryRow> rows;
  for (auto& [key, s] : agg) {
    const double n = s.requests;
    s.mean_recall /= n;
    s.mean_kl /= n;
    s.p95_kl /= n;
    s.mean_err /= n;
    s.kept_fraction /= n;
    rows.push_back(s);
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a.budget != b.budget ? a.budget < b.budget : a.mean_kl < b.mean_kl;
  });
  return rows;
}

void print_summary(const std::vector<SweepSummaryRow>& rows, std::ostream& os) {
  os << std::left << std::setw(8) << "budget" << std::setw(44) << "policy" << std::right << std::setw(10) << "kept"
     << std::setw(10) << "recall" << std::setw(10) << "KL" << std::setw(10) << "p95 KL" << std::setw(10) << "out err"
     << std::setw(6) << "reqs"
     << "\n";
  double last = -1;
  for (const auto& r : rows) {
    if (r.budget != last && last >= 0) os << "\n";
    last = r.budget;
    std::string label = table_label(r.label);
    if (label.size() > 42) label = label.substr(0, 39) + "...";
    char buf[160];
    std::snprintf(buf, sizeof buf, "%-8.3g%-44s%10.3f%10.4f%10.4f%10.4f%10.4f%6d", r.budget, label.c_str(),
                  r.kept_fraction, r.mean_recall, r.mean_kl, r.p95_kl, r.mean_err, r.requests);
    os << buf << "\n";
  }
}

}  // namespace kvsim
