#include "verify/engine_rows.h"

#include <utility>

#include "core/error.h"
#include "core/packed_kv.h"
#include "policies/codec.h"

namespace kvsim {

EngineRows::EngineRows(Engine& model, int layer, const ModelGeometry& g, const KvCodec* codec,
                       const std::vector<std::int32_t>& positions)
    : model_(model), layer_(layer), g_(g), codec_(codec), positions_(positions) {}

void EngineRows::keep_originals() {
  originals_ = std::as_const(model_).cache().layers[static_cast<std::size_t>(layer_)];
  for (KvEntry& e : originals_) e.packed.reset();
}

void EngineRows::joined() {
  if (originals_.empty()) return;
  const auto& live = std::as_const(model_).cache().layers[static_cast<std::size_t>(layer_)];
  const auto d = static_cast<std::size_t>(g_.head_dim);
  for (std::size_t e = 0; e < originals_.size(); ++e) {
    KvEntry& orig = originals_[e];
    const KvEntry& row = live[e];
    const auto at = static_cast<std::ptrdiff_t>((row.tokens.size() - 1) * d);
    orig.tokens.push_back(row.tokens.back());
    if (!orig.bias.empty()) orig.bias.push_back(0.0f);
    orig.k.insert(orig.k.end(), row.k.begin() + at, row.k.end());
    orig.v.insert(orig.v.end(), row.v.begin() + at, row.v.end());
  }
}

namespace {

// Edits a host copy as a one-layer KvCache, with the engine's own keep and evict rules.
template <typename Edit>
void edit_host(std::vector<KvEntry>& entries, int head_dim, Edit edit) {
  if (entries.empty()) return;
  KvCache host;
  host.head_dim = head_dim;
  host.layers = {std::move(entries)};
  edit(host);
  entries = std::move(host.layers[0]);
}

}  // namespace

void EngineRows::keep(const std::vector<std::vector<std::int32_t>>& keep) {
  model_.cache().keep(layer_, keep, g_.n_q_heads);
  edit_host(originals_, g_.head_dim, [&](KvCache& host) { host.keep(0, keep, g_.n_q_heads); });
}

void EngineRows::evict(int entry, std::span<const std::int32_t> tokens) {
  edit_host(originals_, g_.head_dim, [&](KvCache& host) { host.evict(0, entry, tokens); });
  model_.evict(layer_, entry, tokens);  // on the device too, with the CUDA engine
}

void EngineRows::encode(int entry, const HeadPlan& plan) {
  if (!codec_) throw Error("layer " + std::to_string(layer_) + ": a plan encodes tokens, but its policy has no codec");
  KvEntry& e = model_.cache().layers[static_cast<std::size_t>(layer_)][static_cast<std::size_t>(entry)];
  if (!originals_.empty()) e = originals_[static_cast<std::size_t>(entry)];
  std::vector<std::int32_t> positions;
  positions.reserve(e.tokens.size());
  for (const auto t : e.tokens) positions.push_back(positions_[static_cast<std::size_t>(t)]);
  // What a really compressed cache stores, from the exact rows, for a backend that holds it.
  if (model_.holds_packed()) {
    auto p = std::make_shared<PackedEntry>();
    pack_plan(codec_, plan, g_, positions, e.k, e.v, *p);
    e.packed = std::move(p);
  } else {
    e.packed.reset();
  }
  codec_->reconstruct(plan, g_, positions, e.k, e.v);
}

void EngineRows::bias(int entry, std::vector<float> bias) {
  KvEntry& e = model_.cache().layers[static_cast<std::size_t>(layer_)].at(static_cast<std::size_t>(entry));
  if (static_cast<std::int64_t>(bias.size()) != e.rows())
    throw Error("layer " + std::to_string(layer_) + ", entry " + std::to_string(entry) + ": " +
                std::to_string(bias.size()) + " logit biases for " + std::to_string(e.rows()) + " cached rows");
  e.bias = std::move(bias);
}

void check_mirror(const Engine& model, int layer, const kvcache::LayerIndex& index, const std::string& label) {
  const auto& entries = model.cache().layers[static_cast<std::size_t>(layer)];
  bool same = entries.size() == index.tokens.size();
  for (std::size_t e = 0; same && e < entries.size(); ++e) same = entries[e].tokens == index.tokens[e];
  if (!same)
    throw Error("policy " + label + ": the engine's cache of layer " + std::to_string(layer) +
                " no longer holds the tokens the cache manager applied (a kvsim bug)");
}

}  // namespace kvsim
