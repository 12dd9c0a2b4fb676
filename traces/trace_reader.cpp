#include "traces/trace_reader.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "traces/fletcher32.h"
#include "traces/trace_probe.h"
#include "traces/h5_handle.h"
#include "traces/shape_attrs.h"
#include "traces/trace_layout.h"

namespace kvsim {

using h5::check;
using h5::check_status;
using h5::Handle;

namespace {
constexpr std::size_t kTileElements = 128 * 1024;  // 256 KiB of halves, 512 KiB of floats: fit L2
}  // namespace

struct TraceReader::OpenRequest {
  std::string id;
  Handle group;
  Handle tensors[3];                         // k, v, q
  bool filtered[3] = {false, false, false};  // compressed or checksummed: read a whole chunk at a time
  bool checksummed = true;                   // every tensor's chunks carry a Fletcher32 checksum
  bool direct[3] = {false, false, false};    // Fletcher32 alone: read raw, checked by h5::fletcher32
  std::int64_t T = 0, Tq = 0;
};

struct TraceReader::Impl {
  Handle file;
  Handle requests;
  OpenRequest current;  // the last request touched: replay reads many layers of one request
  std::vector<std::uint16_t> scratch;
  std::vector<std::uint8_t> chunk;  // a stored chunk with its checksum
};

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : "\n") + x;
  return s;
}

struct CheckedDataset {
  Handle d;
  std::vector<hsize_t> shape;
  std::size_t n = 0;  // elements
};

// Opens a dataset of `rank` dimensions holding integers (or floats, by mem_type's class), checking
// its rank, class and extent; reads nothing.
CheckedDataset open_checked(hid_t group, const char* name, hid_t mem_type, const std::string& ctx, int rank) {
  if (!h5::link_exists(group, name)) throw FormatError(ctx + ": dataset '" + name + "' is missing");
  Handle d = check(H5Dopen2(group, name, H5P_DEFAULT), ctx + ": opening dataset '" + name + "'");
  const auto shape = h5::dataset_shape(d.get());
  if (static_cast<int>(shape.size()) != rank)
    throw FormatError(ctx + ": dataset '" + name + "' has shape " + h5::shape_string(shape) + ", expected rank " +
                      std::to_string(rank));
  Handle type = check(H5Dget_type(d.get()), ctx + ": type of '" + name + "'");
  const H5T_class_t cls = H5Tget_class(type.get());
  const bool want_float = H5Tget_class(mem_type) == H5T_FLOAT;
  if (cls != (want_float ? H5T_FLOAT : H5T_INTEGER))
    throw FormatError(ctx + ": dataset '" + name + "' must hold " + (want_float ? "floats" : "integers"));
  const auto n = static_cast<std::size_t>(h5::element_count(shape, ctx + ": dataset '" + name + "'"));
  // Token-indexed data is int32-addressed; a larger extent is a corrupt or hostile file.
  if (n > (std::size_t{1} << 31))
    throw FormatError(ctx + ": dataset '" + name + "' claims " + std::to_string(n) + " elements, expected < 2^31");
  h5::check_stored(d.get(), n, H5Tget_size(mem_type), ctx + ": dataset '" + name + "'");
  return {std::move(d), shape, n};
}

// Reads a dataset of integers (or floats) checked by open_checked; type conversion by HDF5.
template <typename T>
std::vector<T> read_ints(hid_t group, const char* name, hid_t mem_type, const std::string& ctx,
                         std::vector<hsize_t>* shape_out = nullptr, int rank = 1) {
  auto [d, shape, n] = open_checked(group, name, mem_type, ctx, rank);
  std::vector<T> out(n);
  if (n > 0)
    check_status(H5Dread(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()),
                 ctx + ": reading dataset '" + name + "'");
  if (shape_out) *shape_out = shape;
  return out;
}

std::int64_t attr_or(hid_t obj, const char* name, std::int64_t fallback, const std::string& ctx) {
  return h5::attr_exists(obj, name) ? h5::read_attr_i64(obj, name, ctx) : fallback;
}

}  // namespace

