#include "traces/trace_writer.h"

#include <cstring>
#include <filesystem>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "traces/fletcher32.h"
#include "traces/h5_handle.h"
#include "traces/shape_attrs.h"
#include "traces/trace_layout.h"
#include "traces/trace_reader.h"

namespace kvsim {

using h5::check;
using h5::check_status;
using h5::Handle;

// Room for about 2,000 request names of up to 8 characters before the /requests heap must move
// (docs/trace-format.md, "A killed writer").
constexpr std::size_t kRequestNameHeapBytes = 16384;

struct TraceWriter::Impl {
  ModelGeometry geometry;
  TraceWriterOptions options;
  Handle file;
  Handle requests;
  std::set<std::string> ids;

  // State of the open request (if any).
  bool open = false;
  std::string id;
  RequestHeader header;
  Handle group;
  Handle k, v, q;
  int next_layer = 0;
  bool reference_written = false;
  std::vector<std::uint16_t> scratch;
  std::vector<std::uint8_t> stored;  // a checksummed chunk on its way to the file

  std::string path;
  std::string ctx() const { return path + ": request '" + id + "'"; }

  Handle create_tensor(const char* name, hsize_t rows, hsize_t heads) {
    const hsize_t dims[4] = {static_cast<hsize_t>(geometry.n_layers), rows, heads,
                             static_cast<hsize_t>(geometry.head_dim)};
    const hsize_t chunk[4] = {1, rows, heads, static_cast<hsize_t>(geometry.head_dim)};
    Handle space = check(H5Screate_simple(4, dims, nullptr), ctx() + ": dataspace for " + name);
    Handle dcpl = check(H5Pcreate(H5P_DATASET_CREATE), "dataset property list");
    check_status(H5Pset_chunk(dcpl.get(), 4, chunk), ctx() + ": chunking " + name);
    // Every chunk is written whole: pre-filling it with zeros would only double the writes.
    check_status(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), ctx() + ": fill time " + name);
    if (options.deflate_level > 0) {
      check_status(H5Pset_shuffle(dcpl.get()), ctx() + ": shuffle filter for " + name);
      check_status(H5Pset_deflate(dcpl.get(), static_cast<unsigned>(options.deflate_level)),
                   ctx() + ": deflate filter for " + name);
    }
    // Last in the pipeline: the checksum covers the bytes as stored.
    if (options.checksums) check_status(H5Pset_fletcher32(dcpl.get()), ctx() + ": checksum filter for " + name);
    // Whole-chunk writes: the chunk cache would only add a copy.
    Handle dapl = check(H5Pcreate(H5P_DATASET_ACCESS), "dataset access list");
    check_status(H5Pset_chunk_cache(dapl.get(), 0, 0, 1.0), ctx() + ": chunk cache for " + name);
    return check(H5Dcreate2(group.get(), name, h5::half_type(), space.get(), H5P_DEFAULT, dcpl.get(), dapl.get()),
                 ctx() + ": creating dataset " + name);
  }

  void write_layer_chunk(const Handle& dset, int layer, hsize_t rows, hsize_t heads, const std::uint16_t* data,
                         const char* name) {
    const hsize_t start[4] = {static_cast<hsize_t>(layer), 0, 0, 0};
    const hsize_t count[4] = {1, rows, heads, static_cast<hsize_t>(geometry.head_dim)};
    if (options.checksums && options.deflate_level == 0) {
      // The chunk as Fletcher32 stores it (the half bits, then the checksum), written past
      // HDF5's filter pipeline, whose checksum loop is several times slower than ours.
      const std::size_t bytes = static_cast<std::size_t>(rows * heads * count[3]) * sizeof(std::uint16_t);
      stored.resize(bytes + h5::kFletcherBytes);
      std::memcpy(stored.data(), data, bytes);
      h5::append_fletcher32(stored.data(), bytes);
      check_status(H5Dwrite_chunk(dset.get(), H5P_DEFAULT, 0, start, stored.size(), stored.data()),
                   ctx() + ": writing layer " + std::to_string(layer) + " of " + name);
      return;
    }
    Handle fspace = check(H5Dget_space(dset.get()), "file space");
    check_status(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr), "hyperslab");
    Handle mspace = check(H5Screate_simple(4, count, nullptr), "memory space");
    check_status(H5Dwrite(dset.get(), h5::half_type(), mspace.get(), fspace.get(), H5P_DEFAULT, data),
                 ctx() + ": writing layer " + std::to_string(layer) + " of " + name);
  }

  void flush() { check_status(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "flushing trace file"); }
};

namespace {

// A small dataset written whole: one chunk with a checksum when `checksums` (and it has data).
template <typename T>
void write_vector(hid_t loc, const char* name, hid_t file_type, hid_t mem_type, const std::vector<T>& data,
                  const std::string& ctx, bool checksums, std::vector<hsize_t> dims = {}) {
  if (dims.empty()) dims = {static_cast<hsize_t>(data.size())};
  Handle space = check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), ctx + ": dataspace");
  Handle dcpl = check(H5Pcreate(H5P_DATASET_CREATE), "dataset property list");
  if (checksums && !data.empty()) {
    std::vector<hsize_t> chunk = dims;
    if (chunk.size() == 4) chunk[0] = 1;  // a layer a chunk, as the tensors: HDF5 caps a chunk at 4 GiB
    check_status(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), ctx + ": chunking " + name);
    check_status(H5Pset_fletcher32(dcpl.get()), ctx + ": checksum filter for " + name);
  }
  Handle dset = check(H5Dcreate2(loc, name, file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                      ctx + ": creating dataset " + name);
  if (!data.empty())
    check_status(H5Dwrite(dset.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()),
                 ctx + ": writing dataset " + name);
}

void join_problems(const std::vector<std::string>& problems) {
  if (problems.empty()) return;
  std::string msg = problems.front();
  for (std::size_t i = 1; i < problems.size(); ++i) msg += "\n" + problems[i];
  throw FormatError(msg);
}

}  // namespace

