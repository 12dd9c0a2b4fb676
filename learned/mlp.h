#pragma once
// A tiny multilayer perceptron with a hand-written backward pass, and Adam. Learned policies are
// a few thousand parameters: no autodiff framework is needed, and every gradient is checked
// against finite differences (tests/test_mlp.cpp) and one step against numpy
// (tests/python/check_mlp.py). Eigen stays in mlp.cpp.
#include <cstdint>
#include <string>
#include <vector>

namespace kvsim::learned {

enum class Activation : int { Tanh = 0, Relu = 1 };  // of the hidden layers; the output layer is linear
const char* activation_name(Activation a);
// "tanh" | "relu"; throws naming `where` otherwise.
Activation parse_activation(const std::string& s, const std::string& where);

class Mlp {
 public:
  Mlp() = default;
  // sizes = {inputs, hidden..., outputs}; Glorot-uniform weights from `seed`, zero biases.
  Mlp(std::vector<int> sizes, Activation act, std::uint64_t seed);
  // Given parameters (as params() lays them out); throws naming `where` on a size mismatch.
  Mlp(std::vector<int> sizes, Activation act, std::vector<double> params, const std::string& where);

  static std::size_t param_count(const std::vector<int>& sizes);
  const std::vector<int>& sizes() const { return sizes_; }
  int inputs() const { return sizes_.front(); }
  int outputs() const { return sizes_.back(); }
  Activation activation() const { return act_; }
  // Layer l's weights [sizes[l+1], sizes[l]] row-major, then its biases, for l = 0, 1, ...
  std::vector<double>& params() { return params_; }
  const std::vector<double>& params() const { return params_; }
  std::size_t weight_offset(int layer) const;
  std::size_t bias_offset(int layer) const;

  // What backward() needs of a forward pass: every layer's output (a[0] is the input).
  struct Tape {
    std::vector<std::vector<double>> a;
    std::int64_t rows = 0;
  };
  // x is [n, inputs] row-major; returns [n, outputs].
  std::vector<double> forward(const double* x, std::int64_t n, Tape* tape = nullptr) const;
  // Inference in float (what policies run).
  std::vector<float> forward(const float* x, std::int64_t n) const;
  // Adds dL/dparams to grad (params().size()) given dL/dy [n, outputs]; dL/dx into dx if given.
  void backward(const Tape& tape, const double* dy, std::vector<double>& grad, std::vector<double>* dx = nullptr) const;

 private:
  std::vector<int> sizes_;
  Activation act_ = Activation::Tanh;
  std::vector<double> params_;
};

// Adam (Kingma & Ba 2015) with bias correction; optional global-norm gradient clipping.
class Adam {
 public:
  explicit Adam(std::size_t n, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8);
  void step(std::vector<double>& params, const std::vector<double>& grad);
  std::int64_t steps() const { return t_; }
  double lr = 1e-3;
  double clip_norm = 0;  // > 0: scale the gradient down to this global norm first

 private:
  double beta1_, beta2_, eps_;
  std::vector<double> m_, v_;
  std::int64_t t_ = 0;
};

}  // namespace kvsim::learned
