#pragma once
// The CUDA transformer against its CPU reference (kvsim-parity's second half), and its benchmark.
#include <string>

#include "gpu/parity/parity_buffers.h"
#include "gpu/parity/parity_report.h"
#include "gpu/parity/parity_shapes.h"

namespace kvsim::gpu {

// Prefill with capture, decode with last-row weights, chunked prefill, a long prompt (models of
// up to 3 layers, unless long_prompt is false: the CPU emulator of tests/cuda_emu would take
// minutes over it), a per-query-head cache and a packed (really compressed) cache, GPU against
// reference; the same weights on both sides.
void transformer_parity(const std::string& name, const ModelConfig& s, DeviceWeights w, ParityReport& r,
                        bool long_prompt = true);

// Prefill and decode tokens/s against the cuBLAS GEMM rate measured in the same run, decode's
// weight bandwidth against `copy_gbs`, and the capture callback's overhead on prefill.
// --smoke sizes: a 256^3 GEMM, a 48-token prompt, 4 decode steps.
void transformer_bench(const std::string& name, const ModelConfig& s, const Bench& bench, ParityReport& r,
                       double copy_gbs);

}  // namespace kvsim::gpu
