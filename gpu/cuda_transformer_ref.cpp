#include "gpu/cuda_transformer_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/half.h"

namespace kvsim::gpu {

namespace {

void round_all(std::vector<float>& x) { round_to_half(x.data(), x.size()); }

// y [n, rows] (+)= x [n, cols] W^T with double accumulation.
void matmul(const std::vector<float>& x, std::int64_t n, const std::vector<float>& W, std::int64_t rows,
            std::int64_t cols, float* y, bool accumulate) {
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* wr = W.data() + r * cols;
    for (std::int64_t i = 0; i < n; ++i) {
      const float* xi = x.data() + i * cols;
      double acc = 0;
      for (std::int64_t c = 0; c < cols; ++c) acc += static_cast<double>(xi[c]) * wr[c];
      float& out = y[i * rows + r];
      out = accumulate ? static_cast<float>(out + acc) : static_cast<float>(acc);
    }
  }
}

std::vector<float> rms_norm(const std::vector<float>& x, std::int64_t n, std::int64_t e, const std::vector<float>& w,
                            double eps) {
  std::vector<float> y(static_cast<std::size_t>(n * e));
  for (std::int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (std::int64_t c = 0; c < e; ++c) ss += static_cast<double>(x[i * e + c]) * x[i * e + c];
    const auto scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(e) + eps));
    for (std::int64_t c = 0; c < e; ++c) y[i * e + c] = x[i * e + c] * scale * w[c];
  }
  return y;
}

// Each head's slice of every row scaled to unit RMS times w [d] (gemma3's q/k norms).
void head_rms_norm(float* x, std::int64_t n, int heads, int d, const std::vector<float>& w, double eps) {
  for (std::int64_t r = 0; r < n * heads; ++r) {
    float* v = x + r * d;
    double ss = 0;
    for (int c = 0; c < d; ++c) ss += static_cast<double>(v[c]) * v[c];
    const auto scale = static_cast<float>(1.0 / std::sqrt(ss / d + eps));
    for (int c = 0; c < d; ++c) v[c] = v[c] * scale * w[static_cast<std::size_t>(c)];
  }
}

// The feed-forward gate's activation times up, in place in gate: SiLU or GELU (tanh form).
void gated_activation(std::vector<float>& gate, const std::vector<float>& up, FfnAct act) {
  const float k = std::sqrt(2.0f / 3.14159265358979f);
  for (std::size_t c = 0; c < gate.size(); ++c) {
    const float g = gate[c];
    gate[c] = (act == FfnAct::Silu ? g / (1.0f + std::exp(-g))
                                   : 0.5f * g * (1.0f + std::tanh(k * (g + 0.044715f * g * g * g)))) *
              up[c];
  }
}

}  // namespace

TransformerRef::TransformerRef(const ModelConfig& s, DeviceWeights w) : s_(s), dw_(w) {
  s_.check();
  weights_.resize(static_cast<std::size_t>((s_.n_layers + 1) * kWeightIds));
  reset();
}

void TransformerRef::set_weight(WeightId id, int layer, std::span<const float> data) {
  const auto [rows, cols] = weight_shape(s_, id);
  if (is_per_layer(id) != (layer >= 0) || layer >= s_.n_layers)
    throw std::invalid_argument(std::string("set_weight: ") + weight_id_name(id) + " at layer " +
                                std::to_string(layer));
  if (static_cast<std::int64_t>(data.size()) != rows * cols)
    throw std::invalid_argument(std::string("set_weight: ") + weight_id_name(id) + " has " +
                                std::to_string(data.size()) + " values, expected " + std::to_string(rows * cols));
  auto& dst = weights_[static_cast<std::size_t>((layer + 1) * kWeightIds + static_cast<int>(id))];
  dst.assign(data.begin(), data.end());
  // The GPU keeps matrices in fp16 (norm weights and biases stay fp32, as there).
  if (dw_ == DeviceWeights::F16 && rows > 1) round_all(dst);
}

