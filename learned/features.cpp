#include "learned/features.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace kvsim::learned {

namespace {

constexpr int kWindows[] = {4, 8, 16, 32};
constexpr int kEntropyWindow = 16;
constexpr int kSinks = 4;
// Attention is scaled by the cache size (1 = uniform attention) before the log, so the features
// mean the same at 200 tokens as at 8000; kFloor keeps log finite for ignored tokens.
constexpr float kFloor = 1e-3f;

enum Column {
  kMean4,
  kMean8,
  kMean16,
  kMean32,
  kLast,
  kMax,
  kEntropy,
  kKeyNorm,
  kValueNorm,
  kKeyCos,
  kPosRelative,
  kDistFromEnd,
  kSink,
  kSegSystem,
  kSegContext,
  kSegQuestion,
  kSegGenerated,
  kLayerFrac,
  kHeadFrac,
  kHeadEntropy,
  kColumns
};
static_assert(kColumns == kFeatureCount);

// Per-token attention statistics of one KV head's group over the last W recorded queries, row by
// row (each row contiguous, so Eigen vectorises the sums, maxima and logs).
struct WindowStats {
  std::vector<Eigen::ArrayXf> mean;  // [windows] (n)
  Eigen::ArrayXf last, max, entropy;
};

WindowStats window_stats(const LayerSignals& s, int kv, int W, std::int64_t n) {
  using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const int G = s.geometry().group();
  const auto N = static_cast<Eigen::Index>(n);
  WindowStats st;
  st.mean.assign(std::size(kWindows), Eigen::ArrayXf::Zero(N));
  st.last = st.max = st.entropy = Eigen::ArrayXf::Zero(N);
  const int we = std::min(kEntropyWindow, W);
  std::vector<Eigen::Map<const RowMat>> heads;  // [G] of [rows, n], the newest query last
  for (int r = 0; r < G; ++r) {
    const MatrixView view = s.window_attention(kv * G + r, W);
    heads.emplace_back(view.data, view.rows, N);
  }
  const Eigen::Index rows = heads.front().rows();
  Eigen::ArrayXf run = Eigen::ArrayXf::Zero(N), group(N);
  for (Eigen::Index age = 0; age < rows; ++age) {
    group.setZero();
    for (const auto& a : heads) {
      const auto row = a.row(rows - 1 - age).array().transpose();
      group += row;
      st.max = st.max.max(row);
    }
    run += group;
    if (age == 0) st.last = group;
    // The entropy term of the group's mean attention (one log per token, not one per head).
    if (age < we) {
      const Eigen::ArrayXf p = group / static_cast<float>(G);
      st.entropy -= p * p.max(1e-30f).log();
    }
    for (std::size_t w = 0; w < std::size(kWindows); ++w)
      if (age + 1 == std::min<Eigen::Index>(kWindows[w], rows)) st.mean[w] += run;
  }
  for (std::size_t w = 0; w < std::size(kWindows); ++w) st.mean[w] /= static_cast<float>(G * std::min(kWindows[w], W));
  st.last /= static_cast<float>(G);
  st.entropy /= static_cast<float>(we);
  return st;
}

using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Per row of m: log(|x_j| / mean |x|), and the cosine between x_j and the mean row.
struct RowShape {
  Eigen::ArrayXf log_norm, cos_mean;
};

RowShape row_shape(const MatrixView& m, bool with_cosine) {
  const Eigen::Map<const RowMatF> x(m.data, m.rows, m.cols);
  RowShape out;
  const Eigen::ArrayXf norms = x.rowwise().norm().array();
  const float mean = m.rows > 0 ? norms.mean() : 0.0f;
  out.log_norm = ((norms + 1e-6f) / (mean + 1e-6f)).log();
  if (with_cosine) {
    const Eigen::RowVectorXf centre = x.colwise().mean();
    out.cos_mean = (x * centre.transpose()).array() / (norms * centre.norm() + 1e-12f);
  }
  return out;
}

}  // namespace

const std::vector<std::string>& feature_names() {
  static const std::vector<std::string> names = {"attn_mean_4",   "attn_mean_8",  "attn_mean_16",    "attn_mean_32",
                                                 "attn_last",     "attn_max_32",  "attn_entropy_16", "key_norm",
                                                 "value_norm",    "key_cos_mean", "pos_relative",    "dist_from_end",
                                                 "is_sink",       "seg_system",   "seg_context",     "seg_question",
                                                 "seg_generated", "layer_frac",   "head_frac",       "head_entropy_16"};
  return names;
}

