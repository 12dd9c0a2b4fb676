#include "model/transformer_weights.h"

#include <string>
#include <vector>

#include "model/gguf.h"
#include "core/error.h"

namespace kvsim {

void load_transformer_weights(const GgufFile& f, const ModelConfig& s, const gpu::WeightSink& sink) {
  std::vector<float> buf;
  for (const auto& [id, layer] : gpu::weight_list(s)) {
    const bool bias = id == gpu::WeightId::Bq || id == gpu::WeightId::Bk || id == gpu::WeightId::Bv;
    const std::string name = (layer >= 0 ? "blk." + std::to_string(layer) + "." : std::string()) +
                             gpu::weight_id_name(id) + (bias ? "" : ".weight");
    const auto [rows, cols] = gpu::weight_shape(s, id);
    const GgufTensor& t = f.tensor(name);
    if (t.row_size() != cols || t.rows() != rows)
      throw FormatError(f.path() + ": tensor '" + name + "' has shape [" + std::to_string(t.row_size()) + ", " +
                        std::to_string(t.rows()) + "], expected [" + std::to_string(cols) + ", " +
                        std::to_string(rows) + "]");
    buf.resize(static_cast<std::size_t>(rows * cols));
    f.dequantize_rows(t, 0, rows, buf);
    sink(id, layer, buf);
  }
}

}  // namespace kvsim
