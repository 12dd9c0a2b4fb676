#include "results/agreement_file.h"

#include <cstdio>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>

#include "core/csv.h"
#include "core/error.h"
#include "results/schema.h"

namespace kvsim::results {

namespace {

const char* const kPrefix = "# kvsim verify agreement";
const char* const kKind = "kvsim agreement file";

std::vector<std::string> columns(int top_k, int wider_k) {
  const std::string k = std::to_string(top_k);
  return {"offline_metric",
          "spearman_live_kl",
          "kendall_live_kl",
          "within_budget_spearman_live_kl",
          "within_budget_min_spearman_live_kl",
          "spearman_task_score",
          "kendall_task_score",
          "top" + k + "_recall",
          "top" + k + "_in_top" + std::to_string(wider_k)};
}

// The counts of the banner: "...: N configs, M requests[ (K calibration requests left out)]".
void read_counts(const std::string& path, AgreementFile& f) {
  const Banner banner = read_banner(path, kPrefix, kKind, kAgreementSchema);
  f.schema = banner.schema;
  if (std::sscanf(banner.rest.c_str(), "%d configs, %d requests (%d", &f.configs, &f.requests, &f.excluded) < 2)
    throw FormatError(path + ":1: expected '" + kPrefix + ": N configs, M requests'");
}

// top_k and wider_k from the last two column names ("top5_recall", "top5_in_top8").
void read_ks(const CsvReader& csv, const std::string& path, AgreementFile& f) {
  for (int k = 1; k <= 1000; ++k)
    if (csv.has("top" + std::to_string(k) + "_recall")) {
      f.top_k = k;
      for (int w = k; w <= 1000; ++w)
        if (csv.has("top" + std::to_string(k) + "_in_top" + std::to_string(w))) {
          f.wider_k = w;
          return;
        }
    }
  throw FormatError(path + ": no columns topK_recall and topK_in_topW; expected a " + std::string(kKind));
}

}  // namespace

std::string agreement_file_text(const AgreementFile& f) {
  std::string out = banner_with_schema(kPrefix, f.schema) + ": " + std::to_string(f.configs) + " configs, " +
                    std::to_string(f.requests) + " requests";
  if (f.excluded > 0) out += " (" + std::to_string(f.excluded) + " calibration requests left out)";
  out += "\n" + csv_line(columns(f.top_k, f.wider_k)) + "\n";
  for (const auto& x : f.rows)
    out += csv_line({x.metric, csv_number(x.spearman_kl), csv_number(x.kendall_kl),
                     csv_number(x.within_budget_spearman_kl), csv_number(x.within_budget_min_spearman_kl),
                     csv_number(x.spearman_task), csv_number(x.kendall_task), csv_number(x.top_recall),
                     csv_number(x.top_in_wider)}) +
           "\n";
  return out;
}

AgreementFile read_agreement_file(const std::string& path) {
  AgreementFile f;
  read_counts(path, f);
  CsvReader csv(path, {"offline_metric", "spearman_live_kl", "kendall_live_kl"}, std::string("a ") + kKind);
  read_ks(csv, path, f);
  const std::vector<std::string> cols = columns(f.top_k, f.wider_k);
  while (csv.next()) {
    AgreementRow r;
    r.metric = csv.text(cols[0]);
    double* values[] = {&r.spearman_kl,
                        &r.kendall_kl,
                        &r.within_budget_spearman_kl,
                        &r.within_budget_min_spearman_kl,
                        &r.spearman_task,
                        &r.kendall_task,
                        &r.top_recall,
                        &r.top_in_wider};
    for (std::size_t i = 1; i < cols.size(); ++i)
      *values[i - 1] = csv.has(cols[i]) ? csv.number(cols[i]) : std::numeric_limits<double>::quiet_NaN();
    f.rows.push_back(r);
  }
  return f;
}

}  // namespace kvsim::results
