#include "sim/chunk_deviation.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "core/half.h"
#include "core/rope.h"
#include "traces/trace_reader.h"

namespace kvsim {

double DeviationCurve::share_above(double x) const {
  if (deviation.empty()) return 0;
  const auto above = deviation.end() - std::upper_bound(deviation.begin(), deviation.end(), x);
  return static_cast<double>(above) / static_cast<double>(deviation.size());
}

double DeviationCurve::quantile(double q) const {
  if (deviation.empty()) return 0;
  const auto i = static_cast<std::size_t>(
      std::min<double>(q * static_cast<double>(deviation.size()), static_cast<double>(deviation.size() - 1)));
  return deviation[i];
}

namespace {

// One token's relative deviation of (k, v) rows [heads, d] from the reference rows.
double relative(const float* k, const float* v, const float* k_ref, const float* v_ref, std::size_t n) {
  double diff = 0, norm = 0;
  for (std::size_t j = 0; j < n; ++j) {
    const double dk = static_cast<double>(k[j]) - k_ref[j], dv = static_cast<double>(v[j]) - v_ref[j];
    diff += dk * dk + dv * dv;
    norm += static_cast<double>(k_ref[j]) * k_ref[j] + static_cast<double>(v_ref[j]) * v_ref[j];
  }
  return norm > 0 ? std::sqrt(diff / norm) : 0.0;
}

bool same_tokens(const std::vector<std::int32_t>& a, const ChunkStateSpan& sa, const std::vector<std::int32_t>& b,
                 const ChunkStateSpan& sb) {
  return sa.end - sa.begin == sb.end - sb.begin &&
         std::equal(a.begin() + sa.begin, a.begin() + sa.end, b.begin() + sb.begin);
}

struct Occurrence {
  std::string request;
  ChunkStateSpan span;
  std::vector<std::string> path;  // the chunk ids before it
};

struct LayerRows {
  std::vector<float> k, v;
};

}  // namespace

std::vector<DeviationCurve> chunk_deviation(const TraceReader& reader) {
  const ModelGeometry& g = reader.geometry();
  const auto row = static_cast<std::size_t>(g.n_kv_heads) * static_cast<std::size_t>(g.head_dim);
  std::vector<std::string> ids;
  std::map<std::string, ChunkStateRecord> tables;
  std::map<std::string, std::vector<Occurrence>> by_chunk;
  std::map<std::string, std::vector<std::int32_t>> tokens;
  for (const std::string& id : reader.request_ids()) {
    if (!reader.has_chunk_states(id)) continue;
    ids.push_back(id);
    tokens[id] = reader.header(id).tokens;
    const ChunkStateRecord& t = tables[id] = reader.chunk_state_table(id);
    std::vector<std::string> path;
    for (const ChunkStateSpan& c : t.chunks) {
      by_chunk[c.id].push_back({id, c, path});
      path.push_back(c.id);
    }
  }
  if (ids.empty())
    throw Error(reader.path() + ": no request has chunk states; capture chunked requests with --chunk-states");
  std::vector<DeviationCurve> out;
  for (int l = 0; l < g.n_layers; ++l) {
    DeviationCurve alone{"alone", l, {}}, other{"other_path", l, {}};
    std::map<std::string, LayerRows> context;  // this layer of every request, in context
    for (const std::string& id : ids) {
      LayerRows& c = context[id];
      c.k.resize(reader.layer_elements(id, Tensor::K));
      c.v.resize(c.k.size());
      reader.read_layer(id, Tensor::K, l, c.k);
      reader.read_layer(id, Tensor::V, l, c.v);
      std::vector<float> ak, av;
      reader.read_chunk_state_layer(id, l, ak, av);
      const ChunkStateRecord& t = tables[id];
      for (std::size_t i = 1; i < t.chunks.size(); ++i)  // the first chunk alone is in its own state
        for (std::int64_t j = 0; j < t.chunks[i].end - t.chunks[i].begin; ++j) {
          const auto a = static_cast<std::size_t>(t.chunks[i].row_begin + j) * row;
          const auto x = static_cast<std::size_t>(t.chunks[i].begin + j) * row;
          alone.deviation.push_back(relative(ak.data() + a, av.data() + a, c.k.data() + x, c.v.data() + x, row));
        }
    }
    const RopeSpec rope = g.rope_at(l);
    for (const auto& [chunk, occ] : by_chunk)
      for (std::size_t o = 1; o < occ.size(); ++o) {
        const Occurrence &a = occ[0], &b = occ[o];
        if (b.path == a.path || !same_tokens(tokens[a.request], a.span, tokens[b.request], b.span))
          continue;                                              // the same state, or another text under the same id
        const std::int64_t shift = a.span.begin - b.span.begin;  // b's keys moved to a's positions
        for (std::int64_t j = 0; j < a.span.end - a.span.begin; ++j) {
          const auto xa = static_cast<std::size_t>(a.span.begin + j) * row;
          const auto xb = static_cast<std::size_t>(b.span.begin + j) * row;
          std::vector<float> k(context[b.request].k.begin() + static_cast<std::ptrdiff_t>(xb),
                               context[b.request].k.begin() + static_cast<std::ptrdiff_t>(xb + row));
          apply_rope(rope, k.data(), g.n_kv_heads, std::abs(shift), shift < 0);
          round_to_half(k.data(), k.size());  // as a cache holds the moved keys
          other.deviation.push_back(relative(k.data(), context[b.request].v.data() + xb,
                                             context[a.request].k.data() + xa, context[a.request].v.data() + xa, row));
        }
      }
    for (DeviationCurve* c : {&alone, &other}) {
      std::sort(c->deviation.begin(), c->deviation.end());
      out.push_back(std::move(*c));
    }
  }
  return out;
}

}  // namespace kvsim
