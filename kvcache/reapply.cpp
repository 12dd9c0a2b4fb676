#include "kvcache/reapply.h"

#include "core/error.h"
#include "kvcache/plan_apply.h"
#include "policies/codec.h"

namespace kvsim::kvcache {

namespace {

class Reapply final : public DecodeState {
 public:
  Reapply(const ReplayConfig& cfg, const ConfigBudget& b, const LayerPlan& initial, std::int64_t c, int head_dim)
      : cfg_(cfg),
        b_(b),
        codec_(cfg.impl->codec()),
        d_(head_dim),
        plan_bytes_(b.fraction * static_cast<double>(c) * b.kv_token_bytes),
        state_bytes_(b.token_bytes - b.kv_token_bytes) {
    if (b.peak_tokens <= 0)
      throw Error("policy " + cfg.label() + ": re-application needs a peak-matched budget (a kvsim bug)");
    for (const HeadPlan& hp : initial.heads) {
      kept_ += hp.kept();
      if (codec_) encoding_.push_back(without_drops(hp));
    }
    ceiling_ = kept_ + static_cast<std::int64_t>(initial.heads.size()) * (b.peak_tokens - b.tokens);
  }

  bool needs_attention() const override { return false; }

  void step(const DecodeStep& s, std::vector<std::vector<std::int32_t>>& evict) override {
    if (codec_) {  // the token joined in fp16; a full cache re-encodes in retier()
      for (HeadPlan& enc : encoding_) {
        enc.codec.push_back(TokenCodec::Fp16);
        if (!enc.rank.empty()) enc.rank.push_back(0);
      }
      return;
    }
    if (!full(s)) return;
    const LayerPlan plan = replan(s);
    for (std::size_t kv = 0; kv < plan.heads.size(); ++kv)
      for (std::size_t m = 0; m < plan.heads[kv].codec.size(); ++m)
        if (plan.heads[kv].codec[m] == TokenCodec::Drop) evict[kv].push_back(s.cache[kv][m]);
  }

  bool retier(const DecodeStep& s, LayerPlan& plan) override {
    if (!codec_ || !full(s)) return false;
    plan = replan(s);
    encoding_.clear();
    for (const HeadPlan& hp : plan.heads) encoding_.push_back(without_drops(hp));
    return true;
  }

 private:
  // Whether the next token would not fit: an eviction policy's layer would hold more rows than it
  // kept at the compression point plus the headroom (its heads and layers may share the budget
  // unevenly, as Ada-KV's and PyramidKV's do; the whole cache then holds the budget); a codec
  // entry (every head held to the same bytes) more bytes than the peak budget.
  bool full(const DecodeStep& s) const {
    if (!codec_) {
      std::int64_t rows = 0;
      for (const auto& held : s.cache) rows += static_cast<std::int64_t>(held.size());
      return rows + static_cast<std::int64_t>(s.cache.size()) > ceiling_;
    }
    for (std::size_t kv = 0; kv < s.cache.size(); ++kv) {
      const double bytes = codec_->bytes(encoding_[kv], d_) + static_cast<double>(s.cache[kv].size()) * state_bytes_;
      if (bytes + b_.token_bytes > b_.peak_entry_bytes + 1e-6) return true;
    }
    return false;
  }

  // The policy's plan for the cache as it is, at the same bytes as at the compression point (its
  // fraction of the larger cache shrinks to keep them). An eviction policy whose allocation moved
  // rows into this layer is asked again at a proportionally smaller budget until the layer keeps
  // no more than it did at the compression point.
  LayerPlan replan(const DecodeStep& s) const {
    if (!s.signals || !*s.signals)
      throw Error("policy " + cfg_.label() + ": the engine offers no signals to re-apply the policy at step " +
                  std::to_string(s.token) + " under --budget-semantics peak (a kvsim bug)");
    const std::shared_ptr<const LayerSignals> signals = (*s.signals)();
    ConfigBudget now = b_;
    now.fraction = plan_bytes_ / (static_cast<double>(signals->n_tokens()) * b_.kv_token_bytes);
    std::vector<std::int64_t> cached;
    for (const auto& held : s.cache) cached.push_back(static_cast<std::int64_t>(held.size()));
    for (int attempt = 0;; ++attempt) {
      LayerPlan plan = make_plan(cfg_, now, *signals, cached, true);
      if (codec_) return plan;
      std::int64_t kept = 0;
      for (const HeadPlan& hp : plan.heads) kept += hp.kept();
      if (kept <= kept_) return plan;
      if (attempt == 8 || now.tokens == 0)
        throw Error("policy " + cfg_.label() + ": re-applied at step " + std::to_string(s.token) + " it keeps " +
                    std::to_string(kept) + " tokens in layer " + std::to_string(signals->layer()) + ", more than the " +
                    std::to_string(kept_) + " it kept at the compression point, at any smaller budget");
      now.tokens = std::min(now.tokens - 1, now.tokens * kept_ / kept);
    }
  }

  ReplayConfig cfg_;
  ConfigBudget b_;
  const KvCodec* codec_;
  int d_;
  double plan_bytes_;               // bytes per entry a plan may keep (the budget less the headroom)
  double state_bytes_;              // per-token policy state beside K/V
  std::vector<HeadPlan> encoding_;  // codec policies: how each entry's held tokens are stored now
  std::int64_t kept_ = 0;           // tokens the layer kept at the compression point
  std::int64_t ceiling_ = 0;        // eviction policies: rows the layer may hold with a token joining
};

}  // namespace

std::unique_ptr<DecodeState> reapply_state(const ReplayConfig& cfg, const ConfigBudget& b, const LayerPlan& initial,
                                           std::int64_t c, int head_dim) {
  if (has_logit_bias(initial))
    throw Error("policy " + cfg.label() +
                ": a soft-gated plan holds the whole cache, so it cannot be held to a peak "
                "budget; run it with --budget-semantics point");
  return std::make_unique<Reapply>(cfg, b, initial, c, head_dim);
}

DecodeStart decode_start(const ReplayConfig& cfg, const ConfigBudget& b, const LayerPlan& plan,
                         std::unique_ptr<DecodeState> own, std::int64_t c, int n_kv_heads, int head_dim) {
  const bool per_query_head = static_cast<int>(plan.heads.size()) != n_kv_heads;
  DecodeStart out{std::move(own), false};
  if (!out.state && b.peak_tokens > 0) {
    if (per_query_head)
      throw Error("policy " + cfg.label() +
                  ": per-query-head plans cannot be re-applied under --budget-semantics peak");
    out.state = reapply_state(cfg, b, plan, c, head_dim);
    out.reapplied = true;
  }
  if (out.state && per_query_head)
    throw Error("policy " + cfg.label() +
                ": decode-time plans must have one entry per KV head (per-query-head plans "
                "cannot be stepped)");
  return out;
}

void check_peak_bytes(const ReplayConfig& cfg, const ConfigBudget& b, double peak_bytes, double budget_bytes,
                      const std::string& where) {
  if (b.peak_tokens > 0 && peak_bytes > budget_bytes * (1 + 1e-9) + 1e-6)
    throw Error("policy " + cfg.label() + " held " + std::to_string(peak_bytes) + " bytes at a step after the " +
                "compression point, over its peak budget " + std::to_string(budget_bytes) + " in " + where +
                " (a kvsim bug)");
}

}  // namespace kvsim::kvcache
