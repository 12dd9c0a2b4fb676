#include "serve/profile.h"

#include <array>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"

namespace kvsim::serve {

namespace {

// Llama-2-7B: 6.7e9 parameters (13.4 GB in BF16), 32 layers, d_model 4096, KV of 2 x 32 x 4096
// BF16 values per token (0.5 MiB). Prefill is compute-bound at 40% of dense BF16 peak; a decode
// step is memory-bound: the weights once, plus each context token's KV, at 80% of HBM bandwidth.
ServeProfile llama2_7b(const std::string& gpu, double peak_tflops, double hbm_tb_per_s) {
  ServeProfile p;
  p.name = "llama2-7b-" + gpu;
  p.source = "public specs: Llama-2-7B on " + gpu + " (" + std::to_string(static_cast<int>(peak_tflops)) +
             " dense BF16 TFLOP/s at 40%, " + std::to_string(hbm_tb_per_s).substr(0, 4) + " TB/s HBM at 80%)";
  const double flops = 0.4 * peak_tflops * 1e12, bytes_per_ms = 0.8 * hbm_tb_per_s * 1e12 / 1e3;
  p.kv_bytes_per_token = 2.0 * 32 * 4096 * 2;
  p.prefill.name = p.name;
  p.prefill.a_ms = 0;
  p.prefill.b_ms_per_token = 2 * 6.7e9 / flops * 1e3;
  p.prefill.c_ms_per_token2 = 0.5 * 4.0 * 32 * 4096 / flops * 1e3;  // causal: l^2/2 (query, key) pairs
  p.decode.a_ms = 13.4e9 / bytes_per_ms;
  p.decode.b_ms_per_ctx_token = p.kv_bytes_per_token / bytes_per_ms;
  p.decode.c_ms_per_seq = 2 * 6.7e9 / flops * 1e3;  // each sequence's token through the weights
  return p;
}

double number(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < 0)
    throw Error(where + ": field '" + key + "' is " + (it == j.end() ? std::string("missing") : it->dump()) +
                "; expected a number >= 0");
  return it->get<double>();
}

// Solves the normal equations of y = X w for the columns in `use` (others 0), by Gaussian
// elimination; returns false when they are singular.
bool least_squares(const std::vector<std::array<double, 3>>& x, const std::vector<double>& y,
                   const std::array<bool, 3>& use, std::array<double, 3>& w) {
  std::vector<int> cols;
  for (int k = 0; k < 3; ++k)
    if (use[static_cast<std::size_t>(k)]) cols.push_back(k);
  const std::size_t n = cols.size();
  std::vector<std::vector<double>> m(n, std::vector<double>(n + 1, 0.0));
  for (std::size_t s = 0; s < x.size(); ++s)
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j < n; ++j)
        m[i][j] += x[s][static_cast<std::size_t>(cols[i])] * x[s][static_cast<std::size_t>(cols[j])];
      m[i][n] += x[s][static_cast<std::size_t>(cols[i])] * y[s];
    }
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t piv = i;
    for (std::size_t r = i + 1; r < n; ++r)
      if (std::abs(m[r][i]) > std::abs(m[piv][i])) piv = r;
    if (std::abs(m[piv][i]) < 1e-300) return false;
    std::swap(m[i], m[piv]);
    for (std::size_t r = 0; r < n; ++r) {
      if (r == i) continue;
      const double f = m[r][i] / m[i][i];
      for (std::size_t c = i; c <= n; ++c) m[r][c] -= f * m[i][c];
    }
  }
  w = {0, 0, 0};
  for (std::size_t i = 0; i < n; ++i) w[static_cast<std::size_t>(cols[i])] = m[i][n] / m[i][i];
  return true;
}

}  // namespace

const std::vector<ServeProfile>& builtin_profiles() {
  static const std::vector<ServeProfile> all = {llama2_7b("h100", 989, 3.35), llama2_7b("h200", 989, 4.8)};
  return all;
}

