#include "capture/query_spill.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/half.h"

namespace kvsim {

namespace {

std::string errno_text() { return std::strerror(errno); }

}  // namespace

QuerySpill::QuerySpill(const std::string& near, int n_layers, std::int64_t row_values)
    : path_(near + ".q-XXXXXX"), row_values_(row_values), records_(static_cast<std::size_t>(n_layers)) {
  std::vector<char> name(path_.begin(), path_.end());
  name.push_back('\0');
  fd_ = mkstemp(name.data());
  if (fd_ < 0) throw Error(path_ + ": cannot create the query scratch file (" + errno_text() + ")");
  path_ = name.data();
  unlink(path_.c_str());
}

QuerySpill::~QuerySpill() {
  if (fd_ >= 0) close(fd_);
}

void QuerySpill::append(int layer, const float* rows, std::int64_t n) {
  if (n <= 0) return;
  const auto count = static_cast<std::size_t>(n * row_values_);
  staging_.resize(count);
  floats_to_halves(rows, staging_.data(), count);
  const auto* p = reinterpret_cast<const char*>(staging_.data());
  std::size_t left = count * sizeof(std::uint16_t);
  std::int64_t at = end_;
  while (left > 0) {
    const ssize_t w = pwrite(fd_, p, left, at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      throw Error(path_ + ": cannot write the query scratch file (" + (w < 0 ? errno_text() : "no space") + ")");
    p += w;
    left -= static_cast<std::size_t>(w);
    at += w;
  }
  records_.at(static_cast<std::size_t>(layer)).push_back({end_, n});
  end_ = at;
}

std::int64_t QuerySpill::rows(int layer) const {
  std::int64_t r = 0;
  for (const Record& rec : records_.at(static_cast<std::size_t>(layer))) r += rec.rows;
  return r;
}

std::vector<std::uint16_t> QuerySpill::read_layer(int layer) const {
  std::vector<std::uint16_t> out(static_cast<std::size_t>(rows(layer) * row_values_));
  char* dst = reinterpret_cast<char*>(out.data());
  for (const Record& rec : records_.at(static_cast<std::size_t>(layer))) {
    std::size_t left = static_cast<std::size_t>(rec.rows * row_values_) * sizeof(std::uint16_t);
    std::int64_t at = rec.offset;
    while (left > 0) {
      const ssize_t r = pread(fd_, dst, left, at);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        throw Error(path_ + ": cannot read back the query scratch file (" + (r < 0 ? errno_text() : "short file") +
                    ")");
      dst += r;
      left -= static_cast<std::size_t>(r);
      at += r;
    }
  }
  return out;
}

void QuerySpill::clear() {
  for (auto& r : records_) r.clear();
  end_ = 0;
  // Give the blocks back so a long capture's scratch file never grows past one request.
  if (ftruncate(fd_, 0) != 0) throw Error(path_ + ": cannot truncate the query scratch file (" + errno_text() + ")");
}

}  // namespace kvsim
