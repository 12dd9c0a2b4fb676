#include "model/llama_model.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <optional>

#include "model/gguf.h"
#include "model/weight_matrix.h"
#include "core/error.h"
#include "core/half.h"

namespace kvsim {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vec = Eigen::VectorXf;

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

struct Layer {
  Vec attn_norm, ffn_norm, bq, bk, bv;
  Vec q_norm, k_norm, post_attn_norm, post_ffn_norm;  // gemma3
  WeightMatrix wq, wk, wv, wo, wgate, wup, wdown;
};

// The cache holds f16 values (kv_cache.h): K/V are rounded once, as they are produced.
void round_to_half(Mat& m) {
  std::vector<std::uint16_t> h(static_cast<std::size_t>(m.size()));
  floats_to_halves(m.data(), h.data(), h.size());
  halves_to_floats(h.data(), m.data(), h.size());
}

Mat matmul(const Mat& x, const WeightMatrix& w) {
  Mat y(x.rows(), w.rows());
  w.multiply(x.data(), x.rows(), y.data());
  return y;
}

// x / sqrt(mean(x^2) + eps) * w, row by row.
Mat rms_norm(const Mat& x, const Vec& w, double eps) {
  Mat y(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    const double ms = static_cast<double>(x.row(i).squaredNorm()) / static_cast<double>(x.cols());
    const auto scale = static_cast<float>(1.0 / std::sqrt(ms + eps));
    y.row(i) = (x.row(i) * scale).cwiseProduct(w.transpose());
  }
  return y;
}

// Each head's slice of every row normalised on its own (gemma3's Q/K norm).
void head_rms_norm(Mat& m, const Vec& w, int heads, double eps) {
  const auto d = static_cast<Eigen::Index>(w.size());
  for (Eigen::Index i = 0; i < m.rows(); ++i)
    for (int h = 0; h < heads; ++h) {
      auto seg = m.row(i).segment(static_cast<Eigen::Index>(h) * d, d);
      const double ms = static_cast<double>(seg.squaredNorm()) / static_cast<double>(d);
      seg = (seg * static_cast<float>(1.0 / std::sqrt(ms + eps))).cwiseProduct(w.transpose());
    }
}

// The feed-forward gate's activation: SiLU, or GELU in its tanh form (gemma's gelu_pytorch_tanh).
Mat activate(const Mat& g, FfnAct act) {
  if (act == FfnAct::Silu) return (g.array() / (1.0f + (-g.array()).exp())).matrix();
  const float k = std::sqrt(2.0f / 3.14159265358979f);
  return (0.5f * g.array() * (1.0f + (k * (g.array() + 0.044715f * g.array().cube())).tanh())).matrix();
}

// The first row of an entry whose token lies after `before` (rows are in token order).
// A forward pass's new tokens (rows of k and v, token indices from `seen`) join every entry of a
// layer's cache: one per KV head, or one per query head (each holding its group's KV head).
void append_rows(std::vector<KvEntry>& entries, const Mat& k, const Mat& v, std::int64_t seen, int head_dim, int group,
                 bool per_query_head, int layer) {
  const Eigen::Index n = k.rows();
  for (std::size_t e = 0; e < entries.size(); ++e) {
    KvEntry& entry = entries[e];
    const auto col =
        static_cast<std::ptrdiff_t>(per_query_head ? static_cast<int>(e) / group : static_cast<int>(e)) * head_dim;
    for (Eigen::Index i = 0; i < n; ++i) {
      entry.tokens.push_back(static_cast<std::int32_t>(seen + i));
      entry.k.insert(entry.k.end(), k.row(i).data() + col, k.row(i).data() + col + head_dim);
      entry.v.insert(entry.v.end(), v.row(i).data() + col, v.row(i).data() + col + head_dim);
      if (!entry.bias.empty()) entry.bias.push_back(0.0f);
    }
  }
  for (const KvEntry& entry : entries)  // checked here: nothing may throw inside the parallel loop
    if (!entry.bias.empty() && entry.bias.size() != entry.tokens.size())
      throw Error("KV cache layer " + std::to_string(layer) + ": " + std::to_string(entry.bias.size()) +
                  " logit biases for " + std::to_string(entry.tokens.size()) + " rows");
}

Eigen::Index first_in_window(const KvEntry& e, std::int64_t before) {
  return static_cast<Eigen::Index>(std::upper_bound(e.tokens.begin(), e.tokens.end(), before) - e.tokens.begin());
}

}  // namespace