TraceReader::TraceReader(const std::string& path, TraceOpen how) : path_(path), impl_(std::make_unique<Impl>()) {
  h5::silence_library_errors();
  if (!std::filesystem::exists(path)) throw Error(path + ": no such file");
  if (how == TraceOpen::Probed) probe_trace(path);
  if (H5Fis_hdf5(path.c_str()) <= 0) throw FormatError(path + ": not an HDF5 file (expected a kvtrace HDF5 file)");
  impl_->file = check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path + ": cannot open HDF5 file");
  const hid_t root = impl_->file.get();
  const std::string rctx = path + ": root";
  if (!h5::attr_exists(root, layout::kFormatAttr))
    throw FormatError(path + ": root attribute 'format' is missing, expected \"" + kTraceFormat +
                      "\" (not a kvtrace file)");
  const std::string format = h5::read_attr_string(root, layout::kFormatAttr, rctx);
  if (format != kTraceFormat)
    throw FormatError(path + ": root attribute 'format' is \"" + format + "\", expected \"" + kTraceFormat + "\"");
  const std::int64_t version = h5::read_attr_i64(root, layout::kVersionAttr, rctx);
  if (version != kTraceVersion)
    throw FormatError(path + ": kvtrace version " + std::to_string(version) +
                      " is not supported; this kvsim reads version " + std::to_string(kTraceVersion));

  if (!h5::link_exists(root, layout::kModelGroup)) throw FormatError(path + ": group '/model' is missing");
  Handle model = check(H5Gopen2(root, layout::kModelGroup, H5P_DEFAULT), path + ": opening /model");
  const std::string mctx = path + ": /model";
  const hid_t m = model.get();
  h5::read_shape_attrs(m, mctx, geometry_);
  geometry_.vocab = h5::read_attr_i64(m, "vocab", mctx);
  geometry_.rope.theta = h5::read_attr_f64(m, "rope_theta", mctx);
  geometry_.rope.type = parse_rope_type(h5::read_attr_string(m, "rope_type", mctx), mctx);
  geometry_.rope.rope_dim = static_cast<int>(h5::read_attr_i64(m, "rope_dim", mctx));
  geometry_.rope.head_dim = geometry_.head_dim;
  if (h5::link_exists(m, "sliding_window"))
    geometry_.sliding_window = read_ints<int>(m, "sliding_window", H5T_NATIVE_INT, mctx);
  if (h5::attr_exists(m, "rope_theta_local"))
    geometry_.rope_theta_local = h5::read_attr_f64(m, "rope_theta_local", mctx);
  const auto gp = geometry_problems(geometry_, path);
  if (!gp.empty()) throw FormatError(join(gp));

  if (h5::link_exists(root, layout::kCaptureGroup)) {
    Handle cap = check(H5Gopen2(root, layout::kCaptureGroup, H5P_DEFAULT), path + ": opening /capture");
    const std::string cctx = path + ": /capture";
    const hid_t c = cap.get();
    auto str = [&](const char* n) { return h5::attr_exists(c, n) ? h5::read_attr_string(c, n, cctx) : ""; };
    capture_.tool_version = str("tool_version");
    capture_.backend = str("backend");
    capture_.date = str("date");
    capture_.config = str("config");
    capture_.seed = static_cast<std::uint64_t>(attr_or(c, "seed", 0, cctx));
  }

  if (!h5::link_exists(root, layout::kRequestsGroup)) throw FormatError(path + ": group '/requests' is missing");
  impl_->requests = check(H5Gopen2(root, layout::kRequestsGroup, H5P_DEFAULT), path + ": opening /requests");
  std::vector<std::pair<std::int64_t, std::string>> ordered;
  for (const std::string& id : h5::child_names(impl_->requests.get(), path + ": /requests")) {
    const std::string ctx = path + ": request '" + id + "'";
    // A request whose group cannot even be opened (a writer killed between two metadata
    // writes) is incomplete; it must not make the committed ones unreadable.
    try {
      Handle g = check(H5Gopen2(impl_->requests.get(), id.c_str(), H5P_DEFAULT), ctx + ": not a group");
      const std::string status = h5::attr_exists(g.get(), layout::kStatusAttr)
                                     ? h5::read_attr_string(g.get(), layout::kStatusAttr, ctx)
                                     : std::string("missing");
      const std::int64_t index = attr_or(g.get(), layout::kIndexAttr, 0, ctx);
      if (status == layout::kStatusComplete)
        ordered.emplace_back(index, id);
      else
        incomplete_.push_back(id);
    } catch (const FormatError&) {
      incomplete_.push_back(id);
    }
  }
  std::sort(ordered.begin(), ordered.end());
  for (auto& [index, id] : ordered) complete_.push_back(id);
}

TraceReader::~TraceReader() = default;

