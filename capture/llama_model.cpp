#include "capture/llama_model.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>

#include "capture/gguf.h"
#include "core/error.h"

namespace kvsim {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vec = Eigen::VectorXf;

LlamaConfig LlamaConfig::from_gguf(const GgufFile& f) {
  LlamaConfig c;
  c.arch = f.get_string("general.architecture");
  if (c.arch != "llama" && c.arch != "qwen2")
    throw FormatError(f.path() + ": general.architecture = '" + c.arch + "', expected llama or qwen2");
  const std::string p = c.arch + ".";
  c.n_layers = static_cast<int>(f.get_int(p + "block_count"));
  c.n_embd = static_cast<int>(f.get_int(p + "embedding_length"));
  c.n_head = static_cast<int>(f.get_int(p + "attention.head_count"));
  c.n_head_kv = static_cast<int>(f.get_int(p + "attention.head_count_kv", c.n_head));
  c.n_ff = static_cast<int>(f.get_int(p + "feed_forward_length"));
  c.head_dim = static_cast<int>(f.get_int(p + "attention.key_length", c.n_embd / c.n_head));
  c.rms_eps = f.get_float(p + "attention.layer_norm_rms_epsilon");
  c.vocab = static_cast<std::int64_t>(f.get_array("tokenizer.ggml.tokens").size());
  c.rope.type = c.arch == "llama" ? RopeType::Norm : RopeType::Neox;  // formats.md §3
  c.rope.head_dim = c.head_dim;
  c.rope.rope_dim = static_cast<int>(f.get_int(p + "rope.dimension_count", c.head_dim));
  c.rope.theta = f.get_float(p + "rope.freq_base", 10000.0);
  c.tied_embeddings = f.find("output.weight") == nullptr;
  if (c.n_layers <= 0 || c.n_head <= 0 || c.n_head_kv <= 0 || c.n_head % c.n_head_kv != 0 || c.head_dim <= 0)
    throw FormatError(f.path() + ": inconsistent head counts (" + std::to_string(c.n_head) + " heads, " +
                      std::to_string(c.n_head_kv) + " KV heads)");
  return c;
}

namespace {

Mat load(const GgufFile& f, const std::string& name, std::int64_t rows, std::int64_t cols) {
  const GgufTensor& t = f.tensor(name);
  if (t.row_size() != cols || t.rows() != rows)
    throw FormatError(f.path() + ": tensor '" + name + "' has shape [" + std::to_string(t.row_size()) + ", " +
                      std::to_string(t.rows()) + "], expected [" + std::to_string(cols) + ", " + std::to_string(rows) + "]");
  Mat m(rows, cols);
  f.dequantize_rows(t, 0, rows, std::span<float>(m.data(), static_cast<std::size_t>(m.size())));
  return m;
}

Vec load_vec(const GgufFile& f, const std::string& name, std::int64_t n) {
  const Mat m = load(f, name, 1, n);
  return m.row(0).transpose();
}

struct Layer {
  Vec attn_norm, ffn_norm, bq, bk, bv;
  Mat wq, wk, wv, wo, wgate, wup, wdown;
  Mat k_cache, v_cache;  // [cached tokens, n_head_kv * head_dim]
  std::vector<std::int32_t> positions;
};

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

}  // namespace

struct LlamaModel::Impl {
  Mat embd, output;  // [vocab, n_embd]
  Vec output_norm;
  std::vector<Layer> layers;
};

LlamaModel::LlamaModel(const GgufFile& f) : impl_(std::make_unique<Impl>()), cfg_(LlamaConfig::from_gguf(f)) {
  const LlamaConfig& c = cfg_;
  const std::int64_t q_dim = static_cast<std::int64_t>(c.n_head) * c.head_dim;
  const std::int64_t kv_dim = static_cast<std::int64_t>(c.n_head_kv) * c.head_dim;
  impl_->embd = load(f, "token_embd.weight", c.vocab, c.n_embd);
  impl_->output_norm = load_vec(f, "output_norm.weight", c.n_embd);
  if (!c.tied_embeddings) impl_->output = load(f, "output.weight", c.vocab, c.n_embd);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    Layer L;
    L.attn_norm = load_vec(f, b + "attn_norm.weight", c.n_embd);
    L.ffn_norm = load_vec(f, b + "ffn_norm.weight", c.n_embd);
    L.wq = load(f, b + "attn_q.weight", q_dim, c.n_embd);
    L.wk = load(f, b + "attn_k.weight", kv_dim, c.n_embd);
    L.wv = load(f, b + "attn_v.weight", kv_dim, c.n_embd);
    L.wo = load(f, b + "attn_output.weight", c.n_embd, q_dim);
    L.wgate = load(f, b + "ffn_gate.weight", c.n_ff, c.n_embd);
    L.wup = load(f, b + "ffn_up.weight", c.n_ff, c.n_embd);
    L.wdown = load(f, b + "ffn_down.weight", c.n_embd, c.n_ff);
    if (f.find(b + "attn_q.bias")) {
      L.bq = load_vec(f, b + "attn_q.bias", q_dim);
      L.bk = load_vec(f, b + "attn_k.bias", kv_dim);
      L.bv = load_vec(f, b + "attn_v.bias", kv_dim);
    }
    L.k_cache.resize(0, kv_dim);
    L.v_cache.resize(0, kv_dim);
    impl_->layers.push_back(std::move(L));
  }
}

