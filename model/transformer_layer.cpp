#include "model/transformer_layer.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "core/half.h"
#include "core/rope.h"

namespace kvsim::layer_ops {

namespace {

Mat matmul(const Mat& x, const WeightMatrix& w) {
  Mat y(x.rows(), w.rows());
  w.multiply(x.data(), x.rows(), y.data());
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
Eigen::Index first_after(const KvEntry& e, std::int64_t before) {
  return static_cast<Eigen::Index>(std::upper_bound(e.tokens.begin(), e.tokens.end(), before) - e.tokens.begin());
}

}  // namespace

Mat rms_norm(const Mat& x, const Vec& w, double eps) {
  Mat y(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    const double ms = static_cast<double>(x.row(i).squaredNorm()) / static_cast<double>(x.cols());
    const auto scale = static_cast<float>(1.0 / std::sqrt(ms + eps));
    y.row(i) = (x.row(i) * scale).cwiseProduct(w.transpose());
  }
  return y;
}

Mat embed(const ModelConfig& c, const WeightMatrix& embd, std::span<const std::int32_t> tokens) {
  Mat x(static_cast<Eigen::Index>(tokens.size()), c.n_embd);
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    const std::int32_t t = tokens[static_cast<std::size_t>(i)];
    if (t < 0 || t >= c.vocab) throw Error("forward: token id " + std::to_string(t) + " out of range");
    embd.row(t, x.row(i).data());
  }
  if (c.embd_scale != 1.0) x *= static_cast<float>(c.embd_scale);
  return x;
}

Qkv project_qkv(const ModelConfig& c, const Layer& L, int l, const Mat& x, std::span<const std::int32_t> positions) {
  const Mat h = rms_norm(x, L.attn_norm, c.rms_eps);
  Qkv r{matmul(h, L.wq), matmul(h, L.wk), matmul(h, L.wv)};
  if (L.bq.size()) {
    r.q.rowwise() += L.bq.transpose();
    r.k.rowwise() += L.bk.transpose();
    r.v.rowwise() += L.bv.transpose();
  }
  if (c.qk_norm) {
    head_rms_norm(r.q, L.q_norm, c.n_q_heads, c.rms_eps);
    head_rms_norm(r.k, L.k_norm, c.n_kv_heads, c.rms_eps);
  }
  const RopeSpec rope = c.rope_at(l);
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    apply_rope(rope, r.q.row(i).data(), c.n_q_heads, positions[static_cast<std::size_t>(i)]);
    apply_rope(rope, r.k.row(i).data(), c.n_kv_heads, positions[static_cast<std::size_t>(i)]);
  }
  // The cache holds f16 values (kv_cache.h): K/V are rounded once, as they are produced.
  round_to_half(r.k.data(), static_cast<std::size_t>(r.k.size()));
  round_to_half(r.v.data(), static_cast<std::size_t>(r.v.size()));
  return r;
}

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

Mat attend(const ModelConfig& c, int l, const std::vector<KvEntry>& entries, const Mat& q,
           std::span<const std::int64_t> row_tokens, std::vector<std::vector<float>>* last_row) {
  const int d = c.head_dim, G = c.n_q_heads / c.n_kv_heads;
  const auto n = static_cast<Eigen::Index>(row_tokens.size());
  if (n == 0) return Mat(0, static_cast<Eigen::Index>(c.n_q_heads) * d);
  const float scale = c.attn_scale > 0 ? static_cast<float>(c.attn_scale) : 1.0f / std::sqrt(static_cast<float>(d));
  const bool per_query_head = static_cast<int>(entries.size()) == c.n_q_heads && c.n_q_heads != c.n_kv_heads;
  if (last_row) last_row->resize(static_cast<std::size_t>(c.n_q_heads));
  Mat attn_out(n, static_cast<Eigen::Index>(c.n_q_heads) * d);
  const std::int64_t window = c.window(l);
#pragma omp parallel for schedule(static)
  for (int hq = 0; hq < c.n_q_heads; ++hq) {
    const KvEntry& entry = entries[static_cast<std::size_t>(per_query_head ? hq : hq / G)];
    const Eigen::Index total = first_after(entry, row_tokens[static_cast<std::size_t>(n - 1)]);  // rows read
    const Mat qh = q.middleCols(static_cast<Eigen::Index>(hq) * d, d);
    const Eigen::Map<const Mat> kh(entry.k.data(), total, d), vh(entry.v.data(), total, d);
    Mat s(n, total);  // [n, total]
    s.noalias() = (qh * kh.transpose()) * scale;
    if (!entry.bias.empty()) s.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(entry.bias.data(), total);
    for (Eigen::Index i = 0; i < n; ++i) {
      const std::int64_t token = row_tokens[static_cast<std::size_t>(i)];
      const Eigen::Index last = first_after(entry, token) - 1;  // causal: itself and everything before it
      // A sliding-window layer sees only the tokens within its window of this one.
      const Eigen::Index first = window > 0 ? first_after(entry, token - window) : 0;
      auto row = s.row(i);
      const Eigen::Index len = last + 1 - first;
      const float m = row.segment(first, len).maxCoeff();
      row.segment(first, len) = (row.segment(first, len).array() - m).exp();
      row.segment(first, len) /= row.segment(first, len).sum();
      if (first > 0) row.head(first).setZero();
      if (last + 1 < total) row.tail(total - last - 1).setZero();
    }
    if (last_row) (*last_row)[static_cast<std::size_t>(hq)].assign(s.row(n - 1).data(), s.row(n - 1).data() + total);
    attn_out.middleCols(static_cast<Eigen::Index>(hq) * d, d).noalias() = s * vh;
  }
  return attn_out;
}

void finish_layer(const ModelConfig& c, const Layer& L, Mat& x, const Mat& attn_out) {
  const Mat o = matmul(attn_out, L.wo);
  x += c.post_norms ? rms_norm(o, L.post_attn_norm, c.rms_eps) : o;
  const Mat h2 = rms_norm(x, L.ffn_norm, c.rms_eps);
  const Mat gate = matmul(h2, L.wgate);
  const Mat up = matmul(h2, L.wup);
  const Mat act = activate(gate, c.ffn_act).cwiseProduct(up);
  const Mat down = matmul(act, L.wdown);
  x += c.post_norms ? rms_norm(down, L.post_ffn_norm, c.rms_eps) : down;
}

}  // namespace kvsim::layer_ops
