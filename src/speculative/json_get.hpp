// A required key of a JSON object as T; FormatError naming `where` and the
// key when it is missing or has another type.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "dspark/error.hpp"

namespace dspark {

template <typename T>
T json_get(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) throw FormatError(where + ": missing key '" + key + "'");
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(where + ": key '" + key + "' has the wrong type (" + j.at(key).type_name() + ")");
  }
}

}  // namespace dspark
