#include "traces/shape_attrs.h"

#include "traces/h5_handle.h"

namespace kvsim::h5 {

void write_shape_attrs(hid_t group, const ModelGeometry& g) {
  write_attr_string(group, "name", g.name);
  write_attr_string(group, "arch", g.arch);
  write_attr_i64(group, "n_layers", g.n_layers);
  write_attr_i64(group, "n_q_heads", g.n_q_heads);
  write_attr_i64(group, "n_kv_heads", g.n_kv_heads);
  write_attr_i64(group, "head_dim", g.head_dim);
}

void read_shape_attrs(hid_t group, const std::string& context, ModelGeometry& g) {
  g.name = read_attr_string(group, "name", context);
  g.arch = read_attr_string(group, "arch", context);
  g.n_layers = static_cast<int>(read_attr_i64(group, "n_layers", context));
  g.n_q_heads = static_cast<int>(read_attr_i64(group, "n_q_heads", context));
  g.n_kv_heads = static_cast<int>(read_attr_i64(group, "n_kv_heads", context));
  g.head_dim = static_cast<int>(read_attr_i64(group, "head_dim", context));
}

}  // namespace kvsim::h5
