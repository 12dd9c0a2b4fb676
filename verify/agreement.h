#pragma once
// How well the offline ranking of (policy, budget) configs predicts the live one: rank
// correlations (Spearman, Kendall tau-b) between each offline metric and the live KL and task
// score, over the configs verified (means over the requests both sides ran), and top-k recall.
#include <iosfwd>
#include <string>
#include <vector>

#include "verify/sweep_results.h"

namespace kvsim {

double spearman(const std::vector<double>& a, const std::vector<double>& b);  // NaN if undefined
double kendall_tau_b(const std::vector<double>& a, const std::vector<double>& b);

struct LiveRow {
  std::string request, policy, params;
  double budget = 0;
  double live_kl = 0, top1 = 0, task_score = 0;  // task_score NaN: the request has no expected answer
};

struct AgreementRow {
  std::string metric;
  double spearman_kl = 0, kendall_kl = 0;
  double within_budget_spearman_kl = 0;      // mean over budgets with >= 3 configs: ranking policies at one budget
  double within_budget_min_spearman_kl = 0;  // the worst of those budgets
  double spearman_task = 0, kendall_task = 0;
  double top_recall = 0;    // of the live top-k (lowest live KL), the share in the offline top-k
  double top_in_wider = 0;  // of the live top-k, the share in the offline top-(wider k)
};

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