WeightSink TransformerRef::sink() {
  return [this](WeightId id, int layer, std::span<const float> d) { set_weight(id, layer, d); };
}

const std::vector<float>& TransformerRef::w(WeightId id, int layer) const {
  const auto& v = weights_[static_cast<std::size_t>((layer + 1) * kWeightIds + static_cast<int>(id))];
  if (v.empty())
    throw std::logic_error(std::string("transformer reference: weight ") + weight_id_name(id) + " not set");
  return v;
}

void TransformerRef::reset() {
  cache_.assign(static_cast<std::size_t>(s_.n_layers), std::vector<Entry>(static_cast<std::size_t>(s_.n_kv_heads)));
  rules_.assign(static_cast<std::size_t>(s_.n_layers), std::nullopt);
  packed_layer_.assign(static_cast<std::size_t>(s_.n_layers), false);
  rule_ready_ = false;
}

void TransformerRef::load_layer(int layer, std::span<const HostEntry> entries) {
  if (entries.size() != static_cast<std::size_t>(s_.n_kv_heads) &&
      !per_query_head(s_, static_cast<int>(entries.size())))
    throw std::invalid_argument("load_layer: " + std::to_string(entries.size()) +
                                " entries, expected n_head_kv or n_head");
  // Every packed prefix is checked before the layer changes: a refused load leaves it as it was.
  for (std::size_t e = 0; e < entries.size(); ++e)
    if (const PackedEntry* p = entries[e].packed) {
      check_host_packed(*p, entries[e].rows, s_.head_dim, static_cast<int>(e));
      check_unwindowed(s_, layer, static_cast<int>(e));
    }
  auto& dst = cache_.at(static_cast<std::size_t>(layer));
  rules_.at(static_cast<std::size_t>(layer)).reset();
  rule_ready_ = false;  // the last pass's weights are not over these rows
  packed_layer_[static_cast<std::size_t>(layer)] =
      std::any_of(entries.begin(), entries.end(), [](const HostEntry& e) { return e.packed != nullptr; });
  dst.assign(entries.size(), Entry{});
  const auto d = static_cast<std::size_t>(s_.head_dim);
  for (std::size_t e = 0; e < entries.size(); ++e) {
    const auto n = static_cast<std::size_t>(entries[e].rows) * d;
    // The GPU cache is fp16: rows a codec rebuilt (not fp16-valued) are rounded as they are there.
    dst[e].k.assign(entries[e].k, entries[e].k + n);
    dst[e].v.assign(entries[e].v, entries[e].v + n);
    round_all(dst[e].k);
    round_all(dst[e].v);
    // A packed prefix is read back from its stored form, as the GPU unpacks it.
    if (const PackedEntry* p = entries[e].packed) {
      std::vector<float> rows;
      unpack_tensor(p->k, s_.head_dim, s_.rope, rows);
      std::copy(rows.begin(), rows.end(), dst[e].k.begin());
      unpack_tensor(p->v, s_.head_dim, s_.rope, rows);
      std::copy(rows.begin(), rows.end(), dst[e].v.begin());
    }
  }
}

void TransformerRef::keep_rows(int layer, int entry, std::span<const std::int64_t> rows) {
  Entry& en = cache_.at(static_cast<std::size_t>(layer)).at(static_cast<std::size_t>(entry));
  if (rules_.at(static_cast<std::size_t>(layer)))
    throw std::invalid_argument("keep_rows: layer " + std::to_string(layer) + " evicts by its decode rule");
  rule_ready_ = false;
  const auto d = static_cast<std::size_t>(s_.head_dim);
  const auto have = static_cast<std::int64_t>(en.k.size() / d);
  Entry kept;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::int64_t r = rows[i];
    if (r < 0 || r >= have || (i > 0 && r <= rows[i - 1]))
      throw std::invalid_argument("keep_rows: row " + std::to_string(r) + " of an entry of " + std::to_string(have) +
                                  " rows (rows must increase)");
    const auto at = static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * d);
    kept.k.insert(kept.k.end(), en.k.begin() + at, en.k.begin() + at + static_cast<std::ptrdiff_t>(d));
    kept.v.insert(kept.v.end(), en.v.begin() + at, en.v.begin() + at + static_cast<std::ptrdiff_t>(d));
  }
  en = std::move(kept);
}

