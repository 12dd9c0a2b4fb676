#pragma once
// A hand-filled LayerSignals for worked examples: every matrix is set by the test.
#include <map>
#include <stdexcept>
#include <vector>

#include "policies/policy.h"

namespace kvsim::test {

struct Rows {
  std::vector<float> data;
  std::int64_t rows = 0, cols = 0;
  Rows() = default;
  Rows(std::initializer_list<std::initializer_list<float>> rows_in) {
    for (const auto& r : rows_in) {
      cols = static_cast<std::int64_t>(r.size());
      data.insert(data.end(), r.begin(), r.end());
      ++rows;
    }
  }
  MatrixView view() const { return {data.data(), rows, cols}; }
};

class FakeSignals : public LayerSignals {
 public:
  FakeSignals(int n_q_heads, int n_kv_heads, std::int64_t n, int layer = 0, int n_layers = 1, int head_dim = 2)
      : n_(n), layer_(layer) {
    g_.n_layers = n_layers;
    g_.n_q_heads = n_q_heads;
    g_.n_kv_heads = n_kv_heads;
    g_.head_dim = head_dim;
    for (std::int64_t j = 0; j < n; ++j) {
      positions_.push_back(static_cast<std::int32_t>(j));
      segments_.push_back(1);
      observed_rows_.push_back(static_cast<std::int32_t>(j));
      observed_rows_all_.push_back(static_cast<std::int32_t>(j));
    }
  }
  void set_rope(const RopeSpec& rope) { g_.rope = rope; }
  void set_segments(std::vector<std::int8_t> segments) { segments_ = std::move(segments); }
  const ModelGeometry& geometry() const override { return g_; }
  int layer() const override { return layer_; }
  std::int64_t n_tokens() const override { return n_; }
  std::span<const std::int32_t> positions() const override { return positions_; }
  std::span<const std::int8_t> segments() const override { return segments_; }
  std::span<const std::int32_t> cached(int) const override { return observed_rows_all_; }
  MatrixView keys(int h) const override { return get(keys_, h, "keys"); }
  MatrixView values(int h) const override { return get(values_, h, "values"); }
  MatrixView window_attention(int q, int window) const override {
    const MatrixView v = get(window_, q, "window attention");
    if (v.rows != window) throw std::runtime_error("fake: window rows differ from the requested window");
    return v;
  }
  OwnedMatrix observed_attention(int q) const override {
    const MatrixView v = get(observed_, q, "observed attention");
    return OwnedMatrix{std::vector<float>(v.data, v.data + v.rows * v.cols), v.rows, v.cols};
  }
  std::span<const std::int32_t> observed_rows() const override { return observed_rows_; }
  MatrixView future_attention(int q) const override { return get(future_, q, "future attention"); }
  MatrixView observed_queries(int q) const override { return get(queries_, q, "observed queries"); }
  const RepeatPassView* repeat_pass() const override { return repeat_; }
  const RepeatPassView* repeat_ = nullptr;
  // Worked examples build a fresh policy per call (a new object may reuse a freed address), so
  // nothing is shared: every call recomputes, and the results live as long as this view.
  std::shared_ptr<const void> memo(const void*,
                                   const std::function<std::shared_ptr<const void>()>& make) const override {
    kept_alive_.push_back(make());
    return kept_alive_.back();
  }
  mutable std::vector<std::shared_ptr<const void>> kept_alive_;

  std::map<int, Rows> keys_, values_, window_, observed_, future_, queries_;
  std::vector<std::int32_t> observed_rows_;

 private:
  std::vector<std::int32_t> observed_rows_all_;  // every head caches every token
  static MatrixView get(const std::map<int, Rows>& m, int h, const char* what) {
    const auto it = m.find(h);
    if (it == m.end()) throw std::runtime_error(std::string("fake: no ") + what + " for head " + std::to_string(h));
    return it->second.view();
  }
  ModelGeometry g_;
  std::int64_t n_;
  int layer_;
  std::vector<std::int32_t> positions_;
  std::vector<std::int8_t> segments_;
};

}  // namespace kvsim::test
