#include "model/backend_engine.h"

#include <algorithm>

#include "model/gguf.h"
#include "model/transformer_weights.h"
#include "core/error.h"
#include "core/half.h"
#include "core/packed_kv.h"
#include "gpu/transformer_backend.h"

namespace kvsim {

BackendEngine::BackendEngine(const GgufFile& f, std::unique_ptr<gpu::TransformerBackend> backend)
    : cfg_(model_config(f)), backend_(std::move(backend)) {
  const ModelConfig want = cfg_, &got = backend_->shape();
  if (!same_kv_shape(got, want) || got.n_embd != want.n_embd || got.n_ff != want.n_ff || got.vocab != want.vocab)
    throw Error(f.path() + ": the " + backend_->name() + " backend was made for another model shape");
  // The rest of the block (norms, activation, scales, windows, RoPE bases) must be the file's too.
  std::string differ;
  auto field = [&](bool same, const char* name) {
    if (!same) differ += std::string(differ.empty() ? "" : ", ") + name;
  };
  field(got.qk_norm == want.qk_norm, "qk_norm");
  field(got.post_norms == want.post_norms, "post_norms");
  field(got.ffn_act == want.ffn_act, "ffn_act");
  field(got.embd_scale == want.embd_scale, "embd_scale");
  field(got.attn_scale == want.attn_scale, "attn_scale");
  field(got.sliding_window == want.sliding_window, "sliding_window");
  field(got.rope_theta_local == want.rope_theta_local, "rope_theta_local");
  field(got.rope == want.rope, "rope");
  field(got.qkv_bias == want.qkv_bias, "qkv_bias");
  field(got.tied_embeddings == want.tied_embeddings, "tied_embeddings");
  field(got.rms_eps == want.rms_eps, "rms_eps");
  if (!differ.empty())
    throw Error(f.path() + ": the " + backend_->name() + " backend was made for another " + want.arch + " block (" +
                differ + " differ from the file's)");
  load_transformer_weights(f, want, backend_->sink());
  cache_.head_dim = cfg_.head_dim;
  reset();
}

BackendEngine::~BackendEngine() = default;

std::string BackendEngine::device() const { return backend_->name(); }

void BackendEngine::reset() {
  cache_.clear(cfg_.n_layers, cfg_.n_kv_heads);
  backend_->reset();
  edited_ = false;
  end_rules();
}

void BackendEngine::end_rules() {
  pending_rules_.assign(static_cast<std::size_t>(cfg_.n_layers), std::nullopt);
  rule_on_.assign(static_cast<std::size_t>(cfg_.n_layers), false);
}

void BackendEngine::start_decode_rule(int layer, const DecodeRuleStart& start) {
  if (layer < 0 || layer >= cfg_.n_layers)
    throw Error("start_decode_rule: layer " + std::to_string(layer) + " of a model of " +
                std::to_string(cfg_.n_layers));
  // An eviction inside a window would break the row masking (check_windows); no policy runs there.
  if (cfg_.window(layer) > 0)
    throw Error("start_decode_rule: layer " + std::to_string(layer) + " is a sliding-window layer (window " +
                std::to_string(cfg_.window(layer)) + "); decode rules run on global layers only");
  pending_rules_[static_cast<std::size_t>(layer)] = start;
}

std::vector<std::vector<std::vector<std::int32_t>>> BackendEngine::decode_rule_step(std::int64_t budget) {
  if (std::find(rule_on_.begin(), rule_on_.end(), true) == rule_on_.end())
    throw Error(
        "decode_rule_step: no decode rule is running (a forward() starts them; a cache edit, set_cache or "
        "reset ends them)");
  std::vector<std::vector<std::vector<std::int64_t>>> rows;
  auto torn = [&](const std::exception& e) {
    edited_ = true;  // the device may have compacted part of the layers: reload from the mirror
    end_rules();
    return Error(backend_->name() + ": " + e.what());
  };
  try {
    rows = backend_->rule_step(budget);
  } catch (const std::invalid_argument& e) {  // rows and scores out of step: the rules are broken
    throw torn(e);
  } catch (const std::logic_error& e) {  // no decode pass since the last step: nothing changed
    throw Error(backend_->name() + ": " + e.what());
  } catch (const std::exception& e) {
    throw torn(e);
  }
  std::vector<std::vector<std::vector<std::int32_t>>> out(cache_.layers.size());
  try {
    for (std::size_t l = 0; l < rows.size() && l < cache_.layers.size(); ++l) {
      out[l].resize(rows[l].size());
      for (std::size_t e = 0; e < rows[l].size(); ++e) {
        const auto& tokens = cache_.layers[l].at(e).tokens;
        for (const auto r : rows[l][e]) out[l][e].push_back(tokens.at(static_cast<std::size_t>(r)));
        cache_.evict(static_cast<int>(l), static_cast<int>(e), out[l][e]);  // the mirror follows the device
      }
    }
  } catch (const std::exception& e) {  // the mirror is part-way: reload the device from it
    throw torn(e);
  }
  return out;
}

void BackendEngine::reserve(std::int64_t tokens) { cache_.reserve(tokens); }

KvCache& BackendEngine::cache() {
  edited_ = true;  // conservatively: the caller may change any entry
  end_rules();     // the reload ends the backend's rules; pending ones would bind to edited rows
  return cache_;
}

void BackendEngine::set_cache(KvCache cache) {
  if (cache.layers.size() != cache_.layers.size() || cache.head_dim != cfg_.head_dim)
    throw Error("set_cache: the cache is shaped for another model");
  for (std::size_t l = 0; l < cache.layers.size(); ++l) {
    const auto n = static_cast<int>(cache.layers[l].size());
    if (n != cfg_.n_kv_heads && n != cfg_.n_q_heads)
      throw Error("set_cache: layer " + std::to_string(l) + " has " + std::to_string(n) + " entries, expected " +
                  std::to_string(cfg_.n_kv_heads) + " (KV heads) or " + std::to_string(cfg_.n_q_heads) +
                  " (query heads)");
  }
  cache_ = std::move(cache);
  edited_ = true;
  end_rules();
}

void BackendEngine::evict(int layer, int entry, std::span<const std::int32_t> tokens) {
  if (tokens.empty()) return;
  if (rule_on_.at(static_cast<std::size_t>(layer)))
    throw Error("evict: layer " + std::to_string(layer) + " evicts by its decode rule (decode_rule_step)");
  const KvEntry& before = cache_.layers.at(static_cast<std::size_t>(layer)).at(static_cast<std::size_t>(entry));
  const std::vector<std::int32_t> had = before.tokens;
  const bool was_packed = before.packed != nullptr;
  cache_.evict(layer, entry, tokens);  // checks every token first
  if (was_packed) edited_ = true;      // packed rows cannot be gathered in place: reload
  if (edited_) return;                 // the whole cache is reloaded before the next pass anyway
  const std::vector<std::int32_t>& now =
      cache_.layers[static_cast<std::size_t>(layer)][static_cast<std::size_t>(entry)].tokens;
  std::vector<std::int64_t> rows;  // the kept tokens' rows in the backend (both lists increase)
  std::size_t j = 0;
  for (std::size_t r = 0; r < had.size() && j < now.size(); ++r)
    if (had[r] == now[j]) rows.push_back(static_cast<std::int64_t>(r)), ++j;
  // Until the device has compacted the entry, the mirror and the device disagree: a keep_rows that
  // throws (a CUDA error part-way) leaves the whole cache to be reloaded before the next pass.
  edited_ = true;
  backend_->keep_rows(layer, entry, rows);
  edited_ = false;
}

std::span<const float> BackendEngine::last_attention(int layer, int q_head) const {
  return backend_->last_attention(layer, q_head);
}

// The backends mask a sliding-window layer by row (gpu/transformer_shape.h's window_start), which
// is the model's window of tokens while each entry's newest rows are the newest tokens without a
// gap, as far back as the window reaches. Older rows may be gone; a gap inside the window may not.
void BackendEngine::check_windows() const {
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const std::int64_t w = cfg_.window(l);
    if (w == 0) continue;
    const auto& entries = cache_.layers[static_cast<std::size_t>(l)];
    for (std::size_t e = 0; e < entries.size(); ++e) {
      const auto& t = entries[e].tokens;
      const std::int64_t reach = std::min<std::int64_t>(static_cast<std::int64_t>(t.size()), w - 1);
      if (reach == 0) continue;
      const std::int64_t first = t[t.size() - static_cast<std::size_t>(reach)];
      if (t.back() != cache_.seen - 1 || first != cache_.seen - reach)
        throw Error("KV cache layer " + std::to_string(l) + " entry " + std::to_string(e) +
                    ": a sliding-window layer (window " + std::to_string(w) + ") must hold its newest " +
                    std::to_string(reach) + " tokens without a gap on the " + backend_->name() +
                    " backend; verify a config that evicts inside the window with --device cpu");
    }
  }
}