int TransformerRef::entries(int layer) const {
  return static_cast<int>(cache_.at(static_cast<std::size_t>(layer)).size());
}
std::int64_t TransformerRef::rows(int layer, int entry) const {
  return static_cast<std::int64_t>(
             cache_.at(static_cast<std::size_t>(layer)).at(static_cast<std::size_t>(entry)).k.size()) /
         s_.head_dim;
}
std::span<const float> TransformerRef::entry_k(int layer, int entry) const {
  return cache_.at(static_cast<std::size_t>(layer)).at(static_cast<std::size_t>(entry)).k;
}
std::span<const float> TransformerRef::entry_v(int layer, int entry) const {
  return cache_.at(static_cast<std::size_t>(layer)).at(static_cast<std::size_t>(entry)).v;
}

void TransformerRef::start_rule(int layer, const DecodeRuleStart& start) {
  std::vector<std::int64_t> held;
  for (int e = 0; e < entries(layer); ++e) held.push_back(rows(layer, e));
  // As the GPU: a rule compacts fp16 rows, and a packed layer has its packed prefix.
  if (packed_layer_.at(static_cast<std::size_t>(layer)))
    throw std::invalid_argument("start_rule: layer " + std::to_string(layer) +
                                " holds packed entries; a decode rule compacts fp16 rows");
  check_rule_start(start, held, s_.n_q_heads);
  rules_.at(static_cast<std::size_t>(layer)) = start;
  rule_ready_ = false;  // a step needs a pass over the rows the rule starts from
}

std::vector<std::vector<std::vector<std::int64_t>>> TransformerRef::rule_step(std::int64_t budget) {
  if (!rule_ready_) throw std::logic_error("rule_step: no one-row forward() with record_last since the last step");
  rule_ready_ = false;
  budget = std::max<std::int64_t>(budget, 0);
  std::vector<std::vector<std::vector<std::int64_t>>> out(static_cast<std::size_t>(s_.n_layers));
  for (int l = 0; l < s_.n_layers; ++l) {
    auto& rule = rules_[static_cast<std::size_t>(l)];
    if (!rule) continue;
    const int ne = entries(l);
    std::vector<std::int64_t> held;
    std::int64_t stride = 0;
    for (int e = 0; e < ne; ++e) held.push_back(rows(l, e)), stride = std::max(stride, held.back());
    std::vector<float> w(static_cast<std::size_t>(s_.n_q_heads * stride), 0.0f);
    for (int h = 0; h < s_.n_q_heads; ++h) {
      const auto& row = last_[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)];
      if (static_cast<std::int64_t>(row.size()) != held[static_cast<std::size_t>(h / (s_.n_q_heads / ne))])
        throw std::logic_error("rule_step: the last-row weights of layer " + std::to_string(l) +
                               " are not over its rows");
      std::copy(row.begin(), row.end(), w.begin() + static_cast<std::ptrdiff_t>(h) * stride);
    }
    out[static_cast<std::size_t>(l)] = decode_rule_step_ref(
        rule->rule, rule->scores, held, LastRowWeights{w.data(), stride, s_.n_q_heads, s_.n_q_heads / ne}, budget);
    const auto d = static_cast<std::size_t>(s_.head_dim);
    for (int e = 0; e < ne; ++e) {  // the kept rows to the front, in order
      Entry& en = cache_[static_cast<std::size_t>(l)][static_cast<std::size_t>(e)];
      const auto& gone = out[static_cast<std::size_t>(l)][static_cast<std::size_t>(e)];
      std::size_t at = 0, g = 0;
      for (std::int64_t r = 0; r < held[static_cast<std::size_t>(e)]; ++r) {
        if (g < gone.size() && gone[g] == r) {
          ++g;
          continue;
        }
        std::copy_n(en.k.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * d), d,
                    en.k.begin() + static_cast<std::ptrdiff_t>(at * d));
        std::copy_n(en.v.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * d), d,
                    en.v.begin() + static_cast<std::ptrdiff_t>(at * d));
        ++at;
      }
      en.k.resize(at * d);
      en.v.resize(at * d);
    }
  }
  return out;
}

