#include "sim/calibration.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "traces/trace_reader.h"

namespace kvsim {

BasisSet fit_calibration_bases(const std::vector<std::string>& traces, int requests_per_trace) {
  if (requests_per_trace < 0) throw Error("calibration: requests per trace must be >= 0");
  std::vector<GramAccumulator> grams;
  ModelGeometry g;
  std::string model;
  for (const std::string& path : traces) {
    const TraceReader reader(path);
    const ModelGeometry& mg = reader.geometry();
    if (grams.empty()) {
      g = mg;
      model = mg.name;
      grams.resize(static_cast<std::size_t>(g.n_layers * g.n_kv_heads));
    } else if (!same_kv_shape(mg, g) || mg.rope.type != g.rope.type || mg.rope.rope_dim != g.rope.rope_dim) {
      throw Error("trace '" + path + "' has another geometry than '" + traces.front() + "' (model " + mg.name + " vs " +
                  model + "): calibration traces must come from one model");
    }
    int used = 0;
    for (const std::string& id : reader.request_ids()) {
      if (requests_per_trace > 0 && used++ >= requests_per_trace) break;
      const RequestHeader h = reader.header(id);
      const auto n = static_cast<std::size_t>(h.n_prompt);
      const auto d = static_cast<std::size_t>(g.head_dim), H = static_cast<std::size_t>(g.n_kv_heads);
      std::vector<float> k(reader.layer_elements(id, Tensor::K)), v(k.size()), kh(n * d), vh(n * d);
      const std::vector<std::int32_t> positions(h.positions.begin(),
                                                h.positions.begin() + static_cast<std::ptrdiff_t>(n));
      for (int layer = 0; layer < g.n_layers; ++layer) {
        reader.read_layer(id, Tensor::K, layer, k);
        reader.read_layer(id, Tensor::V, layer, v);
        for (std::size_t kv = 0; kv < H; ++kv) {
          for (std::size_t t = 0; t < n; ++t) {  // [T, Hkv, d] -> this head's [n, d]
            std::copy_n(k.begin() + static_cast<std::ptrdiff_t>((t * H + kv) * d), d,
                        kh.begin() + static_cast<std::ptrdiff_t>(t * d));
            std::copy_n(v.begin() + static_cast<std::ptrdiff_t>((t * H + kv) * d), d,
                        vh.begin() + static_cast<std::ptrdiff_t>(t * d));
          }
          grams[static_cast<std::size_t>(layer) * H + kv].add(g, kh, vh, positions);
        }
      }
    }
  }
  if (grams.empty() || grams.front().tokens == 0) {
    std::string names;
    for (const std::string& path : traces) names += (names.empty() ? "" : ", ") + path;
    throw Error(names +
                ": no prompt tokens of complete requests to fit bases on (expected at least one committed "
                "request)");
  }
  BasisSet set;
  set.n_layers = g.n_layers;
  set.n_kv_heads = g.n_kv_heads;
  set.head_dim = g.head_dim;
  set.rope = g.rope;
  set.tokens = grams.front().tokens;
  set.source = model + " prompts of";
  for (const auto& t : traces) set.source += " " + std::filesystem::path(t).filename().string();
  for (const GramAccumulator& acc : grams) set.heads.push_back(acc.basis());
  return set;
}

}  // namespace kvsim
