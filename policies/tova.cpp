// TOVA — Oren et al., "Transformers are Multi-State RNNs", EMNLP 2024
// (schwartz-lab-NLP/TOVA tova_cache.py; kvpress tova_press.py for the prefill form).
// Rule: keep the tokens the current (last) query attends to most, averaged over all query heads
// of the layer; one token set for every KV head. Prefill one-shot form.
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {
namespace {

class Tova : public ScoringPolicy {
 public:
  std::vector<HeadScores> score(const LayerSignals& s) const override {
    const KvGeometry& g = s.geometry();
    std::vector<std::vector<float>> rows;
    for (int q = 0; q < g.n_q_heads; ++q) rows.push_back(column_sums(s.window_attention(q, 1)));
    HeadScores h;
    h.score = aggregate_group(rows, GqaAgg::Mean);
    h.protect = protect_ends(s.n_tokens(), 0, 1);  // kvpress keeps the last token
    return std::vector<HeadScores>(static_cast<std::size_t>(g.n_kv_heads), h);
  }
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{"tova",
                                 "attention of the last query, mean over all heads of the layer, same set for "
                                 "every KV head (prefill one-shot)",
                                 "Oren et al., EMNLP 2024, arXiv 2401.06104", {},
                                 [](const Params&) { return std::make_unique<Tova>(); }});

}  // namespace kvsim
