#include "train/training_set.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <ostream>
#include <set>

#include "core/error.h"
#include "core/fingerprint.h"
#include "core/sha256.h"
#include "learned/features.h"
#include "learned/mlp.h"

namespace kvsim::train {

TrainingSet load_training_set(const TrainingInputs& in, std::ostream& progress) {
  if (in.traces.empty()) throw Error("train: no trace files given");
  TrainingSet set;
  set.labeler = in.samples.labeler;
  set.decode_block = in.samples.decode_block;
  std::set<std::string> wanted(in.requests.begin(), in.requests.end()), found;
  for (std::size_t t = 0; t < in.traces.size(); ++t) {
    const TraceReader reader(in.traces[t]);
    if (t == 0)
      set.geometry = reader.geometry();
    else if (!(reader.geometry() == set.geometry))
      throw Error(in.traces[t] + ": model geometry differs from " + in.traces.front() +
                  "'s; train on one model's traces");
    set.provenance.traces.emplace_back(in.traces[t], sha256_file_hex(in.traces[t]));
    for (const std::string& id : reader.request_ids()) {
      if (!wanted.empty() && !wanted.count(id)) continue;
      found.insert(id);
      const RequestHeader h = reader.header(id);
      const auto prompt = std::span<const std::int32_t>(h.tokens).first(static_cast<std::size_t>(h.n_prompt));
      progress << "train: reading " << in.traces[t] << " " << id << " (" << h.n_tokens() << " tokens)\n" << std::flush;
      std::vector<HeadSample> heads = collect_head_samples(reader, id, in.mode, set.requests, in.samples);
      for (auto& s : heads) set.heads.push_back(std::move(s));
      set.provenance.requests.push_back({static_cast<int>(t), id, prompt_fingerprint(prompt)});
      ++set.requests;
    }
  }
  for (const std::string& id : wanted)
    if (!found.count(id)) throw Error("train: request '" + id + "' is in none of the traces given");
  if (set.requests == 0) throw Error("train: no complete requests in the traces given");
  return set;
}

void split_held_out(const TrainingSet& set, std::vector<const HeadSample*>& fit, std::vector<const HeadSample*>& held) {
  const int held_requests = set.requests >= 5 ? std::max(1, set.requests / 5) : 0;
  for (const HeadSample& h : set.heads) (h.request >= set.requests - held_requests ? held : fit).push_back(&h);
}

std::vector<int> requests_of(const std::vector<const HeadSample*>& samples) {
  std::vector<int> out;
  for (const HeadSample* h : samples)
    if (out.empty() || out.back() != h->request) out.push_back(h->request);
  return out;
}

void feature_moments(const std::vector<const HeadSample*>& heads, std::vector<double>& mean,
                     std::vector<double>& std_dev) {
  const int F = learned::kFeatureCount;
  std::vector<double> s(F, 0.0), sq(F, 0.0);
  double n = 0;
  for (const HeadSample* h : heads)
    for (std::int64_t i = 0; i < h->tokens; ++i) {
      for (int c = 0; c < F; ++c) {
        const double v = h->x[static_cast<std::size_t>(i * F + c)];
        s[static_cast<std::size_t>(c)] += v;
        sq[static_cast<std::size_t>(c)] += v * v;
      }
      n += 1;
    }
  mean.assign(F, 0.0);
  std_dev.assign(F, 1.0);
  if (n == 0) return;
  for (int c = 0; c < F; ++c) {
    const auto u = static_cast<std::size_t>(c);
    mean[u] = s[u] / n;
    const double var = std::max(0.0, sq[u] / n - mean[u] * mean[u]);
    std_dev[u] = var > 1e-12 ? std::sqrt(var) : 1.0;
  }
}

const char* evaluated_on(bool held_out) {
  return held_out ? "held-out requests" : "training requests (fewer than 5 requests: none held out)";
}

std::vector<int> scorer_sizes(const std::vector<int>& hidden) {
  std::vector<int> sizes = {learned::kFeatureCount};
  sizes.insert(sizes.end(), hidden.begin(), hidden.end());
  sizes.push_back(1);
  return sizes;
}

std::vector<double> standardized(const std::vector<float>& raw, std::int64_t rows, const std::vector<double>& mean,
                                 const std::vector<double>& std_dev) {
  const int F = learned::kFeatureCount;
  std::vector<double> x(raw.size());
  for (std::int64_t i = 0; i < rows; ++i)
    for (int c = 0; c < F; ++c) {
      const auto k = static_cast<std::size_t>(i * F + c);
      x[k] = (raw[k] - mean[static_cast<std::size_t>(c)]) / std_dev[static_cast<std::size_t>(c)];
    }
  return x;
}

std::string scorer_hyperparameters(const ScorerTraining& o, const std::string& extra_json) {
  nlohmann::json j = {{"hidden", o.hidden},
                      {"activation", learned::activation_name(o.activation)},
                      {"steps", o.steps},
                      {"lr", o.lr},
                      {"heads_per_step", o.heads_per_step}};
  j.update(nlohmann::json::parse(extra_json));
  return j.dump();
}

learned::LearnedModel scorer_model(const std::string& method, const TrainingSet& set, learned::Mlp net,
                                   std::vector<double> mean, std::vector<double> std_dev, learned::TrainingCurve curve,
                                   std::uint64_t seed) {
  learned::LearnedModel m;
  m.method = method;
  m.feature_set = learned::kFeatureSet;
  m.feature_version = learned::kFeatureVersion;
  m.features = learned::feature_names();
  m.geometry = set.geometry;
  m.network = std::move(net);
  m.norm_mean = std::move(mean);
  m.norm_std = std::move(std_dev);
  m.curve = std::move(curve);
  m.provenance = set.provenance;
  m.provenance.seed = seed;
  m.provenance.created = utc_now();
  return m;
}

std::string utc_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace kvsim::train
