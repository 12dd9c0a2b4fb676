#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "model/dequant.h"
#include "core/error.h"

namespace kvsim {

const GgmlTypeInfo* ggml_type_info(std::uint32_t id) {
  static const GgmlTypeInfo f32{"F32", 1, 4}, f16{"F16", 1, 2}, bf16{"BF16", 1, 2}, q4_0{"Q4_0", 32, 18},
      q4_1{"Q4_1", 32, 20}, q5_0{"Q5_0", 32, 22}, q5_1{"Q5_1", 32, 24}, q8_0{"Q8_0", 32, 34}, q8_1{"Q8_1", 32, 36},
      q2_k{"Q2_K", 256, 84}, q3_k{"Q3_K", 256, 110}, q4_k{"Q4_K", 256, 144}, q5_k{"Q5_K", 256, 176},
      q6_k{"Q6_K", 256, 210}, q8_k{"Q8_K", 256, 292};
  switch (static_cast<GgmlType>(id)) {
    case GgmlType::F32:
      return &f32;
    case GgmlType::F16:
      return &f16;
    case GgmlType::BF16:
      return &bf16;
    case GgmlType::Q4_0:
      return &q4_0;
    case GgmlType::Q4_1:
      return &q4_1;
    case GgmlType::Q5_0:
      return &q5_0;
    case GgmlType::Q5_1:
      return &q5_1;
    case GgmlType::Q8_0:
      return &q8_0;
    case GgmlType::Q8_1:
      return &q8_1;
    case GgmlType::Q2_K:
      return &q2_k;
    case GgmlType::Q3_K:
      return &q3_k;
    case GgmlType::Q4_K:
      return &q4_k;
    case GgmlType::Q5_K:
      return &q5_k;
    case GgmlType::Q6_K:
      return &q6_k;
    case GgmlType::Q8_K:
      return &q8_k;
  }
  return nullptr;
}

bool GgufValue::is_integer() const {
  return std::holds_alternative<std::int64_t>(value) || std::holds_alternative<std::uint64_t>(value);
}
bool GgufValue::is_number() const { return is_integer() || std::holds_alternative<double>(value); }

std::int64_t GgufTensor::rows() const {
  std::int64_t r = 1;
  for (std::size_t i = 1; i < ne.size(); ++i) r *= ne[i];
  return r;
}
std::int64_t GgufTensor::row_size() const { return ne.empty() ? 0 : ne[0]; }

namespace {

// Bounds-checked little-endian reads from the mapped file.
class Cursor {
 public:
  Cursor(const std::string& path, const std::uint8_t* data, std::size_t size) : path_(path), data_(data), size_(size) {}
  std::size_t pos() const { return pos_; }
  std::size_t remaining() const { return size_ - pos_; }
  const std::uint8_t* take(std::size_t n, const char* what) {
    if (n > size_ - pos_)
      throw FormatError(path_ + ": truncated at byte " + std::to_string(pos_) + " while reading " + what + " (" +
                        std::to_string(n) + " bytes needed, " + std::to_string(size_ - pos_) + " left)");
    const std::uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  template <typename T>
  T read(const char* what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }
  std::string string(const char* what) {
    const auto n = read<std::uint64_t>(what);
    if (n > (std::uint64_t{1} << 30))
      throw FormatError(path_ + ": " + what + " claims a " + std::to_string(n) + "-byte string");
    const auto* p = take(static_cast<std::size_t>(n), what);
    return std::string(reinterpret_cast<const char*>(p), static_cast<std::size_t>(n));
  }

 private:
  const std::string& path_;
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

GgufValue read_value(Cursor& c, std::uint32_t type, const std::string& key, const std::string& path, int depth) {
  GgufValue v;
  v.type = type;
  const char* what = "a metadata value";
  switch (type) {
    case 0:
      v.value = static_cast<std::uint64_t>(c.read<std::uint8_t>(what));
      break;
    case 1:
      v.value = static_cast<std::int64_t>(c.read<std::int8_t>(what));
      break;
    case 2:
      v.value = static_cast<std::uint64_t>(c.read<std::uint16_t>(what));
      break;
    case 3:
      v.value = static_cast<std::int64_t>(c.read<std::int16_t>(what));
      break;
    case 4:
      v.value = static_cast<std::uint64_t>(c.read<std::uint32_t>(what));
      break;
    case 5:
      v.value = static_cast<std::int64_t>(c.read<std::int32_t>(what));
      break;
    case 6:
      v.value = static_cast<double>(c.read<float>(what));
      break;
    case 7:
      v.value = c.read<std::uint8_t>(what) != 0;
      break;
    case 8:
      v.value = c.string(what);
      break;
    case 9: {
      if (depth > 0) throw FormatError(path + ": metadata '" + key + "' is a nested array (not allowed in GGUF)");
      const auto elem = c.read<std::uint32_t>("an array element type");
      const auto n = c.read<std::uint64_t>("an array length");
      // Every element takes at least a byte: a longer array than the bytes left is a hostile or
      // truncated file, refused before anything is reserved for it.
      if (n > (std::uint64_t{1} << 28) || n > c.remaining())
        throw FormatError(path + ": metadata '" + key + "' claims " + std::to_string(n) + " array elements with " +
                          std::to_string(c.remaining()) + " bytes left in the file");
      std::vector<GgufValue> items;
      // A GgufValue is ~48 bytes: reserve no more than a real vocabulary needs up front, so that a
      // large hostile file cannot turn its length into gigabytes before the elements are read.
      items.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(n, 1 << 20)));
      for (std::uint64_t i = 0; i < n; ++i) items.push_back(read_value(c, elem, key, path, depth + 1));
      v.value = std::move(items);
      break;
    }
    case 10:
      v.value = c.read<std::uint64_t>(what);
      break;
    case 11:
      v.value = c.read<std::int64_t>(what);
      break;
    case 12:
      v.value = c.read<double>(what);
      break;
    default:
      throw FormatError(path + ": metadata '" + key + "' has value type " + std::to_string(type) +
                        ", expected 0..12 (GGUF v3 value types)");
  }
  return v;
}

}  // namespace

GgufFile::GgufFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error(path + ": cannot stat");
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      ::close(fd);
      throw Error(path + ": cannot map the file");
    }
  }
  ::close(fd);
  const auto* base = static_cast<const std::uint8_t*>(map_);
  Cursor c(path_, base, size_);
  const auto magic = c.read<std::uint32_t>("the magic");
  if (magic != 0x46554747u)
    throw FormatError(path + ": not a GGUF file (magic is 0x" + [&] {
      char b[16];
      std::snprintf(b, sizeof b, "%08x", magic);
      return std::string(b);
    }() + ", expected \"GGUF\")");
  version_ = c.read<std::uint32_t>("the version");
  if (version_ != 2 && version_ != 3)
    throw FormatError(path + ": GGUF version " + std::to_string(version_) + " is not supported (expected 2 or 3)");
  const auto n_tensors = c.read<std::uint64_t>("the tensor count");
  const auto n_kv = c.read<std::uint64_t>("the metadata count");
  if (n_tensors > 1'000'000 || n_kv > 1'000'000)
    throw FormatError(path + ": implausible counts (" + std::to_string(n_tensors) + " tensors, " +
                      std::to_string(n_kv) + " metadata entries)");
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.string("a metadata key");
    const auto type = c.read<std::uint32_t>("a metadata value type");
    GgufValue v = read_value(c, type, key, path, 0);
    if (!kv_.emplace(key, std::move(v)).second) throw FormatError(path + ": metadata key '" + key + "' appears twice");
  }
  if (has("general.alignment")) {
    const GgufValue& a = kv_.at("general.alignment");
    if (a.type != 4) throw FormatError(path + ": general.alignment must be a uint32");
    alignment_ = std::get<std::uint64_t>(a.value);
    if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0)
      throw FormatError(path + ": general.alignment = " + std::to_string(alignment_) + ", expected a power of two");
  }
  std::set<std::string> names;
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = c.string("a tensor name");
    if (!names.insert(t.name).second) throw FormatError(path + ": tensor '" + t.name + "' appears twice");
    const auto n_dims = c.read<std::uint32_t>("a tensor rank");
    if (n_dims == 0 || n_dims > 4)
      throw FormatError(path + ": tensor '" + t.name + "' has " + std::to_string(n_dims) +
                        " dimensions, expected 1..4");
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const auto ne = c.read<std::uint64_t>("a tensor dimension");
      if (ne == 0 || ne > (std::uint64_t{1} << 40))
        throw FormatError(path + ": tensor '" + t.name + "' dimension " + std::to_string(d) + " is " +
                          std::to_string(ne));
      t.ne.push_back(static_cast<std::int64_t>(ne));
    }
    const auto type = c.read<std::uint32_t>("a tensor type");
    const GgmlTypeInfo* info = ggml_type_info(type);
    if (!info)
      throw FormatError(path + ": tensor '" + t.name + "' has ggml type " + std::to_string(type) +
                        ", which this reader does not know");
    t.type = static_cast<GgmlType>(type);
    t.offset = c.read<std::uint64_t>("a tensor offset");
    if (t.ne[0] % info->block != 0)
      throw FormatError(path + ": tensor '" + t.name + "' row of " + std::to_string(t.ne[0]) +
                        " elements is not a whole "
                        "number of " +
                        info->name + " blocks (" + std::to_string(info->block) + ")");
    std::uint64_t elems = 1;
    for (auto ne : t.ne) {
      if (elems > (std::uint64_t{1} << 50) / static_cast<std::uint64_t>(ne))
        throw FormatError(path + ": tensor '" + t.name + "' has more than 2^50 elements");
      elems *= static_cast<std::uint64_t>(ne);
    }
    t.nbytes = elems / static_cast<std::uint64_t>(info->block) * static_cast<std::uint64_t>(info->bytes);
    tensors_.push_back(std::move(t));
  }
  const std::uint64_t data_offset = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  for (GgufTensor& t : tensors_) {
    if (t.offset % alignment_ != 0)
      throw FormatError(path + ": tensor '" + t.name + "' offset " + std::to_string(t.offset) +
                        " is not a multiple of "
                        "the alignment " +
                        std::to_string(alignment_));
    if (data_offset + t.offset > size_ || t.nbytes > size_ - data_offset - t.offset)
      throw FormatError(path + ": tensor '" + t.name + "' data [" + std::to_string(data_offset + t.offset) + ", +" +
                        std::to_string(t.nbytes) + ") lies beyond the end of the file (" + std::to_string(size_) +
                        " bytes)");
    t.data = base + data_offset + t.offset;
  }
}