void BackendEngine::load_backend() {
  for (int l = 0; l < cfg_.n_layers; ++l) {
    std::vector<gpu::HostEntry> entries;
    for (KvEntry& e : cache_.layers[static_cast<std::size_t>(l)]) {
      if (!e.bias.empty())
        throw Error("KV cache layer " + std::to_string(l) +
                    ": soft-gated rows (logit biases) run on the CPU engine only; "
                    "verify a soft-gated config with --device cpu");
      // The backend's cache is fp16: rows a codec rebuilt are rounded here too, so the mirror
      // stays what the backend holds (the CPU engine keeps them unrounded).
      round_to_half(e.k.data(), e.k.size());
      round_to_half(e.v.data(), e.v.size());
      // A packed prefix is held packed; the mirror's rows become its read-back (low-rank rows
      // rebuild in another summation order than the codec's reconstruction).
      if (e.packed) {
        if (e.packed->head_dim != cfg_.head_dim || e.packed->rows() > e.rows())
          throw Error("KV cache layer " + std::to_string(l) + ": a packed entry of " +
                      std::to_string(e.packed->rows()) + " rows of head_dim " + std::to_string(e.packed->head_dim) +
                      " for an entry of " + std::to_string(e.rows()) + " rows of head_dim " +
                      std::to_string(cfg_.head_dim));
        std::vector<float> rows;
        unpack_tensor(e.packed->k, cfg_.head_dim, cfg_.rope, rows);
        std::copy(rows.begin(), rows.end(), e.k.begin());
        unpack_tensor(e.packed->v, cfg_.head_dim, cfg_.rope, rows);
        std::copy(rows.begin(), rows.end(), e.v.begin());
      }
      entries.push_back({e.rows(), e.k.data(), e.v.data(), e.packed.get()});
    }
    backend_->load_layer(l, entries);
  }
  edited_ = false;
}

