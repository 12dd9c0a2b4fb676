#include "gpu/cuda_transformer.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/half.h"
#include "gpu/cuda_check.h"
#include "gpu/device_alloc.h"
#include "gpu/packed_attention.cuh"
#include "gpu/packed_rows.h"
#include "gpu/packed_unpack.cuh"
#include "gpu/policy_step.cuh"
#include "gpu/transformer_kernels.cuh"

namespace kvsim::gpu {

namespace {

#define KVSIM_CUBLAS_CHECK(call)                                                                       \
  do {                                                                                                 \
    const cublasStatus_t kvsim_st_ = (call);                                                           \
    if (kvsim_st_ != CUBLAS_STATUS_SUCCESS)                                                            \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " + #call + \
                               " failed: " + cublasGetStatusString(kvsim_st_));                        \
  } while (0)

// Device memory that grows, stream-ordered on `stream` (contents are not kept unless asked).
struct DeviceMem {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  bool pooled = false;  // stream-ordered allocation (gpu/device_alloc.h)
  DeviceMem() = default;
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  DeviceMem(DeviceMem&& o) noexcept : ptr(o.ptr), bytes(o.bytes), pooled(o.pooled) { o.ptr = nullptr, o.bytes = 0; }
  DeviceMem& operator=(DeviceMem&& o) noexcept {
    std::swap(ptr, o.ptr);
    std::swap(bytes, o.bytes);
    std::swap(pooled, o.pooled);
    return *this;
  }
  ~DeviceMem() {
    if (ptr) cudaFree(ptr);  // frees either kind, after the device's pending work
  }
  void release(cudaStream_t stream) {
    if (ptr) KVSIM_CUDA_CHECK(device_free(ptr, stream, pooled));
    ptr = nullptr;
    bytes = 0;
  }
  void ensure(std::size_t want, cudaStream_t stream) {
    if (want <= bytes) return;
    release(stream);  // a failed allocation below leaves an empty buffer, never a stale size
    KVSIM_CUDA_CHECK(device_alloc(&ptr, want, stream, pooled));
    bytes = want;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

// Page-locked host memory (asynchronous copies need it); grows only between forward passes.
struct PinnedMem {
  float* ptr = nullptr;
  std::size_t count = 0;
  PinnedMem() = default;
  PinnedMem(const PinnedMem&) = delete;
  PinnedMem& operator=(const PinnedMem&) = delete;
  ~PinnedMem() {
    if (ptr) cudaFreeHost(ptr);
  }
  void ensure(std::size_t want) {
    if (want <= count) return;
    if (ptr) KVSIM_CUDA_CHECK(cudaFreeHost(ptr));
    ptr = nullptr;
    count = 0;
    KVSIM_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&ptr), want * sizeof(float)));
    count = want;
  }
};

std::vector<std::uint16_t> halves_of(std::span<const float> x) {
  std::vector<std::uint16_t> h(x.size());
  floats_to_halves(x.data(), h.data(), x.size());
  return h;
}

}  // namespace

struct CudaTransformer::Impl {
  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  // Here, not in ~CudaTransformer: a constructor that throws half-way and a move-assigned-over
  // backend release their streams and handles too, after their pending work.
  ~Impl() {
    cudaSetDevice(device);
    if (compute) cudaStreamSynchronize(compute);
    if (copy) cudaStreamSynchronize(copy);
    weights.clear();
    cache.clear();
    if (blas) cublasDestroy(blas);
    for (int b = 0; b < 2; ++b) {
      if (rows_ready[b]) cudaEventDestroy(rows_ready[b]);
      if (copied[b]) cudaEventDestroy(copied[b]);
    }
    if (compute) cudaStreamDestroy(compute);
    if (copy) cudaStreamDestroy(copy);
    // The remaining buffers free themselves after this (cudaFree waits for the device).
  }
  ModelConfig s;
  DeviceWeights dw;
  bool f16 = true;
  int device = 0;
  std::string name;
  cudaStream_t compute = nullptr, copy = nullptr;
  cudaEvent_t rows_ready[2] = {}, copied[2] = {};
  cublasHandle_t blas = nullptr;
  std::vector<DeviceMem> weights;  // [(layer + 1) * kWeightIds + id]
  std::size_t weight_bytes = 0;

  // One tensor of an entry's packed prefix on the device: core/packed_kv.h's arrays, same layout.
  struct PackedDev {
    DeviceMem runs, positions, halves, codes, params, basis;
    PackedTensorView view;
  };
  struct EntryPacked {
    std::int64_t rows = 0;
    PackedDev k, v;
  };
  struct LayerCache {
    std::vector<std::int64_t> rows;   // rows each entry holds: its packed prefix, then fp16 rows
    std::vector<EntryPacked> packed;  // [entry], empty when nothing in the layer is packed
    DeviceMem views;                  // [entry] PackedEntryView of `packed`, what the fused decode reads
    std::int64_t capacity = 0;        // fp16 rows per entry the buffers have room for
    DeviceMem k, v;                   // each entry's fp16 rows (those after its packed prefix)
    std::int64_t packed_rows(std::size_t e) const { return packed.empty() ? 0 : packed[e].rows; }
    std::int64_t stored(std::size_t e) const { return rows[e] - packed_rows(e); }
  };
  std::vector<LayerCache> cache;
  // A packed layer's rows for attention, unpacked one layer at a time: [entries, cap, d] fp16.
  DeviceMem unpacked_k, unpacked_v;

  // Work buffers for up to `work_rows` new rows.
  std::int64_t work_rows = 0, pinned_rows = 0;
  DeviceMem x, in, q[2], k[2], v[2], kh, vh, gate, up, block_out, dev_tokens, dev_positions, dev_logit_rows, xr, logits,
      probs;
  DeviceMem decode_scratch;  // split-K decode partials
  DeviceMem head_stats;      // [n_head, 2]: a packed decode's softmax (max, sum) for the last-row weights
  PackedDecode packed_decode = PackedDecode::Fused;
  DeviceMem keep_index, keep_scratch;            // keep_rows: the kept row indices and the gathered rows
  DeviceMem cos_t, sin_t, cos_local, sin_local;  // RoPE tables: every layer / sliding-window layers (gemma3)
  std::int64_t rope_rows = 0;
  PinnedMem pq[2], pk[2], pv[2];
  std::vector<std::vector<float>> last;  // [layer] -> [n_head, last_stride]
  std::vector<std::vector<std::int64_t>> last_seen;
  std::int64_t last_stride = 0;
  bool last_on_host = true;
  // Decode rules (core/decode_rule.h): each layer's rule and its scores on the device, double
  // [scored entries, score_cap]; the step's working buffers are shared by the layers (their
  // kernels run one after another on the compute stream).
  struct LayerRule {
    bool on = false;
    DecodeRule rule;
    DeviceMem scores;
    std::int64_t score_cap = 0;
    std::vector<std::int64_t> scored_rows;  // [scored entry] rows the scores cover (accumulating)
  };
  std::vector<LayerRule> rules;
  DeviceMem rule_gone, rule_kept, rule_report;
  bool rule_ready = false;  // a one-row forward() with record_last since the last rule step

  std::size_t decode_floats() const { return decode_scratch_floats(s.n_q_heads, s.head_dim); }
  std::size_t gemm_elem() const { return f16 ? sizeof(std::uint16_t) : sizeof(float); }
  cudaDataType gemm_type() const { return f16 ? CUDA_R_16F : CUDA_R_32F; }

