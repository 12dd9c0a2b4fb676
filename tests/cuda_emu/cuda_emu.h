#pragma once
// A CPU stand-in for the CUDA execution model, so that the project's own kernels (gpu/*.cu, whose
// <<<...>>> launches tests/cuda_emu/launch.sed rewrites) run in CI without a GPU: blocks one after
// another, a block's threads as cooperative contexts switched at barriers and shuffles, so a run
// is deterministic. What it reports (unreached barriers, stale reads, refused launches, ...) and
// what it cannot show (speed, device rounding): docs/gpu.md, "Without a GPU".
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace emu {

// The thread running now (valid inside a kernel).
struct ThreadInfo {
  uint3 thread, block;
  dim3 block_dim, grid_dim;
};
const ThreadInfo& current();
int lane();  // the running thread's lane: its linear index in the block, modulo 32
void* dynamic_shared_bytes();
void sync_block();
void sync_warp();
// Every lane of the warp deposits `bits` and receives lane `src`'s (src is taken modulo 32, as
// the hardware does).
std::uint64_t exchange(std::uint64_t bits, int src);

// The kernel body for thread (block, thread) of a launch: set by launch(), called per thread.
using Body = void (*)(void* launch_state);
// Runs `body(state)` for every thread of the grid; false (and sets the last error) when the
// configuration is one a GPU would refuse.
bool launch(dim3 grid, dim3 block, std::size_t shared_bytes, Body body, void* state);
void set_last_error(int code);
int take_last_error();

template <class T>
T* dynamic_shared() {
  return static_cast<T*>(dynamic_shared_bytes());
}

template <class T>
T shuffle(T v, int src) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffles move up to 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = exchange(bits, src);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

struct Config {
  dim3 grid, block;
  std::size_t shared = 0;
  Config(dim3 g, dim3 b, std::size_t s = 0, const void* /*stream*/ = nullptr) : grid(g), block(b), shared(s) {}
  template <class... A>
  auto operator()(A&&... a) const;
};

template <class... A>
struct Bound {
  Config config;
  std::tuple<A...> args;
};

template <class... A>
auto Config::operator()(A&&... a) const {
  return Bound<std::decay_t<A>...>{*this, std::tuple<std::decay_t<A>...>(std::forward<A>(a)...)};
}

// `kernel | Config(grid, block, shared, stream)(args...)`: what launch.sed makes of
// `kernel<<<grid, block, shared, stream>>>(args...)`.
template <class... P, class... A>
void operator|(void (*kernel)(P...), const Bound<A...>& b) {
  struct State {
    void (*kernel)(P...);
    const std::tuple<A...>* args;
  } state{kernel, &b.args};
  launch(
      b.config.grid, b.config.block, b.config.shared,
      [](void* s) {
        auto* st = static_cast<State*>(s);
        std::apply([&](const auto&... a) { st->kernel(a...); }, *st->args);
      },
      &state);
}

}  // namespace emu

#define threadIdx (::emu::current().thread)
#define blockIdx (::emu::current().block)
#define blockDim (::emu::current().block_dim)
#define gridDim (::emu::current().grid_dim)
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __align__(n) alignas(n)
// A block runs alone, so its shared memory can be a function-local static. They all live in one
// section, which the emulator fills with NaN bytes before each block: reading static shared
// memory before writing it shows, as it does for dynamic shared memory.
#define __shared__ static __attribute__((section("kvsim_emu_shared")))

inline void __syncthreads() { ::emu::sync_block(); }
inline void __syncwarp(unsigned /*mask*/ = 0xffffffffu) { ::emu::sync_warp(); }
template <class T>
T __shfl_sync(unsigned /*mask*/, T v, int src) {
  return ::emu::shuffle(v, src);
}
template <class T>
T __shfl_xor_sync(unsigned /*mask*/, T v, int lane_mask) {
  return ::emu::shuffle(v, ::emu::lane() ^ lane_mask);
}
