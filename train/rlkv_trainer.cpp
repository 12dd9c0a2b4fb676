#include "train/rlkv_trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>

#include "core/error.h"
#include "core/rng.h"
#include "core/sha256.h"
#include "core/split.h"
#include "learned/mlp.h"
#include "train/progress.h"

namespace kvsim::train {

namespace {

// Per request, every (layer, KV head)'s streaming error, layer-major.
std::vector<std::vector<double>> request_errors(const TrainingSet& set) {
  const auto H = static_cast<std::size_t>(set.geometry.n_layers * set.geometry.n_kv_heads);
  std::vector<std::vector<double>> e(static_cast<std::size_t>(set.requests), std::vector<double>(H, 0.0));
  for (const HeadSample& h : set.heads)
    e[static_cast<std::size_t>(h.request)][static_cast<std::size_t>(h.layer * set.geometry.n_kv_heads + h.kv_head)] =
        h.streaming_error;
  return e;
}

learned::LearnedModel gate_model(const ModelGeometry& g, std::vector<double> gates) {
  learned::LearnedModel m;
  m.method = "rlkv";
  m.geometry = g;
  m.head_gates = std::move(gates);
  m.provenance.created = utc_now();
  return m;
}

}  // namespace

learned::LearnedModel train_rlkv(const TrainingSet& set, const RlkvOptions& o, std::ostream& progress) {
  if (o.steps < 1 || o.requests_per_step < 1 || !(o.lr > 0) || !(o.sparsity >= 0))
    throw Error("train rlkv: --steps and --requests-per-step must be >= 1, --lr > 0, --sparsity >= 0");
  const auto errors = request_errors(set);
  const std::size_t H = errors.front().size();
  double mean = 0;
  for (const auto& r : errors)
    for (double x : r) mean += x;
  mean /= static_cast<double>(H * errors.size());
  if (!(mean > 0))
    throw Error("train rlkv: every head's streaming error is zero; nothing to learn from these requests");
  std::vector<double> theta(H, 0.0), grad(H), batch(H);
  learned::Adam adam(H, o.lr);
  Rng rng(o.seed, 0x726c6b76);
  learned::TrainingCurve curve{"gate_loss", {}, {}};
  Progress bar(progress, "train rlkv", o.steps, o.tty);
  for (std::int64_t step = 1; step <= o.steps; ++step) {
    std::fill(batch.begin(), batch.end(), 0.0);
    for (int k = 0; k < o.requests_per_step; ++k) {
      const auto& r = errors[rng.below(errors.size())];
      for (std::size_t i = 0; i < H; ++i) batch[i] += r[i] / (o.requests_per_step * mean);
    }
    double loss = 0;
    for (std::size_t i = 0; i < H; ++i) {
      const double g = 1.0 / (1.0 + std::exp(-theta[i]));
      loss += ((1.0 - g) * batch[i] + o.sparsity * g) / static_cast<double>(H);
      grad[i] = g * (1.0 - g) * (o.sparsity - batch[i]) / static_cast<double>(H);
    }
    adam.step(theta, grad);
    curve.step.push_back(static_cast<double>(step));
    curve.value.push_back(loss);
    bar.update(step, "loss", loss);
  }
  std::vector<double> gates(H);
  int open = 0;
  for (std::size_t i = 0; i < H; ++i) {
    gates[i] = 1.0 / (1.0 + std::exp(-theta[i]));
    open += gates[i] > 0.5;
  }
  progress << "train rlkv: " << open << " of " << H << " heads gated to the whole cache (gate > 0.5)\n";
  learned::LearnedModel m = gate_model(set.geometry, std::move(gates));
  m.curve = std::move(curve);
  m.provenance.traces = set.provenance.traces;
  m.provenance.requests = set.provenance.requests;
  m.provenance.seed = o.seed;
  m.provenance.hyperparameters = nlohmann::json{
      {"steps", o.steps},
      {"lr", o.lr},
      {"sparsity", o.sparsity},
      {"requests_per_step", o.requests_per_step},
      {"mean_streaming_error", mean}}.dump();
  m.results = nlohmann::json{{"heads_open", open}, {"heads", H}}.dump();
  return m;
}

learned::LearnedModel import_rlkv_tsv(const std::string& path, const ModelGeometry& g, const std::string& trace) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open the gate file");
  std::vector<double> gates;
  std::string line;
  int row = 0, line_no = 0;  // layers read; physical line (blank lines are skipped, not layers)
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    ++row;
    const std::vector<std::string> cells = split(line, '\t');
    if (static_cast<int>(cells.size()) != g.n_kv_heads)
      throw Error(path + ": line " + std::to_string(line_no) + " has " + std::to_string(cells.size()) +
                  " gates; expected " + std::to_string(g.n_kv_heads) + " (one per KV head of " + g.name + ")");
    for (std::size_t c = 0; c < cells.size(); ++c) {
      char* end = nullptr;
      const double v = std::strtod(cells[c].c_str(), &end);
      if (cells[c].empty() || *end != '\0' || !std::isfinite(v))
        throw Error(path + ": line " + std::to_string(line_no) + ", column " + std::to_string(c + 1) + ": '" +
                    cells[c] + "' is not a number");
      gates.push_back(v);
    }
  }
  if (row != g.n_layers)
    throw Error(path + ": " + std::to_string(row) + " lines of gates; expected " + std::to_string(g.n_layers) +
                " (one per layer of " + g.name + ")");
  learned::LearnedModel m = gate_model(g, std::move(gates));
  m.curve.metric = "none";
  m.provenance.traces = {{path, sha256_file_hex(path)}};
  m.provenance.hyperparameters = nlohmann::json{{"imported_from", path}, {"geometry_from", trace}}.dump();
  m.results = "{}";
  return m;
}

}  // namespace kvsim::train
