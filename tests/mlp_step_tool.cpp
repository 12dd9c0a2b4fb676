// One forward/backward pass and one Adam step of learned::Mlp on the network and batch in a JSON
// file, printed as JSON: what tests/python/check_mlp.py compares with numpy.
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "learned/mlp.h"

int main(int argc, char** argv) {
  using namespace kvsim::learned;
  if (argc != 2) {
    std::cerr << "usage: kvsim_mlp_step INPUT.json\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  const nlohmann::json j = nlohmann::json::parse(in);
  const auto sizes = j.at("sizes").get<std::vector<int>>();
  Mlp m(sizes, parse_activation(j.at("activation").get<std::string>(), "input"),
        j.at("params").get<std::vector<double>>(), "input");
  const auto x = j.at("x").get<std::vector<double>>(), dy = j.at("dy").get<std::vector<double>>();
  const auto n = static_cast<std::int64_t>(x.size()) / sizes.front();
  Mlp::Tape tape;
  const std::vector<double> y = m.forward(x.data(), n, &tape);
  std::vector<double> grad, dx;
  m.backward(tape, dy.data(), grad, &dx);
  Adam adam(m.params().size(), j.at("lr").get<double>());
  for (int s = 0; s < j.at("adam_steps").get<int>(); ++s) adam.step(m.params(), grad);
  std::cout << nlohmann::json{{"y", y}, {"grad", grad}, {"dx", dx}, {"params_after", m.params()}}.dump() << "\n";
  return 0;
}
