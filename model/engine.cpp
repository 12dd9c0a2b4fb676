#include "model/engine.h"

#include <algorithm>

#include "model/llama_model.h"
#include "core/error.h"
#ifdef KVSIM_WITH_CUDA
#include <stdexcept>

#include "model/backend_engine.h"
#include "model/gguf.h"
#include "model/transformer_weights.h"
#include "gpu/cuda_transformer.h"
#endif

namespace kvsim {

std::vector<float> Engine::prefill(std::span<const std::int32_t> tokens, std::int64_t chunk, const LayerHook& hook) {
  if (tokens.empty()) throw Error("prefill: no tokens");
  if (chunk < 1) throw Error("prefill: chunk must be >= 1");
  std::vector<float> logits;
  for (std::size_t s = 0; s < tokens.size(); s += static_cast<std::size_t>(chunk)) {
    const std::size_t e = std::min(tokens.size(), s + static_cast<std::size_t>(chunk));
    std::vector<std::int32_t> pos(e - s);
    for (std::size_t i = 0; i < pos.size(); ++i)
      pos[i] = static_cast<std::int32_t>(cached_tokens()) + static_cast<std::int32_t>(i);
    const std::int64_t last = static_cast<std::int64_t>(e - s) - 1;
    const std::span<const std::int64_t> rows =
        e == tokens.size() ? std::span<const std::int64_t>(&last, 1) : std::span<const std::int64_t>();
    logits = forward(tokens.subspan(s, e - s), pos, rows, hook);
  }
  return logits;
}

std::vector<float> Engine::step(std::int32_t token, const LayerHook& hook) {
  const auto pos = static_cast<std::int32_t>(cached_tokens());
  const std::int64_t row = 0;
  return forward(std::span<const std::int32_t>(&token, 1), std::span<const std::int32_t>(&pos, 1),
                 std::span<const std::int64_t>(&row, 1), hook);
}

RefreshResult Engine::refresh(std::span<const std::int32_t>, std::span<const std::int32_t>,
                              std::span<const std::int64_t>, const RefreshOptions&) {
  throw Error("refreshing cached rows (a chunk transition) runs on the CPU engine only; this engine is " + device());
}

void Engine::start_decode_rule(int, const DecodeRuleStart&) {
  throw Error("the " + device() + " engine runs no decode rules; step the policy on the host");
}

std::vector<std::vector<std::vector<std::int32_t>>> Engine::decode_rule_step(std::int64_t) {
  throw Error("the " + device() + " engine runs no decode rules; step the policy on the host");
}

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::Cpu;
  if (s == "cuda") return Device::Cuda;
  throw Error("--device is '" + s + "', expected cpu or cuda");
}

const char* device_name(Device d) { return d == Device::Cuda ? "cuda" : "cpu"; }

bool cuda_built() {
#ifdef KVSIM_WITH_CUDA
  return true;
#else
  return false;
#endif
}

void require_device(Device d) {
  if (d == Device::Cpu) return;
#ifdef KVSIM_WITH_CUDA
  std::string why;
  if (gpu::cuda_devices(&why) == 0)
    throw Error("--device cuda: no CUDA device is visible (" + why + "); use --device cpu");
#else
  throw Error(
      "--device cuda: this kvsim was built without CUDA (no nvcc when it was configured); rebuild where the "
      "CUDA toolkit is installed, or use --device cpu");
#endif
}

std::unique_ptr<Engine> make_engine(const GgufFile& f, const EngineOptions& o) {
  require_device(o.device);
  if (o.device == Device::Cpu) return std::make_unique<LlamaModel>(f, o.weights);
#ifdef KVSIM_WITH_CUDA
  std::unique_ptr<gpu::TransformerBackend> backend;
  try {
    backend = std::make_unique<gpu::CudaTransformer>(model_config(f),
                                                     o.gpu_f32 ? gpu::DeviceWeights::F32 : gpu::DeviceWeights::F16);
  } catch (const std::invalid_argument& e) {
    throw Error(f.path() + ": the CUDA engine cannot run this model: " + e.what());
  } catch (const std::runtime_error& e) {
    throw Error(std::string("--device cuda: ") + e.what());
  }
  return std::make_unique<BackendEngine>(f, std::move(backend));
#else
  throw Error("unreachable: CUDA engine without CUDA");
#endif
}

}  // namespace kvsim
