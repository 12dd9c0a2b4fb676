#pragma once
// GGUF v3 (and v2) reader: the whole file is memory-mapped read-only; the header, metadata and
// tensor table are parsed with bounds checks, so a truncated or hostile file is an error naming
// the file, the offset and what was being read (formats.md §1).
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace kvsim {

// ggml tensor type ids (formats.md §1.3).
enum class GgmlType : std::uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  BF16 = 30,
};

struct GgmlTypeInfo {
  const char* name;
  std::int64_t block;  // elements per block
  std::int64_t bytes;  // bytes per block
};
// nullptr for ids this reader does not know (the caller names the id in its error).
const GgmlTypeInfo* ggml_type_info(std::uint32_t id);

// A metadata value: integers (any width, signedness kept), floats, bools, strings, arrays.
struct GgufValue {
  std::uint32_t type = 0;  // GGUF value type id (formats.md §1.2)
  std::variant<std::int64_t, std::uint64_t, double, bool, std::string, std::vector<GgufValue>> value;
  bool is_integer() const;
  bool is_number() const;
};

struct GgufTensor {
  std::string name;
  std::vector<std::int64_t> ne;  // GGUF order: ne[0] is the contiguous (fastest) dimension
  GgmlType type = GgmlType::F32;
  std::uint64_t offset = 0;  // relative to the data section
  std::uint64_t nbytes = 0;
  const std::uint8_t* data = nullptr;
  std::int64_t rows() const;      // product of ne[1..]
  std::int64_t row_size() const;  // ne[0]
};

class GgufFile {
 public:
  explicit GgufFile(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  std::uint32_t version() const { return version_; }
  std::uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }

  bool has(const std::string& key) const { return kv_.count(key) > 0; }
  // Typed getters: throw FormatError naming the file, the key and the expected type.
  std::int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  const std::vector<GgufValue>& get_array(const std::string& key) const;
  std::int64_t get_int(const std::string& key, std::int64_t fallback) const;
  double get_float(const std::string& key, double fallback) const;

  const GgufTensor* find(const std::string& name) const;    // nullptr if absent
  const GgufTensor& tensor(const std::string& name) const;  // throws naming the tensor

  // Rows [row0, row0 + count) of a tensor as f32, `count * row_size()` values.
  void dequantize_rows(const GgufTensor& t, std::int64_t row0, std::int64_t count, std::span<float> out) const;

 private:
  std::string path_;
  void* map_ = nullptr;
  std::size_t size_ = 0;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensor> tensors_;
};

}  // namespace kvsim
