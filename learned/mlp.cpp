#include "learned/mlp.h"

#include <Eigen/Dense>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"

namespace kvsim::learned {

namespace {

template <typename T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <typename T>
void activate(RowMat<T>& z, Activation act) {
  if (act == Activation::Tanh)
    z = z.array().tanh();
  else
    z = z.cwiseMax(T(0));
}

// Forward pass in precision T; every layer's output is handed to `keep` (for the tape).
template <typename T, typename Keep>
RowMat<T> run_forward(const Mlp& m, const T* x, std::int64_t n, Keep&& keep) {
  const auto& sizes = m.sizes();
  RowMat<T> a = Eigen::Map<const RowMat<T>>(x, n, sizes.front());
  for (std::size_t l = 0; l + 1 < sizes.size(); ++l) {
    const int in = sizes[l], out = sizes[l + 1];
    // Owned (aligned) copies: Eigen's matrix-vector kernels peel unaligned heads, so a product
    // over a map into a std::vector would round differently from run to run.
    const RowMat<T> w =
        Eigen::Map<const RowMat<double>>(m.params().data() + m.weight_offset(static_cast<int>(l)), out, in)
            .template cast<T>();
    const Eigen::Matrix<T, 1, Eigen::Dynamic> b =
        Eigen::Map<const Eigen::RowVectorXd>(m.params().data() + m.bias_offset(static_cast<int>(l)), out)
            .template cast<T>();
    RowMat<T> z = a * w.transpose();
    z.rowwise() += b;
    if (l + 2 < sizes.size()) activate(z, m.activation());
    a = std::move(z);
    keep(a);
  }
  return a;
}

}  // namespace

const char* activation_name(Activation a) { return a == Activation::Tanh ? "tanh" : "relu"; }

Activation parse_activation(const std::string& s, const std::string& where) {
  if (s == "tanh") return Activation::Tanh;
  if (s == "relu") return Activation::Relu;
  throw Error(where + ": activation '" + s + "'; expected tanh or relu");
}

std::size_t Mlp::param_count(const std::vector<int>& sizes) {
  std::size_t n = 0;
  for (std::size_t l = 0; l + 1 < sizes.size(); ++l)
    n += static_cast<std::size_t>(sizes[l + 1]) * static_cast<std::size_t>(sizes[l] + 1);
  return n;
}

Mlp::Mlp(std::vector<int> sizes, Activation act, std::uint64_t seed) : sizes_(std::move(sizes)), act_(act) {
  if (sizes_.size() < 2) throw Error("mlp: needs at least an input and an output size");
  params_.assign(param_count(sizes_), 0.0);
  Rng rng(seed, 0x6d6c70);
  for (std::size_t l = 0; l + 1 < sizes_.size(); ++l) {
    const int in = sizes_[l], out = sizes_[l + 1];
    const double limit = std::sqrt(6.0 / (in + out));
    double* w = params_.data() + weight_offset(static_cast<int>(l));
    for (std::int64_t i = 0; i < std::int64_t{in} * out; ++i) w[i] = (2.0 * rng.uniform() - 1.0) * limit;
  }
}

Mlp::Mlp(std::vector<int> sizes, Activation act, std::vector<double> params, const std::string& where)
    : sizes_(std::move(sizes)), act_(act), params_(std::move(params)) {
  if (sizes_.size() < 2) throw Error(where + ": a network needs at least an input and an output size");
  for (int s : sizes_)
    if (s < 1) throw Error(where + ": layer sizes must be >= 1");
  if (params_.size() != param_count(sizes_))
    throw Error(where + ": " + std::to_string(params_.size()) + " parameters; the layer sizes need " +
                std::to_string(param_count(sizes_)));
}

std::size_t Mlp::weight_offset(int layer) const {
  std::size_t off = 0;
  for (int l = 0; l < layer; ++l)
    off += static_cast<std::size_t>(sizes_[static_cast<std::size_t>(l) + 1]) *
           static_cast<std::size_t>(sizes_[static_cast<std::size_t>(l)] + 1);
  return off;
}

std::size_t Mlp::bias_offset(int layer) const {
  const auto l = static_cast<std::size_t>(layer);
  return weight_offset(layer) + static_cast<std::size_t>(sizes_[l + 1]) * static_cast<std::size_t>(sizes_[l]);
}

std::vector<double> Mlp::forward(const double* x, std::int64_t n, Tape* tape) const {
  if (tape) {
    tape->rows = n;
    tape->a.assign(1, std::vector<double>(x, x + n * inputs()));
  }
  const RowMat<double> y = run_forward<double>(*this, x, n, [&](const RowMat<double>& a) {
    if (tape) tape->a.emplace_back(a.data(), a.data() + a.size());
  });
  return {y.data(), y.data() + y.size()};
}

std::vector<float> Mlp::forward(const float* x, std::int64_t n) const {
  const RowMat<float> y = run_forward<float>(*this, x, n, [](const RowMat<float>&) {});
  return {y.data(), y.data() + y.size()};
}

void Mlp::backward(const Tape& tape, const double* dy, std::vector<double>& grad, std::vector<double>* dx) const {
  const std::int64_t n = tape.rows;
  if (grad.size() != params_.size()) grad.assign(params_.size(), 0.0);
  // Every operand is an owned (aligned) matrix, as in run_forward: bit-reproducible gradients.
  RowMat<double> delta = Eigen::Map<const RowMat<double>>(dy, n, outputs());
  for (int l = static_cast<int>(sizes_.size()) - 2; l >= 0; --l) {
    const int in = sizes_[static_cast<std::size_t>(l)], out = sizes_[static_cast<std::size_t>(l) + 1];
    const auto lu = static_cast<std::size_t>(l);
    if (l + 2 < static_cast<int>(sizes_.size())) {  // through this layer's activation
      const RowMat<double> a = Eigen::Map<const RowMat<double>>(tape.a[lu + 1].data(), n, out);
      if (act_ == Activation::Tanh)
        delta.array() *= 1.0 - a.array().square();
      else
        delta.array() *= (a.array() > 0.0).cast<double>();
    }
    const RowMat<double> input = Eigen::Map<const RowMat<double>>(tape.a[lu].data(), n, in);
    const RowMat<double> gw = delta.transpose() * input;
    const Eigen::RowVectorXd gb = delta.colwise().sum();
    Eigen::Map<RowMat<double>>(grad.data() + weight_offset(l), out, in) += gw;
    Eigen::Map<Eigen::RowVectorXd>(grad.data() + bias_offset(l), out) += gb;
    if (l > 0 || dx) {
      const RowMat<double> w = Eigen::Map<const RowMat<double>>(params_.data() + weight_offset(l), out, in);
      delta = (delta * w).eval();
    }
  }
  if (dx) dx->assign(delta.data(), delta.data() + delta.size());
}

Adam::Adam(std::size_t n, double lr_, double beta1, double beta2, double eps)
    : lr(lr_), beta1_(beta1), beta2_(beta2), eps_(eps), m_(n, 0.0), v_(n, 0.0) {}

void Adam::step(std::vector<double>& params, const std::vector<double>& grad) {
  if (params.size() != m_.size() || grad.size() != m_.size())
    throw Error("adam: " + std::to_string(m_.size()) + " parameters expected, got " + std::to_string(params.size()) +
                " and " + std::to_string(grad.size()) + " gradients");
  for (std::size_t i = 0; i < grad.size(); ++i)
    if (!std::isfinite(grad[i]))
      throw Error("adam: gradient entry " + std::to_string(i) + " of step " + std::to_string(t_ + 1) +
                  " is not finite; the loss overflowed (a lower --lr or --temperature may help)");
  double scale = 1.0;
  if (clip_norm > 0) {
    double sq = 0;
    for (double g : grad) sq += g * g;
    if (std::sqrt(sq) > clip_norm) scale = clip_norm / std::sqrt(sq);
  }
  ++t_;
  const double c1 = 1.0 - std::pow(beta1_, static_cast<double>(t_)),
               c2 = 1.0 - std::pow(beta2_, static_cast<double>(t_));
  for (std::size_t i = 0; i < params.size(); ++i) {
    const double g = grad[i] * scale;
    m_[i] = beta1_ * m_[i] + (1.0 - beta1_) * g;
    v_[i] = beta2_ * v_[i] + (1.0 - beta2_) * g * g;
    params[i] -= lr * (m_[i] / c1) / (std::sqrt(v_[i] / c2) + eps_);
  }
}

}  // namespace kvsim::learned