const TraceReader::OpenRequest& TraceReader::open_request(const std::string& id) const {
  OpenRequest& cur = impl_->current;
  if (cur.group.valid() && cur.id == id) return cur;
  const std::string ctx = path_ + ": request '" + id + "'";
  if (std::find(complete_.begin(), complete_.end(), id) == complete_.end()) {
    if (std::find(incomplete_.begin(), incomplete_.end(), id) != incomplete_.end())
      throw FormatError(ctx + " is incomplete (its writer stopped before committing it)");
    throw Error(ctx + " does not exist");
  }
  cur = OpenRequest{};
  cur.group = check(H5Gopen2(impl_->requests.get(), id.c_str(), H5P_DEFAULT), ctx + ": opening group");
  // Lengths only: the tensors stay readable (and checkable) when the header's data is damaged.
  const auto T = static_cast<hsize_t>(open_checked(cur.group.get(), "tokens", H5T_NATIVE_INT32, ctx, 1).n);
  const auto Tq = static_cast<hsize_t>(open_checked(cur.group.get(), "q_index", H5T_NATIVE_INT32, ctx, 1).n);
  const hsize_t L = static_cast<hsize_t>(geometry_.n_layers), d = static_cast<hsize_t>(geometry_.head_dim);
  const std::vector<hsize_t> expected[3] = {{L, T, static_cast<hsize_t>(geometry_.n_kv_heads), d},
                                            {L, T, static_cast<hsize_t>(geometry_.n_kv_heads), d},
                                            {L, Tq, static_cast<hsize_t>(geometry_.n_q_heads), d}};
  const char* what[3] = {"[n_layers, T, n_kv_heads, head_dim]", "[n_layers, T, n_kv_heads, head_dim]",
                         "[n_layers, Tq, n_q_heads, head_dim]"};
  for (int i = 0; i < 3; ++i) {
    const char* name = tensor_name(static_cast<Tensor>(i));
    if (!h5::link_exists(cur.group.get(), name)) throw FormatError(ctx + ": dataset '" + name + "' is missing");
    Handle dapl = check(H5Pcreate(H5P_DATASET_ACCESS), "dataset access list");
    check_status(H5Pset_chunk_cache(dapl.get(), 0, 0, 1.0), "chunk cache");
    cur.tensors[i] = check(H5Dopen2(cur.group.get(), name, dapl.get()), ctx + ": opening dataset '" + name + "'");
    Handle dcpl = check(H5Dget_create_plist(cur.tensors[i].get()), ctx + ": creation list of '" + name + "'");
    cur.filtered[i] = H5Pget_nfilters(dcpl.get()) > 0;
    unsigned flags = 0;
    std::size_t values = 0;
    if (H5Pget_filter_by_id2(dcpl.get(), H5Z_FILTER_FLETCHER32, &flags, &values, nullptr, 0, nullptr, nullptr) < 0) {
      cur.checksummed = false;  // written before checksums (HDF5 notes the missing filter as an error)
      H5Eclear2(H5E_DEFAULT);
    } else {
      cur.direct[i] = H5Pget_nfilters(dcpl.get()) == 1;
    }
    const auto shape = h5::dataset_shape(cur.tensors[i].get());
    if (shape != expected[i])
      throw FormatError(ctx + ": dataset '" + name + "' has shape " + h5::shape_string(shape) + ", expected " +
                        h5::shape_string(expected[i]) + " = " + what[i]);
    Handle type = check(H5Dget_type(cur.tensors[i].get()), ctx + ": type of '" + name + "'");
    if (H5Tget_class(type.get()) != H5T_FLOAT || H5Tget_size(type.get()) != 2)
      throw FormatError(ctx + ": dataset '" + name + "' must be IEEE float16 (2-byte float), found " +
                        std::to_string(H5Tget_size(type.get())) + "-byte class " +
                        std::to_string(static_cast<int>(H5Tget_class(type.get()))));
    h5::check_stored(cur.tensors[i].get(), h5::element_count(shape, ctx), 2, ctx + ": dataset '" + name + "'");
  }
  cur.id = id;
  cur.T = static_cast<std::int64_t>(T);
  cur.Tq = static_cast<std::int64_t>(Tq);
  return cur;
}

RequestHeader TraceReader::header(const std::string& id) const {
  const OpenRequest& r = open_request(id);
  const std::string ctx = path_ + ": request '" + id + "'";
  const hid_t g = r.group.get();
  RequestHeader h;
  h.id = id;
  h.task = h5::attr_exists(g, "task") ? h5::read_attr_string(g, "task", ctx) : "";
  h.answer = h5::attr_exists(g, "answer") ? h5::read_attr_string(g, "answer", ctx) : "";
  h.tokens = read_ints<std::int32_t>(g, "tokens", H5T_NATIVE_INT32, ctx);
  h.positions = read_ints<std::int32_t>(g, "positions", H5T_NATIVE_INT32, ctx);
  h.segments = read_ints<std::int8_t>(g, "segments", H5T_NATIVE_INT8, ctx);
  h.q_index = read_ints<std::int32_t>(g, "q_index", H5T_NATIVE_INT32, ctx);
  h.n_prompt = h5::read_attr_i64(g, "n_prompt", ctx);
  h.n_generated = h5::read_attr_i64(g, "n_generated", ctx);
  h.question_start = h5::read_attr_i64(g, "question_start", ctx);
  h.needle_start = attr_or(g, "needle_start", -1, ctx);
  h.needle_end = attr_or(g, "needle_end", -1, ctx);
  if (h5::link_exists(g, layout::kRefGroup)) {
    Handle ref = check(H5Gopen2(g, layout::kRefGroup, H5P_DEFAULT), ctx + ": opening ref");
    const std::string rctx = ctx + " ref";
    std::vector<hsize_t> shape;
    read_ints<std::int32_t>(ref.get(), "topk_ids", H5T_NATIVE_INT32, rctx, &shape, 2);
    h.ref_rows = static_cast<std::int32_t>(shape[0]);
    h.ref_topk = static_cast<std::int32_t>(shape[1]);
  }
  const auto problems = h.problems(geometry_, ctx);
  if (!problems.empty()) throw FormatError(join(problems));
  return h;
}