struct LlamaModel::Impl {
  WeightMatrix embd, output;  // [vocab, n_embd]
  Vec output_norm;
  std::vector<Layer> layers;
  KvCache cache;
  bool record_attention = false;
  std::vector<std::vector<std::vector<float>>> last_attention;  // [layer][q head]
};

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
  Mat x(n, c.n_embd);
  for (Eigen::Index i = 0; i < n; ++i) {
    const std::int32_t t = tokens[static_cast<std::size_t>(i)];
    if (t < 0 || t >= c.vocab) throw Error("forward: token id " + std::to_string(t) + " out of range");
    impl_->embd.row(t, x.row(i).data());
  }
  if (c.embd_scale != 1.0) x *= static_cast<float>(c.embd_scale);
  const float scale = c.attn_scale > 0 ? static_cast<float>(c.attn_scale) : 1.0f / std::sqrt(static_cast<float>(d));
  for (int l = 0; l < c.n_layers; ++l) {
    Layer& L = impl_->layers[static_cast<std::size_t>(l)];
    const Mat h = rms_norm(x, L.attn_norm, c.rms_eps);
    Mat q = matmul(h, L.wq), k = matmul(h, L.wk), v = matmul(h, L.wv);
    if (L.bq.size()) {
      q.rowwise() += L.bq.transpose();
      k.rowwise() += L.bk.transpose();
      v.rowwise() += L.bv.transpose();
    }
    if (c.qk_norm) {
      head_rms_norm(q, L.q_norm, c.n_q_heads, c.rms_eps);
      head_rms_norm(k, L.k_norm, c.n_kv_heads, c.rms_eps);
    }
    const RopeSpec rope = c.rope_at(l);
    for (Eigen::Index i = 0; i < n; ++i) {
      apply_rope(rope, q.row(i).data(), c.n_q_heads, positions[static_cast<std::size_t>(i)]);
      apply_rope(rope, k.row(i).data(), c.n_kv_heads, positions[static_cast<std::size_t>(i)]);
    }
    round_to_half(k);
    round_to_half(v);
    if (hook)
      hook(LayerActivations{l,
                            n,
                            {q.data(), static_cast<std::size_t>(q.size())},
                            {k.data(), static_cast<std::size_t>(k.size())},
                            {v.data(), static_cast<std::size_t>(v.size())}});
    auto& entries = impl_->cache.layers[static_cast<std::size_t>(l)];
    const bool per_query_head = static_cast<int>(entries.size()) == c.n_q_heads && c.n_q_heads != c.n_kv_heads;
    append_rows(entries, k, v, impl_->cache.seen, d, G, per_query_head, l);
    if (impl_->record_attention) impl_->last_attention.resize(static_cast<std::size_t>(c.n_layers));
    auto& last_rows = impl_->last_attention;
    if (impl_->record_attention) last_rows[static_cast<std::size_t>(l)].resize(static_cast<std::size_t>(c.n_q_heads));
    Mat attn_out(n, static_cast<Eigen::Index>(c.n_q_heads) * d);
    const std::int64_t window = c.window(l);
#pragma omp parallel for schedule(static)
    for (int hq = 0; hq < c.n_q_heads; ++hq) {
      const KvEntry& entry = entries[static_cast<std::size_t>(per_query_head ? hq : hq / G)];
      const Eigen::Index total = entry.rows(), past = total - n;
      const Mat qh = q.middleCols(static_cast<Eigen::Index>(hq) * d, d);
      const Eigen::Map<const Mat> kh(entry.k.data(), total, d), vh(entry.v.data(), total, d);
      Mat s(n, total);  // [n, total]
      s.noalias() = (qh * kh.transpose()) * scale;
      if (!entry.bias.empty()) s.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(entry.bias.data(), total);
      for (Eigen::Index i = 0; i < n; ++i) {
        const Eigen::Index last = past + i;  // causal: itself and everything cached before it
        // A sliding-window layer sees only the tokens within its window of this one.
        const Eigen::Index first = window > 0 ? first_in_window(entry, impl_->cache.seen + i - window) : 0;
        auto row = s.row(i);
        const Eigen::Index len = last + 1 - first;
        const float m = row.segment(first, len).maxCoeff();
        row.segment(first, len) = (row.segment(first, len).array() - m).exp();
        row.segment(first, len) /= row.segment(first, len).sum();
        if (first > 0) row.head(first).setZero();
        if (last + 1 < total) row.tail(total - last - 1).setZero();
      }
      if (impl_->record_attention)
        last_rows[static_cast<std::size_t>(l)][static_cast<std::size_t>(hq)].assign(s.row(n - 1).data(),
                                                                                    s.row(n - 1).data() + total);
      attn_out.middleCols(static_cast<Eigen::Index>(hq) * d, d).noalias() = s * vh;
    }
    const Mat o = matmul(attn_out, L.wo);
    x += c.post_norms ? rms_norm(o, L.post_attn_norm, c.rms_eps) : o;
    const Mat h2 = rms_norm(x, L.ffn_norm, c.rms_eps);
    const Mat gate = matmul(h2, L.wgate);
    const Mat up = matmul(h2, L.wup);
    const Mat act = activate(gate, c.ffn_act).cwiseProduct(up);
    const Mat down = matmul(act, L.wdown);
    x += c.post_norms ? rms_norm(down, L.post_ffn_norm, c.rms_eps) : down;
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
  if (!logit_rows.empty()) out_w.multiply(rms_norm(xr, impl_->output_norm, c.rms_eps).data(), xr.rows(), logits.data());
  return logits;
}

}  // namespace kvsim