  const DeviceMem& w(WeightId id, int layer) const {
    const DeviceMem& m = weights[static_cast<std::size_t>((layer + 1) * kWeightIds + static_cast<int>(id))];
    if (!m.ptr) throw std::logic_error(std::string("CUDA transformer: weight ") + weight_id_name(id) + " not set");
    return m;
  }
  const float* bias(WeightId id, int layer) const { return s.qkv_bias ? w(id, layer).as<float>() : nullptr; }
  const float* qk_norm(WeightId id, int layer) const { return s.qk_norm ? w(id, layer).as<float>() : nullptr; }

  // y [n, rows] (+)= x [n, cols] W^T: cuBLAS is column-major, so this is Y^T = W^T^T X^T.
  void gemm(const void* xin, std::int64_t n, const DeviceMem& W, std::int64_t rows, std::int64_t cols, float* y,
            bool accumulate) {
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    KVSIM_CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(n),
                                    static_cast<int>(cols), &alpha, W.ptr, gemm_type(), static_cast<int>(cols), xin,
                                    gemm_type(), static_cast<int>(cols), &beta, y, CUDA_R_32F, static_cast<int>(rows),
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  // x += in W_proj^T ([n, cols] GEMM input in `in`), through the `post` norm first where the shape
  // has post-norms (gemma3).
  void project_into_residual(std::int64_t n, WeightId proj, WeightId post, int layer, std::int64_t cols) {
    if (!s.post_norms) return gemm(in.ptr, n, w(proj, layer), s.n_embd, cols, x.as<float>(), true);
    gemm(in.ptr, n, w(proj, layer), s.n_embd, cols, block_out.as<float>(), false);
    KVSIM_CUDA_CHECK(rms_norm_add_rows(block_out.as<float>(), w(post, layer).as<float>(), static_cast<int>(n),
                                       static_cast<int>(s.n_embd), static_cast<float>(s.rms_eps), x.as<float>(),
                                       compute));
  }

  // Work buffers for n new rows; the pinned host buffers only when a callback takes the rows
  // (pinned memory is slow to allocate and scarce: 48 KB a row at Mistral-7B's shape).
  void ensure_work(std::int64_t n, std::size_t n_logits, bool capture) {
    const std::int64_t E = s.n_embd, Q = s.q_dim(), K = s.kv_dim(), F = s.n_ff;
    if (n > work_rows) {
      KVSIM_CUDA_CHECK(cudaStreamSynchronize(copy));  // the copy stream may still read q/k/v
      const auto un = static_cast<std::size_t>(n);
      x.ensure(un * E * sizeof(float), compute);
      in.ensure(un * std::max({E, Q, F}) * gemm_elem(), compute);
      for (int b = 0; b < 2; ++b) {
        q[b].ensure(un * Q * sizeof(float), compute);
        k[b].ensure(un * K * sizeof(float), compute);
        v[b].ensure(un * K * sizeof(float), compute);
      }
      kh.ensure(un * K * sizeof(std::uint16_t), compute);
      vh.ensure(un * K * sizeof(std::uint16_t), compute);
      gate.ensure(un * F * sizeof(float), compute);
      up.ensure(un * F * sizeof(float), compute);
      if (s.post_norms) block_out.ensure(un * E * sizeof(float), compute);
      dev_tokens.ensure(un * sizeof(std::int32_t), compute);
      dev_positions.ensure(un * sizeof(std::int32_t), compute);
      work_rows = n;
    }
    if (capture && n > pinned_rows) {
      KVSIM_CUDA_CHECK(cudaStreamSynchronize(copy));  // pinned buffers are re-made
      const auto un = static_cast<std::size_t>(n);
      for (int b = 0; b < 2; ++b) {
        pq[b].ensure(un * Q);
        pk[b].ensure(un * K);
        pv[b].ensure(un * K);
      }
      pinned_rows = n;
    }
    decode_scratch.ensure(decode_floats() * sizeof(float), compute);
    head_stats.ensure(static_cast<std::size_t>(s.n_q_heads) * 2 * sizeof(float), compute);
    const std::size_t m = std::max<std::size_t>(n_logits, 1);
    dev_logit_rows.ensure(m * sizeof(std::int64_t), compute);
    xr.ensure(m * E * sizeof(float), compute);
    in.ensure(m * E * gemm_elem(), compute);
    logits.ensure(m * static_cast<std::size_t>(s.vocab) * sizeof(float), compute);
  }

  void ensure_rope(std::int64_t max_pos) {
    if (max_pos < rope_rows) return;
    rope_rows = std::max<std::int64_t>(max_pos + 1, 2 * rope_rows);
    auto upload_tables = [&](const RopeSpec& rope, DeviceMem& dc, DeviceMem& ds) {
      std::vector<float> c, sn;
      rope_tables(rope, rope_rows, c, sn);
      dc.ensure(c.size() * sizeof(float), compute);
      ds.ensure(sn.size() * sizeof(float), compute);
      KVSIM_CUDA_CHECK(cudaMemcpyAsync(dc.ptr, c.data(), c.size() * sizeof(float), cudaMemcpyHostToDevice, compute));
      KVSIM_CUDA_CHECK(cudaMemcpyAsync(ds.ptr, sn.data(), sn.size() * sizeof(float), cudaMemcpyHostToDevice, compute));
      KVSIM_CUDA_CHECK(cudaStreamSynchronize(compute));  // the host tables go out of scope
    };
    upload_tables(s.rope, cos_t, sin_t);
    if (s.rope_theta_local > 0) upload_tables(local_rope(s), cos_local, sin_local);
  }

  // The fewest fp16 rows per entry a layer's buffers are made with (they double as rows arrive).
  static constexpr std::int64_t kMinCacheRows = 64;

  // Room for `extra` more rows in every entry of layer l, keeping what is there.
  void ensure_cache(LayerCache& lc, std::int64_t extra) {
    std::int64_t need = 0;
    for (std::size_t e = 0; e < lc.rows.size(); ++e) need = std::max(need, lc.stored(e) + extra);
    if (need <= lc.capacity) return;
    const std::int64_t cap = std::max({need, 2 * lc.capacity, kMinCacheRows});
    const auto d = static_cast<std::size_t>(s.head_dim), ne = lc.rows.size();
    DeviceMem nk, nv;
    nk.ensure(ne * cap * d * sizeof(std::uint16_t), compute);
    nv.ensure(ne * cap * d * sizeof(std::uint16_t), compute);
    for (std::size_t e = 0; e < ne; ++e) {
      if (lc.stored(e) == 0) continue;
      const std::size_t bytes = static_cast<std::size_t>(lc.stored(e)) * d * sizeof(std::uint16_t);
      KVSIM_CUDA_CHECK(cudaMemcpyAsync(nk.as<std::uint16_t>() + e * cap * d,
                                       lc.k.as<std::uint16_t>() + e * lc.capacity * d, bytes, cudaMemcpyDeviceToDevice,
                                       compute));
      KVSIM_CUDA_CHECK(cudaMemcpyAsync(nv.as<std::uint16_t>() + e * cap * d,
                                       lc.v.as<std::uint16_t>() + e * lc.capacity * d, bytes, cudaMemcpyDeviceToDevice,
                                       compute));
    }
    std::swap(lc.k, nk);
    std::swap(lc.v, nv);
    nk.release(compute);  // stream-ordered: after the copies above
    nv.release(compute);
    lc.capacity = cap;
  }

  // A decode rule's score arrays grow with the cache, a quarter at a time, before a step that
  // would outgrow them (rule_step allocates everything before its first kernel).
  void grow_rule_scores() {
    for (std::size_t l = 0; l < rules.size(); ++l) {
      auto& r = rules[l];
      const std::int64_t need = r.on ? *std::max_element(cache[l].rows.begin(), cache[l].rows.end()) : 0;
      if (need <= r.score_cap) continue;
      const std::size_t scored = r.rule.layer_wide ? 1 : cache[l].rows.size();
      const std::int64_t cap = need + need / 4;
      DeviceMem grown;
      grown.ensure(scored * static_cast<std::size_t>(cap) * sizeof(double), compute);
      for (std::size_t e = 0; e < scored; ++e)
        KVSIM_CUDA_CHECK(cudaMemcpyAsync(grown.as<double>() + e * static_cast<std::size_t>(cap),
                                         r.scores.as<double>() + e * static_cast<std::size_t>(r.score_cap),
                                         static_cast<std::size_t>(r.score_cap) * sizeof(double),
                                         cudaMemcpyDeviceToDevice, compute));
      std::swap(r.scores, grown);
      grown.release(compute);
      r.score_cap = cap;
    }
  }

  EntryRows entry_rows(const LayerCache& lc, std::int64_t plus) const {
    EntryRows r;
    r.count = static_cast<int>(lc.rows.size());
    for (int e = 0; e < r.count; ++e) r.rows[e] = static_cast<int>(lc.rows[static_cast<std::size_t>(e)] + plus);
    return r;
  }
  EntryRows stored_rows(const LayerCache& lc) const {
    EntryRows r;
    r.count = static_cast<int>(lc.rows.size());
    for (int e = 0; e < r.count; ++e) r.rows[e] = static_cast<int>(lc.stored(static_cast<std::size_t>(e)));
    return r;
  }

  // Copies one packed tensor's arrays to the device (the host vectors must outlive the stream's
  // copies: load_layer waits for them).
  void upload(const PackedTensor& t, const RowTable& table, PackedDev& dst) {
    auto put = [&](DeviceMem& m, const void* src, std::size_t bytes) {
      if (bytes == 0) return;
      m.ensure(bytes, compute);
      KVSIM_CUDA_CHECK(cudaMemcpyAsync(m.ptr, src, bytes, cudaMemcpyHostToDevice, compute));
    };
    put(dst.runs, table.runs.data(), table.runs.size() * sizeof(RowRun));
    put(dst.positions, table.positions.data(), table.positions.size() * sizeof(std::int32_t));
    put(dst.halves, t.halves.data(), t.halves.size() * sizeof(std::uint16_t));
    put(dst.codes, t.codes.data(), t.codes.size());
    put(dst.params, t.params.data(), t.params.size() * sizeof(std::uint16_t));
    put(dst.basis, t.basis.data(), t.basis.size() * sizeof(std::uint16_t));
    dst.view = layout_view(t, table);
    dst.view.runs = dst.runs.as<const RowRun>();
    dst.view.positions = table.positions.empty() ? nullptr : dst.positions.as<const std::int32_t>();
    dst.view.halves = dst.halves.as<const std::uint16_t>();
    dst.view.codes = dst.codes.as<const std::uint8_t>();
    dst.view.params = dst.params.as<const std::uint16_t>();
    dst.view.basis = dst.basis.as<const std::uint16_t>();
  }
  static std::size_t bytes_of(const PackedDev& p) {
    return p.runs.bytes + p.positions.bytes + p.halves.bytes + p.codes.bytes + p.params.bytes + p.basis.bytes;
  }

  // Entry e's rows as attention reads them, its packed prefix unpacked and its first
  // stored(e) + extra fp16 rows after it, to out_k / out_v ([rows, d] fp16 each).
  void materialize(const LayerCache& lc, std::size_t e, std::int64_t extra, std::uint16_t* out_k,
                   std::uint16_t* out_v) {
    const auto d = static_cast<std::size_t>(s.head_dim);
    const std::int64_t p = lc.packed_rows(e);
    if (p > 0) {
      const RopeShape rope{s.rope.type == RopeType::Neox, s.rope.rope_dim};
      KVSIM_CUDA_CHECK(
          unpack_packed(lc.packed[e].k.view, s.head_dim, rope, cos_t.as<float>(), sin_t.as<float>(), out_k, compute));
      KVSIM_CUDA_CHECK(
          unpack_packed(lc.packed[e].v.view, s.head_dim, rope, cos_t.as<float>(), sin_t.as<float>(), out_v, compute));
    }
    const std::size_t bytes = static_cast<std::size_t>(lc.stored(e) + extra) * d * sizeof(std::uint16_t);
    if (bytes == 0) return;
    const std::size_t from = e * static_cast<std::size_t>(lc.capacity) * d, to = static_cast<std::size_t>(p) * d;
    KVSIM_CUDA_CHECK(
        cudaMemcpyAsync(out_k + to, lc.k.as<std::uint16_t>() + from, bytes, cudaMemcpyDeviceToDevice, compute));
    KVSIM_CUDA_CHECK(
        cudaMemcpyAsync(out_v + to, lc.v.as<std::uint16_t>() + from, bytes, cudaMemcpyDeviceToDevice, compute));
  }

  std::vector<float> forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> positions,
                             std::span<const std::int64_t> logit_rows, bool want_q, bool record_last,
                             const LayerCallback& on_layer);
  // forward()'s phases: layer l's attention over its cache (the n new rows of kh/vh joined first)
  // into `in`, and the logits of the chosen rows after the last layer (with the last-row weights
  // fetched when they stay on the host).
  void attend_layer(int l, std::int64_t n, const float* qb, bool record_last, float scale);
  std::vector<float> finish_forward(std::span<const std::int64_t> logit_rows, bool record_last);

