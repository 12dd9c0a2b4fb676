#pragma once
// Read-only kvtrace access. Streams one (request, layer, tensor) at a time into caller buffers
// so replay never holds more than a layer of a request; opening checks format and version, and
// first survives a hostile file (see TraceOpen).
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "traces/trace_schema.h"

namespace kvsim {

// HDF5 1.10 itself can crash on a corrupt object header or chunk index (docs/fuzzing.md). So by
// default an open first walks, in a forked child, every object a reader may touch
// (probe_trace, traces/trace_probe.h); a crash there is a FormatError naming the file, before this
// process touches it. Code that already runs in such a child opens Trusted.
enum class TraceOpen { Probed, Trusted };

class TraceReader {
 public:
  explicit TraceReader(const std::string& path, TraceOpen how = TraceOpen::Probed);
  ~TraceReader();
  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;

  const std::string& path() const { return path_; }
  const ModelGeometry& geometry() const { return geometry_; }
  const CaptureInfo& capture() const { return capture_; }
  // Committed requests, in the order they were written.
  const std::vector<std::string>& request_ids() const { return complete_; }
  // Requests whose writer stopped before committing them (their data must not be used).
  const std::vector<std::string>& incomplete_request_ids() const { return incomplete_; }

  // Header of a committed request; throws FormatError naming the request and dataset when the
  // stored header is inconsistent (shapes, ranges, monotonic positions).
  RequestHeader header(const std::string& id) const;
  ReferenceDistribution reference(const std::string& id) const;

  // Element count of one layer of a tensor: T*Hkv*d for K/V, Tq*Hq*d for Q.
  std::size_t layer_elements(const std::string& id, Tensor t) const;
  // One layer of K, V or Q as raw half bits, or converted to f32. dst.size() must equal
  // layer_elements(); layout [tokens, heads, head_dim].
  void read_layer_half(const std::string& id, Tensor t, int layer, std::span<std::uint16_t> dst) const;
  void read_layer(const std::string& id, Tensor t, int layer, std::span<float> dst) const;
  // Every header and reference dataset of the request read once (checksums checked): one error
  // line per dataset that fails, naming it; empty when all read. `trace check` runs it so that one
  // damaged array does not hide another.
  std::vector<std::string> unreadable_arrays(const std::string& id) const;
  // Whether the request's K/V/Q chunks carry checksums (every file since they were added; HDF5
  // then verifies each chunk it reads and a damaged one fails naming request, tensor and layer).
  bool checksummed(const std::string& id) const;
  // KVzip's reconstruction pass, when the capture recorded one: its chunk table and rows, and one
  // layer of its queries [rows, n_q_heads, d] and keys [rows, n_kv_heads, d] (q.k left empty).
  bool has_repeat_pass(const std::string& id) const;
  RepeatPass repeat_pass_table(const std::string& id) const;
  void read_repeat_layer(const std::string& id, int layer, std::vector<float>& q, std::vector<float>& k) const;

  // A chunked request's chunks computed alone, when the capture recorded them: the chunk table,
  // and one layer of their keys and values [rows, n_kv_heads, d] (k, v left empty).
  bool has_chunk_states(const std::string& id) const;
  ChunkStateRecord chunk_state_table(const std::string& id) const;
  void read_chunk_state_layer(const std::string& id, int layer, std::vector<float>& k, std::vector<float>& v) const;

  // Touches every HDF5 object of request `id` that the reads above may touch, as they touch it:
  // header, reference and every header array; per tensor and layer the chunk index entry that a
  // checksummed layer is read through, or the whole layer where HDF5's pipeline reads it; the
  // repeat pass. What probe_trace runs in its child; errors are skipped (the reads raise them).
  void walk_request(const std::string& id) const;

 private:
  struct OpenRequest;
  const OpenRequest& open_request(const std::string& id) const;
  // Checks a layer read's arguments; returns the error-message prefix naming request and tensor.
  std::string layer_context(const std::string& id, Tensor t, int layer, std::size_t dst_size) const;

  std::string path_;
  ModelGeometry geometry_;
  CaptureInfo capture_;
  std::vector<std::string> complete_;
  std::vector<std::string> incomplete_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvsim
