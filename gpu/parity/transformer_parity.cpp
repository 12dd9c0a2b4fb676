#include "gpu/parity/transformer_parity.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>

#include "core/decode_rule.h"
#include "core/packed_kv.h"
#include "gpu/parity/nmse.h"
#include "gpu/cuda_check.h"
#include "gpu/cuda_transformer.h"
#include "gpu/parity/random_packed.h"
#include "gpu/cuda_transformer_ref.h"

namespace kvsim::gpu {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<std::int32_t> prompt(std::int64_t n, std::int64_t vocab, std::uint64_t seed) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& v : t) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v = static_cast<std::int32_t>(x % static_cast<std::uint64_t>(vocab));
  }
  return t;
}

std::vector<std::int32_t> iota_from(std::int32_t first, std::int64_t n) {
  std::vector<std::int32_t> p(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = first + static_cast<std::int32_t>(i);
  return p;
}

std::int32_t argmax(const std::vector<float>& logits, std::int64_t row, std::int64_t vocab) {
  const auto first = logits.begin() + row * vocab;
  return static_cast<std::int32_t>(std::max_element(first, first + vocab) - first);
}

// Each layer's new rows, concatenated over layers.
struct Captured {
  std::vector<float> q, k, v;
  LayerCallback callback() {
    return [this](const LayerRows& x) {
      if (x.q) q.insert(q.end(), x.q, x.q + x.n * qw);
      k.insert(k.end(), x.k, x.k + x.n * kw);
      v.insert(v.end(), x.v, x.v + x.n * kw);
    };
  }
  std::int64_t qw = 0, kw = 0;
};

template <typename Backend>
std::vector<float> all_entries(const Backend& b, const ModelConfig& s, bool keys) {
  std::vector<float> out;
  for (int l = 0; l < s.n_layers; ++l)
    for (int e = 0; e < b.entries(l); ++e) {
      const auto x = keys ? b.entry_k(l, e) : b.entry_v(l, e);
      out.insert(out.end(), x.begin(), x.end());
    }
  return out;
}

template <typename Backend>
std::vector<float> all_last(const Backend& b, const ModelConfig& s) {
  std::vector<float> out;
  for (int l = 0; l < s.n_layers; ++l)
    for (int h = 0; h < s.n_q_heads; ++h) {
      const auto x = b.last_attention(l, h);
      out.insert(out.end(), x.begin(), x.end());
    }
  return out;
}

// The reference rule's step for one layer over the last-row weights a backend handed to the host
// (its own rows, weights packed [n_head, most rows]): what the device's rule_step must evict.
template <typename Backend>
std::vector<std::vector<std::int64_t>> reference_rule_step(const Backend& b, const ModelConfig& s, int layer,
                                                           DecodeRuleStart& rule, std::int64_t budget) {
  const int ne = b.entries(layer);
  std::vector<std::int64_t> rows;
  for (int e = 0; e < ne; ++e) rows.push_back(b.rows(layer, e));
  const std::int64_t stride = *std::max_element(rows.begin(), rows.end());
  std::vector<float> w(static_cast<std::size_t>(s.n_q_heads * stride), 0.0f);
  for (int h = 0; h < s.n_q_heads; ++h) {
    const auto x = b.last_attention(layer, h);
    std::copy(x.begin(), x.end(), w.begin() + static_cast<std::ptrdiff_t>(h) * stride);
  }
  return decode_rule_step_ref(rule.rule, rule.scores, rows,
                              LastRowWeights{w.data(), stride, s.n_q_heads, s.n_q_heads / ne}, budget);
}

// Decode rules on the device (gpu/policy_step.cuh), each kind a policy states (H2O's three GQA
// combinations, TOVA's layer-wide one) over every layer: after each decode step the GPU scores
// from its own last-row weights, evicts and compacts; the reference rule applied to a copy of
// those weights must evict the same rows, and the compacted rows must be the GPU's own rows less
// those, bit for bit. The first step evicts several rows per entry, the others one.
void decode_rule_parity(CudaTransformer& gpu, const ModelConfig& s, ParityReport& r) {
  const std::int64_t P = 24, V = s.vocab;
  const auto tokens = prompt(P, V, 5);
  const auto pos = iota_from(0, P);
  struct Kind {
    const char* name;
    DecodeRule rule;
  };
  for (const Kind& k :
       {Kind{"h2o (sum)", {true, false, HeadCombine::Sum, 6}}, Kind{"h2o (mean)", {true, false, HeadCombine::Mean, 6}},
        Kind{"h2o (max)", {true, false, HeadCombine::Max, 0}},
        Kind{"tova (layer-wide)", {false, true, HeadCombine::Sum, 1}}}) {
    gpu.reset();
    gpu.forward(tokens, pos, {}, false, false);
    std::vector<DecodeRuleStart> starts;
    std::mt19937 rng(11);
    for (int l = 0; l < s.n_layers; ++l) {
      DecodeRuleStart st{k.rule, {}};
      if (k.rule.accumulate)  // prompt scores in eighths: ties for the tie rule
        for (int e = 0; e < gpu.entries(l); ++e) {
          st.scores.emplace_back();
          for (std::int64_t j = 0; j < P; ++j) st.scores.back().push_back(static_cast<double>(rng() % 8) / 8.0);
        }
      gpu.start_rule(l, st);
      starts.push_back(std::move(st));
    }
    bool same_evicted = true, same_rows = true;
    int evicted = 0;
    std::int32_t next = tokens[3];
    for (int t = 0; t < 3; ++t) {
      const std::int64_t budget = P - 4;
      const std::vector<std::int32_t> one = {next}, at = {static_cast<std::int32_t>(P + t)};
      const std::vector<std::int64_t> row0 = {0};
      gpu.set_last_on_host(true);  // for the reference's copy; verify leaves them on the device
      const auto logits = gpu.forward(one, at, row0, false, true);
      next = argmax(logits, 0, V);
      std::vector<std::vector<float>> keys_before, values_before;
      std::vector<std::vector<std::vector<std::int64_t>>> want(static_cast<std::size_t>(s.n_layers));
      for (int l = 0; l < s.n_layers; ++l) {
        for (int e = 0; e < gpu.entries(l); ++e) {
          keys_before.push_back(gpu.entry_k(l, e));
          values_before.push_back(gpu.entry_v(l, e));
        }
        want[static_cast<std::size_t>(l)] = reference_rule_step(gpu, s, l, starts[static_cast<std::size_t>(l)], budget);
      }
      const auto got = gpu.rule_step(budget);
      same_evicted = same_evicted && got == want;
      std::size_t at_entry = 0;
      const auto d = static_cast<std::size_t>(s.head_dim);
      for (int l = 0; l < s.n_layers; ++l)
        for (int e = 0; e < gpu.entries(l); ++e, ++at_entry) {
          const auto& gone = want[static_cast<std::size_t>(l)][static_cast<std::size_t>(e)];
          evicted += static_cast<int>(gone.size());
          std::vector<float> ek, ev;
          const auto& kb = keys_before[at_entry];
          const auto& vb = values_before[at_entry];
          for (std::size_t j = 0; j < kb.size() / d; ++j) {
            if (std::binary_search(gone.begin(), gone.end(), static_cast<std::int64_t>(j))) continue;
            ek.insert(ek.end(), kb.begin() + static_cast<std::ptrdiff_t>(j * d),
                      kb.begin() + static_cast<std::ptrdiff_t>((j + 1) * d));
            ev.insert(ev.end(), vb.begin() + static_cast<std::ptrdiff_t>(j * d),
                      vb.begin() + static_cast<std::ptrdiff_t>((j + 1) * d));
          }
          same_rows = same_rows && gpu.entry_k(l, e) == ek && gpu.entry_v(l, e) == ev;
        }
    }
    r.same(std::string("decode rule ") + k.name + ": evicted rows, 3 steps x every layer (" + std::to_string(evicted) +
               ")",
           same_evicted && evicted > 0);
    r.same(std::string("decode rule ") + k.name + ": rows left after the device compaction", same_rows);
  }
  // A step with the weights left on the device: nothing for the host to read, the rule still runs.
  gpu.set_last_on_host(false);
  const std::vector<std::int32_t> one = {tokens[1]}, at = {static_cast<std::int32_t>(P + 3)};
  const std::vector<std::int64_t> row0 = {0};
  gpu.forward(one, at, row0, false, true);
  bool refused = false;
  try {
    gpu.last_attention(0, 0);
  } catch (const std::logic_error&) {
    refused = true;
  }
  const auto gone = gpu.rule_step(P - 4);
  r.same("decode rule with the weights left on the device: host copy refused, one row evicted per entry",
         refused && gone[0].size() == static_cast<std::size_t>(gpu.entries(0)) && gone[0][0].size() == 1);
  gpu.set_last_on_host(true);
}

// A per-query-head cache (each head drops different rows), loaded into both, then a chunk and one
// decode step.
void per_query_head_parity(TransformerRef& ref, CudaTransformer& gpu, const ModelConfig& s,
                           const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& pos, double limit,
                           ParityReport& r) {
  const auto P = static_cast<std::int64_t>(tokens.size());
  const std::int64_t V = s.vocab;
  ref.reset();
  ref.forward(tokens, pos, {}, false, false);
  for (int l = 0; l < s.n_layers; ++l) {
    std::vector<std::vector<float>> ks(static_cast<std::size_t>(s.n_q_heads)), vs(ks.size());
    std::vector<HostEntry> entries;
    for (int h = 0; h < s.n_q_heads; ++h) {
      const auto K = ref.entry_k(l, h / s.group()), Vv = ref.entry_v(l, h / s.group());
      const auto d = static_cast<std::size_t>(s.head_dim);
      for (std::int64_t j = 0; j < P; ++j) {
        if ((j + h) % 3 == 0 && j != 0) continue;
        ks[static_cast<std::size_t>(h)].insert(ks[static_cast<std::size_t>(h)].end(), K.begin() + j * d,
                                               K.begin() + (j + 1) * d);
        vs[static_cast<std::size_t>(h)].insert(vs[static_cast<std::size_t>(h)].end(), Vv.begin() + j * d,
                                               Vv.begin() + (j + 1) * d);
      }
    }
    for (int h = 0; h < s.n_q_heads; ++h)
      entries.push_back({static_cast<std::int64_t>(ks[static_cast<std::size_t>(h)].size()) / s.head_dim,
                         ks[static_cast<std::size_t>(h)].data(), vs[static_cast<std::size_t>(h)].data()});
    ref.load_layer(l, entries);
    gpu.load_layer(l, entries);
  }
  {
    // A 5-token chunk (rows see different pasts per entry), then one decode step.
    const auto more = prompt(5, V, 9);
    const auto at = iota_from(static_cast<std::int32_t>(P), 5);
    const std::vector<std::int64_t> all_rows = {0, 1, 2, 3, 4}, row0 = {0};
    r.value("per-query-head cache: 5-token chunk logits",
            nmse(gpu.forward(more, at, all_rows, false, false), ref.forward(more, at, all_rows, false, false)), limit);
    const std::vector<std::int32_t> one = {more[0]}, at1 = {static_cast<std::int32_t>(P + 5)};
    const auto dr = ref.forward(one, at1, row0, false, true);
    const auto dg = gpu.forward(one, at1, row0, false, true);
    r.value("per-query-head cache: decode logits", nmse(dg, dr), limit);
    r.value("per-query-head cache: last-row weights", nmse(all_last(gpu, s), all_last(ref, s)), limit);
  }
}

// A packed cache (what verify loads after a codec), every entry shape a codec's plans produce
// (gpu/parity/random_packed.h): packed prefixes of different lengths with fp16 rows after them, an
// entry with none, layers packed to the last row; int2/4/8 codes, per-token and per-channel
// pairs, rotated low-rank keys. The floats of packed rows are NaN, so a backend that ignored the
// packed form would fail every check below. The GPU holds them packed.
void packed_cache_parity(TransformerRef& ref, CudaTransformer& gpu, const ModelConfig& s,
                         const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& pos, double limit,
                         ParityReport& r) {
  const auto P = static_cast<std::int64_t>(tokens.size());
  const std::int64_t V = s.vocab;
  ref.reset();
  ref.forward(tokens, pos, {}, false, false);
  {
    std::mt19937 rng(19);
    std::vector<PackedLayer> layers;
    for (int l = 0; l < s.n_layers; ++l) {
      PackedLayer layer = random_packed_layer(
          s, l, P,
          [&](int e, bool keys) {
            const auto x = keys ? ref.entry_k(l, e) : ref.entry_v(l, e);
            return std::vector<float>(x.begin(), x.end());
          },
          rng);
      if (s.window(l) > 0) {
        // A sliding-window layer holds fp16 rows only: both backends refuse its packed form.
        bool ref_refused = false, gpu_refused = false;
        try {
          ref.load_layer(l, layer.entries());
        } catch (const std::invalid_argument&) {
          ref_refused = true;
        }
        try {
          gpu.load_layer(l, layer.entries());
        } catch (const std::invalid_argument&) {
          gpu_refused = true;
        }
        r.same("packed cache: layer " + std::to_string(l) + " (sliding window) refuses packed rows",
               ref_refused && gpu_refused);
        std::vector<std::vector<float>> ks, vs;  // both then hold the reference's fp16 rows
        std::vector<HostEntry> plain;
        for (int e = 0; e < ref.entries(l); ++e) {
          const auto k = ref.entry_k(l, e), v = ref.entry_v(l, e);
          ks.emplace_back(k.begin(), k.end());
          vs.emplace_back(v.begin(), v.end());
        }
        for (int e = 0; e < ref.entries(l); ++e)
          plain.push_back(
              {ref.rows(l, e), ks[static_cast<std::size_t>(e)].data(), vs[static_cast<std::size_t>(e)].data()});
        ref.load_layer(l, plain);
        gpu.load_layer(l, plain);
        continue;
      }
      layers.push_back(std::move(layer));
      const std::vector<HostEntry> entries = layers.back().entries();
      ref.load_layer(l, entries);
      gpu.load_layer(l, entries);
    }
    r.value("packed cache: rows read back (keys)", nmse(all_entries(gpu, s, true), all_entries(ref, s, true)), limit);
    r.value("packed cache: rows read back (values)", nmse(all_entries(gpu, s, false), all_entries(ref, s, false)),
            limit);
    double payload = 0, fp16_rows = 0;
    for (const auto& layer : layers)
      for (std::size_t e = 0; e < layer.packs.size(); ++e) {
        if (layer.is_packed[e]) payload += layer.packs[e].payload_bytes();
        fp16_rows += static_cast<double>(layer.k[e].size()) / s.head_dim -
                     static_cast<double>(layer.is_packed[e] ? layer.packs[e].rows() : 0);
      }
    const double fp16 =
        2.0 * 2.0 * static_cast<double>(s.n_layers) * s.n_kv_heads * static_cast<double>(P) * s.head_dim;
    // A decode step reads the packed prefixes where they are (no unpack scratch), the last-row
    // weights on the way; a chunk unpacks the layer; then a decode step each way, the unpack path
    // as a chunk would take it and the fused one over packed prefixes with more fp16 rows after them.
    const auto more = prompt(8, V, 13);
    const std::vector<std::int64_t> all_rows = {0, 1, 2, 3, 4}, row0 = {0};
    auto decode = [&](std::size_t i, std::int32_t at, const std::string& label) {
      const std::vector<std::int32_t> one = {more[i]}, at1 = {at};
      const auto dr = ref.forward(one, at1, row0, false, true);
      const auto dg = gpu.forward(one, at1, row0, false, true);
      r.value("packed cache: " + label + ": logits", nmse(dg, dr), limit);
      r.value("packed cache: " + label + ": last-row weights", nmse(all_last(gpu, s), all_last(ref, s)), limit);
    };
    decode(0, static_cast<std::int32_t>(P), "fused decode");
    r.same("packed cache: the fused decode made no unpack scratch", gpu.unpack_scratch_bytes() == 0);
    const std::vector<std::int32_t> chunk(more.begin() + 1, more.begin() + 6);
    const auto at = iota_from(static_cast<std::int32_t>(P + 1), 5);
    r.value("packed cache: 5-token chunk logits",
            nmse(gpu.forward(chunk, at, all_rows, false, false), ref.forward(chunk, at, all_rows, false, false)),
            limit);
    char buf[360];
    std::snprintf(
        buf, sizeof buf,
        "  packed cache on the device: %.1f KB (payload %.1f KB + %.0f fp16 rows, scratch %.1f KB) vs %.1f KB as fp16",
        static_cast<double>(gpu.cache_bytes()) / 1e3, payload / 1e3, fp16_rows,
        static_cast<double>(gpu.unpack_scratch_bytes()) / 1e3, fp16 / 1e3);
    r.line(buf);
    r.same("packed cache: the chunk unpacked through the one-layer scratch", gpu.unpack_scratch_bytes() > 0);
    gpu.set_packed_decode(PackedDecode::Unpack);
    decode(6, static_cast<std::int32_t>(P + 6), "unpack-then-attend decode");
    gpu.set_packed_decode(PackedDecode::Fused);
    decode(7, static_cast<std::int32_t>(P + 7), "fused decode after the chunk");
    r.value("packed cache: rows after decoding (keys)", nmse(all_entries(gpu, s, true), all_entries(ref, s, true)),
            limit);
    r.value("packed cache: rows after decoding (values)", nmse(all_entries(gpu, s, false), all_entries(ref, s, false)),
            limit);
    int packed_layer = 0;  // the first layer held packed (sliding-window layers are not)
    while (packed_layer + 1 < s.n_layers && s.window(packed_layer) > 0) ++packed_layer;
    bool refused = false;
    try {
      gpu.start_rule(packed_layer, DecodeRuleStart{DecodeRule{false, false, HeadCombine::Sum, 1}, {}});
    } catch (const std::invalid_argument&) {
      refused = true;
    }
    r.same("packed cache: a decode rule is refused (it compacts fp16 rows)", refused);
  }
}

}  // namespace

