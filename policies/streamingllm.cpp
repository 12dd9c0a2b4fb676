// StreamingLLM — Xiao et al., "Efficient Streaming Language Models with Attention Sinks",
// ICLR 2024 (mit-han-lab/streaming-llm; kvpress streaming_llm_press.py for the prefill form).
// Rule: keep the first `sinks` tokens and the most recent ones, drop the middle; phase=decode
// (the original) keeps doing so at every decode step, phase=prefill (kvpress) only once.
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {
namespace {

// Every step: drop the oldest tokens past the sinks until the budget holds.
class StreamingDecode : public DecodeState {
 public:
  explicit StreamingDecode(std::int64_t sinks) : sinks_(sinks) {}
  bool needs_attention() const override { return false; }
  void step(const DecodeStep& s, std::vector<std::vector<std::int32_t>>& evict) override {
    for (std::size_t kv = 0; kv < s.cache.size(); ++kv) {
      const auto& cache = s.cache[kv];
      auto excess = static_cast<std::int64_t>(cache.size()) - s.budget;
      for (std::size_t m = 0; m < cache.size() && excess > 0; ++m) {
        if (cache[m] < sinks_) continue;
        evict[kv].push_back(cache[m]);
        --excess;
      }
    }
  }

 private:
  std::int64_t sinks_;
};

class StreamingLlm : public ScoringPolicy {
 public:
  StreamingLlm(std::int64_t sinks, bool decode) : sinks_(sinks), decode_(decode) {}
  std::unique_ptr<DecodeState> start_decode(const LayerSignals&, const LayerPlan&, const Budget&) const override {
    return decode_ ? std::make_unique<StreamingDecode>(sinks_) : nullptr;
  }
  bool selection_is_uniform() const override { return !decode_; }
  std::int64_t decode_growth() const override { return decode_ ? 1 : 0; }
  std::vector<HeadScores> score(const LayerSignals& s) const override {
    std::vector<HeadScores> out(static_cast<std::size_t>(s.geometry().n_kv_heads));
    for (int kv = 0; kv < s.geometry().n_kv_heads; ++kv) {
      const auto cached = s.cached(kv);
      HeadScores& h = out[static_cast<std::size_t>(kv)];
      h.score.resize(cached.size());
      for (std::size_t m = 0; m < cached.size(); ++m) h.score[m] = static_cast<float>(cached[m]);  // recency
      h.protect = protect_cached(cached, sinks_, 0);
    }
    return out;
  }

 private:
  std::int64_t sinks_;
  bool decode_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "streamingllm",
    "attention sinks + most recent tokens (no position shift: keys keep their trace RoPE)",
    "Xiao et al., ICLR 2024, arXiv 2309.17453",
    {{"sinks", "4", "first tokens always kept (paper and kvpress: 4)"},
     {"phase", "decode", "decode: evict at every step (paper) | prefill: once at the compression point (kvpress)"}},
    [](const Params& p) {
      return std::make_unique<StreamingLlm>(p.integer("sinks"), p.choice("phase", {"decode", "prefill"}) == "decode");
    }});

}  // namespace kvsim