int feature_index(const std::string& name) {
  const auto& names = feature_names();
  const auto it = std::find(names.begin(), names.end(), name);
  if (it == names.end()) throw Error("learned features: no feature '" + name + "'");
  return static_cast<int>(it - names.begin());
}

int feature_window(const LayerSignals& s) {
  const auto rows = s.observed_rows();
  const std::int64_t c = s.n_tokens();
  int w = 0;
  while (w < kMaxFeatureWindow && w < static_cast<int>(rows.size()) &&
         rows[rows.size() - 1 - static_cast<std::size_t>(w)] == c - 1 - w)
    ++w;
  return w;
}

HeadFeatures extract_features(const LayerSignals& s, int kv) {
  const ModelGeometry& g = s.geometry();
  const auto cached = s.cached(kv);
  const auto n = static_cast<std::int64_t>(cached.size());
  const int W = feature_window(s);
  if (W == 0)
    throw Error("learned features, layer " + std::to_string(s.layer()) + ": need the query of the last token before " +
                "the compression point (token " + std::to_string(s.n_tokens() - 1) + "), which was not recorded");
  const WindowStats st = window_stats(s, kv, W, n);
  const RowShape keys = row_shape(s.keys(kv), true), values = row_shape(s.values(kv), false);
  const auto positions = s.positions();
  const auto segments = s.segments();
  const float last_pos =
      static_cast<float>(std::max<double>(1.0, positions[static_cast<std::size_t>(s.n_tokens() - 1)]));
  HeadFeatures f;
  f.tokens = n;
  f.x.assign(static_cast<std::size_t>(n * kFeatureCount), 0.0f);
  // Column by column, each vectorised over the tokens.
  Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, kFeatureCount, Eigen::RowMajor>> x(f.x.data(), n, kFeatureCount);
  const auto scaled_log = [n](const Eigen::ArrayXf& a) -> Eigen::ArrayXf {
    return (kFloor + a * static_cast<float>(n)).log();
  };
  for (std::size_t w = 0; w < std::size(kWindows); ++w)
    x.col(kMean4 + static_cast<int>(w)) = scaled_log(st.mean[w]).matrix();
  x.col(kLast) = scaled_log(st.last).matrix();
  x.col(kMax) = scaled_log(st.max).matrix();
  x.col(kEntropy) =
      scaled_log(st.entropy / static_cast<float>(std::log(std::max<double>(2.0, static_cast<double>(n))))).matrix();
  x.col(kKeyNorm) = keys.log_norm.matrix();
  x.col(kValueNorm) = values.log_norm.matrix();
  x.col(kKeyCos) = keys.cos_mean.matrix();
  Eigen::ArrayXf since(n);
  const float layer_frac = g.n_layers > 1 ? static_cast<float>(s.layer()) / static_cast<float>(g.n_layers - 1) : 0.0f;
  const float head_frac = g.n_kv_heads > 1 ? static_cast<float>(kv) / static_cast<float>(g.n_kv_heads - 1) : 0.0f;
  for (std::int64_t j = 0; j < n; ++j) {
    const std::int32_t t = cached[static_cast<std::size_t>(j)];
    since[j] = static_cast<float>(s.n_tokens() - 1 - t);
    x(j, kPosRelative) = static_cast<float>(positions[static_cast<std::size_t>(t)]) / last_pos;
    x(j, kSink) = t < kSinks ? 1.0f : 0.0f;
    const int seg = segments[static_cast<std::size_t>(t)];
    if (seg >= 0 && seg < 4) x(j, kSegSystem + seg) = 1.0f;
    x(j, kLayerFrac) = layer_frac;
    x(j, kHeadFrac) = head_frac;
  }
  x.col(kDistFromEnd) = since.log1p().matrix();
  // The head's own attention entropy (not a token's term of it): how spread the head's attention
  // is, the same for each of its tokens, so the network can weigh the others by it.
  x.col(kHeadEntropy)
      .setConstant(st.entropy.sum() / static_cast<float>(std::log(std::max<double>(2.0, static_cast<double>(n)))));
  return f;
}

}  // namespace kvsim::learned
