#pragma once
// The model shape as HDF5 attributes (name, arch, n_layers, n_q_heads, n_kv_heads, head_dim):
// what both of kvsim's HDF5 formats carry, a trace's /model group and a learned model file's
// /geometry, written and read here once.
#include <hdf5.h>

#include <string>

#include "core/geometry.h"

namespace kvsim::h5 {

void write_shape_attrs(hid_t group, const ModelGeometry& g);
// Fills those fields of `g` from `group`; errors name `context` and the attribute.
void read_shape_attrs(hid_t group, const std::string& context, ModelGeometry& g);

}  // namespace kvsim::h5
