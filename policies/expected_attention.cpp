// Expected Attention — Devoto, Jeblick, Jégou, "Expected Attention: KV Cache Compression by
// Estimating Attention from Future Queries Distribution", arXiv 2510.00636
// (kvpress expected_attention_press.py).
// Rule: model future queries as a Gaussian fitted to the prompt's pre-RoPE queries, rotated to
// the next positions on average; score each key by its expected attention times ‖v‖.
#include <Eigen/Dense>
#include <cmath>

#include "core/error.h"
#include "core/rope.h"
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {
namespace {

using Mat = Eigen::MatrixXd;

struct Options {
  std::int64_t future = 512;
  std::int64_t sinks = 4;
  bool covariance = true;
  bool vnorm = true;
  double epsilon = 0.0;
  bool all_queries = true;
};

// Mean RoPE rotation over positions [start, start + count): per pair, mean cos and mean sin.
Mat mean_rotation(const RopeSpec& rope, std::int64_t start, std::int64_t count) {
  Mat r = Mat::Identity(rope.head_dim, rope.head_dim);
  for (int i = 0; i < rope.rope_dim / 2; ++i) {
    // Closed form of the mean of cos/sin(t w) over t = start .. start + count - 1:
    // sum = sin(count w / 2) / sin(w / 2) * {cos, sin}(start w + (count - 1) w / 2).
    const double w = rope_frequency(rope, i);
    const double half = std::sin(w / 2);
    const double gain =
        std::abs(half) < 1e-12 ? static_cast<double>(count) : std::sin(static_cast<double>(count) * w / 2) / half;
    const double mid = static_cast<double>(start) * w + static_cast<double>(count - 1) * w / 2;
    const double c = gain * std::cos(mid) / static_cast<double>(count);
    const double s = gain * std::sin(mid) / static_cast<double>(count);
    const int a = rope_pair_first(rope, i), b = rope_pair_second(rope, i);
    r(a, a) = c;
    r(a, b) = -s;
    r(b, a) = s;
    r(b, b) = c;
  }
  return r;
}

class ExpectedAttention : public ScoringPolicy {
 public:
  explicit ExpectedAttention(Options o) : o_(o) {}

  std::vector<HeadScores> score(const LayerSignals& s) const override {
    const ModelGeometry& g = s.geometry();
    const int d = g.head_dim;
    const std::int64_t seen = s.n_tokens();
    const auto positions = s.positions();
    RopeSpec rope = g.rope_at(s.layer());  // sliding-window layers may rotate with their own base
    rope.head_dim = d;
    if (o_.all_queries) require_all_prompt_queries(s, o_.sinks, "expected_attention");
    const Mat rbar = mean_rotation(rope, positions[static_cast<std::size_t>(seen - 1)] + 1, o_.future);
    RopeTable table(rope);  // one sin/cos per position for every head of the layer
    std::vector<HeadScores> out(static_cast<std::size_t>(g.n_kv_heads));
    for (int kv = 0; kv < g.n_kv_heads; ++kv) {
      const MatrixView keys = s.keys(kv), values = s.values(kv);
      const auto cached = s.cached(kv);
      const auto n = static_cast<std::int64_t>(cached.size());
      // Sinks (tokens below `sinks`) are kept and left out of the softmax.
      auto is_sink = [&](std::int64_t m) { return cached[static_cast<std::size_t>(m)] < o_.sinks; };
      std::vector<std::vector<float>> per_q;
      for (int r = 0; r < g.group(); ++r) {
        const int qh = kv * g.group() + r;
        const auto [mu, sigma] = query_statistics(s, qh, table);
        const Eigen::VectorXd mu_r = rbar * mu;
        const Mat sigma_r = rbar * sigma * rbar.transpose();
        // log E[exp(q.k / sqrt d)] for Gaussian q, softmax over the non-sink keys; the
        // quadratic term for all keys at once as rowwise(K S) . K.
        using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
        const Eigen::Map<const RowMat> K(keys.data, n, d);
        const Eigen::VectorXf lin = K * (mu_r.cast<float>() / std::sqrt(static_cast<float>(d)));
        const Eigen::VectorXf quad =
            (K * sigma_r.cast<float>()).cwiseProduct(K).rowwise().sum() / (2.0f * static_cast<float>(d));
        std::vector<double> z(static_cast<std::size_t>(n), -INFINITY);
        double zmax = -INFINITY;
        for (std::int64_t j = 0; j < n; ++j) {
          if (is_sink(j)) continue;
          const double v = static_cast<double>(lin(j)) + static_cast<double>(quad(j));
          z[static_cast<std::size_t>(j)] = v;
          zmax = std::max(zmax, v);
        }
        double sum = 0;
        for (std::int64_t j = 0; j < n; ++j)
          if (!is_sink(j)) sum += std::exp(z[static_cast<std::size_t>(j)] - zmax);
        std::vector<float> p(static_cast<std::size_t>(n), 0.0f);
        for (std::int64_t j = 0; j < n; ++j)
          if (!is_sink(j))
            p[static_cast<std::size_t>(j)] = static_cast<float>(std::exp(z[static_cast<std::size_t>(j)] - zmax) / sum);
        per_q.push_back(std::move(p));
      }
      HeadScores& hs = out[static_cast<std::size_t>(kv)];
      hs.score = aggregate_group(per_q, GqaAgg::Mean);
      for (std::int64_t j = 0; j < n; ++j) {
        const double vn = o_.vnorm ? Eigen::Map<const Eigen::VectorXf>(values.row(j), d).norm() : 1.0;
        hs.score[static_cast<std::size_t>(j)] =
            static_cast<float>((hs.score[static_cast<std::size_t>(j)] + o_.epsilon) * vn);
      }
      hs.protect = protect_cached(cached, o_.sinks, 0);
    }
    return out;
  }

 private:
  // Mean and covariance of the pre-RoPE prompt queries of one head past the sinks.
  std::pair<Eigen::VectorXd, Mat> query_statistics(const LayerSignals& s, int qh, RopeTable& table) const {
    const int d = s.geometry().head_dim;
    const auto rows = s.observed_rows();
    const auto positions = s.positions();
    const MatrixView q = s.observed_queries(qh);
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor> pre(d,
                                                                              static_cast<Eigen::Index>(rows.size()));
    Eigen::Index n = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      if (rows[i] < o_.sinks) continue;
      float* x = pre.col(n++).data();
      std::copy(q.row(static_cast<std::int64_t>(i)), q.row(static_cast<std::int64_t>(i)) + d, x);
      table.apply(x, 1, positions[static_cast<std::size_t>(rows[i])], true);
    }
    if (n == 0)
      throw Error("policy expected_attention: no recorded prompt queries past the " + std::to_string(o_.sinks) +
                  " sinks to fit the query distribution");
    const Mat x = pre.leftCols(n).cast<double>();
    const Eigen::VectorXd mu = x.rowwise().mean();
    Mat sigma = Mat::Zero(d, d);
    if (o_.covariance) {
      const Mat centred = x.colwise() - mu;
      sigma = centred * centred.transpose() / static_cast<double>(n);
    }
    return {mu, sigma};
  }

  Options o_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "expected_attention",
    "closed-form expected attention of Gaussian future queries (pre-RoPE prompt statistics, mean rotation) x |v|",
    "Devoto et al., arXiv 2510.00636 (kvpress)",
    {{"future", "512", "number of future positions the rotation is averaged over"},
     {"sinks", "4", "first tokens kept and left out of the statistics"},
     {"covariance", "true", "use the query covariance (false: mean only)"},
     {"vnorm", "true", "multiply by the value norm"},
     {"epsilon", "0", "added to the probabilities before the value norm (kvpress leaderboard with AdaKV: 0.01)"},
     {"queries", "all", "all: fit on every prompt query past the sinks | recorded: the ones the trace has"}},
    [](const Params& p) {
      Options o;
      o.future = p.integer("future");
      o.sinks = p.integer("sinks");
      o.covariance = p.boolean("covariance");
      o.vnorm = p.boolean("vnorm");
      o.epsilon = p.number("epsilon");
      o.all_queries = p.choice("queries", {"all", "recorded"}) == "all";
      if (o.future < 1) throw Error("policy expected_attention: parameter 'future' must be >= 1");
      if (o.sinks < 0) throw Error("policy expected_attention: parameter 'sinks' must be >= 0");
      return std::make_unique<ExpectedAttention>(o);
    }});

}  // namespace kvsim