  std::vector<float> download(int layer, int entry, bool keys) {
    KVSIM_CUDA_CHECK(cudaSetDevice(device));
    const auto& lc = cache.at(static_cast<std::size_t>(layer));
    const std::int64_t n = lc.rows.at(static_cast<std::size_t>(entry));
    const auto d = static_cast<std::size_t>(s.head_dim);
    std::vector<std::uint16_t> h(static_cast<std::size_t>(n) * d);
    if (!h.empty()) {
      const auto* src = (keys ? lc.k : lc.v).as<std::uint16_t>() + static_cast<std::size_t>(entry) * lc.capacity * d;
      DeviceMem tk, tv;  // a packed entry is read back as attention reads it
      if (lc.packed_rows(static_cast<std::size_t>(entry)) > 0) {
        tk.ensure(h.size() * sizeof(std::uint16_t), compute);
        tv.ensure(h.size() * sizeof(std::uint16_t), compute);
        materialize(lc, static_cast<std::size_t>(entry), 0, tk.as<std::uint16_t>(), tv.as<std::uint16_t>());
        src = (keys ? tk : tv).as<std::uint16_t>();
      }
      KVSIM_CUDA_CHECK(
          cudaMemcpyAsync(h.data(), src, h.size() * sizeof(std::uint16_t), cudaMemcpyDeviceToHost, compute));
      KVSIM_CUDA_CHECK(cudaStreamSynchronize(compute));
    }
    std::vector<float> out(h.size());
    halves_to_floats(h.data(), out.data(), h.size());
    return out;
  }
};

int cuda_devices(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why) *why = cudaGetErrorString(err);
    cudaGetLastError();  // clear it
    return 0;
  }
  if (n == 0 && why) *why = "the CUDA driver reports no devices";
  return n;
}

