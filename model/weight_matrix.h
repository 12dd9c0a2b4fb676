#pragma once
// A model weight W [rows = outputs, cols = inputs], either dequantized to f32 at load or kept in
// its GGUF blocks inside the memory-mapped file. Kept quantized, a decode step reads ~6x fewer
// bytes (Q4_1: 0.625 B per weight against 4) and the model costs no heap: GEMVs dot the blocks
// directly, GEMMs dequantize L2-sized row tiles and hand them to Eigen. Formats without a block
// dot (Q4_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) are also unpacked at load to one byte per weight plus
// a scale and offset per 16, exactly (dequant.h), which the GEMV reads at 1.5 B per weight.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kvsim {

class GgufFile;
struct GgufTensor;

enum class WeightFormat { F32, Quantized };
const char* weight_format_name(WeightFormat f);
WeightFormat parse_weight_format(const std::string& s);  // "f32" | "quant"; throws naming the value

class WeightMatrix {
 public:
  WeightMatrix();
  // Checks the tensor's shape is [rows, cols] (GGUF ne = {cols, rows}); throws naming the file,
  // the tensor and both shapes. In Quantized form the GgufFile must outlive this object.
  WeightMatrix(const GgufFile& f, const std::string& name, std::int64_t rows, std::int64_t cols, WeightFormat fmt);
  WeightMatrix(WeightMatrix&&) noexcept;
  WeightMatrix& operator=(WeightMatrix&&) noexcept;
  ~WeightMatrix();

  std::int64_t rows() const { return rows_; }
  std::int64_t cols() const { return cols_; }
  bool empty() const { return rows_ == 0; }

  // y [n, rows] = x [n, cols] * W^T, both row-major; y is overwritten.
  void multiply(const float* x, std::int64_t n, float* y) const;
  // Row r of W as f32 (cols values), e.g. an embedding lookup.
  void row(std::int64_t r, float* out) const;
  std::size_t heap_bytes() const;  // what this object allocated (0 when kept quantized)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::int64_t rows_ = 0, cols_ = 0;
};

}  // namespace kvsim
