#include "model/llama_model.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <optional>

#include "model/gguf.h"
#include "model/llama_model_impl.h"
#include "model/transformer_layer.h"
#include "model/weight_matrix.h"
#include "core/error.h"
#include "core/half.h"

namespace kvsim {

using layer_ops::Layer;
using layer_ops::Mat;
using layer_ops::Vec;

namespace {

// A count or size from the file's metadata, checked before anything divides by it or sizes a
// vector with it: positive and no larger than any real model's. The error names the key.
int dimension(const GgufFile& f, const std::string& key, std::int64_t value) {
  constexpr std::int64_t kMax = std::int64_t{1} << 24;
  if (value < 1 || value > kMax)
    throw FormatError(f.path() + ": " + key + " = " + std::to_string(value) + ", expected 1.." + std::to_string(kMax));
  return static_cast<int>(value);
}

// A positive, finite real from the metadata (an epsilon, a RoPE base, a scale).
double positive(const GgufFile& f, const std::string& key, double value) {
  if (!(value > 0 && std::isfinite(value)))
    throw FormatError(f.path() + ": " + key + " = " + std::to_string(value) + ", expected a positive finite number");
  return value;
}

// Gemma 3 (docs/models.md): what its GGUF declares (sliding window, head sizes, the global RoPE
// base, q.k scale when given), and the architecture's fixed conventions where the file says
// nothing, as llama.cpp applies them: every 6th layer global, the rest local with RoPE base 10000,
// GeGLU (tanh GELU), per-head Q/K RMSNorm, post-norms, embeddings times sqrt(n_embd).
void gemma3_config(const GgufFile& f, ModelConfig& c) {
  const std::string p = "gemma3.";
  const std::int64_t window_raw = f.get_int(p + "attention.sliding_window", 0);
  const int window = window_raw == 0 ? 0 : dimension(f, p + "attention.sliding_window", window_raw);
  const int pattern =
      dimension(f, p + "attention.sliding_window_pattern", f.get_int(p + "attention.sliding_window_pattern", 6));
  if (window > 0 && pattern > 0) {
    c.sliding_window.assign(static_cast<std::size_t>(c.n_layers), 0);
    for (int l = 0; l < c.n_layers; ++l)
      if (l % pattern < pattern - 1) c.sliding_window[static_cast<std::size_t>(l)] = window;
  }
  c.rope.type = RopeType::Neox;
  c.rope_theta_local = positive(f, p + "rope.freq_base_swa", f.get_float(p + "rope.freq_base_swa", 10000.0));
  c.ffn_act = FfnAct::GeluTanh;
  c.qk_norm = true;
  c.post_norms = true;
  c.tied_embeddings = f.find("output.weight") == nullptr;
  c.embd_scale = std::sqrt(static_cast<double>(c.n_embd));
  const double pre_attn = positive(f, p + "attention.query_pre_attn_scalar",
                                   f.get_float(p + "attention.query_pre_attn_scalar", static_cast<double>(c.head_dim)));
  c.attn_scale = 1.0 / std::sqrt(pre_attn);
}

}  // namespace

ModelConfig model_config(const GgufFile& f) {
  ModelConfig c;
  c.arch = f.get_string("general.architecture");
  if (f.has("general.name")) c.name = f.get_string("general.name");
  if (c.arch != "llama" && c.arch != "qwen2" && c.arch != "gemma3")
    throw FormatError(f.path() + ": general.architecture = '" + c.arch + "', expected llama, qwen2 or gemma3");
  const std::string p = c.arch + ".";
  const auto dim = [&](const std::string& key, std::optional<std::int64_t> fallback = std::nullopt) {
    return dimension(f, p + key, fallback ? f.get_int(p + key, *fallback) : f.get_int(p + key));
  };
  c.n_layers = dim("block_count");
  c.n_embd = dim("embedding_length");
  c.n_q_heads = dim("attention.head_count");
  c.n_kv_heads = dim("attention.head_count_kv", c.n_q_heads);
  c.n_ff = dim("feed_forward_length");
  if (!f.has(p + "attention.key_length") && c.n_embd < c.n_q_heads)
    throw FormatError(f.path() + ": " + p + "embedding_length = " + std::to_string(c.n_embd) + " is less than " + p +
                      "attention.head_count = " + std::to_string(c.n_q_heads) + " (no key_length): no head size");
  c.head_dim = dim("attention.key_length", c.n_embd / c.n_q_heads);
  c.rms_eps = positive(f, p + "attention.layer_norm_rms_epsilon", f.get_float(p + "attention.layer_norm_rms_epsilon"));
  c.vocab = static_cast<std::int64_t>(f.get_array("tokenizer.ggml.tokens").size());
  c.rope.type = c.arch == "llama" ? RopeType::Norm : RopeType::Neox;  // formats.md §3
  c.rope.head_dim = c.head_dim;
  c.rope.rope_dim = dim("rope.dimension_count", c.head_dim);
  c.rope.theta = positive(f, p + "rope.freq_base", f.get_float(p + "rope.freq_base", 10000.0));
  c.tied_embeddings = f.find("output.weight") == nullptr;
  c.qkv_bias = f.find("blk.0.attn_q.bias") != nullptr;
  if (c.arch == "gemma3") gemma3_config(f, c);
  if (c.n_q_heads % c.n_kv_heads != 0)
    throw FormatError(f.path() + ": inconsistent head counts (" + std::to_string(c.n_q_heads) + " heads, " +
                      std::to_string(c.n_kv_heads) + " KV heads)");
  if (c.rope.rope_dim > c.head_dim || c.rope.rope_dim % 2 != 0)
    throw FormatError(f.path() + ": " + p + "rope.dimension_count = " + std::to_string(c.rope.rope_dim) +
                      ", expected an even number <= the head size " + std::to_string(c.head_dim));
  if (c.vocab < 1) throw FormatError(f.path() + ": tokenizer.ggml.tokens is empty");
  return c;
}

namespace {

Vec load_vec(const GgufFile& f, const std::string& name, std::int64_t n) {
  const GgufTensor& t = f.tensor(name);
  if (t.row_size() != n || t.rows() != 1)
    throw FormatError(f.path() + ": tensor '" + name + "' has shape [" + std::to_string(t.row_size()) + ", " +
                      std::to_string(t.rows()) + "], expected [" + std::to_string(n) + "]");
  Vec v(n);
  f.dequantize_rows(t, 0, 1, std::span<float>(v.data(), static_cast<std::size_t>(n)));
  return v;
}

}  // namespace

LlamaModel::LlamaModel(const GgufFile& f, WeightFormat weights)
    : impl_(std::make_unique<Impl>()), cfg_(model_config(f)), weights_(weights) {
  const ModelConfig& c = cfg_;
  const std::int64_t q_dim = static_cast<std::int64_t>(c.n_q_heads) * c.head_dim;
  const std::int64_t kv_dim = static_cast<std::int64_t>(c.n_kv_heads) * c.head_dim;
  impl_->embd = WeightMatrix(f, "token_embd.weight", c.vocab, c.n_embd, weights);
  impl_->output_norm = load_vec(f, "output_norm.weight", c.n_embd);
  if (!c.tied_embeddings) impl_->output = WeightMatrix(f, "output.weight", c.vocab, c.n_embd, weights);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    Layer L;
    L.attn_norm = load_vec(f, b + "attn_norm.weight", c.n_embd);
    L.ffn_norm = load_vec(f, b + "ffn_norm.weight", c.n_embd);
    L.wq = WeightMatrix(f, b + "attn_q.weight", q_dim, c.n_embd, weights);
    L.wk = WeightMatrix(f, b + "attn_k.weight", kv_dim, c.n_embd, weights);
    L.wv = WeightMatrix(f, b + "attn_v.weight", kv_dim, c.n_embd, weights);
    L.wo = WeightMatrix(f, b + "attn_output.weight", c.n_embd, q_dim, weights);
    L.wgate = WeightMatrix(f, b + "ffn_gate.weight", c.n_ff, c.n_embd, weights);
    L.wup = WeightMatrix(f, b + "ffn_up.weight", c.n_ff, c.n_embd, weights);
    L.wdown = WeightMatrix(f, b + "ffn_down.weight", c.n_embd, c.n_ff, weights);
    if (c.qk_norm) {
      L.q_norm = load_vec(f, b + "attn_q_norm.weight", c.head_dim);
      L.k_norm = load_vec(f, b + "attn_k_norm.weight", c.head_dim);
    }
    if (c.post_norms) {
      L.post_attn_norm = load_vec(f, b + "post_attention_norm.weight", c.n_embd);
      L.post_ffn_norm = load_vec(f, b + "post_ffw_norm.weight", c.n_embd);
    }
    if (f.find(b + "attn_q.bias")) {
      L.bq = load_vec(f, b + "attn_q.bias", q_dim);
      L.bk = load_vec(f, b + "attn_k.bias", kv_dim);
      L.bv = load_vec(f, b + "attn_v.bias", kv_dim);
    }
    impl_->layers.push_back(std::move(L));
  }
  impl_->cache.head_dim = c.head_dim;
  reset();
}