CudaTransformer::CudaTransformer(const ModelConfig& s, DeviceWeights w, int device) : impl_(std::make_unique<Impl>()) {
  s.check();
  Impl& m = *impl_;
  m.s = s;
  m.dw = w;
  m.f16 = w == DeviceWeights::F16;
  m.device = device;
  const int d = s.head_dim;
  if (d != 32 && d != 64 && d != 96 && d != 128 && d != 256)
    throw std::invalid_argument("CUDA transformer: head_dim " + std::to_string(d) +
                                " is not supported (32, 64, 96, 128 or 256)");
  if (s.n_q_heads > kMaxEntries)
    throw std::invalid_argument("CUDA transformer: " + std::to_string(s.n_q_heads) + " query heads, at most " +
                                std::to_string(kMaxEntries));
  std::string why;
  const int n = cuda_devices(&why);
  if (device < 0 || device >= n)
    throw std::runtime_error("no CUDA device " + std::to_string(device) + " (" + std::to_string(n) + " found" +
                             (why.empty() ? "" : ": " + why) + ")");
  KVSIM_CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  KVSIM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  m.name = prop.name;
  KVSIM_CUDA_CHECK(cudaStreamCreateWithFlags(&m.compute, cudaStreamNonBlocking));
  KVSIM_CUDA_CHECK(cudaStreamCreateWithFlags(&m.copy, cudaStreamNonBlocking));
  for (int b = 0; b < 2; ++b) {
    KVSIM_CUDA_CHECK(cudaEventCreateWithFlags(&m.rows_ready[b], cudaEventDisableTiming));
    KVSIM_CUDA_CHECK(cudaEventCreateWithFlags(&m.copied[b], cudaEventDisableTiming));
  }
  KVSIM_CUBLAS_CHECK(cublasCreate(&m.blas));
  KVSIM_CUBLAS_CHECK(cublasSetStream(m.blas, m.compute));
  m.weights.resize(static_cast<std::size_t>((s.n_layers + 1) * kWeightIds));
  m.cache.resize(static_cast<std::size_t>(s.n_layers));
  reset();
}

CudaTransformer::~CudaTransformer() = default;

CudaTransformer::CudaTransformer(CudaTransformer&&) noexcept = default;
CudaTransformer& CudaTransformer::operator=(CudaTransformer&&) noexcept = default;

const ModelConfig& CudaTransformer::shape() const { return impl_->s; }
std::size_t CudaTransformer::weight_bytes() const { return impl_->weight_bytes; }

std::size_t CudaTransformer::cache_bytes() const {
  std::size_t bytes = 0;
  for (const auto& lc : impl_->cache) {
    bytes += lc.k.bytes + lc.v.bytes;
    for (const auto& p : lc.packed) bytes += Impl::bytes_of(p.k) + Impl::bytes_of(p.v);
    if (!lc.packed.empty()) bytes += lc.views.bytes;
  }
  return bytes;
}

std::size_t CudaTransformer::unpack_scratch_bytes() const { return impl_->unpacked_k.bytes + impl_->unpacked_v.bytes; }
std::string CudaTransformer::device_name() const { return impl_->name; }
void CudaTransformer::set_packed_decode(PackedDecode how) { impl_->packed_decode = how; }

std::string CudaTransformer::name() const { return "cuda:" + std::to_string(impl_->device) + " (" + impl_->name + ")"; }

void CudaTransformer::set_weight(WeightId id, int layer, std::span<const float> data) {
  Impl& m = *impl_;
  KVSIM_CUDA_CHECK(cudaSetDevice(m.device));  // the current device is per host thread
  const auto [rows, cols] = weight_shape(m.s, id);
  if (is_per_layer(id) != (layer >= 0) || layer >= m.s.n_layers)
    throw std::invalid_argument(std::string("set_weight: ") + weight_id_name(id) + " at layer " +
                                std::to_string(layer));
  if (static_cast<std::int64_t>(data.size()) != rows * cols)
    throw std::invalid_argument(std::string("set_weight: ") + weight_id_name(id) + " has " +
                                std::to_string(data.size()) + " values, expected " + std::to_string(rows * cols));
  DeviceMem& dst = m.weights[static_cast<std::size_t>((layer + 1) * kWeightIds + static_cast<int>(id))];
  const bool as_half = m.f16 && rows > 1;  // matrices in the GEMM type; norms and biases fp32
  const std::size_t bytes = data.size() * (as_half ? sizeof(std::uint16_t) : sizeof(float));
  if (!dst.ptr) m.weight_bytes += bytes;
  dst.ensure(bytes, m.compute);
  if (as_half) {
    const std::vector<std::uint16_t> h = halves_of(data);
    KVSIM_CUDA_CHECK(cudaMemcpyAsync(dst.ptr, h.data(), bytes, cudaMemcpyHostToDevice, m.compute));
    KVSIM_CUDA_CHECK(cudaStreamSynchronize(m.compute));
  } else {
    KVSIM_CUDA_CHECK(cudaMemcpyAsync(dst.ptr, data.data(), bytes, cudaMemcpyHostToDevice, m.compute));
    KVSIM_CUDA_CHECK(cudaStreamSynchronize(m.compute));
  }
}

WeightSink CudaTransformer::sink() {
  return [this](WeightId id, int layer, std::span<const float> d) { set_weight(id, layer, d); };
}

void CudaTransformer::reset() {
  KVSIM_CUDA_CHECK(cudaSetDevice(impl_->device));
  for (auto& lc : impl_->cache) {
    lc.rows.assign(static_cast<std::size_t>(impl_->s.n_kv_heads), 0);
    lc.packed.clear();
    lc.views.release(impl_->compute);
  }
  impl_->rules.resize(impl_->cache.size());
  for (auto& r : impl_->rules) r.on = false;
  impl_->rule_ready = false;
}

