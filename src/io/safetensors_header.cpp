// The safetensors header parser; see safetensors_header.hpp.
#include "safetensors_header.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <set>
#include <sstream>

#include "dspark/error.hpp"
#include "dspark/io/safetensors.hpp"

namespace dspark::io::safetensors_detail {

using json = nlohmann::json;

constexpr std::array<DTypeInfo, 10> kDTypes = {{
    {"F64", at::kDouble, 8},
    {"F32", at::kFloat, 4},
    {"F16", at::kHalf, 2},
    {"BF16", at::kBFloat16, 2},
    {"I64", at::kLong, 8},
    {"I32", at::kInt, 4},
    {"I16", at::kShort, 2},
    {"I8", at::kChar, 1},
    {"U8", at::kByte, 1},
    {"BOOL", at::kBool, 1},
}};

// Dtypes of the specification that this reader does not load.
constexpr std::array<const char*, 11> kUnsupportedSpecDTypes = {
    "U16", "U32", "U64", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64", "F8_E4M3FNUZ"};

const DTypeInfo* find_dtype(std::string_view name) {
  for (const auto& d : kDTypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

const DTypeInfo* find_dtype(at::ScalarType type) {
  for (const auto& d : kDTypes) {
    if (type == d.type) return &d;
  }
  return nullptr;
}

std::string supported_dtype_list() {
  std::string out;
  for (const auto& d : kDTypes) {
    if (!out.empty()) out += ", ";
    out += d.name;
  }
  return out;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// A short rendering of a JSON value for error messages: its type and, for
// small values, the value itself.
std::string describe(const json& v) {
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return std::string(v.type_name()) + " " + text;
}



class HeaderParser {
 public:
  HeaderParser(const std::string& source, uint64_t data_size) : source_(source), data_size_(data_size) {}

  Header parse(std::string_view text) {
    const json root = parse_json(text);
    if (!root.is_object()) fail("header must be a JSON object, found " + describe(root));
    Header h;
    for (const auto& [key, value] : root.items()) {
      if (key == "__metadata__") {
        h.metadata = parse_metadata(value);
      } else {
        h.entries.push_back(parse_entry(key, value));
      }
    }
    check_coverage(h.entries);
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw FormatError(source_ + ": " + what); }
  [[noreturn]] void fail_tensor(const std::string& name, const std::string& what) const {
    fail("tensor '" + name + "': " + what);
  }

  json parse_json(std::string_view text) const {
    // Track the keys of every open object so that a repeated key (which a
    // plain parse would silently collapse) is reported.
    std::vector<std::set<std::string>> open_objects;
    const json::parser_callback_t callback = [&](int, json::parse_event_t event, json& parsed) {
      switch (event) {
        case json::parse_event_t::object_start:
          open_objects.emplace_back();
          break;
        case json::parse_event_t::object_end:
          if (!open_objects.empty()) open_objects.pop_back();
          break;
        case json::parse_event_t::key:
          if (!open_objects.empty() && parsed.is_string() &&
              !open_objects.back().insert(parsed.get<std::string>()).second) {
            fail("header repeats the key '" + parsed.get<std::string>() + "'");
          }
          break;
        default:
          break;
      }
      return true;
    };
    try {
      return json::parse(text.begin(), text.end(), callback);
    } catch (const json::exception& e) {  // syntax errors, and numbers beyond double range (1e400)
      fail(std::string("header is not valid JSON: ") + e.what());
    }
  }

  std::map<std::string, std::string> parse_metadata(const json& value) const {
    if (!value.is_object()) {
      fail("\"__metadata__\" must be an object of strings, found " + describe(value));
    }
    std::map<std::string, std::string> out;
    for (const auto& [key, v] : value.items()) {
      if (!v.is_string()) {
        fail("\"__metadata__\" key '" + key + "': expected a string value, found " + describe(v));
      }
      out.emplace(key, v.get<std::string>());
    }
    return out;
  }

  // A JSON non-negative integer, or fails with `what` describing the field.
  uint64_t as_u64(const std::string& name, const json& v, const std::string& what) const {
    if (v.is_number_unsigned()) return v.get<uint64_t>();
    if (v.is_number_integer()) {
      fail_tensor(name, what + " is " + std::to_string(v.get<int64_t>()) + ", expected a non-negative integer");
    }
    fail_tensor(name, what + " must be a non-negative integer, found " + describe(v));
  }

  Entry parse_entry(const std::string& name, const json& value) const {
    if (!value.is_object()) {
      fail_tensor(name, "expected an object with \"dtype\", \"shape\" and \"data_offsets\", found " +
                            describe(value));
    }
    for (const auto& [key, v] : value.items()) {
      (void)v;
      if (key != "dtype" && key != "shape" && key != "data_offsets") {
        fail_tensor(name, "unexpected key '" + key + "' (expected only \"dtype\", \"shape\", \"data_offsets\")");
      }
    }
    for (const char* key : {"dtype", "shape", "data_offsets"}) {
      if (!value.contains(key)) fail_tensor(name, std::string("missing \"") + key + "\"");
    }

    Entry e;
    e.name = name;

    const json& dtype = value.at("dtype");
    if (!dtype.is_string()) fail_tensor(name, "\"dtype\" must be a string, found " + describe(dtype));
    const std::string dtype_name = dtype.get<std::string>();
    e.dtype = find_dtype(dtype_name);
    if (e.dtype == nullptr) {
      const bool in_spec = std::any_of(kUnsupportedSpecDTypes.begin(), kUnsupportedSpecDTypes.end(),
                                       [&](const char* n) { return dtype_name == n; });
      fail_tensor(name, std::string(in_spec ? "unsupported" : "unknown") + " dtype '" + dtype_name +
                            "' (supported: " + supported_dtype_list() + ")");
    }

    const json& shape = value.at("shape");
    if (!shape.is_array()) fail_tensor(name, "\"shape\" must be an array of integers, found " + describe(shape));
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t i = 0; i < shape.size(); ++i) {
      const uint64_t d = as_u64(name, shape[i], "shape dimension " + std::to_string(i));
      if (d > static_cast<uint64_t>(INT64_MAX)) {
        fail_tensor(name, "shape dimension " + std::to_string(i) + " is " + std::to_string(d) + ", too large");
      }
      e.shape.push_back(static_cast<int64_t>(d));
      overflow = overflow || __builtin_mul_overflow(numel, d, &numel);
    }

    const json& offsets = value.at("data_offsets");
    if (!offsets.is_array() || offsets.size() != 2) {
      fail_tensor(name, "\"data_offsets\" must be an array of two integers [begin, end], found " +
                            describe(offsets));
    }
    e.begin = as_u64(name, offsets[0], "data_offsets begin");
    e.end = as_u64(name, offsets[1], "data_offsets end");
    std::string range(1, '[');
    range.append(std::to_string(e.begin)).append(", ").append(std::to_string(e.end)).append("]");
    if (e.begin > e.end) fail_tensor(name, "data_offsets " + range + ": begin is after end");
    if (e.end > data_size_) {
      fail_tensor(name, "data_offsets " + range + " end beyond the data section of " + std::to_string(data_size_) +
                            " bytes");
    }
    uint64_t expected = 0;
    overflow = overflow || __builtin_mul_overflow(numel, e.dtype->size, &expected) ||
               numel > static_cast<uint64_t>(INT64_MAX);
    const std::string what = " (shape " + shape_string(e.shape) + ", " + e.dtype->name + ")";
    if (overflow) {
      fail_tensor(name, "data_offsets span " + std::to_string(e.end - e.begin) +
                            " bytes, but the element count overflows" + what);
    }
    if (e.end - e.begin != expected) {
      fail_tensor(name, "data_offsets span " + std::to_string(e.end - e.begin) + " bytes, expected " +
                            std::to_string(expected) + what);
    }
    return e;
  }

  // The ranges must tile [0, data_size) exactly.
  void check_coverage(const std::vector<Entry>& entries) const {
    std::vector<const Entry*> sorted;
    for (const auto& e : entries) sorted.push_back(&e);
    std::sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) {
      if (a->begin != b->begin) return a->begin < b->begin;
      if (a->end != b->end) return a->end < b->end;
      return a->name < b->name;
    });
    const auto range = [](const Entry* e) {
      std::string r(1, '[');
      r.append(std::to_string(e->begin)).append(", ").append(std::to_string(e->end)).append(")");
      return r;
    };
    uint64_t pos = 0;
    const Entry* prev = nullptr;
    for (const Entry* e : sorted) {
      if (e->begin < pos) {
        fail("tensor '" + e->name + "' (bytes " + range(e) + ") overlaps tensor '" + prev->name + "' (bytes " +
             range(prev) + ")");
      }
      if (e->begin > pos) {
        if (prev == nullptr) {
          fail("gap of " + std::to_string(e->begin) + " bytes at the start of the data section: first tensor '" +
               e->name + "' begins at " + std::to_string(e->begin) + ", expected 0");
        }
        fail("gap of " + std::to_string(e->begin - pos) + " bytes in the data section between tensor '" +
             prev->name + "' (ends at " + std::to_string(pos) + ") and tensor '" + e->name + "' (begins at " +
             std::to_string(e->begin) + ")");
      }
      pos = e->end;
      prev = e;
    }
    if (pos != data_size_) {
      fail("data section has " + std::to_string(data_size_) + " bytes but the tensors cover only " +
           std::to_string(pos) + " (" + std::to_string(data_size_ - pos) + " trailing bytes unaccounted for)");
    }
  }

  const std::string& source_;
  uint64_t data_size_;
};

Header parse_header(const std::string& source, uint64_t data_size, std::string_view text) {
  return HeaderParser(source, data_size).parse(text);
}

uint64_t read_u64_le(const unsigned char* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Validates the size prefix against the total size; returns the header size.
uint64_t check_prefix(const std::string& source, uint64_t total, const unsigned char* prefix) {
  if (total < 8) {
    throw FormatError(source + ": file is " + std::to_string(total) +
                      " bytes, too short for the 8-byte header size");
  }
  const uint64_t n = read_u64_le(prefix);
  if (n > kSafetensorsMaxHeaderBytes) {
    throw FormatError(source + ": header size " + std::to_string(n) + " bytes is implausible (limit " +
                      std::to_string(kSafetensorsMaxHeaderBytes) + ")");
  }
  if (n > total - 8) {
    throw FormatError(source + ": header size " + std::to_string(n) + " bytes exceeds the " +
                      std::to_string(total - 8) + " bytes that follow the size field");
  }
  return n;
}

// Owns a file descriptor.

}  // namespace dspark::io::safetensors_detail