ReferenceDistribution TraceReader::reference(const std::string& id) const {
  const OpenRequest& r = open_request(id);
  const std::string ctx = path_ + ": request '" + id + "' ref";
  ReferenceDistribution ref;
  if (!h5::link_exists(r.group.get(), layout::kRefGroup)) return ref;
  Handle g = check(H5Gopen2(r.group.get(), layout::kRefGroup, H5P_DEFAULT), ctx + ": opening group");
  std::vector<hsize_t> ids_shape, logp_shape;
  ref.topk_ids = read_ints<std::int32_t>(g.get(), "topk_ids", H5T_NATIVE_INT32, ctx, &ids_shape, 2);
  ref.topk_logp = read_ints<float>(g.get(), "topk_logp", H5T_NATIVE_FLOAT, ctx, &logp_shape, 2);
  ref.index = read_ints<std::int32_t>(g.get(), "index", H5T_NATIVE_INT32, ctx);
  ref.lse = read_ints<float>(g.get(), "lse", H5T_NATIVE_FLOAT, ctx);
  ref.rows = static_cast<std::int32_t>(ids_shape[0]);
  ref.topk = static_cast<std::int32_t>(ids_shape[1]);
  const auto rows = static_cast<std::size_t>(ref.rows);
  if (logp_shape != ids_shape || ref.index.size() != rows || ref.lse.size() != rows)
    throw FormatError(ctx + ": shapes topk_ids " + h5::shape_string(ids_shape) + ", topk_logp " +
                      h5::shape_string(logp_shape) + ", index [" + std::to_string(ref.index.size()) + "], lse [" +
                      std::to_string(ref.lse.size()) + "], expected [Tg, k], [Tg, k], [Tg], [Tg]");
  for (std::size_t i = 0; i < rows; ++i) {
    if (ref.index[i] < 0 || ref.index[i] >= r.T || (i > 0 && ref.index[i] <= ref.index[i - 1]))
      throw FormatError(ctx + ": index[" + std::to_string(i) + "] = " + std::to_string(ref.index[i]) +
                        ", expected strictly increasing token indices in [0, T = " + std::to_string(r.T) + ")");
  }
  for (std::size_t i = 0; i < ref.topk_ids.size(); ++i) {
    if (ref.topk_ids[i] < 0 || ref.topk_ids[i] >= geometry_.vocab)
      throw FormatError(ctx + ": topk_ids has " + std::to_string(ref.topk_ids[i]) + " at row " +
                        std::to_string(i / static_cast<std::size_t>(ref.topk)) +
                        ", expected ids in [0, vocab = " + std::to_string(geometry_.vocab) + ")");
  }
  return ref;
}

std::size_t TraceReader::layer_elements(const std::string& id, Tensor t) const {
  const OpenRequest& r = open_request(id);
  const std::size_t rows = static_cast<std::size_t>(t == Tensor::Q ? r.Tq : r.T);
  const std::size_t heads = static_cast<std::size_t>(t == Tensor::Q ? geometry_.n_q_heads : geometry_.n_kv_heads);
  return rows * heads * static_cast<std::size_t>(geometry_.head_dim);
}

namespace {

// Reads rows [row0, row0 + rows) of one layer of a [L, rows, heads, d] half dataset.
void read_rows(hid_t dset, const std::vector<hsize_t>& shape, int layer, hsize_t row0, hsize_t rows, std::uint16_t* dst,
               const std::string& ctx) {
  const hsize_t start[4] = {static_cast<hsize_t>(layer), row0, 0, 0};
  const hsize_t count[4] = {1, rows, shape[2], shape[3]};
  Handle fspace = check(H5Dget_space(dset), ctx + ": dataspace");
  check_status(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr), ctx + ": select");
  Handle mspace = check(H5Screate_simple(4, count, nullptr), ctx + ": memory space");
  check_status(H5Dread(dset, h5::half_type(), mspace.get(), fspace.get(), H5P_DEFAULT, dst),
               ctx + ": reading layer " + std::to_string(layer));
}

