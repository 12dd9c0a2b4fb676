#include "traces/h5_handle.h"

#include <algorithm>
#include <mutex>

#include "core/error.h"

namespace kvsim::h5 {

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void Handle::reset() {
  if (id_ < 0) return;
  switch (H5Iget_type(id_)) {
    case H5I_FILE:
      H5Fclose(id_);
      break;
    case H5I_GROUP:
      H5Gclose(id_);
      break;
    case H5I_DATASET:
      H5Dclose(id_);
      break;
    case H5I_DATASPACE:
      H5Sclose(id_);
      break;
    case H5I_DATATYPE:
      H5Tclose(id_);
      break;
    case H5I_ATTR:
      H5Aclose(id_);
      break;
    case H5I_GENPROP_LST:
      H5Pclose(id_);
      break;
    default:
      break;
  }
  id_ = H5I_INVALID_HID;
}

void silence_library_errors() {
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
}

namespace {

// The innermost message of HDF5's error stack says what actually went wrong
// ("truncated file", "bad object header"), which is worth showing the user.
std::string library_detail() {
  std::string detail;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* e, void* out) -> herr_t {
        if (n == 0 && e->desc) *static_cast<std::string*>(out) = e->desc;
        return 0;
      },
      &detail);
  H5Eclear2(H5E_DEFAULT);
  return detail;
}

}  // namespace

Handle check(hid_t id, const std::string& context) {
  if (id < 0) {
    const std::string detail = library_detail();
    throw FormatError(context + (detail.empty() ? "" : " (HDF5: " + detail + ")"));
  }
  return Handle(id);
}

void check_status(herr_t status, const std::string& context) {
  if (status < 0) {
    const std::string detail = library_detail();
    throw FormatError(context + (detail.empty() ? "" : " (HDF5: " + detail + ")"));
  }
}

hid_t half_type() {
  static const hid_t type = [] {
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    H5Tset_fields(t, 15, 10, 5, 0, 10);
    H5Tset_size(t, 2);
    H5Tset_precision(t, 16);
    H5Tset_ebias(t, 15);
    H5Tlock(t);  // shared for the process lifetime, never closed
    return t;
  }();
  return type;
}

bool link_exists(hid_t loc, const std::string& name) { return H5Lexists(loc, name.c_str(), H5P_DEFAULT) > 0; }

bool attr_exists(hid_t obj, const std::string& name) { return H5Aexists(obj, name.c_str()) > 0; }

std::string object_name(hid_t obj) {
  char file[1024] = {}, path[1024] = {};
  H5Fget_name(obj, file, sizeof file);
  H5Iget_name(obj, path, sizeof path);
  return std::string(file) + ":" + path;
}

namespace {

void write_attr_raw(hid_t obj, const std::string& name, hid_t type, const void* data) {
  const std::string ctx = object_name(obj) + ": attribute '" + name + "'";
  if (attr_exists(obj, name)) check_status(H5Adelete(obj, name.c_str()), ctx + ": deleting");
  Handle space = check(H5Screate(H5S_SCALAR), ctx + ": creating dataspace");
  Handle attr = check(H5Acreate2(obj, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT), ctx + ": creating");
  check_status(H5Awrite(attr.get(), type, data), ctx + ": writing");
}

Handle open_attr(hid_t obj, const std::string& name, const std::string& context) {
  if (!attr_exists(obj, name)) throw FormatError(context + ": attribute '" + name + "' is missing");
  return check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), context + ": opening attribute '" + name + "'");
}

void require_scalar(hid_t attr, const std::string& name, const std::string& context) {
  Handle space = check(H5Aget_space(attr), context + ": attribute '" + name + "'");
  if (H5Sget_simple_extent_npoints(space.get()) != 1)
    throw FormatError(context + ": attribute '" + name + "' must be a scalar");
}

}  // namespace

void write_attr_string(hid_t obj, const std::string& name, const std::string& value) {
  // Fixed-length, null-padded UTF-8 (h5py returns bytes: .decode()).
  Handle type = check(H5Tcopy(H5T_C_S1), "string type");
  H5Tset_size(type.get(), value.empty() ? 1 : value.size());
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  const std::string padded = value.empty() ? std::string(1, '\0') : value;
  write_attr_raw(obj, name, type.get(), padded.data());
}

void write_attr_i64(hid_t obj, const std::string& name, std::int64_t value) {
  write_attr_raw(obj, name, H5T_STD_I64LE, &value);
}

void write_attr_f64(hid_t obj, const std::string& name, double value) {
  write_attr_raw(obj, name, H5T_IEEE_F64LE, &value);
}