LlamaModel::~LlamaModel() = default;

void LlamaModel::reset() {
  for (auto& L : impl_->layers) {
    L.k_cache.resize(0, L.k_cache.cols());
    L.v_cache.resize(0, L.v_cache.cols());
    L.positions.clear();
  }
}

std::vector<float> LlamaModel::prefill(std::span<const std::int32_t> tokens, std::int64_t chunk,
                                       const std::function<void(const LayerActivations&)>& hook) {
  if (tokens.empty()) throw Error("prefill: no tokens");
  if (chunk < 1) throw Error("prefill: chunk must be >= 1");
  std::vector<float> logits;
  for (std::size_t s = 0; s < tokens.size(); s += static_cast<std::size_t>(chunk)) {
    const std::size_t e = std::min(tokens.size(), s + static_cast<std::size_t>(chunk));
    std::vector<std::int32_t> pos(e - s);
    for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<std::int32_t>(cached_tokens()) + static_cast<std::int32_t>(i);
    const std::int64_t last = static_cast<std::int64_t>(e - s) - 1;
    const std::span<const std::int64_t> rows = e == tokens.size() ? std::span<const std::int64_t>(&last, 1)
                                                                   : std::span<const std::int64_t>();
    logits = forward(tokens.subspan(s, e - s), pos, rows, hook);
  }
  return logits;
}

std::vector<float> LlamaModel::step(std::int32_t token, const std::function<void(const LayerActivations&)>& hook) {
  const auto pos = static_cast<std::int32_t>(cached_tokens());
  const std::int64_t row = 0;
  return forward(std::span<const std::int32_t>(&token, 1), std::span<const std::int32_t>(&pos, 1),
                 std::span<const std::int64_t>(&row, 1), hook);
}

std::int64_t LlamaModel::cached_tokens() const { return impl_->layers.empty() ? 0 : impl_->layers[0].k_cache.rows(); }

