// A required key of a JSON object as T; FormatError naming `where` and the
// key when it is missing or has another type. Integers (and arrays of them)
// are read strictly: a number with a fractional part (7.5) or outside T's
// range is refused, never truncated; an integral float (7.0) reads as 7.
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "dspark/error.hpp"

namespace dspark {

namespace json_detail {

template <typename T>
inline constexpr bool is_int = std::is_integral_v<T> && !std::is_same_v<T, bool>;

template <typename T>
struct is_int_vector : std::false_type {};
template <typename U>
struct is_int_vector<std::vector<U>> : std::bool_constant<is_int<U>> {};
template <typename T>
struct is_float_vector : std::false_type {};
template <typename U>
struct is_float_vector<std::vector<U>> : std::bool_constant<std::is_floating_point_v<U>> {};

// v as the integer type T, or throws FormatError("<where>: <what> must be an integer ...").
template <typename T>
T strict_int(const nlohmann::json& v, const std::string& where, const std::string& what) {
  auto refuse = [&](const char* why) -> T {
    throw FormatError(where + ": " + what + " must be " + why + ", got " + v.dump());
  };
  if (v.is_number_integer()) {
    if (v.is_number_unsigned()) {
      const auto u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) return refuse("an integer in range");
      return static_cast<T>(u);
    }
    const auto s = v.get<int64_t>();
    if constexpr (std::is_unsigned_v<T>) {
      if (s < 0) return refuse("a non-negative integer");
      if (static_cast<uint64_t>(s) > static_cast<uint64_t>(std::numeric_limits<T>::max()))
        return refuse("an integer in range");
    } else if (s < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
               s > static_cast<int64_t>(std::numeric_limits<T>::max())) {
      return refuse("an integer in range");
    }
    return static_cast<T>(s);
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) return refuse("an integer");
    if (d < static_cast<double>(std::numeric_limits<T>::min()) ||
        d > static_cast<double>(std::numeric_limits<T>::max()))
      return refuse("an integer in range");
    return static_cast<T>(d);
  }
  throw FormatError(where + ": " + what + " has the wrong type (" + v.type_name() + ")");
}

}  // namespace json_detail

template <typename T>
T json_get(const nlohmann::json& j, const std::string& key, const std::string& where) {
  if (!j.contains(key)) throw FormatError(where + ": missing key '" + key + "'");
  const nlohmann::json& v = j.at(key);
  if constexpr (json_detail::is_int<T>) {
    return json_detail::strict_int<T>(v, where, "key '" + key + "'");
  } else if constexpr (json_detail::is_int_vector<T>::value) {
    if (!v.is_array()) throw FormatError(where + ": key '" + key + "' has the wrong type (" + v.type_name() + ")");
    T out;
    out.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      out.push_back(json_detail::strict_int<typename T::value_type>(
          v[i], where, "key '" + key + "' element " + std::to_string(i)));
    return out;
  } else if constexpr (json_detail::is_float_vector<T>::value) {
    if (!v.is_array()) throw FormatError(where + ": key '" + key + "' has the wrong type (" + v.type_name() + ")");
    T out;
    out.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_number())
        throw FormatError(where + ": key '" + key + "' element " + std::to_string(i) + " must be a number, got " +
                          v[i].dump());
      out.push_back(v[i].get<typename T::value_type>());
    }
    return out;
  } else {
    try {
      return v.get<T>();
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(where + ": key '" + key + "' has the wrong type (" + v.type_name() + ")");
    }
  }
}

}  // namespace dspark
