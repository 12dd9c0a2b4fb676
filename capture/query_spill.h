#pragma once
// Spill file for the queries a capture keeps. The engine produces Q chunk by chunk for all layers
// at once while the trace stores one chunk per (request, layer), so Q has to wait until the
// request ends; parking it in an unlinked scratch file (page cache, not process memory) keeps the
// capture's footprint at the model, its KV cache and a layer of trace buffers. K and V need no
// spill: they are the engine's own cache.
#include <cstdint>
#include <string>
#include <vector>

namespace kvsim {

class QuerySpill {
 public:
  // Creates the scratch file next to `near` (e.g. the trace being written) and unlinks it at
  // once, so nothing is left behind even if the process is killed. Throws naming the path.
  QuerySpill(const std::string& near, int n_layers, std::int64_t row_values);
  ~QuerySpill();
  QuerySpill(const QuerySpill&) = delete;
  QuerySpill& operator=(const QuerySpill&) = delete;

  // Appends `n` rows of `row_values` f32 (stored as f16) to `layer`.
  void append(int layer, const float* rows, std::int64_t n);
  std::int64_t rows(int layer) const;
  // All rows of `layer` in append order, as f16 bits.
  std::vector<std::uint16_t> read_layer(int layer) const;
  void clear();  // forgets every row (the next request starts at offset 0)

 private:
  struct Record {
    std::int64_t offset, rows;
  };
  std::string path_;
  int fd_ = -1;
  std::int64_t row_values_, end_ = 0;
  std::vector<std::vector<Record>> records_;  // per layer
  std::vector<std::uint16_t> staging_;
};

}  // namespace kvsim