void CudaTransformer::load_layer(int layer, std::span<const HostEntry> entries) {
  Impl& m = *impl_;
  KVSIM_CUDA_CHECK(cudaSetDevice(m.device));
  if (entries.size() != static_cast<std::size_t>(m.s.n_kv_heads) &&
      !per_query_head(m.s, static_cast<int>(entries.size())))
    throw std::invalid_argument("load_layer: " + std::to_string(entries.size()) +
                                " entries, expected n_head_kv or n_head");
  auto& lc = m.cache.at(static_cast<std::size_t>(layer));
  m.rules.at(static_cast<std::size_t>(layer)).on = false;
  m.rule_ready = false;  // the last pass's weights are not over these rows
  const auto d = static_cast<std::size_t>(m.s.head_dim);
  // Packed prefixes are held as stored (a decode step reads them in place, a chunk unpacks the
  // layer first); the buffers hold the fp16 rows after them.
  bool any_packed = false;
  std::int32_t last_position = 0;
  std::vector<std::int64_t> first_fp16(entries.size(), 0);
  std::vector<RowTable> k_tables(entries.size()), v_tables(entries.size());  // outlive the copies below
  for (std::size_t e = 0; e < entries.size(); ++e) {
    const PackedEntry* p = entries[e].packed;
    if (!p) continue;
    check_host_packed(*p, entries[e].rows, m.s.head_dim, static_cast<int>(e));
    check_unwindowed(m.s, layer, static_cast<int>(e));
    k_tables[e] = row_table(p->k, m.s.head_dim);
    v_tables[e] = row_table(p->v, m.s.head_dim);
    any_packed = true;
    first_fp16[e] = p->rows();
    for (const PackedRow& r : p->k.rows) last_position = std::max(last_position, r.position);
  }
  std::int64_t most = 0;
  for (std::size_t e = 0; e < entries.size(); ++e) most = std::max(most, entries[e].rows - first_fp16[e]);
  // Until every copy is in, the layer holds nothing (rows 0, no packed prefix): a load that throws
  // part-way leaves it empty, never with row counts that disagree with its buffers.
  lc.packed.clear();
  lc.rows.assign(entries.size(), 0);
  // The fp16 buffers hold the rows after the packed prefixes, with a quarter more to grow. They stay
  // when the entry count is the same and they fit without being more than twice too large (a
  // policy edits the cache every few steps); otherwise they are re-made, so a cache a codec packed
  // keeps only its few fp16 rows in fp16 (and none when every row is packed).
  const std::int64_t want = most + most / 4;
  const bool fits = lc.k.bytes != 0 && lc.capacity >= most &&
                    lc.k.bytes >= entries.size() * static_cast<std::size_t>(lc.capacity) * d * 2;
  const bool oversized = (want == 0 && lc.capacity > 0) || lc.capacity > 2 * std::max(want, Impl::kMinCacheRows);
  if (!fits || oversized) {
    lc.capacity = 0;
    lc.k.release(m.compute);
    lc.v.release(m.compute);
    if (want > 0) m.ensure_cache(lc, want);
  }
  std::vector<Impl::EntryPacked> packed;
  if (any_packed) {
    m.ensure_rope(last_position);  // rotated low-rank rows read the tables
    packed.resize(entries.size());
    for (std::size_t e = 0; e < entries.size(); ++e) {
      if (!entries[e].packed) continue;
      m.upload(entries[e].packed->k, k_tables[e], packed[e].k);
      m.upload(entries[e].packed->v, v_tables[e], packed[e].v);
    }
  }
  // The fused decode's view of the layer: one PackedEntryView per entry (empty where none is packed).
  std::vector<PackedEntryView> views;
  if (!any_packed) lc.views.release(m.compute);
  if (any_packed) {
    for (const auto& p : packed) views.push_back({p.k.view, p.v.view});
    lc.views.ensure(views.size() * sizeof(PackedEntryView), m.compute);
    KVSIM_CUDA_CHECK(cudaMemcpyAsync(lc.views.ptr, views.data(), views.size() * sizeof(PackedEntryView),
                                     cudaMemcpyHostToDevice, m.compute));
  }
  // All fp16 rows staged in one host buffer, copied, then one wait (the buffers must outlive the copies).
  std::vector<std::uint16_t> hk, hv;
  std::vector<std::size_t> at;
  for (std::size_t e = 0; e < entries.size(); ++e) {
    const auto skip = static_cast<std::size_t>(first_fp16[e]) * d;
    const auto n = static_cast<std::size_t>(entries[e].rows) * d - skip;
    at.push_back(hk.size());
    hk.resize(hk.size() + n);
    hv.resize(hv.size() + n);
    floats_to_halves(entries[e].k + skip, hk.data() + at.back(), n);
    floats_to_halves(entries[e].v + skip, hv.data() + at.back(), n);
  }
  for (std::size_t e = 0; e < entries.size(); ++e) {
    const std::size_t bytes = static_cast<std::size_t>(entries[e].rows - first_fp16[e]) * d * sizeof(std::uint16_t);
    if (bytes == 0) continue;
    KVSIM_CUDA_CHECK(cudaMemcpyAsync(lc.k.as<std::uint16_t>() + e * lc.capacity * d, hk.data() + at[e], bytes,
                                     cudaMemcpyHostToDevice, m.compute));
    KVSIM_CUDA_CHECK(cudaMemcpyAsync(lc.v.as<std::uint16_t>() + e * lc.capacity * d, hv.data() + at[e], bytes,
                                     cudaMemcpyHostToDevice, m.compute));
  }
  KVSIM_CUDA_CHECK(cudaStreamSynchronize(m.compute));
  for (std::size_t e = 0; e < packed.size(); ++e) packed[e].rows = first_fp16[e];
  lc.packed = std::move(packed);
  for (std::size_t e = 0; e < entries.size(); ++e) lc.rows[e] = entries[e].rows;
}

void CudaTransformer::keep_rows(int layer, int entry, std::span<const std::int64_t> rows) {
  Impl& m = *impl_;
  KVSIM_CUDA_CHECK(cudaSetDevice(m.device));
  auto& lc = m.cache.at(static_cast<std::size_t>(layer));
  const std::int64_t have = lc.rows.at(static_cast<std::size_t>(entry));
  if (lc.packed_rows(static_cast<std::size_t>(entry)) > 0)
    throw std::invalid_argument("keep_rows: entry " + std::to_string(entry) + " of layer " + std::to_string(layer) +
                                " is held packed; load the layer again instead");
  if (m.rules.at(static_cast<std::size_t>(layer)).on)
    throw std::invalid_argument("keep_rows: layer " + std::to_string(layer) + " evicts by its decode rule");
  m.rule_ready = false;
  std::vector<std::int32_t> idx(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= have || (i > 0 && rows[i] <= rows[i - 1]))
      throw std::invalid_argument("keep_rows: row " + std::to_string(rows[i]) + " of an entry of " +
                                  std::to_string(have) + " rows (rows must increase)");
    idx[i] = static_cast<std::int32_t>(rows[i]);
  }
  const auto n = static_cast<int>(idx.size()), d = m.s.head_dim;
  const std::size_t bytes = static_cast<std::size_t>(n) * static_cast<std::size_t>(d) * sizeof(std::uint16_t);
  m.keep_index.ensure(std::max<std::size_t>(idx.size(), 1) * sizeof(std::int32_t), m.compute);
  m.keep_scratch.ensure(std::max<std::size_t>(bytes, 1), m.compute);
  KVSIM_CUDA_CHECK(cudaMemcpyAsync(m.keep_index.ptr, idx.data(), idx.size() * sizeof(std::int32_t),
                                   cudaMemcpyHostToDevice, m.compute));
  for (DeviceMem* buf : {&lc.k, &lc.v}) {  // gather into scratch, then back to the entry's start
    std::uint16_t* base = buf->as<std::uint16_t>() + static_cast<std::size_t>(entry) * lc.capacity * d;
    KVSIM_CUDA_CHECK(
        gather_half_rows(base, m.keep_index.as<std::int32_t>(), n, d, m.keep_scratch.as<std::uint16_t>(), m.compute));
    if (bytes) KVSIM_CUDA_CHECK(cudaMemcpyAsync(base, m.keep_scratch.ptr, bytes, cudaMemcpyDeviceToDevice, m.compute));
  }
  KVSIM_CUDA_CHECK(cudaStreamSynchronize(m.compute));  // idx is host memory of this call
  lc.rows[static_cast<std::size_t>(entry)] = n;
}

int CudaTransformer::entries(int layer) const {
  return static_cast<int>(impl_->cache.at(static_cast<std::size_t>(layer)).rows.size());
}

std::int64_t CudaTransformer::rows(int layer, int entry) const {
  return impl_->cache.at(static_cast<std::size_t>(layer)).rows.at(static_cast<std::size_t>(entry));
}

