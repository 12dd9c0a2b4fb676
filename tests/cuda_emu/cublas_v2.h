#pragma once
// cuBLAS as tests/cuda_emu needs it: GemmEx on the CPU, column-major as cuBLAS is, fp16 or fp32
// inputs, fp32 output and accumulation.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/half.h"
#include "cuda_runtime.h"

enum cublasStatus_t { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7, CUBLAS_STATUS_NOT_SUPPORTED = 15 };
struct cublasContext;
using cublasHandle_t = cublasContext*;
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cudaDataType { CUDA_R_32F = 0, CUDA_R_16F = 2 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };

inline cublasStatus_t cublasCreate(cublasHandle_t* h) {
  *h = reinterpret_cast<cublasHandle_t>(new char);
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasDestroy(cublasHandle_t h) {
  delete reinterpret_cast<char*>(h);
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
inline const char* cublasGetStatusString(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS ? "success" : "error"; }

// C [m, n] = alpha op(A) [m, k] op(B) [k, n] + beta C, column-major with leading dimensions.
inline cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                   const void* alpha, const void* A, cudaDataType a_type, int lda, const void* B,
                                   cudaDataType b_type, int ldb, const void* beta, void* C, cudaDataType c_type,
                                   int ldc, cublasComputeType_t, cublasGemmAlgo_t) {
  if (c_type != CUDA_R_32F || a_type != b_type) return CUBLAS_STATUS_NOT_SUPPORTED;
  // What cuBLAS refuses: negative sizes, leading dimensions shorter than a stored column.
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, ta == CUBLAS_OP_N ? m : k) ||
      ldb < std::max(1, tb == CUBLAS_OP_N ? k : n) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  auto load = [](const void* p, cudaDataType t, std::int64_t i) {
    return t == CUDA_R_16F ? kvsim::half_to_float(static_cast<const std::uint16_t*>(p)[i])
                           : static_cast<const float*>(p)[i];
  };
  // op(A) row i and op(B) column j as contiguous k-vectors.
  std::vector<float> a(static_cast<std::size_t>(m) * k), b(static_cast<std::size_t>(n) * k);
  for (int i = 0; i < m; ++i)
    for (int l = 0; l < k; ++l)
      a[static_cast<std::size_t>(i) * k + l] =
          load(A, a_type,
               ta == CUBLAS_OP_T ? l + static_cast<std::int64_t>(i) * lda : i + static_cast<std::int64_t>(l) * lda);
  for (int j = 0; j < n; ++j)
    for (int l = 0; l < k; ++l)
      b[static_cast<std::size_t>(j) * k + l] =
          load(B, b_type,
               tb == CUBLAS_OP_T ? j + static_cast<std::int64_t>(l) * ldb : l + static_cast<std::int64_t>(j) * ldb);
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  float* c = static_cast<float*>(C);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      float acc = 0.0f;
      const float* ai = a.data() + static_cast<std::size_t>(i) * k;
      const float* bj = b.data() + static_cast<std::size_t>(j) * k;
      for (int l = 0; l < k; ++l) acc += ai[l] * bj[l];
      float& out = c[i + static_cast<std::int64_t>(j) * ldc];
      out = al * acc + (be != 0.0f ? be * out : 0.0f);
    }
  return CUBLAS_STATUS_SUCCESS;
}
