#include "gpu/transformer_shape.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>

namespace kvsim::gpu {

const char* device_weights_name(DeviceWeights w) { return w == DeviceWeights::F16 ? "f16" : "f32"; }

const char* weight_id_name(WeightId id) {
  switch (id) {
    case WeightId::TokenEmbd:
      return "token_embd";
    case WeightId::Output:
      return "output";
    case WeightId::OutputNorm:
      return "output_norm";
    case WeightId::AttnNorm:
      return "attn_norm";
    case WeightId::FfnNorm:
      return "ffn_norm";
    case WeightId::Wq:
      return "attn_q";
    case WeightId::Wk:
      return "attn_k";
    case WeightId::Wv:
      return "attn_v";
    case WeightId::Wo:
      return "attn_output";
    case WeightId::Wgate:
      return "ffn_gate";
    case WeightId::Wup:
      return "ffn_up";
    case WeightId::Wdown:
      return "ffn_down";
    case WeightId::Bq:
      return "attn_q.bias";
    case WeightId::Bk:
      return "attn_k.bias";
    case WeightId::Bv:
      return "attn_v.bias";
    case WeightId::QNorm:
      return "attn_q_norm";
    case WeightId::KNorm:
      return "attn_k_norm";
    case WeightId::PostAttnNorm:
      return "post_attention_norm";
    case WeightId::PostFfnNorm:
      return "post_ffw_norm";
  }
  return "?";
}

bool is_per_layer(WeightId id) {
  return id != WeightId::TokenEmbd && id != WeightId::Output && id != WeightId::OutputNorm;
}

std::pair<std::int64_t, std::int64_t> weight_shape(const ModelConfig& s, WeightId id) {
  switch (id) {
    case WeightId::TokenEmbd:
    case WeightId::Output:
      return {s.vocab, s.n_embd};
    case WeightId::OutputNorm:
    case WeightId::AttnNorm:
    case WeightId::FfnNorm:
    case WeightId::PostAttnNorm:
    case WeightId::PostFfnNorm:
      return {1, s.n_embd};
    case WeightId::QNorm:
    case WeightId::KNorm:
      return {1, s.head_dim};
    case WeightId::Wq:
      return {s.q_dim(), s.n_embd};
    case WeightId::Wk:
    case WeightId::Wv:
      return {s.kv_dim(), s.n_embd};
    case WeightId::Wo:
      return {s.n_embd, s.q_dim()};
    case WeightId::Wgate:
    case WeightId::Wup:
      return {s.n_ff, s.n_embd};
    case WeightId::Wdown:
      return {s.n_embd, s.n_ff};
    case WeightId::Bq:
      return {1, s.q_dim()};
    case WeightId::Bk:
    case WeightId::Bv:
      return {1, s.kv_dim()};
  }
  return {0, 0};
}

std::vector<std::pair<WeightId, int>> weight_list(const ModelConfig& s) {
  std::vector<std::pair<WeightId, int>> out{{WeightId::TokenEmbd, -1}, {WeightId::OutputNorm, -1}};
  if (!s.tied_embeddings) out.emplace_back(WeightId::Output, -1);
  for (int l = 0; l < s.n_layers; ++l) {
    for (WeightId id : {WeightId::AttnNorm, WeightId::FfnNorm, WeightId::Wq, WeightId::Wk, WeightId::Wv, WeightId::Wo,
                        WeightId::Wgate, WeightId::Wup, WeightId::Wdown})
      out.emplace_back(id, l);
    if (s.qkv_bias)
      for (WeightId id : {WeightId::Bq, WeightId::Bk, WeightId::Bv}) out.emplace_back(id, l);
    if (s.qk_norm)
      for (WeightId id : {WeightId::QNorm, WeightId::KNorm}) out.emplace_back(id, l);
    if (s.post_norms)
      for (WeightId id : {WeightId::PostAttnNorm, WeightId::PostFfnNorm}) out.emplace_back(id, l);
  }
  return out;
}

void random_weights(const ModelConfig& s, std::uint64_t seed, const WeightSink& sink) {
  s.check();
  std::vector<float> buf;
  std::uint64_t n_tensor = 0;
  for (const auto& [id, layer] : weight_list(s)) {
    const auto [rows, cols] = weight_shape(s, id);
    buf.resize(static_cast<std::size_t>(rows * cols));
    float mean = 0.0f, sd = 1.0f;
    if (rows == 1 && id != WeightId::Bq && id != WeightId::Bk && id != WeightId::Bv)
      mean = 1.0f, sd = 0.1f;  // norms
    else if (rows == 1)
      sd = 0.02f;
    else if (id == WeightId::TokenEmbd)
      sd = static_cast<float>(1.0 / s.embd_scale);
    else
      sd = static_cast<float>(1.0 / std::sqrt(static_cast<double>(cols)));
    // One stream per (tensor, block of 2^20 values): values do not depend on which tensors came
    // before, nor on the thread count, and a 7B-shaped layer is drawn on every core.
    const std::uint64_t tensor = n_tensor++;
    constexpr std::size_t block = std::size_t{1} << 20;
    const auto blocks = static_cast<std::int64_t>((buf.size() + block - 1) / block);
#pragma omp parallel for schedule(static)
    for (std::int64_t b = 0; b < blocks; ++b) {
      std::mt19937_64 rng((seed * 1000003u + tensor) * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(b));
      std::normal_distribution<float> nd(0.0f, 1.0f);
      const std::size_t lo = static_cast<std::size_t>(b) * block, hi = std::min(buf.size(), lo + block);
      for (std::size_t i = lo; i < hi; ++i) buf[i] = mean + sd * nd(rng);
    }
    sink(id, layer, buf);
  }
}

void rope_tables(const RopeSpec& s, std::int64_t rows, std::vector<float>& cos_t, std::vector<float>& sin_t) {
  const int pairs = s.rope_dim / 2;
  cos_t.resize(static_cast<std::size_t>(rows * pairs));
  sin_t.resize(cos_t.size());
  for (std::int64_t p = 0; p < rows; ++p)
    for (int i = 0; i < pairs; ++i) {
      const double angle = static_cast<double>(p) * rope_frequency(s, i);
      cos_t[static_cast<std::size_t>(p * pairs + i)] = static_cast<float>(std::cos(angle));
      sin_t[static_cast<std::size_t>(p * pairs + i)] = static_cast<float>(std::sin(angle));
    }
}

void check_unwindowed(const ModelConfig& s, int layer, int entry) {
  if (s.window(layer) > 0)
    throw std::invalid_argument("load_layer: entry " + std::to_string(entry) + "'s packed rows: layer " +
                                std::to_string(layer) + " is a sliding-window layer (window " +
                                std::to_string(s.window(layer)) + "), whose entries hold fp16 rows only");
}

void check_host_packed(const PackedEntry& p, std::int64_t entry_rows, int head_dim, int entry) {
  const std::string where = "load_layer: entry " + std::to_string(entry) + "'s packed rows: ";
  if (p.head_dim != head_dim)
    throw std::invalid_argument(where + "head_dim " + std::to_string(p.head_dim) + ", expected " +
                                std::to_string(head_dim));
  try {
    check_packed(p);
  } catch (const std::exception& e) {
    throw std::invalid_argument(where + e.what());
  }
  if (p.rows() > entry_rows)
    throw std::invalid_argument(where + std::to_string(p.rows()) + " rows, but the entry has " +
                                std::to_string(entry_rows));
}

}  // namespace kvsim::gpu