std::vector<float> CudaTransformer::entry_k(int layer, int entry) const { return impl_->download(layer, entry, true); }
std::vector<float> CudaTransformer::entry_v(int layer, int entry) const { return impl_->download(layer, entry, false); }

void CudaTransformer::set_last_on_host(bool on) { impl_->last_on_host = on; }

void CudaTransformer::start_rule(int layer, const DecodeRuleStart& start) {
  Impl& m = *impl_;
  KVSIM_CUDA_CHECK(cudaSetDevice(m.device));
  auto& lc = m.cache.at(static_cast<std::size_t>(layer));
  if (!lc.packed.empty())
    throw std::invalid_argument("start_rule: layer " + std::to_string(layer) +
                                " holds packed entries; a decode rule compacts fp16 rows");
  check_rule_start(start, lc.rows, m.s.n_q_heads);
  auto& r = m.rules[static_cast<std::size_t>(layer)];
  r.on = false;
  m.rule_ready = false;  // a step needs a pass over the rows the rule starts from
  const std::size_t scored = start.rule.layer_wide ? 1 : lc.rows.size();
  const std::int64_t most = *std::max_element(lc.rows.begin(), lc.rows.end());
  const std::int64_t cap = std::max<std::int64_t>(most + most / 4, Impl::kMinCacheRows);
  r.scores.ensure(scored * static_cast<std::size_t>(cap) * sizeof(double), m.compute);
  r.score_cap = cap;
  if (start.rule.accumulate) {
    for (std::size_t e = 0; e < scored; ++e)
      if (!start.scores[e].empty())
        KVSIM_CUDA_CHECK(cudaMemcpyAsync(r.scores.as<double>() + e * static_cast<std::size_t>(cap),
                                         start.scores[e].data(), start.scores[e].size() * sizeof(double),
                                         cudaMemcpyHostToDevice, m.compute));
    KVSIM_CUDA_CHECK(cudaStreamSynchronize(m.compute));  // the host scores belong to the caller
  }
  r.rule = start.rule;
  r.scored_rows.assign(lc.rows.begin(), lc.rows.begin() + static_cast<std::ptrdiff_t>(scored));
  r.on = true;
}

std::vector<std::vector<std::vector<std::int64_t>>> CudaTransformer::rule_step(std::int64_t budget) {
  Impl& m = *impl_;
  KVSIM_CUDA_CHECK(cudaSetDevice(m.device));
  if (!m.rule_ready) throw std::logic_error("rule_step: no one-row forward() with record_last since the last step");
  m.rule_ready = false;
  budget = std::max<std::int64_t>(budget, 0);  // below 0 drops as much as 0 does
  const auto L = static_cast<std::size_t>(m.s.n_layers);
  std::vector<std::vector<std::vector<std::int64_t>>> out(L);
  // One report for every layer, sized by the most any entry can lose: rows - budget.
  std::int64_t most = 0;
  std::size_t widest = 0, n_rules = 0;
  for (std::size_t l = 0; l < L; ++l) {
    const auto& r = m.rules[l];
    if (!r.on) continue;
    ++n_rules;
    widest = std::max(widest, m.cache[l].rows.size());
    for (auto rows : m.cache[l].rows) most = std::max(most, rows);
    if (!r.rule.accumulate) continue;
    for (std::size_t e = 0; e < r.scored_rows.size(); ++e)
      if (m.cache[l].rows[e] != r.scored_rows[e] + 1)
        throw std::invalid_argument("rule_step: entry " + std::to_string(e) + " of layer " + std::to_string(l) +
                                    " holds " + std::to_string(m.cache[l].rows[e]) + " rows, its scores cover " +
                                    std::to_string(r.scored_rows[e]) + " (one new row expected)");
  }
  if (n_rules == 0) return out;
  const int report_stride = static_cast<int>(1 + std::max<std::int64_t>(most - budget, 0));
  const std::size_t per_layer = widest * static_cast<std::size_t>(report_stride);
  std::vector<std::int32_t> report(n_rules * per_layer);
  try {
    // Every buffer first: once a layer's kernels have run, nothing below may fail but the kernels.
    const std::size_t work = widest * static_cast<std::size_t>(most);
    m.rule_gone.ensure(std::max<std::size_t>(work, 1), m.compute);
    m.rule_kept.ensure(std::max<std::size_t>(work, 1) * sizeof(std::int32_t), m.compute);
    m.rule_report.ensure(n_rules * per_layer * sizeof(std::int32_t), m.compute);
    m.grow_rule_scores();
    std::size_t slot = 0;
    for (std::size_t l = 0; l < L; ++l) {
      auto& r = m.rules[l];
      if (!r.on) continue;
      auto& lc = m.cache[l];
      RuleStepArgs a;
      a.rule = r.rule;
      a.weights =
          m.probs.as<float>() + l * static_cast<std::size_t>(m.s.n_q_heads) * static_cast<std::size_t>(m.last_stride);
      a.stride = m.last_stride;
      a.n_heads = m.s.n_q_heads;
      a.heads_per_entry = m.s.n_q_heads / static_cast<int>(lc.rows.size());
      a.rows = m.entry_rows(lc, 0);
      a.scores = r.scores.as<double>();
      a.score_stride = r.score_cap;
      a.gone = m.rule_gone.as<std::uint8_t>();
      a.kept = m.rule_kept.as<std::int32_t>();
      a.work_stride = most;
      a.report = m.rule_report.as<std::int32_t>() + slot * per_layer;
      a.report_stride = report_stride;
      a.budget = budget;
      KVSIM_CUDA_CHECK(decode_rule_step(a, m.compute));
      KVSIM_CUDA_CHECK(compact_kept_rows(a, lc.k.as<std::uint16_t>(), lc.v.as<std::uint16_t>(), lc.capacity,
                                         m.s.head_dim, m.compute));
      ++slot;
    }
    KVSIM_CUDA_CHECK(cudaMemcpyAsync(report.data(), m.rule_report.ptr, report.size() * sizeof(std::int32_t),
                                     cudaMemcpyDeviceToHost, m.compute));
    KVSIM_CUDA_CHECK(cudaStreamSynchronize(m.compute));
  } catch (...) {
    // Some layers may be compacted and some not: every rule layer is left empty and its rule off,
    // as a load that fails part-way leaves a layer (the caller reloads).
    cudaStreamSynchronize(m.compute);
    for (std::size_t l = 0; l < L; ++l)
      if (m.rules[l].on) {
        m.rules[l].on = false;
        m.cache[l].rows.assign(m.cache[l].rows.size(), 0);
      }
    throw;
  }
  std::size_t slot = 0;
  for (std::size_t l = 0; l < L; ++l) {
    if (!m.rules[l].on) continue;
    auto& lc = m.cache[l];
    out[l].resize(lc.rows.size());
    for (std::size_t e = 0; e < lc.rows.size(); ++e) {
      const std::int32_t* rep = report.data() + slot * per_layer + e * static_cast<std::size_t>(report_stride);
      out[l][e].assign(rep + 1, rep + 1 + rep[0]);
      lc.rows[e] -= rep[0];
    }
    auto& r = m.rules[l];
    for (std::size_t e = 0; e < r.scored_rows.size(); ++e) r.scored_rows[e] = lc.rows[e];
    ++slot;
  }
  return out;
}