std::vector<float> LlamaModel::forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> positions,
                                       std::span<const std::int64_t> logit_rows,
                                       const std::function<void(const LayerActivations&)>& hook) {
  const LlamaConfig& c = cfg_;
  const auto n = static_cast<Eigen::Index>(tokens.size());
  if (positions.size() != tokens.size()) throw Error("forward: positions and tokens differ in length");
  const int d = c.head_dim, G = c.n_head / c.n_head_kv;
  Mat x(n, c.n_embd);
  for (Eigen::Index i = 0; i < n; ++i) {
    const std::int32_t t = tokens[static_cast<std::size_t>(i)];
    if (t < 0 || t >= c.vocab) throw Error("forward: token id " + std::to_string(t) + " out of range");
    x.row(i) = impl_->embd.row(t);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int l = 0; l < c.n_layers; ++l) {
    Layer& L = impl_->layers[static_cast<std::size_t>(l)];
    const Mat h = rms_norm(x, L.attn_norm, c.rms_eps);
    Mat q = h * L.wq.transpose(), k = h * L.wk.transpose(), v = h * L.wv.transpose();
    if (L.bq.size()) {
      q.rowwise() += L.bq.transpose();
      k.rowwise() += L.bk.transpose();
      v.rowwise() += L.bv.transpose();
    }
    for (Eigen::Index i = 0; i < n; ++i) {
      apply_rope(c.rope, q.row(i).data(), c.n_head, positions[static_cast<std::size_t>(i)]);
      apply_rope(c.rope, k.row(i).data(), c.n_head_kv, positions[static_cast<std::size_t>(i)]);
    }
    if (hook)
      hook(LayerActivations{l, n, {q.data(), static_cast<std::size_t>(q.size())},
                            {k.data(), static_cast<std::size_t>(k.size())}, {v.data(), static_cast<std::size_t>(v.size())}});
    const Eigen::Index past = L.k_cache.rows();
    L.k_cache.conservativeResize(past + n, Eigen::NoChange);
    L.v_cache.conservativeResize(past + n, Eigen::NoChange);
    L.k_cache.bottomRows(n) = k;
    L.v_cache.bottomRows(n) = v;
    L.positions.insert(L.positions.end(), positions.begin(), positions.end());
    const Eigen::Index total = past + n;
    Mat attn_out(n, static_cast<Eigen::Index>(c.n_head) * d);
#pragma omp parallel for schedule(static)
    for (int hq = 0; hq < c.n_head; ++hq) {
      const int hk = hq / G;
      const Mat qh = q.middleCols(static_cast<Eigen::Index>(hq) * d, d);
      const Mat kh = L.k_cache.middleCols(static_cast<Eigen::Index>(hk) * d, d);
      const Mat vh = L.v_cache.middleCols(static_cast<Eigen::Index>(hk) * d, d);
      Mat s = (qh * kh.transpose()) * scale;  // [n, total]
      for (Eigen::Index i = 0; i < n; ++i) {
        const Eigen::Index last = past + i;  // causal: itself and everything before it
        auto row = s.row(i);
        const float m = row.head(last + 1).maxCoeff();
        row.head(last + 1) = (row.head(last + 1).array() - m).exp();
        row.head(last + 1) /= row.head(last + 1).sum();
        if (last + 1 < total) row.tail(total - last - 1).setZero();
      }
      attn_out.middleCols(static_cast<Eigen::Index>(hq) * d, d) = s * vh;
    }
    x += attn_out * L.wo.transpose();
    const Mat h2 = rms_norm(x, L.ffn_norm, c.rms_eps);
    const Mat gate = h2 * L.wgate.transpose();
    const Mat up = h2 * L.wup.transpose();
    const Mat act = (gate.array() / (1.0f + (-gate.array()).exp())).matrix().cwiseProduct(up);  // silu(gate) * up
    x += act * L.wdown.transpose();
  }
  const Mat& out_w = c.tied_embeddings ? impl_->embd : impl_->output;
  std::vector<float> logits;
  logits.reserve(logit_rows.size() * static_cast<std::size_t>(c.vocab));
  for (std::int64_t r : logit_rows) {
    if (r < 0 || r >= n) throw Error("forward: logit row " + std::to_string(r) + " out of range");
    const Mat xr = rms_norm(x.row(r), impl_->output_norm, c.rms_eps);
    const Vec lg = out_w * xr.transpose();
    logits.insert(logits.end(), lg.data(), lg.data() + lg.size());
  }
  return logits;
}

}  // namespace kvsim