void TransformerRef::project_into_residual(const std::vector<float>& in, std::int64_t n, WeightId proj, WeightId post,
                                           int layer, std::int64_t cols, std::vector<float>& x) const {
  const std::int64_t E = s_.n_embd;
  if (!s_.post_norms) return matmul(in, n, w(proj, layer), E, cols, x.data(), true);
  std::vector<float> y(static_cast<std::size_t>(n * E));
  matmul(in, n, w(proj, layer), E, cols, y.data(), false);
  const std::vector<float> normed = rms_norm(y, n, E, w(post, layer), s_.rms_eps);
  for (std::size_t c = 0; c < x.size(); ++c) x[c] += normed[c];
}

std::span<const float> TransformerRef::last_attention(int layer, int q_head) const {
  if (!last_handed_)
    throw std::logic_error(
        "last_attention: the last forward() recorded no last-row weights, or left them on the device");
  return last_.at(static_cast<std::size_t>(layer)).at(static_cast<std::size_t>(q_head));
}

std::vector<float> TransformerRef::attend(int l, std::int64_t n, const std::vector<float>& q,
                                          const std::vector<float>& k, const std::vector<float>& v, bool record_last,
                                          float scale) {
  const std::int64_t Q = s_.q_dim(), K = s_.kv_dim();
  const int d = s_.head_dim, Hq = s_.n_q_heads, G = s_.group();
  auto& entries = cache_[static_cast<std::size_t>(l)];
  const bool pqh = per_query_head(s_, static_cast<int>(entries.size()));
  std::vector<std::int64_t> past(entries.size());
  for (std::size_t e = 0; e < entries.size(); ++e) {
    Entry& en = entries[e];
    past[e] = static_cast<std::int64_t>(en.k.size()) / d;
    const std::int64_t hk = pqh ? static_cast<std::int64_t>(e) / G : static_cast<std::int64_t>(e);
    for (std::int64_t i = 0; i < n; ++i) {
      en.k.insert(en.k.end(), k.begin() + i * K + hk * d, k.begin() + i * K + hk * d + d);
      en.v.insert(en.v.end(), v.begin() + i * K + hk * d, v.begin() + i * K + hk * d + d);
    }
  }
  std::vector<float> att(static_cast<std::size_t>(n * Q));
#pragma omp parallel for schedule(static)
  for (int hq = 0; hq < Hq; ++hq) {
    const std::size_t e = pqh ? static_cast<std::size_t>(hq) : static_cast<std::size_t>(hq / G);
    const Entry& en = entries[e];
    std::vector<double> sc;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t seen = past[e] + i + 1;  // causal: everything cached plus itself
      const std::int64_t lo = window_start(s_.window(l), seen);
      const float* qi = q.data() + i * Q + static_cast<std::int64_t>(hq) * d;
      sc.assign(static_cast<std::size_t>(seen), 0.0);
      double m = -std::numeric_limits<double>::infinity();
      for (std::int64_t j = lo; j < seen; ++j) {
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += static_cast<double>(qi[c]) * en.k[static_cast<std::size_t>(j * d + c)];
        sc[static_cast<std::size_t>(j)] = dot * scale;
        m = std::max(m, sc[static_cast<std::size_t>(j)]);
      }
      double sum = 0;
      for (std::int64_t j = lo; j < seen; ++j)
        sum += (sc[static_cast<std::size_t>(j)] = std::exp(sc[static_cast<std::size_t>(j)] - m));
      for (int c = 0; c < d; ++c) {
        double o = 0;
        for (std::int64_t j = lo; j < seen; ++j)
          o += sc[static_cast<std::size_t>(j)] * en.v[static_cast<std::size_t>(j * d + c)];
        att[static_cast<std::size_t>(i * Q + static_cast<std::int64_t>(hq) * d + c)] = static_cast<float>(o / sum);
      }
      if (record_last && i == n - 1) {
        auto& dst = last_[static_cast<std::size_t>(l)][static_cast<std::size_t>(hq)];
        dst.resize(sc.size());
        for (std::size_t j = 0; j < sc.size(); ++j) dst[j] = static_cast<float>(sc[j] / sum);
      }
    }
  }
  return att;
}