std::string read_attr_string(hid_t obj, const std::string& name, const std::string& context) {
  Handle attr = open_attr(obj, name, context);
  require_scalar(attr.get(), name, context);
  Handle type = check(H5Aget_type(attr.get()), context + ": attribute '" + name + "'");
  if (H5Tget_class(type.get()) != H5T_STRING)
    throw FormatError(context + ": attribute '" + name + "' must be a string");
  if (H5Tis_variable_str(type.get()) > 0) {
    Handle mem = check(H5Tcopy(H5T_C_S1), "string type");
    H5Tset_size(mem.get(), H5T_VARIABLE);
    char* s = nullptr;
    check_status(H5Aread(attr.get(), mem.get(), &s), context + ": reading attribute '" + name + "'");
    std::string out = s ? s : "";
    Handle space = check(H5Aget_space(attr.get()), "attribute space");
    H5Dvlen_reclaim(mem.get(), space.get(), H5P_DEFAULT, &s);
    return out;
  }
  const std::size_t size = H5Tget_size(type.get());
  std::string buf(size, '\0');
  check_status(H5Aread(attr.get(), type.get(), buf.data()), context + ": reading attribute '" + name + "'");
  buf.resize(buf.find('\0') == std::string::npos ? size : buf.find('\0'));
  return buf;
}

std::int64_t read_attr_i64(hid_t obj, const std::string& name, const std::string& context) {
  Handle attr = open_attr(obj, name, context);
  require_scalar(attr.get(), name, context);
  Handle type = check(H5Aget_type(attr.get()), context + ": attribute '" + name + "'");
  if (H5Tget_class(type.get()) != H5T_INTEGER)
    throw FormatError(context + ": attribute '" + name + "' must be an integer");
  std::int64_t v = 0;
  check_status(H5Aread(attr.get(), H5T_NATIVE_INT64, &v), context + ": reading attribute '" + name + "'");
  return v;
}

double read_attr_f64(hid_t obj, const std::string& name, const std::string& context) {
  Handle attr = open_attr(obj, name, context);
  require_scalar(attr.get(), name, context);
  Handle type = check(H5Aget_type(attr.get()), context + ": attribute '" + name + "'");
  const H5T_class_t cls = H5Tget_class(type.get());
  if (cls != H5T_FLOAT && cls != H5T_INTEGER)
    throw FormatError(context + ": attribute '" + name + "' must be a number");
  double v = 0;
  check_status(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &v), context + ": reading attribute '" + name + "'");
  return v;
}

std::vector<hsize_t> dataset_shape(hid_t dset) {
  Handle space = check(H5Dget_space(dset), object_name(dset) + ": dataspace");
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) throw FormatError(object_name(dset) + ": unreadable dataspace");
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return dims;
}

std::uint64_t element_count(const std::vector<hsize_t>& shape, const std::string& context) {
  std::uint64_t n = 1;
  for (const hsize_t s : shape)
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(s), &n) || n > (std::uint64_t{1} << 40))
      throw FormatError(context + ": extent " + shape_string(shape) + " claims more values than any trace holds");
  return n;
}

void check_stored(hid_t dset, std::uint64_t elements, std::size_t element_bytes, const std::string& context) {
  if (elements > (std::uint64_t{1} << 40) / std::max<std::size_t>(element_bytes, 1))
    throw FormatError(context + ": claims " + std::to_string(elements) + " values, more than any trace holds");
  const std::uint64_t bytes = elements * element_bytes;
  if (bytes == 0) return;
  Handle dcpl = check(H5Dget_create_plist(dset), context + ": creation list");
  const int filters = H5Pget_nfilters(dcpl.get());
  bool shrinks = false;
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0;
    std::size_t n = 0;
    if (H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &n, nullptr, 0, nullptr, nullptr) !=
        H5Z_FILTER_FLETCHER32)
      shrinks = true;
  }
  const std::uint64_t stored = H5Dget_storage_size(dset);
  const std::uint64_t least = shrinks ? bytes / 1032 : bytes;
  if (stored < least)
    throw FormatError(context + ": claims " + std::to_string(bytes) + " bytes of data but stores " +
                      std::to_string(stored) + (shrinks ? " (compressed: at least 1/1032 expected)" : "") +
                      "; the file is damaged or hostile");
}

std::string shape_string(const std::vector<hsize_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::vector<std::string> child_names(hid_t group, const std::string& context) {
  std::vector<std::string> names;
  const herr_t status = H5Literate(
      group, H5_INDEX_NAME, H5_ITER_INC, nullptr,
      [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
        static_cast<std::vector<std::string>*>(out)->emplace_back(name);
        return 0;
      },
      &names);
  check_status(status, context + ": listing its members failed (damaged link table)");
  return names;
}

}  // namespace kvsim::h5
