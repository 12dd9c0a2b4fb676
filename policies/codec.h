#pragma once
// Codecs turn a plan's per-token encoding into bytes and into the reconstructed K̂/V̂ that the
// metrics compare against. Drop and fp16 are built in; a policy with other encodings (quantized
// tiers) supplies a KvCodec, which replay and live verify both use.
#include <cstdint>
#include <span>

#include "policies/policy.h"

namespace kvsim {

struct PackedEntry;  // core/packed_kv.h

// Bytes one token costs in one (layer, KV head) under `codec`: keys and values together,
// including per-token metadata the codec needs (scales, coefficients).
double codec_token_bytes(TokenCodec codec, int head_dim);

// Whether the replay can reconstruct this encoding today.
bool codec_supported(TokenCodec codec);
const char* codec_name(TokenCodec codec);

// Reconstructs one token's key and value (head_dim floats each) as the cache would hold them.
// Drop yields nothing (returns false). The trace already stores fp16, so fp16 is the identity.
bool codec_reconstruct(TokenCodec codec, std::span<const float> k, std::span<const float> v, std::span<float> k_hat,
                       std::span<float> v_hat);

// A policy's storage for one (layer, entry) cache: plans mark each cached token Drop, Fp16 or an
// encoding this codec understands (the codec may also treat the kept tokens as a sequence, as
// KIVI's token groups and residual window do).
class KvCodec {
 public:
  virtual ~KvCodec() = default;
  // Bytes of the cache holding the plan's kept tokens: K and V with their metadata.
  virtual double bytes(const HeadPlan& plan, int head_dim) const = 0;
  // Bytes held off the device for this plan (a recoverable tier's fp16 host copy): reported
  // beside the device bytes, never counted against the budget.
  virtual double host_bytes(const HeadPlan& plan, int head_dim) const {
    (void)plan, (void)head_dim;
    return 0.0;
  }
  // Replaces the kept tokens' K and V rows ([kept, head_dim] each, in cached order, post-RoPE)
  // with what the stored encoding reads back; `positions` are the kept tokens' (RoPE) positions.
  virtual void reconstruct(const HeadPlan& plan, const ModelGeometry& g, std::span<const std::int32_t> positions,
                           std::span<float> keys, std::span<float> values) const = 0;
  // Whether reconstruct reads the rows it is handed. False: it writes every kept row from the
  // plan's own data (a low-rank fit of the cached tokens), so the caller need not gather them.
  virtual bool reads_rows(const HeadPlan& plan) const {
    (void)plan;
    return true;
  }
  // As reconstruct, but a codec whose values are all stored as factors (V̂ = C·Uᵀ) may leave them
  // so: `values` then receives C ([kept, r] row-major, zero beyond each token's rank) and `basis`
  // U ([head_dim, head_dim] row-major, its first r columns used; owned by the plan's data), and it
  // returns r. Attention weights times C is an r-wide product instead of a head_dim-wide one plus
  // the rebuild. Returns -1 when `values` holds V̂ (the default).
  virtual int reconstruct_factored(const HeadPlan& plan, const ModelGeometry& g,
                                   std::span<const std::int32_t> positions, std::span<float> keys,
                                   std::span<float> values, std::span<const float>& basis) const {
    reconstruct(plan, g, positions, keys, values);
    basis = {};
    return -1;
  }
  // What a really compressed cache stores for the plan's kept tokens (keys and values as
  // reconstruct takes them): unpack_tensor reads back reconstruct's rows rounded to fp16, and
  // the payload is bytes(plan). The default refuses, naming the missing piece.
  virtual void pack(const HeadPlan& plan, const ModelGeometry& g, std::span<const std::int32_t> positions,
                    std::span<const float> keys, std::span<const float> values, PackedEntry& out) const;
};

// Packs one plan entry: through `codec` when the plan needs it, else as fp16 rows (`codec` may be
// null then). The result is checked (check_packed) before it is returned.
void pack_plan(const KvCodec* codec, const HeadPlan& plan, const ModelGeometry& g,
               std::span<const std::int32_t> positions, std::span<const float> keys, std::span<const float> values,
               PackedEntry& out);

// Whether a plan entry needs its policy's codec (some token is neither dropped nor fp16).
bool needs_codec(const HeadPlan& plan);

}  // namespace kvsim