ServeProfile load_profile(const std::string& name_or_path) {
  for (const ServeProfile& p : builtin_profiles())
    if (p.name == name_or_path) return p;
  std::ifstream in(name_or_path);
  if (!in) {
    std::string names;
    for (const ServeProfile& p : builtin_profiles()) names += (names.empty() ? "" : ", ") + p.name;
    throw Error("profile '" + name_or_path + "': no such file, and not a built-in profile (" + names + ")");
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {  // syntax, and numbers out of range
    throw Error(name_or_path + ": not a JSON profile (" + e.what() + ")");
  }
  auto text = [&](const char* key) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_string())
      throw Error(name_or_path + ": field '" + key + "' is " + (it == j.end() ? std::string("missing") : it->dump()) +
                  "; expected a string");
    return it->get<std::string>();
  };
  if (!j.is_object()) throw Error(name_or_path + ": not a JSON object");
  if (text("format") != "kvsim-serve-profile")
    throw Error(name_or_path + ": field 'format' is not 'kvsim-serve-profile'");
  ServeProfile p;
  p.name = text("name");
  p.source = j.contains("source") ? text("source") : std::string();
  const auto pre = j.find("prefill"), dec = j.find("decode");
  if (pre == j.end() || !pre->is_object()) throw Error(name_or_path + ": field 'prefill' is missing or not an object");
  if (dec == j.end() || !dec->is_object()) throw Error(name_or_path + ": field 'decode' is missing or not an object");
  p.prefill.name = p.name;
  p.prefill.a_ms = number(*pre, "a_ms", name_or_path + ": prefill");
  p.prefill.b_ms_per_token = number(*pre, "b_ms_per_token", name_or_path + ": prefill");
  p.prefill.c_ms_per_token2 = number(*pre, "c_ms_per_token2", name_or_path + ": prefill");
  p.decode.a_ms = number(*dec, "a_ms", name_or_path + ": decode");
  p.decode.b_ms_per_ctx_token = number(*dec, "b_ms_per_ctx_token", name_or_path + ": decode");
  p.decode.c_ms_per_seq = number(*dec, "c_ms_per_seq", name_or_path + ": decode");
  p.kv_bytes_per_token = number(j, "kv_bytes_per_token", name_or_path);
  if (p.kv_bytes_per_token <= 0) throw Error(name_or_path + ": field 'kv_bytes_per_token' is 0; expected > 0");
  return p;
}

void write_profile(const ServeProfile& p, const std::string& path) {
  const nlohmann::json j = {{"format", "kvsim-serve-profile"},
                            {"name", p.name},
                            {"source", p.source},
                            {"kv_bytes_per_token", p.kv_bytes_per_token},
                            {"prefill",
                             {{"a_ms", p.prefill.a_ms},
                              {"b_ms_per_token", p.prefill.b_ms_per_token},
                              {"c_ms_per_token2", p.prefill.c_ms_per_token2}}},
                            {"decode",
                             {{"a_ms", p.decode.a_ms},
                              {"b_ms_per_ctx_token", p.decode.b_ms_per_ctx_token},
                              {"c_ms_per_seq", p.decode.c_ms_per_seq}}}};
  write_file_atomically(path, j.dump(2) + "\n");
}

std::vector<double> fit_nonnegative(const std::vector<CostSample>& samples, bool decode) {
  std::vector<std::array<double, 3>> x;
  std::vector<double> y;
  for (const CostSample& s : samples) {
    x.push_back({1.0, s.tokens, decode ? s.batch : s.tokens2});
    y.push_back(s.ms);
  }
  double best_err = -1, scale = 0;
  for (double v : y) scale += v * v;
  std::array<double, 3> best{0, 0, 0};
  for (int mask = 1; mask < 8; ++mask) {
    const std::array<bool, 3> use = {(mask & 1) != 0, (mask & 2) != 0, (mask & 4) != 0};
    const int free = (mask & 1) + ((mask >> 1) & 1) + ((mask >> 2) & 1);
    if (static_cast<int>(samples.size()) < free) continue;
    std::array<double, 3> w{};
    if (!least_squares(x, y, use, w) || w[0] < 0 || w[1] < 0 || w[2] < 0) continue;
    double err = 0;
    for (std::size_t s = 0; s < x.size(); ++s) {
      const double r = w[0] + w[1] * x[s][1] + w[2] * x[s][2] - y[s];
      err += r * r;
    }
    // Equal fits (up to rounding) keep the first: the intercept before the batch term when one
    // sequence size cannot tell them apart.
    if (best_err < 0 || err < best_err - 1e-9 * scale) {
      best_err = err;
      best = w;
    }
  }
  if (best_err < 0)
    throw Error("cost fit: " + std::to_string(samples.size()) +
                " samples admit no fit with coefficients >= 0; measure more lengths");
  return {best[0], best[1], best[2]};
}

}  // namespace kvsim::serve
