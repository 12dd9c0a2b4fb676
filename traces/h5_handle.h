#pragma once
// A thin RAII layer over the HDF5 C API (formats.md §7.2: the C API with our own guards, no
// H5Cpp). Every failing call becomes a kvsim::FormatError naming the file and the object, and
// the library's own error printing is silenced so hostile files never spray stderr.
#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvsim::h5 {

// Owns one hid_t and closes it with the matching H5*close.
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept;
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Turns off HDF5's automatic error printing for this process (idempotent).
void silence_library_errors();

// Throws FormatError("<context>: <what>") if id < 0; returns a Handle owning it otherwise.
Handle check(hid_t id, const std::string& context);
void check_status(herr_t status, const std::string& context);

// A file-type-equals-memory-type IEEE half, built as h5py does so numpy sees float16.
hid_t half_type();

// "file:/path/of/object", for error messages.
std::string object_name(hid_t obj);

bool link_exists(hid_t loc, const std::string& name);
bool attr_exists(hid_t obj, const std::string& name);

void write_attr_string(hid_t obj, const std::string& name, const std::string& value);
void write_attr_i64(hid_t obj, const std::string& name, std::int64_t value);
void write_attr_f64(hid_t obj, const std::string& name, double value);

// Readers throw FormatError naming `context` when the attribute is missing or of the wrong kind.
std::string read_attr_string(hid_t obj, const std::string& name, const std::string& context);
std::int64_t read_attr_i64(hid_t obj, const std::string& name, const std::string& context);
double read_attr_f64(hid_t obj, const std::string& name, const std::string& context);

// Dataset shape (empty for scalars).
std::vector<hsize_t> dataset_shape(hid_t dset);
// A dataset about to be read as `elements` values of `element_bytes` each must store them: its
// allocated storage holds at least those bytes when no filter can shrink them (none, or Fletcher32
// alone), at least 1/1032 of them under compression (deflate's best ratio). Throws naming the
// dataset otherwise, so a hostile file cannot make its reader allocate what it does not hold.
void check_stored(hid_t dset, std::uint64_t elements, std::size_t element_bytes, const std::string& context);
// The number of elements of `shape`, refused (naming `context`) past 2^40, where a product of
// hostile extents could wrap around.
std::uint64_t element_count(const std::vector<hsize_t>& shape, const std::string& context);
std::string shape_string(const std::vector<hsize_t>& shape);

// Names of the links directly below `group`, in creation order when tracked, else by name.
// Throws FormatError naming `context` if the iteration fails partway (a damaged link table).
std::vector<std::string> child_names(hid_t group, const std::string& context);

}  // namespace kvsim::h5
