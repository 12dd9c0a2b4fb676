// StreamingLLM — Xiao et al., "Efficient Streaming Language Models with Attention Sinks",
// ICLR 2024 (mit-han-lab/streaming-llm; kvpress streaming_llm_press.py for the prefill form).
// Rule: keep the first `sinks` tokens and the most recent ones, drop the middle.
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {
namespace {

class StreamingLlm : public ScoringPolicy {
 public:
  explicit StreamingLlm(std::int64_t sinks) : sinks_(sinks) {}
  std::vector<HeadScores> score(const LayerSignals& s) const override {
    HeadScores h;
    h.score.resize(static_cast<std::size_t>(s.n_tokens()));
    for (std::size_t j = 0; j < h.score.size(); ++j) h.score[j] = static_cast<float>(j);  // recency
    h.protect = protect_ends(s.n_tokens(), sinks_, 0);
    return std::vector<HeadScores>(static_cast<std::size_t>(s.geometry().n_kv_heads), h);
  }

 private:
  std::int64_t sinks_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "streamingllm", "attention sinks + most recent tokens (prefill one-shot, kvpress form; no position shift)",
    "Xiao et al., ICLR 2024, arXiv 2309.17453",
    {{"sinks", "4", "first tokens always kept (paper and kvpress: 4)"}},
    [](const Params& p) { return std::make_unique<StreamingLlm>(p.integer("sinks")); }});

}  // namespace kvsim
