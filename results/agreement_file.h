#pragma once
// The owner of the agreement file (`kvsim verify --agreement`, `kvsim agreement`;
// docs/result-files.md): a banner with the schema and the counts, the column names, then one row
// per offline metric: how well it ranks configs as the live model does.
#include <string>
#include <vector>

namespace kvsim::results {

inline constexpr int kAgreementSchema = 2;

struct AgreementRow {
  std::string metric;
  double spearman_kl = 0, kendall_kl = 0;
  double within_budget_spearman_kl = 0;      // mean over budgets with >= 3 configs: ranking policies at one budget
  double within_budget_min_spearman_kl = 0;  // the worst of those budgets
  double spearman_task = 0, kendall_task = 0;
  double top_recall = 0;    // of the live top-k (lowest live KL), the share in the offline top-k
  double top_in_wider = 0;  // of the live top-k, the share in the offline top-(wider k)
};

struct AgreementFile {
  int schema = kAgreementSchema;
  int configs = 0, requests = 0, excluded = 0;  // excluded: calibration requests left out
  int top_k = 5, wider_k = 8;
  std::vector<AgreementRow> rows;
};

std::string agreement_file_text(const AgreementFile& f);
// Reads and checks one; errors name the file, line and column.
AgreementFile read_agreement_file(const std::string& path);

}  // namespace kvsim::results