// A layer's chunk as stored (its half bits, then the Fletcher32 checksum), read past HDF5's filter
// pipeline into `buf` and checked here: the library's checksum loop is several times slower.
void read_checked_chunk(hid_t dset, int layer, std::span<std::uint16_t> dst, std::vector<std::uint8_t>& buf,
                        const std::string& ctx) {
  const hsize_t offset[4] = {static_cast<hsize_t>(layer), 0, 0, 0};
  const std::string where = ctx + ": reading layer " + std::to_string(layer);
  hsize_t stored = 0;
  check_status(H5Dget_chunk_storage_size(dset, offset, &stored), where + ": chunk size");
  const std::size_t bytes = dst.size_bytes();
  if (stored != bytes + h5::kFletcherBytes)
    throw FormatError(where + ": its chunk holds " + std::to_string(stored) + " bytes, expected " +
                      std::to_string(bytes + h5::kFletcherBytes) + " (the data and a Fletcher32 checksum)");
  buf.resize(static_cast<std::size_t>(stored));
  std::uint32_t skipped = 0;
  check_status(H5Dread_chunk(dset, H5P_DEFAULT, offset, &skipped, buf.data()), where);
  if (skipped != 0) throw FormatError(where + ": its chunk was stored without its checksum filter");
  if (!h5::fletcher32_intact(buf.data(), buf.size()))
    throw FormatError(where + ": data error detected by Fletcher32 checksum (the chunk is damaged)");
  std::memcpy(dst.data(), buf.data(), bytes);
}

}  // namespace

std::string TraceReader::layer_context(const std::string& id, Tensor t, int layer, std::size_t dst_size) const {
  const std::string ctx = path_ + ": request '" + id + "' dataset '" + tensor_name(t) + "'";
  if (layer < 0 || layer >= geometry_.n_layers)
    throw Error(ctx + ": layer " + std::to_string(layer) + " out of range [0, " + std::to_string(geometry_.n_layers) +
                ")");
  const std::size_t n = layer_elements(id, t);
  if (dst_size != n)
    throw Error(ctx + ": destination holds " + std::to_string(dst_size) + " values, a layer has " + std::to_string(n));
  return ctx;
}

bool TraceReader::checksummed(const std::string& id) const { return open_request(id).checksummed; }

std::vector<std::string> TraceReader::unreadable_arrays(const std::string& id) const {
  const OpenRequest& r = open_request(id);
  const std::string ctx = path_ + ": request '" + id + "'";
  std::vector<std::string> errors;
  std::vector<std::string> names = {"tokens", "positions", "segments", "q_index"};
  if (h5::link_exists(r.group.get(), layout::kRefGroup))
    for (const char* n : {"index", "topk_ids", "topk_logp", "lse"})
      names.push_back(std::string(layout::kRefGroup) + "/" + n);
  std::vector<std::uint8_t> buf;
  for (const auto& name : names) {
    try {
      Handle d = check(H5Dopen2(r.group.get(), name.c_str(), H5P_DEFAULT), ctx + ": opening dataset '" + name + "'");
      Handle type = check(H5Dget_type(d.get()), ctx + ": type of '" + name + "'");
      Handle native = check(H5Tget_native_type(type.get(), H5T_DIR_ASCEND), ctx + ": type of '" + name + "'");
      const std::size_t n =
          H5Tget_size(native.get()) * h5::element_count(h5::dataset_shape(d.get()), ctx + ": dataset '" + name + "'");
      if (n > (std::size_t{1} << 33))
        throw FormatError(ctx + ": dataset '" + name + "' claims " + std::to_string(n) + " bytes");
      h5::check_stored(d.get(), n, 1, ctx + ": dataset '" + name + "'");
      buf.resize(n);
      if (n > 0)
        check_status(H5Dread(d.get(), native.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()),
                     ctx + ": reading dataset '" + name + "'");
    } catch (const Error& e) {
      errors.push_back(e.what());
    }
  }
  return errors;
}

void TraceReader::read_layer_half(const std::string& id, Tensor t, int layer, std::span<std::uint16_t> dst) const {
  const OpenRequest& r = open_request(id);
  const std::string ctx = layer_context(id, t, layer, dst.size());
  const hid_t dset = r.tensors[static_cast<int>(t)].get();
  if (r.direct[static_cast<int>(t)]) return read_checked_chunk(dset, layer, dst, impl_->chunk, ctx);
  read_rows(dset, h5::dataset_shape(dset), layer, 0, static_cast<hsize_t>(t == Tensor::Q ? r.Tq : r.T), dst.data(),
            ctx);
}