GgufFile::~GgufFile() {
  if (map_) ::munmap(map_, size_);
}

namespace {
const char* kind(const GgufValue& v) {
  if (v.is_integer()) return "integer";
  if (std::holds_alternative<double>(v.value)) return "float";
  if (std::holds_alternative<bool>(v.value)) return "bool";
  if (std::holds_alternative<std::string>(v.value)) return "string";
  return "array";
}
}  // namespace

std::int64_t GgufFile::get_int(const std::string& key) const {
  const auto it = kv_.find(key);
  if (it == kv_.end()) throw FormatError(path_ + ": metadata '" + key + "' is missing");
  const GgufValue& v = it->second;
  if (const auto* i = std::get_if<std::int64_t>(&v.value)) return *i;
  if (const auto* u = std::get_if<std::uint64_t>(&v.value)) {
    if (*u > static_cast<std::uint64_t>(INT64_MAX))
      throw FormatError(path_ + ": metadata '" + key + "' overflows int64");
    return static_cast<std::int64_t>(*u);
  }
  throw FormatError(path_ + ": metadata '" + key + "' is a " + kind(v) + ", expected an integer");
}

double GgufFile::get_float(const std::string& key) const {
  const auto it = kv_.find(key);
  if (it == kv_.end()) throw FormatError(path_ + ": metadata '" + key + "' is missing");
  const GgufValue& v = it->second;
  if (const auto* d = std::get_if<double>(&v.value)) return *d;
  if (v.is_integer()) return static_cast<double>(get_int(key));
  throw FormatError(path_ + ": metadata '" + key + "' is a " + kind(v) + ", expected a number");
}

