// dspark/io/gguf.hpp — reader for GGUF model files (versions 2 and 3).
//
// Implements the GGUF container as specified by ggml (docs/gguf.md in the ggml
// repository): magic "GGUF", u32 version, u64 tensor count, u64 metadata KV
// count, the KV pairs (all 13 value types, arrays nested to any depth), the
// tensor infos, then the tensor data section aligned to `general.alignment`
// (default 32 bytes). The file is memory-mapped read-only; tensor data pointers
// stay valid for the lifetime of the GGUFFile.
//
// Every structural problem (bad magic, unknown version, a length or offset
// running past the end of the file, an unknown value or tensor type) throws
// dspark::FormatError naming the file, the byte offset or the key, and what was
// expected versus found.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace dspark::io {

/// ggml tensor element types (numeric values are the on-disk ids).
enum class GGMLType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, BF16 = 30,
};

/// Block geometry of a ggml type: `block_elems` values are stored in
/// `block_bytes` bytes. Returns std::nullopt for ids this reader does not know.
struct GGMLTypeTraits {
  const char* name;
  int64_t block_elems;
  int64_t block_bytes;
};
std::optional<GGMLTypeTraits> ggml_type_traits(uint32_t type_id);

/// Human-readable name of a type id ("Q4_K", or "type#23" when unknown).
std::string ggml_type_name(uint32_t type_id);

/// GGUF metadata value types (on-disk ids).
enum class GGUFValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
  BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};

/// One metadata value. Integers are widened to int64/uint64, floats to double;
/// `type` keeps the on-disk type, `elem_type` the element type of an array.
struct GGUFValue {
  using Array = std::vector<GGUFValue>;
  GGUFValueType type = GGUFValueType::UINT8;
  GGUFValueType elem_type = GGUFValueType::UINT8;  // only meaningful for ARRAY
  std::variant<uint64_t, int64_t, double, bool, std::string, Array> value;

  bool is_integer() const;
  bool is_float() const;
  /// Accessors throw dspark::FormatError when the type does not fit
  /// (e.g. as_string on an integer, a negative value as_uint).
  int64_t as_int() const;
  uint64_t as_uint() const;
  double as_float() const;  // integers convert too
  bool as_bool() const;
  const std::string& as_string() const;
  const Array& as_array() const;
};

/// Description of one tensor inside the file.
struct GGUFTensorInfo {
  std::string name;
  std::vector<int64_t> ne;   // ggml order: ne[0] is the contiguous (innermost) dim
  uint32_t type_id = 0;      // GGMLType id
  uint64_t offset = 0;       // byte offset relative to the data section
  uint64_t n_bytes = 0;      // size of the data in bytes
  const uint8_t* data = nullptr;  // points into the mapped file

  GGMLType type() const { return static_cast<GGMLType>(type_id); }
  int64_t n_elements() const;
  /// PyTorch/row-major shape: ne reversed, e.g. a [out, in] weight has ne {in, out}.
  std::vector<int64_t> shape() const;
};

/// A read-only memory-mapped GGUF file. Move-only; unmapped on destruction.
class GGUFFile {
 public:
  /// Opens and validates `path`. Throws dspark::FormatError (or dspark::Error
  /// when the file cannot be opened) with the path in the message.
  explicit GGUFFile(const std::string& path);
  ~GGUFFile();
  GGUFFile(GGUFFile&&) noexcept;
  GGUFFile& operator=(GGUFFile&&) noexcept;
  GGUFFile(const GGUFFile&) = delete;
  GGUFFile& operator=(const GGUFFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }

  const std::map<std::string, GGUFValue>& metadata() const { return kv_; }
  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  /// Throws FormatError "<path>: missing metadata key '<key>'" when absent.
  const GGUFValue& get(const std::string& key) const;
  const GGUFValue* find(const std::string& key) const;

  /// Typed getters; the `*_or` forms return the fallback when the key is absent.
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  int64_t get_int_or(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key) const;
  double get_float_or(const std::string& key, double fallback) const;
  bool get_bool_or(const std::string& key, bool fallback) const;
  /// Arrays of strings / integers / floats, converted element by element.
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  std::vector<double> get_float_array(const std::string& key) const;

  const std::vector<GGUFTensorInfo>& tensors() const { return tensors_; }
  const GGUFTensorInfo* find_tensor(const std::string& name) const;
  /// Throws FormatError "<path>: missing tensor '<name>'" when absent.
  const GGUFTensorInfo& tensor(const std::string& name) const;

 private:
  void parse();
  std::string path_;
  int fd_ = -1;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GGUFValue> kv_;
  std::vector<GGUFTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace dspark::io
