#pragma once
// Every CUDA runtime call goes through KVSIM_CUDA_CHECK so a failure names the file and line.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#define KVSIM_CUDA_CHECK(call)                                                                         \
  do {                                                                                                 \
    const cudaError_t kvsim_err_ = (call);                                                             \
    if (kvsim_err_ != cudaSuccess)                                                                     \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " + #call + \
                               " failed: " + cudaGetErrorString(kvsim_err_));                          \
  } while (0)