LlamaModel::~LlamaModel() = default;

void LlamaModel::reset() { impl_->cache.clear(cfg_.n_layers, cfg_.n_kv_heads); }

void LlamaModel::reserve(std::int64_t tokens) { impl_->cache.reserve(tokens); }

const KvCache& LlamaModel::cache() const { return impl_->cache; }
KvCache& LlamaModel::cache() { return impl_->cache; }

void LlamaModel::set_cache(KvCache cache) {
  if (cache.layers.size() != impl_->cache.layers.size() || cache.head_dim != cfg_.head_dim)
    throw Error("set_cache: the cache is shaped for another model");
  impl_->cache = std::move(cache);
}

void LlamaModel::record_last_attention(bool on) { impl_->record_attention = on; }

std::span<const float> LlamaModel::last_attention(int layer, int q_head) const {
  return impl_->last_attention.at(static_cast<std::size_t>(layer)).at(static_cast<std::size_t>(q_head));
}

std::size_t LlamaModel::weight_heap_bytes() const {
  std::size_t b = impl_->embd.heap_bytes() + impl_->output.heap_bytes();
  for (const auto& L : impl_->layers)
    for (const WeightMatrix* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.wgate, &L.wup, &L.wdown}) b += w->heap_bytes();
  return b;
}

std::vector<float> LlamaModel::forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> positions,
                                       std::span<const std::int64_t> logit_rows,
                                       const std::function<void(const LayerActivations&)>& hook) {
  const ModelConfig& c = cfg_;
  const auto n = static_cast<Eigen::Index>(tokens.size());
  if (positions.size() != tokens.size()) throw Error("forward: positions and tokens differ in length");
  const int d = c.head_dim, G = c.n_q_heads / c.n_kv_heads;
  Mat x = layer_ops::embed(c, impl_->embd, tokens);
  std::vector<std::int64_t> row_tokens(static_cast<std::size_t>(n));
  for (Eigen::Index i = 0; i < n; ++i) row_tokens[static_cast<std::size_t>(i)] = impl_->cache.seen + i;
  if (impl_->record_attention) impl_->last_attention.resize(static_cast<std::size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const Layer& L = impl_->layers[static_cast<std::size_t>(l)];
    const layer_ops::Qkv a = layer_ops::project_qkv(c, L, l, x, positions);
    if (hook)
      hook(LayerActivations{l,
                            n,
                            {a.q.data(), static_cast<std::size_t>(a.q.size())},
                            {a.k.data(), static_cast<std::size_t>(a.k.size())},
                            {a.v.data(), static_cast<std::size_t>(a.v.size())}});
    auto& entries = impl_->cache.layers[static_cast<std::size_t>(l)];
    const bool per_query_head = static_cast<int>(entries.size()) == c.n_q_heads && c.n_q_heads != c.n_kv_heads;
    layer_ops::append_rows(entries, a.k, a.v, impl_->cache.seen, d, G, per_query_head, l);
    const Mat attn_out =
        layer_ops::attend(c, l, entries, a.q, row_tokens,
                          impl_->record_attention ? &impl_->last_attention[static_cast<std::size_t>(l)] : nullptr);
    layer_ops::finish_layer(c, L, x, attn_out);
  }
  impl_->cache.seen += n;
  const WeightMatrix& out_w = c.tied_embeddings ? impl_->embd : impl_->output;
  Mat xr(static_cast<Eigen::Index>(logit_rows.size()), c.n_embd);
  for (std::size_t j = 0; j < logit_rows.size(); ++j) {
    const std::int64_t r = logit_rows[j];
    if (r < 0 || r >= n) throw Error("forward: logit row " + std::to_string(r) + " out of range");
    xr.row(static_cast<Eigen::Index>(j)) = x.row(r);
  }
  std::vector<float> logits(logit_rows.size() * static_cast<std::size_t>(c.vocab));
  if (!logit_rows.empty())
    out_w.multiply(layer_ops::rms_norm(xr, impl_->output_norm, c.rms_eps).data(), xr.rows(), logits.data());
  return logits;
}

}  // namespace kvsim
