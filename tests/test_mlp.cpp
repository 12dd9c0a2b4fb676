// learned/mlp.h: the hand-written backward pass against finite differences, Adam, determinism.
#include <catch2/catch.hpp>
#include <cmath>

#include "core/rng.h"
#include "learned/mlp.h"

using namespace kvsim;
using kvsim::learned::Activation;
using kvsim::learned::Mlp;

namespace {

std::vector<double> random_vector(std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<double> v(n);
  for (double& x : v) x = rng.normal();
  return v;
}

// L = sum(c * y): dL/dy = c.
double loss(const Mlp& m, const std::vector<double>& x, std::int64_t n, const std::vector<double>& c) {
  const std::vector<double> y = m.forward(x.data(), n);
  double l = 0;
  for (std::size_t i = 0; i < y.size(); ++i) l += c[i] * y[i];
  return l;
}

}  // namespace

TEST_CASE("the backward pass matches central finite differences", "[mlp]") {
  const Activation act = GENERATE(Activation::Tanh, Activation::Relu);
  INFO(learned::activation_name(act));
  const std::vector<int> sizes = {5, 7, 4, 2};
  Mlp m(sizes, act, 42);
  // Biases away from zero, so ReLU units sit clear of their kink.
  for (int l = 0; l < 3; ++l)
    for (int i = 0; i < sizes[static_cast<std::size_t>(l) + 1]; ++i)
      m.params()[m.bias_offset(l) + static_cast<std::size_t>(i)] = 0.3;
  const std::int64_t n = 6;
  const std::vector<double> x = random_vector(static_cast<std::size_t>(n * 5), 1),
                            c = random_vector(static_cast<std::size_t>(n * 2), 2);
  Mlp::Tape tape;
  m.forward(x.data(), n, &tape);
  std::vector<double> grad, dx;
  m.backward(tape, c.data(), grad, &dx);
  REQUIRE(grad.size() == Mlp::param_count(sizes));
  const double h = 1e-6;
  for (std::size_t i = 0; i < grad.size(); ++i) {
    Mlp plus = m, minus = m;
    plus.params()[i] += h;
    minus.params()[i] -= h;
    const double fd = (loss(plus, x, n, c) - loss(minus, x, n, c)) / (2 * h);
    INFO("parameter " << i);
    CHECK(grad[i] == Approx(fd).margin(1e-6).epsilon(1e-5));
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::vector<double> xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    const double fd = (loss(m, xp, n, c) - loss(m, xm, n, c)) / (2 * h);
    INFO("input " << i);
    CHECK(dx[i] == Approx(fd).margin(1e-6).epsilon(1e-5));
  }
}

TEST_CASE("gradients accumulate over calls, float inference matches double", "[mlp]") {
  const Mlp m({3, 4, 1}, Activation::Tanh, 7);
  const std::vector<double> x = random_vector(9, 3), c = {1.0, -2.0, 0.5};
  Mlp::Tape tape;
  m.forward(x.data(), 3, &tape);
  std::vector<double> once, twice;
  m.backward(tape, c.data(), once);
  m.backward(tape, c.data(), twice);
  m.backward(tape, c.data(), twice);
  for (std::size_t i = 0; i < once.size(); ++i) CHECK(twice[i] == Approx(2 * once[i]));
  const std::vector<float> xf(x.begin(), x.end());
  const std::vector<float> yf = m.forward(xf.data(), 3);
  const std::vector<double> yd = m.forward(x.data(), 3);
  for (std::size_t i = 0; i < yd.size(); ++i) CHECK(yf[i] == Approx(yd[i]).margin(1e-5));
}

TEST_CASE("Adam fits a least-squares problem; a seed fixes the run", "[mlp]") {
  // y = 2 x0 - x1 + 0.5 through a linear network: Adam must reach it.
  auto fit = [](std::uint64_t seed) {
    Mlp m({2, 1}, Activation::Tanh, seed);
    learned::Adam adam(m.params().size(), 0.05);
    const std::vector<double> x = random_vector(64, 11);
    std::vector<double> target(32);
    for (int i = 0; i < 32; ++i)
      target[static_cast<std::size_t>(i)] =
          2 * x[static_cast<std::size_t>(2 * i)] - x[static_cast<std::size_t>(2 * i + 1)] + 0.5;
    for (int step = 0; step < 600; ++step) {
      Mlp::Tape tape;
      const std::vector<double> y = m.forward(x.data(), 32, &tape);
      std::vector<double> dy(32), grad;
      for (std::size_t i = 0; i < 32; ++i) dy[i] = (y[i] - target[i]) / 32;
      m.backward(tape, dy.data(), grad);
      adam.step(m.params(), grad);
    }
    return m.params();
  };
  const std::vector<double> p = fit(5);
  CHECK(p[0] == Approx(2.0).margin(1e-3));
  CHECK(p[1] == Approx(-1.0).margin(1e-3));
  CHECK(p[2] == Approx(0.5).margin(1e-3));
  CHECK(fit(5) == p);
  CHECK(Mlp({4, 8, 1}, Activation::Tanh, 1).params() == Mlp({4, 8, 1}, Activation::Tanh, 1).params());
  CHECK(Mlp({4, 8, 1}, Activation::Tanh, 1).params() != Mlp({4, 8, 1}, Activation::Tanh, 2).params());
}

TEST_CASE("a network's parameters must fit its sizes", "[mlp]") {
  CHECK_THROWS_WITH(Mlp({3, 2}, Activation::Tanh, std::vector<double>(7), "m.h5"),
                    Catch::Contains("m.h5") && Catch::Contains("7 parameters") && Catch::Contains("need 8"));
  CHECK_THROWS_WITH(Mlp({3, 0, 1}, Activation::Tanh, std::vector<double>(), "m.h5"), Catch::Contains(">= 1"));
  CHECK_THROWS_WITH(learned::parse_activation("gelu", "--activation"), Catch::Contains("expected tanh or relu"));
  learned::Adam adam(3);
  std::vector<double> p(3), g(2);
  CHECK_THROWS_WITH(adam.step(p, g), Catch::Contains("3 parameters expected"));
}
