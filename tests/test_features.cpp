// learned/features.h: every feature of a hand-filled layer, computed here from its definition.
#include <catch2/catch.hpp>
#include <cmath>

#include "fake_signals.h"
#include "learned/features.h"

using namespace kvsim;
using kvsim::learned::extract_features;
using kvsim::learned::feature_names;
using kvsim::learned::kFeatureCount;

namespace {

int column(const std::string& name) {
  const auto& names = feature_names();
  const auto it = std::find(names.begin(), names.end(), name);
  REQUIRE(it != names.end());
  return static_cast<int>(it - names.begin());
}

// Six tokens, one query head, one KV head; every token's query recorded.
test::FakeSignals six_tokens() {
  test::FakeSignals s(1, 1, 6, /*layer=*/2, /*n_layers=*/5);
  s.set_segments({0, 0, 1, 1, 2, 2});
  s.keys_[0] = {{1, 0}, {0, 2}, {3, 4}, {1, 1}, {-1, 0}, {0, -2}};
  s.values_[0] = {{2, 0}, {0, 1}, {1, 1}, {0, 0.5f}, {4, 3}, {1, 0}};
  s.window_[0] = {{1, 0, 0, 0, 0, 0},
                  {0.5f, 0.5f, 0, 0, 0, 0},
                  {0.2f, 0.3f, 0.5f, 0, 0, 0},
                  {0.1f, 0.1f, 0.1f, 0.7f, 0, 0},
                  {0.4f, 0, 0.2f, 0.2f, 0.2f, 0},
                  {0.5f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f}};
  return s;
}

}  // namespace

TEST_CASE("token features follow their definitions", "[features]") {
  const test::FakeSignals s = six_tokens();
  REQUIRE(learned::feature_window(s) == 6);
  const learned::HeadFeatures f = extract_features(s, 0);
  REQUIRE(f.tokens == 6);
  REQUIRE(static_cast<int>(feature_names().size()) == kFeatureCount);
  const auto& w = s.window_.at(0);
  const double n = 6;
  auto at = [&](std::int64_t j, const std::string& name) { return static_cast<double>(f.row(j)[column(name)]); };
  double head_entropy = 0;  // the head's: each query row's entropy, averaged over the rows, over log n
  for (std::size_t i = 0; i < w.data.size(); ++i)
    if (w.data[i] > 0) head_entropy -= w.data[i] * std::log(w.data[i]) / 6 / std::log(n);
  for (std::int64_t j = 0; j < 6; ++j) {
    INFO("token " << j);
    double sum_all = 0, mx = 0, ent = 0;
    for (std::int64_t i = 0; i < 6; ++i) {
      const double a = w.data[static_cast<std::size_t>(i * 6 + j)];
      sum_all += a;
      mx = std::max(mx, a);
      if (a > 0) ent -= a * std::log(a);
    }
    // Fewer recorded queries (6) than the windows of 8 and more: they average all six; the window
    // of 4 the last four.
    for (const char* name : {"attn_mean_8", "attn_mean_16", "attn_mean_32"})
      CHECK(at(j, name) == Approx(std::log(1e-3 + n * sum_all / 6)).margin(1e-5));
    double last4 = 0;
    for (std::int64_t i = 2; i < 6; ++i) last4 += w.data[static_cast<std::size_t>(i * 6 + j)] / 4;
    CHECK(at(j, "attn_mean_4") == Approx(std::log(1e-3 + n * last4)).margin(1e-5));
    CHECK(at(j, "attn_last") == Approx(std::log(1e-3 + n * w.data[static_cast<std::size_t>(30 + j)])).margin(1e-5));
    CHECK(at(j, "attn_max_32") == Approx(std::log(1e-3 + n * mx)).margin(1e-5));
    CHECK(at(j, "attn_entropy_16") == Approx(std::log(1e-3 + n * ent / 6 / std::log(n))).margin(1e-5));
    CHECK(at(j, "dist_from_end") == Approx(std::log1p(5.0 - static_cast<double>(j))));
    CHECK(at(j, "pos_relative") == Approx(static_cast<double>(j) / 5.0));
    CHECK(at(j, "is_sink") == (j < 4 ? 1.0 : 0.0));
    const int seg = j < 2 ? 0 : j < 4 ? 1 : 2;
    CHECK(at(j, "seg_system") == (seg == 0 ? 1.0 : 0.0));
    CHECK(at(j, "seg_context") == (seg == 1 ? 1.0 : 0.0));
    CHECK(at(j, "seg_question") == (seg == 2 ? 1.0 : 0.0));
    CHECK(at(j, "seg_generated") == 0.0);
    CHECK(at(j, "layer_frac") == Approx(0.5));
    CHECK(at(j, "head_frac") == 0.0);
    CHECK(at(j, "head_entropy_16") == Approx(head_entropy).margin(1e-5));
  }
  // Norms relative to the head's mean norm, and the cosine to the mean key.
  const auto& k = s.keys_.at(0);
  double mean_norm = 0, mk0 = 0, mk1 = 0;
  for (int j = 0; j < 6; ++j) {
    mean_norm += std::hypot(k.data[2 * j], k.data[2 * j + 1]) / 6;
    mk0 += k.data[2 * j] / 6.0;
    mk1 += k.data[2 * j + 1] / 6.0;
  }
  const double k2 = std::hypot(3.0, 4.0);
  CHECK(at(2, "key_norm") == Approx(std::log((k2 + 1e-6) / (mean_norm + 1e-6))).margin(1e-5));
  CHECK(at(2, "key_cos_mean") == Approx((3 * mk0 + 4 * mk1) / (k2 * std::hypot(mk0, mk1))).margin(1e-5));
  CHECK(at(3, "value_norm") < at(4, "value_norm"));
}