void TraceReader::read_layer(const std::string& id, Tensor t, int layer, std::span<float> dst) const {
  const OpenRequest& r = open_request(id);
  const int ti = static_cast<int>(t);
  if (r.filtered[ti]) {  // compressed chunks decode whole: convert after one read
    std::vector<std::uint16_t>& buf = impl_->scratch;
    buf.resize(dst.size());
    read_layer_half(id, t, layer, buf);
    halves_to_floats(buf.data(), dst.data(), dst.size());
    return;
  }
  const std::string ctx = layer_context(id, t, layer, dst.size());
  // Uncompressed: read in cache-sized tiles and widen each while it is still in L2, instead of
  // streaming the whole layer through memory twice.
  const hid_t dset = r.tensors[ti].get();
  const auto shape = h5::dataset_shape(dset);
  const std::size_t row_elems = static_cast<std::size_t>(shape[2] * shape[3]);
  const hsize_t rows = shape[1];
  const hsize_t tile = std::max<hsize_t>(1, kTileElements / row_elems);
  std::vector<std::uint16_t>& buf = impl_->scratch;
  buf.resize(static_cast<std::size_t>(std::min(tile, rows)) * row_elems);
  for (hsize_t row0 = 0; row0 < rows; row0 += tile) {
    const hsize_t n = std::min(tile, rows - row0);
    read_rows(dset, shape, layer, row0, n, buf.data(), ctx);
    halves_to_floats(buf.data(), dst.data() + row0 * row_elems, static_cast<std::size_t>(n) * row_elems);
  }
}

void TraceReader::walk_request(const std::string& id) const {
  auto part = [](const auto& f) {
    try {
      f();
    } catch (const std::exception&) {  // the read raises it in-process too; the walk goes on
    }
  };
  part([&] { header(id); });
  part([&] { reference(id); });
  part([&] { unreadable_arrays(id); });
  std::vector<float> values, q, k;
  for (int ti = 0; ti < 3; ++ti) {
    const auto t = static_cast<Tensor>(ti);
    for (int layer = 0; layer < geometry_.n_layers; ++layer)
      part([&] {
        const OpenRequest& r = open_request(id);
        if (!r.direct[ti]) {  // HDF5's own pipeline reads it: read it here, whole
          values.resize(layer_elements(id, t));
          read_layer(id, t, layer, values);
          return;
        }
        const hsize_t offset[4] = {static_cast<hsize_t>(layer), 0, 0, 0};
        hsize_t stored = 0;
        check_status(H5Dget_chunk_storage_size(r.tensors[ti].get(), offset, &stored), path_ + ": chunk size");
      });
  }
  if (has_chunk_states(id)) {
    std::vector<float> ck, cv;
    part([&] { chunk_state_table(id); });
    for (int layer = 0; layer < geometry_.n_layers; ++layer) part([&] { read_chunk_state_layer(id, layer, ck, cv); });
  }
  if (!has_repeat_pass(id)) return;
  part([&] { repeat_pass_table(id); });
  for (int layer = 0; layer < geometry_.n_layers; ++layer) part([&] { read_repeat_layer(id, layer, q, k); });
}

bool TraceReader::has_repeat_pass(const std::string& id) const {
  return h5::link_exists(open_request(id).group.get(), layout::kRepeatGroup);
}