TraceWriter::TraceWriter(const std::string& path, const ModelGeometry& geometry, const CaptureInfo& capture,
                         const TraceWriterOptions& options)
    : impl_(std::make_unique<Impl>()), path_(path) {
  h5::silence_library_errors();
  join_problems(geometry_problems(geometry, "trace writer for " + path));
  if (options.deflate_level < 0 || options.deflate_level > 9)
    throw Error("trace writer: deflate level " + std::to_string(options.deflate_level) + ", expected 0..9");
  impl_->geometry = geometry;
  impl_->options = options;
  impl_->path = path;
  if (options.append && std::filesystem::exists(path)) {
    open_for_append(geometry, capture);
    return;
  }
  if (!options.overwrite && std::filesystem::exists(path))
    throw Error(path + ": file exists; refusing to overwrite it (pass --force / overwrite to replace)");
  // Default (1.8-compatible) format on purpose: the newest superblock records "open for
  // writing" and a killed writer would leave a file that needs h5clear before it can be read.
  // Never reuse freed file space: a block freed by a metadata change (a grown group heap) could
  // otherwise be overwritten by raw data before the next flush, while the last flushed metadata
  // still points at it -- a killed writer would then lose the whole file, not just one request.
  Handle fcpl = check(H5Pcreate(H5P_FILE_CREATE), path + ": file creation list");
  check_status(H5Pset_file_space_strategy(fcpl.get(), H5F_FSPACE_STRATEGY_NONE, 0, 1), path + ": file space strategy");
  // EXCL when not overwriting: no window between the existence check and the create.
  impl_->file =
      check(H5Fcreate(path.c_str(), options.overwrite ? H5F_ACC_TRUNC : H5F_ACC_EXCL, fcpl.get(), H5P_DEFAULT),
            path + ": cannot create file");
  const hid_t root = impl_->file.get();
  h5::write_attr_string(root, layout::kFormatAttr, kTraceFormat);
  h5::write_attr_i64(root, layout::kVersionAttr, kTraceVersion);
  h5::write_attr_string(root, layout::kSegmentNamesAttr, segment_names_csv());
  h5::write_attr_string(root, "dtype", "float16");

  Handle model = check(H5Gcreate2(root, layout::kModelGroup, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path + ": /model");
  h5::write_shape_attrs(model.get(), geometry);
  h5::write_attr_i64(model.get(), "vocab", geometry.vocab);
  h5::write_attr_f64(model.get(), "rope_theta", geometry.rope.theta);
  h5::write_attr_string(model.get(), "rope_type", rope_type_name(geometry.rope.type));
  h5::write_attr_i64(model.get(), "rope_dim", geometry.rope.rope_dim);
  if (geometry.rope_theta_local > 0) h5::write_attr_f64(model.get(), "rope_theta_local", geometry.rope_theta_local);
  if (!geometry.sliding_window.empty())
    write_vector(model.get(), "sliding_window", H5T_STD_I32LE, H5T_NATIVE_INT, geometry.sliding_window, path,
                 options.checksums);

  Handle cap =
      check(H5Gcreate2(root, layout::kCaptureGroup, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path + ": /capture");
  h5::write_attr_string(cap.get(), "tool_version", capture.tool_version);
  h5::write_attr_string(cap.get(), "backend", capture.backend);
  h5::write_attr_string(cap.get(), "date", capture.date);
  h5::write_attr_i64(cap.get(), "seed", static_cast<std::int64_t>(capture.seed));
  h5::write_attr_string(cap.get(), "config", capture.config);

  // The name heap of /requests sized up front: a heap that outgrows its block moves, and a kill
  // between writing its header and its new block tears the list of every committed request.
  Handle gcpl = check(H5Pcreate(H5P_GROUP_CREATE), path + ": group creation list");
  check_status(H5Pset_local_heap_size_hint(gcpl.get(), kRequestNameHeapBytes), path + ": /requests name heap");
  impl_->requests =
      check(H5Gcreate2(root, layout::kRequestsGroup, H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), path + ": /requests");
  impl_->flush();
}

void TraceWriter::open_for_append(const ModelGeometry& geometry, const CaptureInfo& capture) {
  Impl& s = *impl_;
  std::vector<std::string> committed, incomplete;
  {
    const TraceReader earlier(path_);  // checks format and version; closed before the file reopens
    const ModelGeometry& had = earlier.geometry();
    auto describe = [](const ModelGeometry& x) {
      return x.name + " (" + x.arch + ", " + std::to_string(x.n_layers) + " layers, " + std::to_string(x.n_q_heads) +
             "/" + std::to_string(x.n_kv_heads) + " heads of " + std::to_string(x.head_dim) + ", vocab " +
             std::to_string(x.vocab) + ")";
    };
    if (!(had == geometry))
      throw Error(path_ + ": was written for another model geometry, " + describe(had) + "; this run's is " +
                  describe(geometry) + " (resume needs the same model)");
    if (earlier.capture().config != capture.config)
      throw Error(path_ + ": --resume with a different capture configuration; the file was written with\n  " +
                  earlier.capture().config + "\nbut this run is\n  " + capture.config +
                  "\n(use a new output, or --force to start again)");
    committed = earlier.request_ids();
    incomplete = earlier.incomplete_request_ids();
  }
  s.file = check(H5Fopen(path_.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), path_ + ": cannot open for appending");
  s.requests = check(H5Gopen2(s.file.get(), layout::kRequestsGroup, H5P_DEFAULT), path_ + ": /requests");
  for (const auto& id : incomplete)  // what its writer left half-written goes; it is captured again
    check_status(H5Ldelete(s.requests.get(), id.c_str(), H5P_DEFAULT),
                 path_ + ": removing incomplete request '" + id + "'");
  s.ids.insert(committed.begin(), committed.end());
  n_committed_ = static_cast<std::int64_t>(committed.size());
  s.flush();
}

const std::set<std::string>& TraceWriter::written_ids() const { return impl_->ids; }

TraceWriter::~TraceWriter() {
  try {
    close();
  } catch (...) {
    // Destructors must not throw; close() errors surface when called explicitly.
  }
}

void TraceWriter::begin_request(const RequestHeader& header) {
  Impl& s = *impl_;
  if (!s.file.valid()) throw Error(path_ + ": trace writer is closed");
  if (s.open) throw Error(path_ + ": request '" + s.id + "' is still open; commit it before starting another");
  if (header.id.empty() || header.id.find('/') != std::string::npos || header.id == "." || header.id == "..")
    throw FormatError(path_ + ": request id '" + header.id + "' is not usable as an HDF5 name (non-empty, no '/')");
  if (s.ids.count(header.id)) throw FormatError(path_ + ": request id '" + header.id + "' is used twice");
  const std::string ctx = path_ + ": request '" + header.id + "'";
  join_problems(header.problems(s.geometry, ctx));
  // One layer of one tensor is one HDF5 chunk, and HDF5 caps chunks below 4 GiB.
  const double q_chunk = static_cast<double>(header.n_queries()) * s.geometry.n_q_heads * s.geometry.head_dim * 2;
  const double kv_chunk = static_cast<double>(header.n_tokens()) * s.geometry.n_kv_heads * s.geometry.head_dim * 2;
  if (std::max(q_chunk, kv_chunk) >= 4294967296.0)
    throw FormatError(ctx + ": one layer of " + (q_chunk > kv_chunk ? "q" : "k/v") + " would be " +
                      std::to_string(static_cast<std::int64_t>(std::max(q_chunk, kv_chunk))) +
                      " bytes, expected < 4 GiB (HDF5's chunk limit); record fewer queries or split the request");

  s.id = header.id;
  s.header = header;
  s.group = check(H5Gcreate2(s.requests.get(), header.id.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                  ctx + ": creating group");
  s.ids.insert(header.id);
  const hid_t g = s.group.get();
  h5::write_attr_string(g, layout::kStatusAttr, layout::kStatusWriting);
  h5::write_attr_i64(g, layout::kIndexAttr, static_cast<std::int64_t>(s.ids.size() - 1));
  h5::write_attr_string(g, "task", header.task);
  h5::write_attr_string(g, "answer", header.answer);
  h5::write_attr_i64(g, "n_prompt", header.n_prompt);
  h5::write_attr_i64(g, "n_generated", header.n_generated);
  h5::write_attr_i64(g, "question_start", header.question_start);
  h5::write_attr_i64(g, "needle_start", header.needle_start);
  h5::write_attr_i64(g, "needle_end", header.needle_end);
  write_vector(g, "tokens", H5T_STD_I32LE, H5T_NATIVE_INT32, header.tokens, ctx, s.options.checksums);
  write_vector(g, "positions", H5T_STD_I32LE, H5T_NATIVE_INT32, header.positions, ctx, s.options.checksums);
  write_vector(g, "segments", H5T_STD_I8LE, H5T_NATIVE_INT8, header.segments, ctx, s.options.checksums);
  write_vector(g, "q_index", H5T_STD_I32LE, H5T_NATIVE_INT32, header.q_index, ctx, s.options.checksums);
  const auto T = static_cast<hsize_t>(header.n_tokens());
  const auto Tq = static_cast<hsize_t>(header.n_queries());
  s.k = s.create_tensor("k", T, static_cast<hsize_t>(s.geometry.n_kv_heads));
  s.v = s.create_tensor("v", T, static_cast<hsize_t>(s.geometry.n_kv_heads));
  s.q = s.create_tensor("q", Tq, static_cast<hsize_t>(s.geometry.n_q_heads));
  s.next_layer = 0;
  s.reference_written = false;
  s.open = true;
  s.flush();  // the request now exists on disk, marked "writing"
}

void TraceWriter::write_layer(int layer, std::span<const std::uint16_t> k, std::span<const std::uint16_t> v,
                              std::span<const std::uint16_t> q) {
  Impl& s = *impl_;
  if (!s.open) throw Error(path_ + ": write_layer without begin_request");
  if (layer != s.next_layer)
    throw Error(s.ctx() + ": layer " + std::to_string(layer) + " written out of order, expected layer " +
                std::to_string(s.next_layer));
  const std::size_t d = static_cast<std::size_t>(s.geometry.head_dim);
  const std::size_t kv_n = static_cast<std::size_t>(s.header.n_tokens()) * s.geometry.n_kv_heads * d;
  const std::size_t q_n = static_cast<std::size_t>(s.header.n_queries()) * s.geometry.n_q_heads * d;
  if (k.size() != kv_n || v.size() != kv_n || q.size() != q_n)
    throw Error(s.ctx() + ": layer " + std::to_string(layer) + " sizes k=" + std::to_string(k.size()) + " v=" +
                std::to_string(v.size()) + " q=" + std::to_string(q.size()) + ", expected k=v=" + std::to_string(kv_n) +
                " (T*n_kv_heads*head_dim) and q=" + std::to_string(q_n) + " (Tq*n_q_heads*head_dim)");
  const auto T = static_cast<hsize_t>(s.header.n_tokens());
  const auto Tq = static_cast<hsize_t>(s.header.n_queries());
  s.write_layer_chunk(s.k, layer, T, static_cast<hsize_t>(s.geometry.n_kv_heads), k.data(), "k");
  s.write_layer_chunk(s.v, layer, T, static_cast<hsize_t>(s.geometry.n_kv_heads), v.data(), "v");
  s.write_layer_chunk(s.q, layer, Tq, static_cast<hsize_t>(s.geometry.n_q_heads), q.data(), "q");
  ++s.next_layer;
}

void TraceWriter::write_layer_f32(int layer, std::span<const float> k, std::span<const float> v,
                                  std::span<const float> q) {
  std::vector<std::uint16_t>& buf = impl_->scratch;
  buf.resize(k.size() + v.size() + q.size());
  floats_to_halves(k.data(), buf.data(), k.size());
  floats_to_halves(v.data(), buf.data() + k.size(), v.size());
  floats_to_halves(q.data(), buf.data() + k.size() + v.size(), q.size());
  write_layer(layer, {buf.data(), k.size()}, {buf.data() + k.size(), v.size()},
              {buf.data() + k.size() + v.size(), q.size()});
}

void TraceWriter::write_reference(const ReferenceDistribution& ref) {
  Impl& s = *impl_;
  if (!s.open) throw Error(path_ + ": write_reference without begin_request");
  if (s.reference_written) throw Error(s.ctx() + ": reference written twice");
  const std::size_t rows = static_cast<std::size_t>(ref.rows), k = static_cast<std::size_t>(ref.topk);
  if (ref.rows != s.header.ref_rows || ref.topk != s.header.ref_topk || ref.index.size() != rows ||
      ref.topk_ids.size() != rows * k || ref.topk_logp.size() != rows * k || ref.lse.size() != rows)
    throw Error(s.ctx() + ": reference shape [" + std::to_string(ref.rows) + ", " + std::to_string(ref.topk) +
                "] with index/ids/logp/lse sizes " + std::to_string(ref.index.size()) + "/" +
                std::to_string(ref.topk_ids.size()) + "/" + std::to_string(ref.topk_logp.size()) + "/" +
                std::to_string(ref.lse.size()) + ", expected header's [" + std::to_string(s.header.ref_rows) + ", " +
                std::to_string(s.header.ref_topk) + "]");
  if (rows == 0) {
    s.reference_written = true;
    return;
  }
  Handle g = check(H5Gcreate2(s.group.get(), layout::kRefGroup, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                   s.ctx() + ": creating ref group");
  const std::vector<hsize_t> dims2 = {rows, k};
  write_vector(g.get(), "index", H5T_STD_I32LE, H5T_NATIVE_INT32, ref.index, s.ctx(), s.options.checksums);
  write_vector(g.get(), "topk_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, ref.topk_ids, s.ctx(), s.options.checksums, dims2);
  write_vector(g.get(), "topk_logp", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, ref.topk_logp, s.ctx(), s.options.checksums,
               dims2);
  write_vector(g.get(), "lse", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, ref.lse, s.ctx(), s.options.checksums);
  s.reference_written = true;
}

void TraceWriter::write_repeat_pass(const RepeatPass& pass) {
  Impl& s = *impl_;
  if (!s.open) throw Error(path_ + ": write_repeat_pass without begin_request");
  const std::string ctx = s.ctx() + " repeat pass";
  const auto L = static_cast<std::size_t>(s.geometry.n_layers), d = static_cast<std::size_t>(s.geometry.head_dim);
  const auto rows = static_cast<std::size_t>(pass.rows);
  if (pass.q.size() != L || pass.k.size() != L)
    throw Error(ctx + ": " + std::to_string(pass.q.size()) + " query and " + std::to_string(pass.k.size()) +
                " key layers, expected " + std::to_string(L));
  std::int64_t row = 0;
  for (const RepeatChunk& c : pass.chunks) {
    if (c.row_begin != row || c.row_end <= c.row_begin || c.begin < 0 || c.end <= c.begin ||
        c.end > s.header.question_start)
      throw Error(ctx + ": chunk [" + std::to_string(c.begin) + ", " + std::to_string(c.end) + ") rows [" +
                  std::to_string(c.row_begin) + ", " + std::to_string(c.row_end) +
                  "), expected consecutive row ranges over context tokens before the question");
    row = c.row_end;
  }
  if (row != pass.rows)
    throw Error(ctx + ": chunks cover " + std::to_string(row) + " rows of " + std::to_string(pass.rows));
  std::vector<std::uint16_t> q(L * rows * static_cast<std::size_t>(s.geometry.n_q_heads) * d),
      k(L * rows * static_cast<std::size_t>(s.geometry.n_kv_heads) * d);
  const std::size_t ql = q.size() / L, kl = k.size() / L;
  for (std::size_t l = 0; l < L; ++l) {
    if (pass.q[l].size() != ql || pass.k[l].size() != kl)
      throw Error(ctx + ": layer " + std::to_string(l) + " sizes q=" + std::to_string(pass.q[l].size()) + " k=" +
                  std::to_string(pass.k[l].size()) + ", expected " + std::to_string(ql) + " and " + std::to_string(kl));
    floats_to_halves(pass.q[l].data(), q.data() + l * ql, ql);
    floats_to_halves(pass.k[l].data(), k.data() + l * kl, kl);
  }
  Handle g = check(H5Gcreate2(s.group.get(), layout::kRepeatGroup, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                   ctx + ": creating group");
  std::vector<std::int64_t> table;
  for (const RepeatChunk& c : pass.chunks) table.insert(table.end(), {c.begin, c.end, c.row_begin, c.row_end});
  write_vector(g.get(), "chunks", H5T_STD_I64LE, H5T_NATIVE_INT64, table, ctx, s.options.checksums,
               {pass.chunks.size(), 4});
  write_vector(g.get(), "q", h5::half_type(), h5::half_type(), q, ctx, s.options.checksums,
               {L, rows, static_cast<hsize_t>(s.geometry.n_q_heads), d});
  write_vector(g.get(), "k", h5::half_type(), h5::half_type(), k, ctx, s.options.checksums,
               {L, rows, static_cast<hsize_t>(s.geometry.n_kv_heads), d});
}

void TraceWriter::write_chunk_states(const ChunkStateRecord& states) {
  Impl& s = *impl_;
  if (!s.open) throw Error(path_ + ": write_chunk_states without begin_request");
  const std::string ctx = s.ctx() + " chunk states";
  const auto L = static_cast<std::size_t>(s.geometry.n_layers);
  const auto row_elems =
      static_cast<std::size_t>(s.geometry.n_kv_heads) * static_cast<std::size_t>(s.geometry.head_dim);
  std::int64_t row = 0, token = 0;
  nlohmann::json ids = nlohmann::json::array();
  std::vector<std::int64_t> table;
  for (const ChunkStateSpan& c : states.chunks) {
    if (c.row_begin != row || c.end - c.begin != c.row_end - c.row_begin || c.end <= c.begin || c.begin < token ||
        c.end > s.header.question_start)
      throw Error(ctx + ": chunk '" + c.id + "' tokens [" + std::to_string(c.begin) + ", " + std::to_string(c.end) +
                  ") rows [" + std::to_string(c.row_begin) + ", " + std::to_string(c.row_end) +
                  "), expected consecutive rows, one per token, over ordered context tokens before the question");
    row = c.row_end;
    token = c.end;
    ids.push_back(c.id);
    table.insert(table.end(), {c.begin, c.end, c.row_begin, c.row_end});
  }
  if (row != states.rows || states.chunks.empty())
    throw Error(ctx + ": chunks cover " + std::to_string(row) + " rows of " + std::to_string(states.rows));
  const auto per_layer = static_cast<std::size_t>(states.rows) * row_elems;
  std::vector<std::uint16_t> k(L * per_layer), v(L * per_layer);
  for (std::size_t l = 0; l < L; ++l) {
    if (states.k.size() != L || states.v.size() != L || states.k[l].size() != per_layer ||
        states.v[l].size() != per_layer)
      throw Error(ctx + ": layer " + std::to_string(l) + " sizes, expected " + std::to_string(per_layer) +
                  " values each of k and v");
    floats_to_halves(states.k[l].data(), k.data() + l * per_layer, per_layer);
    floats_to_halves(states.v[l].data(), v.data() + l * per_layer, per_layer);
  }
  Handle g = check(H5Gcreate2(s.group.get(), layout::kChunkStatesGroup, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                   ctx + ": creating group");
  h5::write_attr_string(g.get(), "ids", ids.dump());
  write_vector(g.get(), "chunks", H5T_STD_I64LE, H5T_NATIVE_INT64, table, ctx, s.options.checksums,
               {states.chunks.size(), 4});
  const std::vector<hsize_t> shape = {L, static_cast<hsize_t>(states.rows), static_cast<hsize_t>(s.geometry.n_kv_heads),
                                      static_cast<hsize_t>(s.geometry.head_dim)};
  write_vector(g.get(), "k", h5::half_type(), h5::half_type(), k, ctx, s.options.checksums, shape);
  write_vector(g.get(), "v", h5::half_type(), h5::half_type(), v, ctx, s.options.checksums, shape);
}

void TraceWriter::commit_request() {
  Impl& s = *impl_;
  if (!s.open) throw Error(path_ + ": commit_request without begin_request");
  if (s.next_layer != s.geometry.n_layers)
    throw Error(s.ctx() + ": commit after " + std::to_string(s.next_layer) + " layers, expected all " +
                std::to_string(s.geometry.n_layers));
  if (s.header.ref_rows > 0 && !s.reference_written)
    throw Error(s.ctx() + ": header announced " + std::to_string(s.header.ref_rows) +
                " reference rows but write_reference was not called");
  s.k.reset();
  s.v.reset();
  s.q.reset();
  // Data first, then the flag: the flag is flushed only after every byte it vouches for.
  s.flush();
  h5::write_attr_string(s.group.get(), layout::kStatusAttr, layout::kStatusComplete);
  s.group.reset();
  s.flush();
  s.open = false;
  ++n_committed_;
}

void TraceWriter::close() {
  if (!impl_ || !impl_->file.valid()) return;
  Impl& s = *impl_;
  s.k.reset();
  s.v.reset();
  s.q.reset();
  s.group.reset();
  s.requests.reset();
  s.open = false;
  const hid_t fid = s.file.get();
  check_status(H5Fflush(fid, H5F_SCOPE_GLOBAL), path_ + ": flushing on close");
  s.file.reset();
}

}  // namespace kvsim