void TransformerRef::rotate(int l, std::int64_t n, std::span<const std::int32_t> positions, std::vector<float>& q,
                            std::vector<float>& k) const {
  const std::int64_t Q = s_.q_dim(), K = s_.kv_dim();
  const int d = s_.head_dim, Hq = s_.n_q_heads, pairs = s_.rope.rope_dim / 2;
  const bool local = s_.rope_theta_local > 0 && s_.window(l) > 0;
  const std::vector<float>& cos_l = local ? cos_local_ : cos_;
  const std::vector<float>& sin_l = local ? sin_local_ : sin_;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t p = positions[static_cast<std::size_t>(i)];
    const float* cs = cos_l.data() + p * pairs;
    const float* sn = sin_l.data() + p * pairs;
    auto rotate = [&](float* row, int heads) {
      for (int hh = 0; hh < heads; ++hh)
        for (int j = 0; j < pairs; ++j) {
          float* vv = row + static_cast<std::int64_t>(hh) * d;
          const int a = rope_pair_first(s_.rope, j), b = rope_pair_second(s_.rope, j);
          const float x0 = vv[a], x1 = vv[b];
          vv[a] = x0 * cs[j] - x1 * sn[j];
          vv[b] = x0 * sn[j] + x1 * cs[j];
        }
    };
    rotate(q.data() + i * Q, Hq);
    rotate(k.data() + i * K, s_.n_kv_heads);
  }
}

