#pragma once
// Strong types for quantities that cross module borders, so a token count is never passed
// where a byte count is expected (ChampSim's `champsim::data::bytes` is the model).
#include <compare>
#include <cstdint>

namespace kvsim {

template <typename Tag>
class Quantity {
 public:
  constexpr Quantity() = default;
  constexpr explicit Quantity(std::int64_t v) : value_(v) {}
  constexpr std::int64_t value() const { return value_; }
  constexpr auto operator<=>(const Quantity&) const = default;
  constexpr Quantity& operator+=(Quantity o) { value_ += o.value_; return *this; }
  constexpr Quantity& operator-=(Quantity o) { value_ -= o.value_; return *this; }
  friend constexpr Quantity operator+(Quantity a, Quantity b) { return a += b; }
  friend constexpr Quantity operator-(Quantity a, Quantity b) { return a -= b; }
  friend constexpr Quantity operator*(Quantity a, std::int64_t k) { return Quantity(a.value_ * k); }
  friend constexpr Quantity operator*(std::int64_t k, Quantity a) { return Quantity(a.value_ * k); }

 private:
  std::int64_t value_ = 0;
};

struct BytesTag {};
struct TokensTag {};
using Bytes = Quantity<BytesTag>;
using Tokens = Quantity<TokensTag>;

}  // namespace kvsim
