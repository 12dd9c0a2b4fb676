#pragma once
// How well the offline ranking of (policy, budget) configs predicts the live one: rank
// correlations (Spearman, Kendall tau-b) between each offline metric and the live KL and task
// score, over the configs verified (means over the requests both sides ran), and top-k recall.
#include <iosfwd>
#include <string>
#include <vector>

#include "results/agreement_file.h"
#include "verify/sweep_results.h"

namespace kvsim {

double spearman(const std::vector<double>& a, const std::vector<double>& b);  // NaN if undefined
double kendall_tau_b(const std::vector<double>& a, const std::vector<double>& b);

struct LiveRow {
  std::string request, policy, params;
  double budget = 0;
  double live_kl = 0, top1 = 0, task_score = 0;  // task_score NaN: the request has no expected answer
};

using results::AgreementRow;  // one per offline metric (results/agreement_file.h)

struct AgreementReport {
  int configs = 0, requests = 0, top_k = 5, wider_k = 8;
  std::vector<std::string> excluded;  // requests left out (an estimator was fitted on them)
  std::vector<AgreementRow> rows;     // one per offline metric
};

// Configs that compress (budget < 1) and appear on both sides, over the live requests not in
// `exclude`; throws when too few do, naming why. Metrics no offline row has are left out.
AgreementReport agreement(const std::vector<OfflineRow>& offline, const std::vector<LiveRow>& live,
                          const std::vector<std::string>& metrics, int top_k = 5,
                          const std::vector<std::string>& exclude = {}, int wider_k = 8);

void write_agreement_csv(const AgreementReport& r, const std::string& path);
void print_agreement(const AgreementReport& r, std::ostream& os);

}  // namespace kvsim
