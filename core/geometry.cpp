#include "core/geometry.h"

#include <stdexcept>

namespace kvsim {

bool same_kv_shape(const ModelGeometry& a, const ModelGeometry& b) {
  return a.n_layers == b.n_layers && a.n_q_heads == b.n_q_heads && a.n_kv_heads == b.n_kv_heads &&
         a.head_dim == b.head_dim;
}

std::string kv_shape(const ModelGeometry& g) {
  return std::to_string(g.n_layers) + " layers, " + std::to_string(g.n_q_heads) + "/" + std::to_string(g.n_kv_heads) +
         " query/KV heads, head_dim " + std::to_string(g.head_dim);
}

void ModelConfig::check() const {
  auto bad = [](const std::string& what) { throw std::invalid_argument("model config: " + what); };
  if (n_layers <= 0) bad("n_layers must be > 0");
  if (n_embd <= 0 || n_ff <= 0 || vocab <= 0) bad("n_embd, n_ff and vocab must be > 0");
  if (n_q_heads <= 0 || n_kv_heads <= 0 || n_q_heads % n_kv_heads != 0)
    bad("n_q_heads (" + std::to_string(n_q_heads) + ") must be a positive multiple of n_kv_heads (" +
        std::to_string(n_kv_heads) + ")");
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > 256) bad("head_dim must be even and in [2, 256]");
  if (rope.head_dim != head_dim || rope.rope_dim <= 0 || rope.rope_dim > head_dim || rope.rope_dim % 2 != 0)
    bad("rope dims must be even and within head_dim");
}

}  // namespace kvsim
