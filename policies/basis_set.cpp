#include "policies/basis_set.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace kvsim {

namespace {

constexpr char kMagic[] = "KVSIMBASIS1\n";  // 12 bytes; the digit is the format version

template <typename T>
void put(std::ostream& out, T x) {
  out.write(reinterpret_cast<const char*>(&x), sizeof x);
}

template <typename T>
T get(std::istream& in, const std::string& path, const char* field) {
  T x{};
  if (!in.read(reinterpret_cast<char*>(&x), sizeof x))
    throw Error("basis file '" + path + "': truncated while reading " + field);
  return x;
}

std::string where(const std::string& path, const char* field) { return "basis file '" + path + "': field " + field; }

}  // namespace

const HeadBasis& BasisSet::at(int layer, int kv) const {
  const auto i = static_cast<std::size_t>(layer) * static_cast<std::size_t>(n_kv_heads) + static_cast<std::size_t>(kv);
  if (layer < 0 || kv < 0 || layer >= n_layers || kv >= n_kv_heads || i >= heads.size())
    throw Error("basis set: no basis for layer " + std::to_string(layer) + ", KV head " + std::to_string(kv));
  return heads[i];
}

void save_basis_set(const BasisSet& set, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("cannot write basis file '" + tmp + "'");
    out.write(kMagic, sizeof kMagic - 1);
    put<std::int32_t>(out, set.n_layers);
    put<std::int32_t>(out, set.n_kv_heads);
    put<std::int32_t>(out, set.head_dim);
    put<std::int32_t>(out, static_cast<std::int32_t>(set.rope.type));
    put<std::int32_t>(out, set.rope.rope_dim);
    put<double>(out, set.rope.theta);
    put<std::int64_t>(out, set.tokens);
    put<std::uint32_t>(out, static_cast<std::uint32_t>(set.source.size()));
    out.write(set.source.data(), static_cast<std::streamsize>(set.source.size()));
    const auto dd = static_cast<std::size_t>(set.head_dim) * static_cast<std::size_t>(set.head_dim);
    for (const HeadBasis& b : set.heads) {
      if (b.uk.size() != dd || b.uv.size() != dd) throw Error("basis set: a basis is not head_dim x head_dim");
      out.write(reinterpret_cast<const char*>(b.uk.data()), static_cast<std::streamsize>(dd * sizeof(float)));
      out.write(reinterpret_cast<const char*>(b.uv.data()), static_cast<std::streamsize>(dd * sizeof(float)));
    }
    if (!out.flush()) throw Error("cannot write basis file '" + tmp + "' (disk full?)");
  }
  std::filesystem::rename(tmp, path);
}

BasisSet load_basis_set(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open basis file '" + path + "'");
  char magic[sizeof kMagic - 1] = {};
  if (!in.read(magic, sizeof magic) || std::memcmp(magic, kMagic, sizeof magic) != 0)
    throw Error("basis file '" + path +
                "': not a kvsim basis file (expected it to start with KVSIMBASIS1; write one "
                "with `kvsim trace fit-basis`)");
  BasisSet s;
  s.n_layers = get<std::int32_t>(in, path, "n_layers");
  s.n_kv_heads = get<std::int32_t>(in, path, "n_kv_heads");
  s.head_dim = get<std::int32_t>(in, path, "head_dim");
  const auto rope_type = get<std::int32_t>(in, path, "rope_type");
  s.rope.rope_dim = get<std::int32_t>(in, path, "rope_dim");
  s.rope.theta = get<double>(in, path, "rope_theta");
  s.tokens = get<std::int64_t>(in, path, "tokens");
  if (s.n_layers < 1 || s.n_layers > 4096)
    throw Error(where(path, "n_layers") + " = " + std::to_string(s.n_layers) + ", expected 1..4096");
  if (s.n_kv_heads < 1 || s.n_kv_heads > 4096)
    throw Error(where(path, "n_kv_heads") + " = " + std::to_string(s.n_kv_heads) + ", expected 1..4096");
  if (s.head_dim < 1 || s.head_dim > 1024)
    throw Error(where(path, "head_dim") + " = " + std::to_string(s.head_dim) + ", expected 1..1024");
  if (rope_type != 0 && rope_type != 1)
    throw Error(where(path, "rope_type") + " = " + std::to_string(rope_type) + ", expected 0 or 1");
  s.rope.type = static_cast<RopeType>(rope_type);
  s.rope.head_dim = s.head_dim;
  const auto len = get<std::uint32_t>(in, path, "source length");
  if (len > (1u << 20)) throw Error(where(path, "source length") + " = " + std::to_string(len) + ", expected < 1 MiB");
  s.source.resize(len);
  if (len && !in.read(s.source.data(), len)) throw Error("basis file '" + path + "': truncated while reading source");
  const auto dd = static_cast<std::size_t>(s.head_dim) * static_cast<std::size_t>(s.head_dim);
  for (int i = 0; i < s.n_layers * s.n_kv_heads; ++i) {
    HeadBasis b;
    b.d = s.head_dim;
    b.uk.resize(dd);
    b.uv.resize(dd);
    if (!in.read(reinterpret_cast<char*>(b.uk.data()), static_cast<std::streamsize>(dd * sizeof(float))) ||
        !in.read(reinterpret_cast<char*>(b.uv.data()), static_cast<std::streamsize>(dd * sizeof(float))))
      throw Error("basis file '" + path + "': truncated in the bases (" + std::to_string(i) + " of " +
                  std::to_string(s.n_layers * s.n_kv_heads) + " read)");
    s.heads.push_back(std::move(b));
  }
  if (in.peek() != std::char_traits<char>::eof())
    throw Error("basis file '" + path + "': trailing bytes after the bases");
  return s;
}

void check_basis_set(const BasisSet& s, const ModelGeometry& g) {
  auto field = [&](const char* name, long long have, long long want) {
    if (have != want)
      throw Error("basis set fitted on " + s.source + ": " + name + " = " + std::to_string(have) + ", expected " +
                  std::to_string(want) + " (the trace's model)");
  };
  field("n_layers", s.n_layers, g.n_layers);
  field("n_kv_heads", s.n_kv_heads, g.n_kv_heads);
  field("head_dim", s.head_dim, g.head_dim);
  field("rope_type", static_cast<int>(s.rope.type), static_cast<int>(g.rope.type));
  field("rope_dim", s.rope.rope_dim, g.rope.rope_dim);
}

}  // namespace kvsim
