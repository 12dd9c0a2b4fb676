#pragma once
// Shared by the uniform quantization baselines (intn.cpp, kivi.cpp): the byte budget of one cache
// at a compression point, and the keep rule when even quantized tokens do not all fit.
#include <cstdint>
#include <functional>
#include <vector>

#include "policies/codec.h"
#include "policies/policy.h"
#include "policies/quantize.h"

namespace kvsim {

// The budget in bytes of one (layer, KV head) cache: the budget fraction of its full fp16 K/V.
double head_byte_budget(const LayerSignals& s, const Budget& b);

// Keeps every cached token if `bytes(n)` fits `budget`; else the first `sinks` and the most
// recent tokens, as many as fit (StreamingLLM's rule: these baselines spend no signal on
// choosing), and the plan is marked position_fallback. Kept tokens get `codec`; bytes(k) is the
// cache's cost with k kept tokens.
HeadPlan fit_quantized(std::int64_t n, double budget, int sinks, TokenCodec codec,
                       const std::function<double(std::int64_t)>& bytes);

// fit_quantized for every KV head of a layer, each with the layer's per-head byte budget.
LayerPlan fit_every_head(const LayerSignals& s, const Budget& b, int sinks, TokenCodec codec,
                         const std::function<double(std::int64_t)>& bytes);

TokenCodec int_codec(int bits);

// Per-token intN storage (tokens marked Int2/4/8 are quantized with one IntSpec; Fp16 stays).
// With `host_copy`, every quantized token also keeps its fp16 rows on the host so it can be
// promoted back (QEvict's recoverable tier): those bytes are host bytes, not device bytes.
class IntCodec : public KvCodec {
 public:
  explicit IntCodec(IntSpec s, bool host_copy = false) : s_(s), host_copy_(host_copy) {}
  double bytes(const HeadPlan& plan, int head_dim) const override;
  double host_bytes(const HeadPlan& plan, int head_dim) const override;
  void reconstruct(const HeadPlan& plan, const ModelGeometry& g, std::span<const std::int32_t> positions,
                   std::span<float> keys, std::span<float> values) const override;
  void pack(const HeadPlan& plan, const ModelGeometry& g, std::span<const std::int32_t> positions,
            std::span<const float> keys, std::span<const float> values, PackedEntry& out) const override;
  const IntSpec& spec() const { return s_; }

 private:
  IntSpec s_;
  bool host_copy_;
};

}  // namespace kvsim