void transformer_parity(const std::string& name, const ModelConfig& s, DeviceWeights w, ParityReport& r,
                        bool long_prompt) {
  r.line(name + " (" + device_weights_name(w) + " weights): " + std::to_string(s.n_layers) + " layers, n_embd " +
         std::to_string(s.n_embd) + ", " + std::to_string(s.n_q_heads) + "/" + std::to_string(s.n_kv_heads) +
         " heads, head_dim " + std::to_string(s.head_dim) + ", rope " +
         (s.rope.type == RopeType::Neox ? "neox" : "norm") + (s.qkv_bias ? ", QKV bias" : "") +
         (s.sliding_window.empty() ? "" : ", sliding windows") + (s.qk_norm ? ", q/k norms" : "") +
         (s.post_norms ? ", post-norms" : "") + (s.ffn_act == FfnAct::GeluTanh ? ", GeGLU" : ""));
  const double limit = w == DeviceWeights::F16 ? 1e-4 : 1e-5;
  TransformerRef ref(s, w);
  CudaTransformer gpu(s, w);
  random_weights(s, 7, [&](WeightId id, int layer, std::span<const float> d) {
    ref.set_weight(id, layer, d);
    gpu.set_weight(id, layer, d);
  });
  const std::int64_t P = 80, V = s.vocab;  // 80 rows: three key tiles, twenty row blocks
  const auto tokens = prompt(P, V, 3);
  const auto pos = iota_from(0, P);
  const std::vector<std::int64_t> rows = {P - 1, P / 2};

  Captured cr, cg;
  cr.qw = cg.qw = s.q_dim();
  cr.kw = cg.kw = s.kv_dim();
  const auto lr = ref.forward(tokens, pos, rows, true, false, cr.callback());
  const auto lg = gpu.forward(tokens, pos, rows, true, false, cg.callback());
  r.value("prefill logits (2 rows)", nmse(lg, lr), limit);
  r.value("prefill capture: Q rows of every layer", nmse(cg.q, cr.q), limit);
  r.value("prefill capture: K rows of every layer", nmse(cg.k, cr.k), limit);
  r.value("prefill capture: V rows of every layer", nmse(cg.v, cr.v), limit);

  // Greedy decode on the reference's tokens: logits and the last row's weights each step.
  std::int32_t next = argmax(lr, 0, V);
  double worst_logits = 0, worst_last = 0;
  auto worst = [](double& acc, double x) {
    if (!(x <= acc)) acc = x;  // NaN sticks (std::max would drop it)
  };
  int same_top1 = 0;
  const int steps = 3;
  for (int t = 0; t < steps; ++t) {
    const std::vector<std::int32_t> one = {next}, at = {static_cast<std::int32_t>(P + t)};
    const std::vector<std::int64_t> row0 = {0};
    const auto dr = ref.forward(one, at, row0, false, true);
    const auto dg = gpu.forward(one, at, row0, false, true);
    worst(worst_logits, nmse(dg, dr));
    worst(worst_last, nmse(all_last(gpu, s), all_last(ref, s)));
    same_top1 += argmax(dg, 0, V) == argmax(dr, 0, V);
    next = argmax(dr, 0, V);
  }
  r.value("decode logits (worst of 3 steps)", worst_logits, limit);
  r.value("decode last-row attention weights (worst step)", worst_last, limit);
  r.line("  decode top-1 agreement: " + std::to_string(same_top1) + "/" + std::to_string(steps) + " (informative)");
  r.value("KV cache keys after decode", nmse(all_entries(gpu, s, true), all_entries(ref, s, true)), limit);
  r.value("KV cache values after decode", nmse(all_entries(gpu, s, false), all_entries(ref, s, false)), limit);

  // Eviction on the device: every entry keeps a different subset, then one more step.
  for (int l = 0; l < s.n_layers; ++l)
    for (int e = 0; e < ref.entries(l); ++e) {
      std::vector<std::int64_t> keep;
      for (std::int64_t j = 0; j < ref.rows(l, e); ++j)
        if (j < 2 || (j + e + l) % 4 != 0) keep.push_back(j);
      ref.keep_rows(l, e, keep);
      gpu.keep_rows(l, e, keep);
    }
  r.value("evicted cache (keep_rows): keys", nmse(all_entries(gpu, s, true), all_entries(ref, s, true)), limit);
  {
    const std::vector<std::int32_t> one = {next}, at = {static_cast<std::int32_t>(P + steps)};
    const std::vector<std::int64_t> row0 = {0};
    const auto dr = ref.forward(one, at, row0, false, true);
    const auto dg = gpu.forward(one, at, row0, false, true);
    r.value("evicted cache: decode logits", nmse(dg, dr), limit);
    r.value("evicted cache: last-row weights", nmse(all_last(gpu, s), all_last(ref, s)), limit);
  }

  // A chunked prefill reaches the one-pass logits.
  gpu.reset();
  const std::int64_t cut = 37;
  gpu.forward(std::span(tokens).first(cut), std::span(pos).first(cut), {}, false, false);
  const std::vector<std::int64_t> last = {P - cut - 1};
  const auto chunked = gpu.forward(std::span(tokens).subspan(cut), std::span(pos).subspan(cut), last, false, false);
  r.value("chunked prefill (37 + 43) vs one-pass reference", nmse(chunked, {lr.begin(), lr.begin() + V}), limit);

  // Small models: a long prompt, so decode splits its keys over many blocks and prefill walks
  // many key tiles (the big shapes would take the reference minutes).
  if (long_prompt && s.n_layers <= 3) {
    const std::int64_t L = 1500;
    const auto lt = prompt(L, V, 21);
    const auto lp = iota_from(0, L);
    ref.reset();
    gpu.reset();
    const std::vector<std::int64_t> lrow = {L - 1};
    r.value("long prompt (1500): prefill logits",
            nmse(gpu.forward(lt, lp, lrow, false, false), ref.forward(lt, lp, lrow, false, false)), limit);
    const std::vector<std::int32_t> one = {lt[7]}, at = {static_cast<std::int32_t>(L)};
    const std::vector<std::int64_t> row0 = {0};
    const auto dr = ref.forward(one, at, row0, false, true);
    const auto dg = gpu.forward(one, at, row0, false, true);
    r.value("long prompt: split-key decode logits", nmse(dg, dr), limit);
    r.value("long prompt: decode last-row weights", nmse(all_last(gpu, s), all_last(ref, s)), limit);
  }

  per_query_head_parity(ref, gpu, s, tokens, pos, limit, r);
  packed_cache_parity(ref, gpu, s, tokens, pos, limit, r);
  decode_rule_parity(gpu, s, r);
}

