#pragma once
// The interface both transformer backends offer (the CUDA one and its CPU reference), so one
// engine (model/backend_engine.h) drives either: on a CPU machine the reference stands in for
// the GPU and every line of the engine above it is tested.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/decode_rule.h"
#include "gpu/transformer_shape.h"

namespace kvsim::gpu {

class TransformerBackend {
 public:
  virtual ~TransformerBackend() = default;
  virtual const ModelConfig& shape() const = 0;
  virtual WeightSink sink() = 0;
  virtual void reset() = 0;  // every layer: n_head_kv empty entries
  // Replaces a layer's cache; rows are held as fp16 (a codec's rebuilt rows are rounded), an
  // entry's packed prefix (HostEntry::packed) as stored where the backend can.
  virtual void load_layer(int layer, std::span<const HostEntry> entries) = 0;
  // Keeps only `rows` (increasing indices) of one entry, in place: an eviction without a reload.
  virtual void keep_rows(int layer, int entry, std::span<const std::int64_t> rows) = 0;
  // Appends the tokens at `positions` to every entry and returns the logits [rows, vocab] of
  // `logit_rows`; `on_layer` sees each layer's new rows (q only with want_q). With record_last,
  // last_attention() then holds each query head's softmax of the last row over its entry.
  virtual std::vector<float> forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> positions,
                                     std::span<const std::int64_t> logit_rows, bool want_q, bool record_last,
                                     const LayerCallback& on_layer) = 0;
  virtual std::span<const float> last_attention(int layer, int q_head) const = 0;
  // Whether forward(record_last) also hands the weights to the host for last_attention() (on by
  // default); off when only rule steps read them, so they stay where they were computed.
  virtual void set_last_on_host(bool on) = 0;
  // Decode-time eviction where the cache is (core/decode_rule.h). start_rule: the layer evicts by
  // `start` from the next rule_step on, its scores aligned with the rows its entries hold now.
  // load_layer and reset end a layer's rule; keep_rows refuses a layer that has one.
  virtual void start_rule(int layer, const DecodeRuleStart& start) = 0;
  // One step of every layer's rule, right after a one-row forward() with record_last, `budget`
  // rows per entry: the evicted rows [layer][entry] (increasing; none for a layer without a rule),
  // already gone from the cache. Throws std::logic_error when no such forward() came first.
  virtual std::vector<std::vector<std::vector<std::int64_t>>> rule_step(std::int64_t budget) = 0;
  virtual std::string name() const = 0;  // for traces and reports
};

}  // namespace kvsim::gpu