std::string GgufFile::get_string(const std::string& key) const {
  const auto it = kv_.find(key);
  if (it == kv_.end()) throw FormatError(path_ + ": metadata '" + key + "' is missing");
  if (const auto* s = std::get_if<std::string>(&it->second.value)) return *s;
  throw FormatError(path_ + ": metadata '" + key + "' is a " + kind(it->second) + ", expected a string");
}

const std::vector<GgufValue>& GgufFile::get_array(const std::string& key) const {
  const auto it = kv_.find(key);
  if (it == kv_.end()) throw FormatError(path_ + ": metadata '" + key + "' is missing");
  if (const auto* a = std::get_if<std::vector<GgufValue>>(&it->second.value)) return *a;
  throw FormatError(path_ + ": metadata '" + key + "' is a " + kind(it->second) + ", expected an array");
}

std::int64_t GgufFile::get_int(const std::string& key, std::int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}
double GgufFile::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

const GgufTensor* GgufFile::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const GgufTensor& GgufFile::tensor(const std::string& name) const {
  if (const GgufTensor* t = find(name)) return *t;
  throw FormatError(path_ + ": tensor '" + name + "' is missing");
}

void GgufFile::dequantize_rows(const GgufTensor& t, std::int64_t row0, std::int64_t count, std::span<float> out) const {
  if (row0 < 0 || count < 0 || row0 + count > t.rows())
    throw Error(path_ + ": tensor '" + t.name + "' rows [" + std::to_string(row0) + ", " +
                std::to_string(row0 + count) + ") out of range [0, " + std::to_string(t.rows()) + ")");
  if (static_cast<std::int64_t>(out.size()) != count * t.row_size())
    throw Error(path_ + ": tensor '" + t.name + "': output holds " + std::to_string(out.size()) + " values, expected " +
                std::to_string(count * t.row_size()));
  const GgmlTypeInfo* info = ggml_type_info(static_cast<std::uint32_t>(t.type));
  const std::int64_t row_bytes = t.row_size() / info->block * info->bytes;
  for (std::int64_t r = 0; r < count; ++r)
    dequantize_row(t.type, t.data + (row0 + r) * row_bytes, out.data() + r * t.row_size(), t.row_size());
}

}  // namespace kvsim
