// Internal to the safetensors reader (src/io/safetensors.cpp): the header
// parser and file prefix check, apart from the tensor construction so that
// they build and fuzz without the tensor library's operators.
#pragma once

#include <c10/core/ScalarType.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace dspark::io::safetensors_detail {

struct DTypeInfo {
  const char* name;
  at::ScalarType type;
  uint64_t size;
};

// One validated header entry.
struct Entry {
  std::string name;
  const DTypeInfo* dtype = nullptr;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct Header {
  std::vector<Entry> entries;  // in header order
  std::map<std::string, std::string> metadata;
};

const DTypeInfo* find_dtype(std::string_view name);
const DTypeInfo* find_dtype(at::ScalarType type);
/// "F32, F16, ..." for error messages.
std::string supported_dtype_list();
/// A JSON value's type and, when short, its text (for error messages).
std::string describe(const nlohmann::json& v);

/// Parses and validates the JSON header `text` of a file whose data section
/// holds `data_size` bytes; throws FormatError naming `source`.
Header parse_header(const std::string& source, uint64_t data_size, std::string_view text);

uint64_t read_u64_le(const unsigned char* p);
/// Validates the 8-byte length prefix against the file size `total`;
/// returns the header length.
uint64_t check_prefix(const std::string& source, uint64_t total, const unsigned char* prefix);

}  // namespace dspark::io::safetensors_detail