void transformer_bench(const std::string& name, const ModelConfig& s, const Bench& bench, ParityReport& r,
                       double copy_gbs) {
  CudaTransformer gpu(s, DeviceWeights::F16);
  random_weights(s, 11, gpu.sink());
  char buf[400];

  // cuBLAS's own rate on a large fp16-in, fp32-out GEMM: the ceiling the forward pass is held to.
  double gemm_flops = 0;
  {
    const int n = static_cast<int>(bench.size(8192, 256));
    void *a = nullptr, *b = nullptr, *c = nullptr;
    KVSIM_CUDA_CHECK(cudaMalloc(&a, std::size_t{2} * n * n));
    KVSIM_CUDA_CHECK(cudaMalloc(&b, std::size_t{2} * n * n));
    KVSIM_CUDA_CHECK(cudaMalloc(&c, std::size_t{4} * n * n));
    KVSIM_CUDA_CHECK(cudaMemset(a, 0, std::size_t{2} * n * n));
    KVSIM_CUDA_CHECK(cudaMemset(b, 0, std::size_t{2} * n * n));
    cublasHandle_t h = nullptr;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate failed");
    const float one = 1.0f, zero = 0.0f;
    auto run = [&] {
      if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16F, n, b, CUDA_R_16F, n, &zero, c,
                       CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
        throw std::runtime_error("benchmark GEMM: cublasGemmEx failed");
    };
    run();
    KVSIM_CUDA_CHECK(cudaDeviceSynchronize());
    const auto t0 = Clock::now();
    const int reps = bench.reps(5);
    for (int i = 0; i < reps; ++i) run();
    KVSIM_CUDA_CHECK(cudaDeviceSynchronize());
    gemm_flops = reps * 2.0 * n * static_cast<double>(n) * n / since(t0);
    cublasDestroy(h);
    cudaFree(a), cudaFree(b), cudaFree(c);
  }
  const double E = s.n_embd, Q = static_cast<double>(s.q_dim()), K = static_cast<double>(s.kv_dim()), F = s.n_ff;
  const double layer_params = E * Q + 2 * E * K + Q * E + 3 * E * F;
  const std::int64_t n = bench.size(2048, 48);
  const auto tokens = prompt(n, s.vocab, 5);
  const auto pos = iota_from(0, n);
  const std::vector<std::int64_t> last = {n - 1};
  auto prefill = [&](const LayerCallback& cb) {
    gpu.reset();
    const auto t0 = Clock::now();
    gpu.forward(tokens, pos, last, cb != nullptr, false, cb);
    return since(t0);
  };
  prefill({});  // warm-up: buffers, cuBLAS heuristics
  double t_plain = 1e30, t_capture = 1e30;
  // A writer's side of the capture: the rows land in host memory the trace writer owns.
  std::vector<float> sink_q(static_cast<std::size_t>(n * s.q_dim())), sink_k(static_cast<std::size_t>(n * s.kv_dim())),
      sink_v(sink_k.size());
  const LayerCallback writer = [&](const LayerRows& x) {
    std::memcpy(sink_q.data(), x.q, static_cast<std::size_t>(x.n * s.q_dim()) * sizeof(float));
    std::memcpy(sink_k.data(), x.k, static_cast<std::size_t>(x.n * s.kv_dim()) * sizeof(float));
    std::memcpy(sink_v.data(), x.v, static_cast<std::size_t>(x.n * s.kv_dim()) * sizeof(float));
  };
  for (int rep = 0; rep < bench.reps(3); ++rep) {
    t_plain = std::min(t_plain, prefill({}));
    t_capture = std::min(t_capture, prefill(writer));
  }
  const auto nd = static_cast<double>(n);
  const double attn_flops = s.n_layers * static_cast<double>(s.n_q_heads) * 4.0 * s.head_dim * (nd * (nd + 1.0) / 2.0);
  const double prefill_flops =
      2.0 * nd * s.n_layers * layer_params + 2.0 * E * static_cast<double>(s.vocab) + attn_flops;
  // Decode: 64 single-token steps after the prompt.
  const int steps = static_cast<int>(bench.size(64, 4));
  const std::vector<std::int64_t> row0 = {0};
  const auto t0 = Clock::now();
  for (int t = 0; t < steps; ++t) {
    const std::vector<std::int32_t> one = {tokens[static_cast<std::size_t>(t)]},
                                    at = {static_cast<std::int32_t>(n + t)};
    gpu.forward(one, at, row0, false, false);
  }
  const double t_step = since(t0) / steps;
  const double decode_flops = 2.0 * (s.n_layers * layer_params + E * static_cast<double>(s.vocab)) +
                              s.n_layers * static_cast<double>(s.n_q_heads) * 4.0 * s.head_dim * (nd + steps / 2.0);
  r.line(name + " benchmark (fp16 weights, " + std::to_string(gpu.weight_bytes() >> 20) + " MiB on " +
         gpu.device_name() + ")");
  std::snprintf(buf, sizeof buf, "  cuBLAS GEMM %lld^3 fp16->fp32: %.1f TFLOP/s",
                static_cast<long long>(bench.size(8192, 256)), gemm_flops / 1e12);
  r.line(buf);
  std::snprintf(buf, sizeof buf, "  prefill %lld tokens: %.0f tok/s, %.1f TFLOP/s = %.2f of the GEMM rate",
                static_cast<long long>(n), nd / t_plain, prefill_flops / t_plain / 1e12,
                prefill_flops / t_plain / gemm_flops);
  r.line(buf);
  std::snprintf(
      buf, sizeof buf,
      "  decode at %lld: %.0f tok/s, %.3f TFLOP/s = %.4f of the GEMM rate; weights read at %.0f GB/s = %.2f of the "
      "copy bandwidth",
      static_cast<long long>(n), 1.0 / t_step, decode_flops / t_step / 1e12, decode_flops / t_step / gemm_flops,
      static_cast<double>(gpu.weight_bytes()) / t_step / 1e9,
      copy_gbs > 0 ? static_cast<double>(gpu.weight_bytes()) / t_step / 1e9 / copy_gbs : 0.0);
  r.line(buf);
  std::snprintf(
      buf, sizeof buf,
      "  capture (Q/K/V of every layer to host, copied while the next layer runs): prefill %.3f s vs %.3f s = %.2fx",
      t_capture, t_plain, t_capture / t_plain);
  r.line(buf);

  // A decode-time policy step (H2O's rule; the budget is the prompt, so every step evicts one row
  // per entry): on the device (the weights stay there, the rows are compacted in place) against
  // the host path (the weights copied to the host, the reference rule there, keep_rows per entry).
  auto h2o_steps = [&](bool on_device) {
    gpu.reset();
    gpu.forward(tokens, pos, last, false, false);
    std::vector<DecodeRuleStart> rules;
    for (int l = 0; l < s.n_layers; ++l) {
      rules.push_back({DecodeRule{true, false, HeadCombine::Sum, std::min<std::int64_t>(64, n / 4)}, {}});
      for (int e = 0; e < gpu.entries(l); ++e) rules.back().scores.emplace_back(static_cast<std::size_t>(n), 0.0);
      if (on_device) gpu.start_rule(l, rules.back());
    }
    gpu.set_last_on_host(!on_device);
    const auto t_start = Clock::now();
    for (int t = 0; t < steps; ++t) {
      const std::vector<std::int32_t> one = {tokens[static_cast<std::size_t>(t)]},
                                      at = {static_cast<std::int32_t>(n + t)};
      gpu.forward(one, at, row0, false, true);
      if (on_device) {
        gpu.rule_step(n);
        continue;
      }
      for (int l = 0; l < s.n_layers; ++l) {
        const auto gone = reference_rule_step(gpu, s, l, rules[static_cast<std::size_t>(l)], n);
        for (int e = 0; e < gpu.entries(l); ++e) {
          std::vector<std::int64_t> keep;
          const auto& g = gone[static_cast<std::size_t>(e)];
          for (std::int64_t j = 0; j < gpu.rows(l, e); ++j)
            if (!std::binary_search(g.begin(), g.end(), j)) keep.push_back(j);
          gpu.keep_rows(l, e, keep);
        }
      }
    }
    const double t_rule = since(t_start) / steps;
    gpu.set_last_on_host(true);
    return t_rule;
  };
  const double t_host_rule = h2o_steps(false), t_device_rule = h2o_steps(true);
  std::snprintf(
      buf, sizeof buf,
      "  h2o decode step at %lld: %.2f ms with the rule on the device vs %.2f ms through the host = %.2fx faster "
      "(plain decode %.2f ms)",
      static_cast<long long>(n), t_device_rule * 1e3, t_host_rule * 1e3, t_host_rule / t_device_rule, t_step * 1e3);
  r.line(buf);
}

}  // namespace kvsim::gpu