RepeatPass TraceReader::repeat_pass_table(const std::string& id) const {
  const OpenRequest& r = open_request(id);
  const std::string ctx = path_ + ": request '" + id + "' repeat pass";
  if (!h5::link_exists(r.group.get(), layout::kRepeatGroup))
    throw Error(ctx + " is missing: capture with --repeat-pass to record KVzip's reconstruction pass");
  Handle g = check(H5Gopen2(r.group.get(), layout::kRepeatGroup, H5P_DEFAULT), ctx + ": opening group");
  std::vector<hsize_t> shape;
  const auto table = read_ints<std::int64_t>(g.get(), "chunks", H5T_NATIVE_INT64, ctx, &shape, 2);
  if (shape[1] != 4)
    throw FormatError(ctx + ": 'chunks' has shape " + h5::shape_string(shape) + ", expected [chunks, 4]");
  const auto question_start = h5::read_attr_i64(r.group.get(), "question_start", ctx);
  RepeatPass pass;
  for (std::size_t i = 0; i < shape[0]; ++i) {
    const RepeatChunk c{table[i * 4], table[i * 4 + 1], table[i * 4 + 2], table[i * 4 + 3]};
    if (c.row_begin != pass.rows || c.row_end <= c.row_begin || c.begin < 0 || c.end <= c.begin ||
        c.end > question_start)
      throw FormatError(ctx + ": chunk " + std::to_string(i) + " = [" + std::to_string(c.begin) + ", " +
                        std::to_string(c.end) + ") rows [" + std::to_string(c.row_begin) + ", " +
                        std::to_string(c.row_end) +
                        "), expected consecutive row ranges over context tokens before question_start = " +
                        std::to_string(question_start));
    pass.chunks.push_back(c);
    pass.rows = c.row_end;
  }
  const hsize_t L = static_cast<hsize_t>(geometry_.n_layers), d = static_cast<hsize_t>(geometry_.head_dim);
  for (const auto& [name, heads] : {std::pair{"q", geometry_.n_q_heads}, std::pair{"k", geometry_.n_kv_heads}}) {
    if (!h5::link_exists(g.get(), name)) throw FormatError(ctx + ": dataset '" + name + "' is missing");
    Handle dset = check(H5Dopen2(g.get(), name, H5P_DEFAULT), ctx + ": opening '" + name + "'");
    const std::vector<hsize_t> want = {L, static_cast<hsize_t>(pass.rows), static_cast<hsize_t>(heads), d};
    const auto have = h5::dataset_shape(dset.get());
    if (have != want)
      throw FormatError(ctx + ": dataset '" + name + "' has shape " + h5::shape_string(have) + ", expected " +
                        h5::shape_string(want));
    h5::check_stored(dset.get(), h5::element_count(have, ctx), 2, ctx + ": dataset '" + name + "'");
  }
  return pass;
}

void TraceReader::read_repeat_layer(const std::string& id, int layer, std::vector<float>& q,
                                    std::vector<float>& k) const {
  if (layer < 0 || layer >= geometry_.n_layers)
    throw Error(path_ + ": repeat pass layer " + std::to_string(layer) + " out of range");
  const std::string ctx = path_ + ": request '" + id + "' repeat pass";
  const OpenRequest& r = open_request(id);
  if (!h5::link_exists(r.group.get(), layout::kRepeatGroup))
    throw Error(ctx + " is missing: capture with --repeat-pass to record KVzip's reconstruction pass");
  Handle g = check(H5Gopen2(r.group.get(), layout::kRepeatGroup, H5P_DEFAULT), ctx + ": opening group");
  hsize_t rows = 0;
  for (auto [name, out, heads] :
       {std::tuple{"q", &q, geometry_.n_q_heads}, std::tuple{"k", &k, geometry_.n_kv_heads}}) {
    if (!h5::link_exists(g.get(), name)) throw FormatError(ctx + ": dataset '" + name + "' is missing");
    Handle dset = check(H5Dopen2(g.get(), name, H5P_DEFAULT), ctx + ": opening '" + name + "'");
    const auto shape = h5::dataset_shape(dset.get());
    if (name[0] == 'q' && shape.size() == 4) rows = shape[1];
    const std::vector<hsize_t> want = {static_cast<hsize_t>(geometry_.n_layers), rows, static_cast<hsize_t>(heads),
                                       static_cast<hsize_t>(geometry_.head_dim)};
    if (shape != want)
      throw FormatError(ctx + ": dataset '" + name + "' has shape " + h5::shape_string(shape) + ", expected " +
                        h5::shape_string(want));
    h5::check_stored(dset.get(), h5::element_count(shape, ctx), 2, ctx + ": dataset '" + name + "'");
    std::vector<std::uint16_t> half(static_cast<std::size_t>(shape[1] * shape[2] * shape[3]));
    read_rows(dset.get(), shape, layer, 0, shape[1], half.data(), ctx + " '" + name + "'");
    out->resize(half.size());
    halves_to_floats(half.data(), out->data(), half.size());
  }
}

bool TraceReader::has_chunk_states(const std::string& id) const {
  return h5::link_exists(open_request(id).group.get(), layout::kChunkStatesGroup);
}

