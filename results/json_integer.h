#pragma once
// Values read from JSON without undefined behaviour: nlohmann's get<int>() converts a float
// such as 2e33 unchecked (fuzz_result_files found it). Only a JSON integer in T's range is one.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <type_traits>
#include <utility>

namespace kvsim::results {

template <class T>
bool as_integer(const nlohmann::json& v, T& out) {
  if (v.is_number_unsigned()) {
    const auto x = v.get<std::uint64_t>();
    if (!std::in_range<T>(x)) return false;
    out = static_cast<T>(x);
    return true;
  }
  if (v.is_number_integer()) {
    const auto x = v.get<std::int64_t>();
    if (!std::in_range<T>(x)) return false;
    out = static_cast<T>(x);
    return true;
  }
  return false;
}

// `v` as a T (integers by as_integer); false when it is not one. Containers of integers are not
// checked this way: read them element by element (keep_sets_file.cpp, kept_sets).
template <class T>
bool json_value(const nlohmann::json& v, T& out) {
  if constexpr (std::is_integral_v<T>) {
    return as_integer(v, out);
  } else {
    try {
      out = v.get<T>();
      return true;
    } catch (const nlohmann::json::exception&) {
      return false;
    }
  }
}

}  // namespace kvsim::results
