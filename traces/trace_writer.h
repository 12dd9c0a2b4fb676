#pragma once
// Append-oriented kvtrace writer: one request at a time, layer by layer. Each layer of each
// tensor is one HDF5 chunk, so replay reads a (request, layer) with a single contiguous read.
// Crash safety: the request's group is created and flushed with status "writing" before any
// tensor data, and flipped to "complete" (and flushed) only after the last write, so a writer
// killed midway leaves every earlier request readable and this one detectably incomplete.
#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <string>

#include "traces/trace_schema.h"

namespace kvsim {

struct TraceWriterOptions {
  bool overwrite = false;  // refuse to replace an existing file unless asked: no lost data
  int deflate_level = 0;   // 0 = uncompressed (default: f16 K/V barely compress, see bench/)
  // A Fletcher32 checksum on every chunk of every dataset, which HDF5 verifies on every read
  // (docs/trace-format.md). Off only to write a file as kvsim did before checksums (tests).
  bool checksums = true;
  // Continue a file an earlier writer was stopped in (kvsim capture --resume): its committed
  // requests stay, a request it left incomplete is removed, new ones follow. The file's geometry
  // and capture configuration must be this writer's.
  bool append = false;
};

class TraceWriter {
 public:
  TraceWriter(const std::string& path, const ModelGeometry& geometry, const CaptureInfo& capture,
              const TraceWriterOptions& options = {});
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Starts a request; its header is validated against the geometry and written at once.
  void begin_request(const RequestHeader& header);
  // Layers must come in order 0..n_layers-1. Spans hold raw half bits:
  // k, v: [T, n_kv_heads, head_dim]; q: [Tq, n_q_heads, head_dim].
  void write_layer(int layer, std::span<const std::uint16_t> k, std::span<const std::uint16_t> v,
                   std::span<const std::uint16_t> q);
  // Same, from f32 (converted to half with round-to-nearest-even).
  void write_layer_f32(int layer, std::span<const float> k, std::span<const float> v, std::span<const float> q);
  // Required when the header announced ref_rows > 0; shapes must match it.
  void write_reference(const ReferenceDistribution& ref);
  // Optional, once per request: KVzip's reconstruction pass (every layer at once).
  void write_repeat_pass(const RepeatPass& pass);
  // Optional, once per request: its chunks computed alone (every layer at once).
  void write_chunk_states(const ChunkStateRecord& states);
  // Marks the request complete and flushes the file.
  void commit_request();

  // Flushes and closes; a request begun but not committed stays marked incomplete.
  void close();
  const std::string& path() const { return path_; }
  // Request ids in this file: committed by earlier writers (append), and begun by this one.
  const std::set<std::string>& written_ids() const;
  std::int64_t requests_written() const { return n_committed_; }

 private:
  void open_for_append(const ModelGeometry& geometry, const CaptureInfo& capture);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
  std::int64_t n_committed_ = 0;
};

}  // namespace kvsim