ChunkStateRecord TraceReader::chunk_state_table(const std::string& id) const {
  const OpenRequest& r = open_request(id);
  const std::string ctx = path_ + ": request '" + id + "' chunk states";
  if (!h5::link_exists(r.group.get(), layout::kChunkStatesGroup))
    throw Error(ctx + " are missing: capture chunked requests with --chunk-states");
  Handle g = check(H5Gopen2(r.group.get(), layout::kChunkStatesGroup, H5P_DEFAULT), ctx + ": opening group");
  std::vector<hsize_t> shape;
  const auto table = read_ints<std::int64_t>(g.get(), "chunks", H5T_NATIVE_INT64, ctx, &shape, 2);
  if (shape[1] != 4)
    throw FormatError(ctx + ": 'chunks' has shape " + h5::shape_string(shape) + ", expected [chunks, 4]");
  const nlohmann::json ids = nlohmann::json::parse(h5::read_attr_string(g.get(), "ids", ctx), nullptr, false);
  if (!ids.is_array() || ids.size() != shape[0] ||
      !std::all_of(ids.begin(), ids.end(), [](const nlohmann::json& x) { return x.is_string(); }))
    throw FormatError(ctx + ": attribute 'ids' is not a JSON array of " + std::to_string(shape[0]) + " strings");
  const auto question_start = h5::read_attr_i64(r.group.get(), "question_start", ctx);
  ChunkStateRecord rec;
  std::int64_t token = 0;
  for (std::size_t i = 0; i < shape[0]; ++i) {
    const ChunkStateSpan c{ids[i].get<std::string>(), table[i * 4], table[i * 4 + 1], table[i * 4 + 2],
                           table[i * 4 + 3]};
    if (c.row_begin != rec.rows || c.end <= c.begin || c.end - c.begin != c.row_end - c.row_begin || c.begin < token ||
        c.end > question_start)
      throw FormatError(ctx + ": chunk " + std::to_string(i) + " = tokens [" + std::to_string(c.begin) + ", " +
                        std::to_string(c.end) + ") rows [" + std::to_string(c.row_begin) + ", " +
                        std::to_string(c.row_end) + "), expected consecutive rows, one per token, over ordered " +
                        "context tokens before question_start = " + std::to_string(question_start));
    for (const ChunkStateSpan& o : rec.chunks)
      if (o.id == c.id) throw FormatError(ctx + ": chunk id '" + c.id + "' appears twice; expected unique ids");
    rec.chunks.push_back(c);
    rec.rows = c.row_end;
    token = c.end;
  }
  const std::vector<hsize_t> want = {static_cast<hsize_t>(geometry_.n_layers), static_cast<hsize_t>(rec.rows),
                                     static_cast<hsize_t>(geometry_.n_kv_heads),
                                     static_cast<hsize_t>(geometry_.head_dim)};
  for (const char* name : {"k", "v"}) {
    if (!h5::link_exists(g.get(), name)) throw FormatError(ctx + ": dataset '" + name + "' is missing");
    Handle dset = check(H5Dopen2(g.get(), name, H5P_DEFAULT), ctx + ": opening '" + name + "'");
    const auto have = h5::dataset_shape(dset.get());
    if (have != want)
      throw FormatError(ctx + ": dataset '" + name + "' has shape " + h5::shape_string(have) + ", expected " +
                        h5::shape_string(want));
    h5::check_stored(dset.get(), h5::element_count(have, ctx), 2, ctx + ": dataset '" + name + "'");
  }
  return rec;
}

void TraceReader::read_chunk_state_layer(const std::string& id, int layer, std::vector<float>& k,
                                         std::vector<float>& v) const {
  if (layer < 0 || layer >= geometry_.n_layers)
    throw Error(path_ + ": chunk states layer " + std::to_string(layer) + " out of range");
  // One layer's read checks its own datasets; the table is read once, by chunk_state_table.
  const std::string ctx = path_ + ": request '" + id + "' chunk states";
  const OpenRequest& r = open_request(id);
  if (!h5::link_exists(r.group.get(), layout::kChunkStatesGroup))
    throw Error(ctx + " are missing: capture chunked requests with --chunk-states");
  Handle g = check(H5Gopen2(r.group.get(), layout::kChunkStatesGroup, H5P_DEFAULT), ctx + ": opening group");
  for (auto [name, out] : {std::pair{"k", &k}, std::pair{"v", &v}}) {
    if (!h5::link_exists(g.get(), name)) throw FormatError(ctx + ": dataset '" + name + "' is missing");
    Handle dset = check(H5Dopen2(g.get(), name, H5P_DEFAULT), ctx + ": opening '" + name + "'");
    const auto shape = h5::dataset_shape(dset.get());
    const std::vector<hsize_t> want = {static_cast<hsize_t>(geometry_.n_layers), shape.size() == 4 ? shape[1] : 0,
                                       static_cast<hsize_t>(geometry_.n_kv_heads),
                                       static_cast<hsize_t>(geometry_.head_dim)};
    if (shape != want)
      throw FormatError(ctx + ": dataset '" + name + "' has shape " + h5::shape_string(shape) + ", expected " +
                        h5::shape_string(want));
    h5::check_stored(dset.get(), h5::element_count(shape, ctx), 2, ctx + ": dataset '" + name + "'");
    std::vector<std::uint16_t> half(static_cast<std::size_t>(shape[1] * shape[2] * shape[3]));
    read_rows(dset.get(), shape, layer, 0, shape[1], half.data(), ctx + " '" + name + "'");
    out->resize(half.size());
    halves_to_floats(half.data(), out->data(), half.size());
  }
}

}  // namespace kvsim