TEST_CASE("the attention windows stop at the recorded queries", "[features]") {
  test::FakeSignals s = six_tokens();
  // Only the last two tokens' queries recorded: every window averages those two rows.
  s.observed_rows_ = {4, 5};
  s.window_[0] = {{0.4f, 0, 0.2f, 0.2f, 0.2f, 0}, {0.5f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f}};
  REQUIRE(learned::feature_window(s) == 2);
  const learned::HeadFeatures f = extract_features(s, 0);
  CHECK(f.row(0)[column("attn_mean_8")] == Approx(std::log(1e-3 + 6 * 0.45)).margin(1e-5));
  CHECK(f.row(1)[column("attn_mean_32")] == Approx(std::log(1e-3 + 6 * 0.05)).margin(1e-5));
  // A gap before the last token: no window at all, and a message that says which token.
  s.observed_rows_ = {3, 4};
  CHECK(learned::feature_window(s) == 0);
  CHECK_THROWS_WITH(extract_features(s, 0), Catch::Contains("layer 2") && Catch::Contains("token 5"));
}

TEST_CASE("a GQA group's features: means over its heads, entropy of its mean attention", "[features]") {
  test::FakeSignals s(2, 1, 3);  // two query heads share one KV head; three tokens, three queries
  s.keys_[0] = {{1, 0}, {0, 1}, {1, 1}};
  s.values_[0] = {{1, 0}, {0, 1}, {1, 1}};
  s.window_[0] = {{1, 0, 0}, {0.5f, 0.5f, 0}, {0.2f, 0.2f, 0.6f}};
  s.window_[1] = {{1, 0, 0}, {0.1f, 0.9f, 0}, {0.6f, 0.2f, 0.2f}};
  const learned::HeadFeatures f = extract_features(s, 0);
  const double n = 3;
  // The group's mean attention, per query row.
  const double mean[3][3] = {{1, 0, 0}, {0.3, 0.7, 0}, {0.4, 0.2, 0.4}};
  double head = 0;
  for (int j = 0; j < 3; ++j) {
    INFO("token " << j);
    double ent = 0, sum = 0;
    for (int i = 0; i < 3; ++i) {
      sum += mean[i][j];
      if (mean[i][j] > 0) ent -= mean[i][j] * std::log(mean[i][j]) / 3;
    }
    head += ent / std::log(n);
    CHECK(f.row(j)[column("attn_entropy_16")] == Approx(std::log(1e-3 + n * ent / std::log(n))).margin(1e-5));
    CHECK(f.row(j)[column("attn_mean_4")] == Approx(std::log(1e-3 + n * sum / 3)).margin(1e-5));
  }
  CHECK(f.row(0)[column("attn_max_32")] == Approx(std::log(1e-3 + n * 1.0)).margin(1e-5));
  CHECK(f.row(1)[column("attn_max_32")] == Approx(std::log(1e-3 + n * 0.9)).margin(1e-5));
  for (int j = 0; j < 3; ++j) CHECK(f.row(j)[column("head_entropy_16")] == Approx(head).margin(1e-5));
}