std::span<const float> CudaTransformer::last_attention(int layer, int q_head) const {
  const Impl& m = *impl_;
  if (m.last.empty())
    throw std::logic_error(
        "last_attention: the last forward() recorded no last-row weights, or left them on the device");
  const auto& row = m.last.at(static_cast<std::size_t>(layer));
  const std::int64_t seen = m.last_seen.at(static_cast<std::size_t>(layer)).at(static_cast<std::size_t>(q_head));
  return {row.data() + static_cast<std::size_t>(q_head * m.last_stride), static_cast<std::size_t>(seen)};
}

std::vector<float> CudaTransformer::forward(std::span<const std::int32_t> tokens,
                                            std::span<const std::int32_t> positions,
                                            std::span<const std::int64_t> logit_rows, bool want_q, bool record_last,
                                            const LayerCallback& on_layer) {
  KVSIM_CUDA_CHECK(cudaSetDevice(impl_->device));
  impl_->rule_ready = false;
  try {
    auto logits = impl_->forward(tokens, positions, logit_rows, want_q, record_last, on_layer);
    impl_->rule_ready = tokens.size() == 1 && record_last;
    return logits;
  } catch (...) {
    // Nothing queued may outlive the call: it reads the caller's memory and the pinned buffers.
    cudaStreamSynchronize(impl_->compute);
    cudaStreamSynchronize(impl_->copy);
    throw;
  }
}

std::vector<float> CudaTransformer::Impl::forward(std::span<const std::int32_t> tokens,
                                                  std::span<const std::int32_t> positions,
                                                  std::span<const std::int64_t> logit_rows, bool want_q,
                                                  bool record_last, const LayerCallback& on_layer) {
  Impl& m = *this;
  const auto n = static_cast<std::int64_t>(tokens.size());
  if (n == 0 || positions.size() != tokens.size())
    throw std::invalid_argument("forward: tokens and positions must be non-empty and equal in length");
  for (const auto t : tokens)
    if (t < 0 || t >= s.vocab) throw std::invalid_argument("forward: token id " + std::to_string(t) + " out of range");
  if (*std::min_element(positions.begin(), positions.end()) < 0)
    throw std::invalid_argument("forward: negative position");
  for (const auto r : logit_rows)
    if (r < 0 || r >= n) throw std::invalid_argument("forward: logit row " + std::to_string(r) + " out of range");
  const std::int64_t E = s.n_embd, Q = s.q_dim(), K = s.kv_dim(), F = s.n_ff;
  const int d = s.head_dim;
  m.ensure_work(n, logit_rows.size(), static_cast<bool>(on_layer));
  m.ensure_rope(*std::max_element(positions.begin(), positions.end()));
  cudaStream_t st = m.compute;
  KVSIM_CUDA_CHECK(cudaMemcpyAsync(m.dev_tokens.ptr, tokens.data(), tokens.size_bytes(), cudaMemcpyHostToDevice, st));
  KVSIM_CUDA_CHECK(
      cudaMemcpyAsync(m.dev_positions.ptr, positions.data(), positions.size_bytes(), cudaMemcpyHostToDevice, st));
  const DeviceMem& embd = m.w(WeightId::TokenEmbd, -1);
  KVSIM_CUDA_CHECK(embed_rows(embd.ptr, f16, m.dev_tokens.as<std::int32_t>(), static_cast<int>(n), static_cast<int>(E),
                              static_cast<float>(s.embd_scale), m.x.as<float>(), st));
  const float scale = attention_scale(s);
  const auto eps = static_cast<float>(s.rms_eps);
  const QkvShape qs{s.n_q_heads, s.n_kv_heads, d, s.rope.rope_dim, s.rope.type == RopeType::Neox};

  // Last-row weights: one device block [layers, n_head, stride], fetched once after the layers.
  m.last.clear();  // until this pass succeeds there are no weights to hand out
  if (record_last) {
    std::int64_t most = 0;
    for (const auto& lc : m.cache)
      for (auto r : lc.rows) most = std::max(most, r + n);
    m.last_stride = most;
    m.probs.ensure(static_cast<std::size_t>(s.n_layers) * s.n_q_heads * most * sizeof(float), st);
    m.last_seen.assign(static_cast<std::size_t>(s.n_layers),
                       std::vector<std::int64_t>(static_cast<std::size_t>(s.n_q_heads)));
  }

  // The host side of the capture: layer l's rows, copied while layer l + 1 computes.
  auto deliver = [&](int layer) {
    const int b = layer % 2;
    KVSIM_CUDA_CHECK(cudaEventSynchronize(m.copied[b]));
    on_layer(LayerRows{layer, n, want_q ? m.pq[b].ptr : nullptr, m.pk[b].ptr, m.pv[b].ptr});
  };

  for (int l = 0; l < s.n_layers; ++l) {
    const int b = l % 2;
    // Buffer b was last read by layer l - 2's copy.
    if (on_layer && l >= 2) KVSIM_CUDA_CHECK(cudaStreamWaitEvent(st, m.copied[b], 0));
    float *qb = m.q[b].as<float>(), *kb = m.k[b].as<float>(), *vb = m.v[b].as<float>();
    KVSIM_CUDA_CHECK(rms_norm_rows(m.x.as<float>(), m.w(WeightId::AttnNorm, l).as<float>(), static_cast<int>(n),
                                   static_cast<int>(E), eps, m.in.ptr, f16, st));
    m.gemm(m.in.ptr, n, m.w(WeightId::Wq, l), Q, E, qb, false);
    m.gemm(m.in.ptr, n, m.w(WeightId::Wk, l), K, E, kb, false);
    m.gemm(m.in.ptr, n, m.w(WeightId::Wv, l), K, E, vb, false);
    const QkvFinish fin{m.bias(WeightId::Bq, l),       m.bias(WeightId::Bk, l),       m.bias(WeightId::Bv, l),
                        m.qk_norm(WeightId::QNorm, l), m.qk_norm(WeightId::KNorm, l), eps};
    const int window = s.window(l);
    const bool local = window > 0 && s.rope_theta_local > 0;  // this layer's RoPE base
    KVSIM_CUDA_CHECK(qkv_finish(qs, static_cast<int>(n), qb, kb, vb, fin, m.dev_positions.as<std::int32_t>(),
                                (local ? m.cos_local : m.cos_t).as<float>(),
                                (local ? m.sin_local : m.sin_t).as<float>(), m.kh.as<std::uint16_t>(),
                                m.vh.as<std::uint16_t>(), st));
    if (on_layer) {
      KVSIM_CUDA_CHECK(cudaEventRecord(m.rows_ready[b], st));
      KVSIM_CUDA_CHECK(cudaStreamWaitEvent(m.copy, m.rows_ready[b], 0));
      const auto kv_bytes = static_cast<std::size_t>(n * K) * sizeof(float);
      if (want_q)
        KVSIM_CUDA_CHECK(cudaMemcpyAsync(m.pq[b].ptr, qb, static_cast<std::size_t>(n * Q) * sizeof(float),
                                         cudaMemcpyDeviceToHost, m.copy));
      KVSIM_CUDA_CHECK(cudaMemcpyAsync(m.pk[b].ptr, kb, kv_bytes, cudaMemcpyDeviceToHost, m.copy));
      KVSIM_CUDA_CHECK(cudaMemcpyAsync(m.pv[b].ptr, vb, kv_bytes, cudaMemcpyDeviceToHost, m.copy));
      KVSIM_CUDA_CHECK(cudaEventRecord(m.copied[b], m.copy));
    }
    m.attend_layer(l, n, qb, record_last, scale);
    m.project_into_residual(n, WeightId::Wo, WeightId::PostAttnNorm, l, Q);
    KVSIM_CUDA_CHECK(rms_norm_rows(m.x.as<float>(), m.w(WeightId::FfnNorm, l).as<float>(), static_cast<int>(n),
                                   static_cast<int>(E), eps, m.in.ptr, f16, st));
    m.gemm(m.in.ptr, n, m.w(WeightId::Wgate, l), F, E, m.gate.as<float>(), false);
    m.gemm(m.in.ptr, n, m.w(WeightId::Wup, l), F, E, m.up.as<float>(), false);
    KVSIM_CUDA_CHECK(
        gated_act(m.gate.as<float>(), m.up.as<float>(), n * F, s.ffn_act == FfnAct::GeluTanh, m.in.ptr, f16, st));
    m.project_into_residual(n, WeightId::Wdown, WeightId::PostFfnNorm, l, F);
    if (on_layer && l >= 1) deliver(l - 1);
  }
  if (on_layer) deliver(s.n_layers - 1);

  return m.finish_forward(logit_rows, record_last);
}