std::vector<float> TransformerRef::forward(std::span<const std::int32_t> tokens,
                                           std::span<const std::int32_t> positions,
                                           std::span<const std::int64_t> logit_rows, bool want_q, bool record_last,
                                           const LayerCallback& on_layer) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  if (n == 0 || positions.size() != tokens.size())
    throw std::invalid_argument("forward: tokens and positions must be non-empty and equal in length");
  const std::int64_t E = s_.n_embd, Q = s_.q_dim(), K = s_.kv_dim(), F = s_.n_ff, V = s_.vocab;
  const int d = s_.head_dim, Hq = s_.n_q_heads;
  const bool f16 = dw_ == DeviceWeights::F16;
  auto gemm_input = [&](std::vector<float>& x) {
    if (f16) round_all(x);
  };
  const std::int32_t max_pos = *std::max_element(positions.begin(), positions.end());
  if (*std::min_element(positions.begin(), positions.end()) < 0)
    throw std::invalid_argument("forward: negative position");
  if (max_pos >= rope_rows_) {
    rope_rows_ = std::max<std::int64_t>(max_pos + 1, 2 * rope_rows_);
    rope_tables(s_.rope, rope_rows_, cos_, sin_);
    if (s_.rope_theta_local > 0) rope_tables(local_rope(s_), rope_rows_, cos_local_, sin_local_);
  }
  std::vector<float> x(static_cast<std::size_t>(n * E));
  const auto& embd = w(WeightId::TokenEmbd, -1);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int32_t t = tokens[static_cast<std::size_t>(i)];
    if (t < 0 || t >= V) throw std::invalid_argument("forward: token id " + std::to_string(t) + " out of range");
    std::copy_n(embd.begin() + t * E, E, x.begin() + i * E);
  }
  if (s_.embd_scale != 1.0)
    for (float& xi : x) xi *= static_cast<float>(s_.embd_scale);
  rule_ready_ = last_handed_ = false;
  if (record_last)
    last_.assign(static_cast<std::size_t>(s_.n_layers), std::vector<std::vector<float>>(static_cast<std::size_t>(Hq)));
  const float scale = attention_scale(s_);
  std::vector<float> q(static_cast<std::size_t>(n * Q)), k(static_cast<std::size_t>(n * K)), v(k.size());
  for (int l = 0; l < s_.n_layers; ++l) {
    std::vector<float> h = rms_norm(x, n, E, w(WeightId::AttnNorm, l), s_.rms_eps);
    gemm_input(h);
    matmul(h, n, w(WeightId::Wq, l), Q, E, q.data(), false);
    matmul(h, n, w(WeightId::Wk, l), K, E, k.data(), false);
    matmul(h, n, w(WeightId::Wv, l), K, E, v.data(), false);
    if (s_.qkv_bias) {
      const auto &bq = w(WeightId::Bq, l), &bk = w(WeightId::Bk, l), &bv = w(WeightId::Bv, l);
      for (std::int64_t i = 0; i < n; ++i) {
        for (std::int64_t c = 0; c < Q; ++c) q[i * Q + c] += bq[c];
        for (std::int64_t c = 0; c < K; ++c) k[i * K + c] += bk[c], v[i * K + c] += bv[c];
      }
    }
    if (s_.qk_norm) {
      head_rms_norm(q.data(), n, Hq, d, w(WeightId::QNorm, l), s_.rms_eps);
      head_rms_norm(k.data(), n, s_.n_kv_heads, d, w(WeightId::KNorm, l), s_.rms_eps);
    }
    rotate(l, n, positions, q, k);
    round_all(k);
    round_all(v);
    if (on_layer) on_layer(LayerRows{l, n, want_q ? q.data() : nullptr, k.data(), v.data()});
    std::vector<float> att = attend(l, n, q, k, v, record_last, scale);
    gemm_input(att);
    project_into_residual(att, n, WeightId::Wo, WeightId::PostAttnNorm, l, Q, x);
    std::vector<float> h2 = rms_norm(x, n, E, w(WeightId::FfnNorm, l), s_.rms_eps);
    gemm_input(h2);
    std::vector<float> gate(static_cast<std::size_t>(n * F)), up(gate.size());
    matmul(h2, n, w(WeightId::Wgate, l), F, E, gate.data(), false);
    matmul(h2, n, w(WeightId::Wup, l), F, E, up.data(), false);
    gated_activation(gate, up, s_.ffn_act);
    gemm_input(gate);
    project_into_residual(gate, n, WeightId::Wdown, WeightId::PostFfnNorm, l, F, x);
  }
  std::vector<float> xr(logit_rows.size() * static_cast<std::size_t>(E));
  for (std::size_t j = 0; j < logit_rows.size(); ++j) {
    const std::int64_t r = logit_rows[j];
    if (r < 0 || r >= n) throw std::invalid_argument("forward: logit row " + std::to_string(r) + " out of range");
    std::copy_n(x.begin() + r * E, E, xr.begin() + static_cast<std::int64_t>(j) * E);
  }
  std::vector<float> logits(logit_rows.size() * static_cast<std::size_t>(V));
  if (!logit_rows.empty()) {
    std::vector<float> hr =
        rms_norm(xr, static_cast<std::int64_t>(logit_rows.size()), E, w(WeightId::OutputNorm, -1), s_.rms_eps);
    gemm_input(hr);
    const auto& out_w = s_.tied_embeddings ? w(WeightId::TokenEmbd, -1) : w(WeightId::Output, -1);
    matmul(hr, static_cast<std::int64_t>(logit_rows.size()), out_w, V, E, logits.data(), false);
  }
  rule_ready_ = n == 1 && record_last;
  last_handed_ = record_last && last_on_host_;
  return logits;
}

}  // namespace kvsim::gpu
