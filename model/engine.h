#pragma once
// What capture and live verify run a model on: the CPU engine (llama_model.h) or the CUDA
// backend through backend_engine.h, chosen with --device. Both hold the KV cache as a host KvCache that
// compression edits between forward() calls (the CUDA engine mirrors it and re-loads the device
// after an edit), and hand every layer's post-RoPE Q/K/V to a hook.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model/kv_cache.h"
#include "model/weight_matrix.h"
#include "core/decode_rule.h"
#include "core/geometry.h"
#include "core/rope.h"

namespace kvsim {

class GgufFile;

// The model's geometry and forward-pass settings from its GGUF metadata (llama and qwen2 files);
// throws naming a missing or bad key.
ModelConfig model_config(const GgufFile& f);

// What a forward pass exposes per layer, for n new tokens (rows), post-RoPE, row-major:
// q [n, n_head, head_dim], k and v [n, n_head_kv, head_dim].
struct LayerActivations {
  int layer;
  std::int64_t n;
  std::span<const float> q, k, v;
};
using LayerHook = std::function<void(const LayerActivations&)>;

// A CacheBlend-style refresh of cached rows (Engine::refresh, docs/chunk-states.md).
struct RefreshOptions {
  // Layers below it run every row in full. At it, every row's K/V is recomputed (replacing the
  // cached ones) and compared with the cached, and `select` picks the rows that go on; above it
  // only those run, their K/V replacing the cached at every layer. Layer 0's K/V do not depend on
  // the context, so 1 is the first layer whose deviation says anything.
  int select_layer = 1;
  // Given each row's deviation at select_layer (squared difference of its new K and V from the
  // cached ones, summed over KV heads and dimensions), the rows recomputed above it: indices into
  // the refreshed rows, increasing. Unset: every row.
  std::function<std::vector<std::int64_t>(const std::vector<double>&)> select;
  // Row ranges [begin, end) run together, in order, covering every row: prefill's chunks, so that
  // a refresh of every row equals prefill bit for bit. Empty: one range.
  std::vector<std::pair<std::int64_t, std::int64_t>> batches;
};
struct RefreshResult {
  std::vector<double> deviation;       // per row, at select_layer
  std::vector<std::int64_t> selected;  // the rows recomputed above it
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const ModelConfig& config() const = 0;
  // Appends `tokens` at `positions` to the KV cache and returns the logits of the rows listed
  // in `logit_rows` (indices into tokens), [rows, vocab]. `hook` (optional) sees every layer.
  virtual std::vector<float> forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> positions,
                                     std::span<const std::int64_t> logit_rows, const LayerHook& hook = {}) = 0;
  // `tokens` continue the cached sequence at the next positions, in chunks of `chunk`; returns
  // the last token's logits [vocab].
  std::vector<float> prefill(std::span<const std::int32_t> tokens, std::int64_t chunk = 256,
                             const LayerHook& hook = {});
  // One decode step: `token` at the next position; returns its logits [vocab].
  std::vector<float> step(std::int32_t token, const LayerHook& hook = {});
  // Recomputes the K/V of cached rows in place (RefreshOptions): `tokens` at `positions` are the
  // sequence's tokens `indices` (increasing, each cached in every entry of every layer). Each row
  // reads the cache up to its own token, so the rows before and after it need not be exact. The
  // CPU engine runs it; others throw.
  virtual RefreshResult refresh(std::span<const std::int32_t> tokens, std::span<const std::int32_t> positions,
                                std::span<const std::int64_t> indices, const RefreshOptions& options);
  virtual void reset() = 0;                                    // empties the KV cache: one full entry per KV head
  virtual void reserve(std::int64_t tokens) = 0;               // sizes the KV cache for this many tokens
  std::int64_t cached_tokens() const { return cache().seen; }  // tokens run through since reset()
  virtual const KvCache& cache() const = 0;
  virtual KvCache& cache() = 0;  // for editing between forward() calls
  virtual void set_cache(KvCache cache) = 0;
  // Drops `tokens` (each must be cached) from one entry: KvCache::evict, which a backend engine
  // also applies on the device instead of reloading the cache.
  virtual void evict(int layer, int entry, std::span<const std::int32_t> tokens) {
    cache().evict(layer, entry, tokens);
  }
  // When on, forward() keeps each layer's attention weights of its last row over the entry the
  // query head reads (aligned with that entry's tokens): what decode-time policies read.
  virtual void record_last_attention(bool on) = 0;
  virtual std::span<const float> last_attention(int layer, int q_head) const = 0;
  // Decode-time policy steps where the cache is (core/decode_rule.h), for engines that run them
  // (the backend engine: on the GPU with --device cuda, so neither the cache nor the attention
  // weights go to the host for a step). start_decode_rule hands a layer's rule over; it applies
  // to the layer as it is when the next forward() starts, and an edit (a mutable cache(),
  // set_cache, reset), before that or after, ends it. decode_rule_step, after each one-token forward(), runs every
  // layer's rule with `budget` tokens per entry and returns the evicted tokens [layer][entry]
  // (none for layers without a rule), already gone from the cache. Others throw.
  virtual bool runs_decode_rules() const { return false; }
  virtual void start_decode_rule(int layer, const DecodeRuleStart& start);
  virtual std::vector<std::vector<std::vector<std::int32_t>>> decode_rule_step(std::int64_t budget);
  virtual std::string device() const = 0;  // "cpu", or "cuda:N (name)"
  // Whether the engine holds a KvEntry's packed form (KvEntry::packed) as stored, so that a caller
  // encoding tokens with a codec should pack them; the CPU engine attends over the codec's float
  // reconstruction and has no use for it.
  virtual bool holds_packed() const { return false; }
};

enum class Device { Cpu, Cuda };
Device parse_device(const std::string& s);  // "cpu" | "cuda"; throws naming the value
const char* device_name(Device d);
// Whether this build has the CUDA backend (nvcc was found at configure time).
bool cuda_built();
// Throws a clear Error when `d` cannot run here (CUDA: not built in, or no device visible), so a
// command can refuse before it reads or writes anything.
void require_device(Device d);

struct EngineOptions {
  Device device = Device::Cpu;
  WeightFormat weights = WeightFormat::Quantized;  // CPU: keep GGUF blocks or dequantize to f32
  bool gpu_f32 = false;                            // CUDA: fp32 weights on the device (default fp16)
};
// The engine for `f` (which must outlive it). Throws a clear Error when CUDA is asked for and
// this build has none, or no device is visible.
std::unique_ptr<Engine> make_engine(const GgufFile& f, const EngineOptions& o);

}  // namespace kvsim