std::vector<float> BackendEngine::forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> positions,
                                          std::span<const std::int64_t> logit_rows, const LayerHook& hook) {
  check_windows();
  try {
    if (edited_) {
      rule_on_.assign(rule_on_.size(), false);  // a reload ends the backend's rules
      load_backend();
    }
  } catch (const std::invalid_argument& e) {
    throw Error(backend_->name() + ": " + e.what());
  }
  try {
    for (std::size_t l = 0; l < pending_rules_.size(); ++l) {
      if (!pending_rules_[l]) continue;
      backend_->start_rule(static_cast<int>(l), *pending_rules_[l]);
      pending_rules_[l].reset();
      rule_on_[l] = true;
    }
  } catch (const std::exception& e) {
    // All or none: the rules started so far end with a reload, the others are dropped.
    edited_ = true;
    end_rules();
    throw Error(backend_->name() + ": " + e.what());
  }
  const bool rules = std::find(rule_on_.begin(), rule_on_.end(), true) != rule_on_.end();
  const auto n = static_cast<std::int64_t>(tokens.size());
  const int d = cfg_.head_dim, G = cfg_.n_q_heads / cfg_.n_kv_heads;
  const std::int64_t kw = static_cast<std::int64_t>(cfg_.n_kv_heads) * d,
                     qw = static_cast<std::int64_t>(cfg_.n_q_heads) * d;
  const std::int64_t first = cache_.seen;
  // The mirror takes each layer's new rows as the backend delivers them (entry e reads KV head
  // e, or e / group when the layer holds one entry per query head).
  auto on_layer = [&](const gpu::LayerRows& r) {
    auto& entries = cache_.layers[static_cast<std::size_t>(r.layer)];
    const bool pqh = static_cast<int>(entries.size()) == cfg_.n_q_heads && cfg_.n_q_heads != cfg_.n_kv_heads;
    for (std::size_t e = 0; e < entries.size(); ++e) {
      KvEntry& en = entries[e];
      const std::int64_t hk = pqh ? static_cast<std::int64_t>(e) / G : static_cast<std::int64_t>(e);
      for (std::int64_t i = 0; i < r.n; ++i) {
        en.tokens.push_back(static_cast<std::int32_t>(first + i));
        en.k.insert(en.k.end(), r.k + i * kw + hk * d, r.k + i * kw + hk * d + d);
        en.v.insert(en.v.end(), r.v + i * kw + hk * d, r.v + i * kw + hk * d + d);
      }
    }
    if (hook)
      hook(LayerActivations{r.layer,
                            r.n,
                            {r.q, static_cast<std::size_t>(r.n * qw)},
                            {r.k, static_cast<std::size_t>(r.n * kw)},
                            {r.v, static_cast<std::size_t>(r.n * kw)}});
  };
  // A pass that fails part-way leaves the mirror as it was, and the backend to be re-loaded.
  std::vector<std::vector<std::size_t>> before(cache_.layers.size());
  for (std::size_t l = 0; l < cache_.layers.size(); ++l)
    for (const KvEntry& e : cache_.layers[l]) before[l].push_back(e.tokens.size());
  auto restore = [&] {
    const auto row = static_cast<std::size_t>(d);
    for (std::size_t l = 0; l < cache_.layers.size(); ++l)
      for (std::size_t e = 0; e < cache_.layers[l].size(); ++e) {
        KvEntry& en = cache_.layers[l][e];
        en.tokens.resize(before[l][e]);
        en.k.resize(before[l][e] * row);
        en.v.resize(before[l][e] * row);
      }
    edited_ = true;
    rule_on_.assign(rule_on_.size(), false);
  };
  std::vector<float> logits;
  try {
    // Rules read the last-row weights where they were computed; the host gets them only on request.
    backend_->set_last_on_host(record_);
    logits = backend_->forward(tokens, positions, logit_rows, static_cast<bool>(hook), record_ || rules, on_layer);
  } catch (const std::invalid_argument& e) {
    restore();
    throw Error(backend_->name() + ": " + e.what());
  } catch (...) {
    restore();
    throw;
  }
  cache_.seen += n;
  return logits;
}

}  // namespace kvsim