void CudaTransformer::Impl::attend_layer(int l, std::int64_t n, const float* qb, bool record_last, float scale) {
  Impl& m = *this;
  cudaStream_t st = compute;
  const int d = s.head_dim, G = s.group(), window = s.window(l);
  const std::int64_t Q = s.q_dim();
  auto& lc = m.cache[static_cast<std::size_t>(l)];
  const bool pqh = per_query_head(s, static_cast<int>(lc.rows.size()));
  // Inverse divisors: query head h reads entry h / head_div; entry e takes KV head e / entry_div.
  const int head_div = pqh ? 1 : G, entry_div = pqh ? G : 1;
  m.ensure_cache(lc, n);
  const EntryRows past = m.entry_rows(lc, 0), seen = m.entry_rows(lc, n);
  float* last_w =
      record_last ? m.probs.as<float>() + static_cast<std::size_t>(l) * s.n_q_heads * m.last_stride : nullptr;
  if (record_last)
    for (int h = 0; h < s.n_q_heads; ++h)
      m.last_seen[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)] = seen.rows[pqh ? h : h / G];
  std::uint16_t *ck = lc.k.as<std::uint16_t>(), *cv = lc.v.as<std::uint16_t>();
  std::int64_t cap = lc.capacity;
  // The new rows join the fp16 rows (after the packed prefixes, if any).
  KVSIM_CUDA_CHECK(kv_append(m.kh.as<std::uint16_t>(), m.vh.as<std::uint16_t>(), static_cast<int>(n), s.n_kv_heads, d,
                             lc.packed.empty() ? past : m.stored_rows(lc), entry_div, lc.capacity, ck, cv, st));
  if (!lc.packed.empty() && n == 1 && m.packed_decode == PackedDecode::Fused) {
    // Decode reads the packed prefixes where they are, with the last-row weights on the way.
    const RopeShape rope{s.rope.type == RopeType::Neox, s.rope.rope_dim};
    KVSIM_CUDA_CHECK(attend_decode_packed(qb, s.n_q_heads, d, head_div, lc.views.as<const PackedEntryView>(), rope,
                                          m.cos_t.as<float>(), m.sin_t.as<float>(), ck, cv, cap, seen, scale,
                                          m.decode_scratch.as<float>(), m.decode_floats(), m.in.ptr, f16, last_w,
                                          static_cast<int>(m.last_stride), m.head_stats.as<float>(), st));
  } else {
    if (!lc.packed.empty()) {
      // Attention reads the layer unpacked: each entry's packed prefix read back, its fp16 rows
      // after it, in the one-layer scratch.
      cap = 0;
      for (auto r : lc.rows) cap = std::max(cap, r + n);
      const auto ne = lc.rows.size(), per = static_cast<std::size_t>(cap) * static_cast<std::size_t>(d);
      m.unpacked_k.ensure(ne * per * sizeof(std::uint16_t), st);
      m.unpacked_v.ensure(ne * per * sizeof(std::uint16_t), st);
      ck = m.unpacked_k.as<std::uint16_t>();
      cv = m.unpacked_v.as<std::uint16_t>();
      for (std::size_t e = 0; e < ne; ++e) m.materialize(lc, e, n, ck + e * per, cv + e * per);
    }
    if (n == 1)  // decode: split over the keys, or a handful of blocks would walk the whole cache
      KVSIM_CUDA_CHECK(attend_decode(qb, s.n_q_heads, d, head_div, ck, cv, cap, seen, window, scale,
                                     m.decode_scratch.as<float>(), m.decode_floats(), m.in.ptr, f16, st));
    else
      KVSIM_CUDA_CHECK(attend_rows(qb, static_cast<int>(n), s.n_q_heads, d, head_div, ck, cv, cap, past, window, scale,
                                   m.in.ptr, f16, st));
    if (record_last)
      KVSIM_CUDA_CHECK(last_row_weights(qb + (n - 1) * Q, s.n_q_heads, d, head_div, ck, cap, seen, window, scale,
                                        last_w, static_cast<int>(m.last_stride), st));
  }
  for (auto& r : lc.rows) r += n;
}

std::vector<float> CudaTransformer::Impl::finish_forward(std::span<const std::int64_t> logit_rows, bool record_last) {
  Impl& m = *this;
  cudaStream_t st = compute;
  const std::int64_t E = s.n_embd, V = s.vocab;
  const auto eps = static_cast<float>(s.rms_eps);
  std::vector<float> out(logit_rows.size() * static_cast<std::size_t>(V));
  if (!logit_rows.empty()) {
    const auto nl = static_cast<std::int64_t>(logit_rows.size());
    KVSIM_CUDA_CHECK(
        cudaMemcpyAsync(m.dev_logit_rows.ptr, logit_rows.data(), logit_rows.size_bytes(), cudaMemcpyHostToDevice, st));
    KVSIM_CUDA_CHECK(gather_rows(m.x.as<float>(), m.dev_logit_rows.as<std::int64_t>(), static_cast<int>(nl),
                                 static_cast<int>(E), m.xr.as<float>(), st));
    KVSIM_CUDA_CHECK(rms_norm_rows(m.xr.as<float>(), m.w(WeightId::OutputNorm, -1).as<float>(), static_cast<int>(nl),
                                   static_cast<int>(E), eps, m.in.ptr, f16, st));
    m.gemm(m.in.ptr, nl, s.tied_embeddings ? m.w(WeightId::TokenEmbd, -1) : m.w(WeightId::Output, -1), V, E,
           m.logits.as<float>(), false);
    KVSIM_CUDA_CHECK(cudaMemcpyAsync(out.data(), m.logits.ptr, out.size() * sizeof(float), cudaMemcpyDeviceToHost, st));
  }
  if (record_last && m.last_on_host) {
    m.last.assign(static_cast<std::size_t>(s.n_layers),
                  std::vector<float>(static_cast<std::size_t>(s.n_q_heads * m.last_stride)));
    for (int l = 0; l < s.n_layers; ++l)
      KVSIM_CUDA_CHECK(cudaMemcpyAsync(m.last[static_cast<std::size_t>(l)].data(),
                                       m.probs.as<float>() + static_cast<std::size_t>(l) * s.n_q_heads * m.last_stride,
                                       m.last[static_cast<std::size_t>(l)].size() * sizeof(float),
                                       cudaMemcpyDeviceToHost, st));
  }
  KVSIM_CUDA_CHECK(cudaStreamSynchronize(st));
  return out;
}

}  // namespace kvsim::gpu
