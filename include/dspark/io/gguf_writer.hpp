// dspark/io/gguf_writer.hpp — writer for GGUF model files (versions 2 and 3).
//
// Produces the container that include/dspark/io/gguf.hpp reads and that
// llama.cpp loads, as specified by ggml (docs/gguf.md in the ggml repository),
// little-endian:
//
//   u32 magic "GGUF" | u32 version | u64 tensor count | u64 metadata KV count
//   KV pairs:     string key, u32 value type, value
//   tensor infos: string name, u32 n_dims, u64 ne[n_dims], u32 ggml type,
//                 u64 offset (relative to the data section)
//   zero padding up to a multiple of the alignment
//   data section: each tensor's bytes at its offset, each followed by zero
//                 padding up to a multiple of the alignment
//
// Strings are a u64 byte length followed by the bytes (no terminator); arrays
// are a u32 element type, a u64 element count, then the elements. Versions 2
// and 3 share this layout (version 3 only added big-endian files, which this
// writer does not produce). The alignment is `general.alignment` when that key
// is set (a uint32 power of two, as the spec requires) and 32 bytes otherwise.
//
// Metadata keys keep their insertion order; setting an existing key replaces
// its value in place. Tensors keep the order in which they were added.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dspark/io/gguf.hpp"

namespace dspark::io {

/// Builders for GGUFValue with an explicit on-disk type, e.g.
/// `w.set("llama.block_count", gguf::u32(30))`.
namespace gguf {
GGUFValue u8(uint8_t v);
GGUFValue i8(int8_t v);
GGUFValue u16(uint16_t v);
GGUFValue i16(int16_t v);
GGUFValue u32(uint32_t v);
GGUFValue i32(int32_t v);
GGUFValue u64(uint64_t v);
GGUFValue i64(int64_t v);
/// FLOAT32: stored as fp32 on disk (the reader widens it back to double exactly).
GGUFValue f32(float v);
GGUFValue f64(double v);
GGUFValue boolean(bool v);
/// STRING: UTF-8 is expected by the spec but any bytes are stored verbatim.
GGUFValue string(std::string v);
/// ARRAY of `elem_type`; every element must have exactly that type (arrays of
/// arrays are allowed, each inner array with its own element type). Throws
/// dspark::InvalidArgument naming the first element whose type differs.
GGUFValue array(GGUFValueType elem_type, GGUFValue::Array elems);
/// Arrays of STRING / INT32 / UINT32 / FLOAT32 / FLOAT64 from plain vectors.
GGUFValue string_array(const std::vector<std::string>& v);
GGUFValue i32_array(const std::vector<int32_t>& v);
GGUFValue u32_array(const std::vector<uint32_t>& v);
GGUFValue f32_array(const std::vector<float>& v);
GGUFValue f64_array(const std::vector<double>& v);
}  // namespace gguf

/// Builds a GGUF file in memory and writes it out. Tensor data is copied when
/// added, so the sources may be freed afterwards. Not thread-safe.
class GGUFWriter {
 public:
  /// `version`: 2 or 3 (the on-disk version field). Throws
  /// dspark::InvalidArgument for any other value.
  explicit GGUFWriter(uint32_t version = 3);

  uint32_t version() const { return version_; }
  /// Current data alignment in bytes: general.alignment when set, else 32.
  uint64_t alignment() const { return alignment_; }

  /// Sets metadata `key` to `value` (any of the 13 value types; arrays nested
  /// up to 8 levels, the reader's limit). A key already present keeps its
  /// position and gets the new value. Throws dspark::InvalidArgument (message
  /// names the key) when the key is empty or longer than 65535 bytes (the
  /// spec's limit), the value is malformed (its
  /// variant alternative does not match `type`, an integer does not fit the
  /// declared width, array elements of another type than `elem_type`, nesting
  /// too deep), or `key` is "general.alignment" and the value is not a UINT32
  /// power of two.
  void set(const std::string& key, GGUFValue value);
  /// The value stored for `key`, or nullptr.
  const GGUFValue* find(const std::string& key) const;
  /// Removes `key` if present; returns whether it was.
  bool erase(const std::string& key);
  /// Number of metadata pairs.
  size_t n_metadata() const { return kv_.size(); }

  /// Adds a tensor of ggml type `type_id` with dimensions `ne` in ggml order
  /// (ne[0] is the contiguous, innermost dimension: a row-major [rows, cols]
  /// matrix has ne {cols, rows}) and its raw little-endian bytes `data`.
  /// Throws dspark::InvalidArgument when the name is empty, 64 bytes or
  /// longer (ggml's limit) or already used, `ne` has not 1..4 positive
  /// entries, the type id is unknown (see ggml_type_traits), ne[0] is not a
  /// multiple of the type's block size, or data.size() differs from
  /// n_elements / block_elems * block_bytes.
  void add_tensor(const std::string& name, uint32_t type_id, std::vector<int64_t> ne,
                  std::string_view data);
  /// Adds a CPU or device tensor of dtype float32 (F32), float16 (F16),
  /// bfloat16 (BF16), float64 (F64), int8 (I8), int16 (I16), int32 (I32) or
  /// int64 (I64) with 1..4 dimensions; the row-major shape [..., rows, cols]
  /// is reversed into ne {cols, rows, ...} and a 0-dim tensor becomes ne {1}.
  /// Non-contiguous tensors are copied contiguous first. Throws
  /// dspark::InvalidArgument for another dtype, more than 4 dimensions, an
  /// empty tensor, or as the raw overload does.
  void add_tensor(const std::string& name, const at::Tensor& t);
  /// Number of tensors added.
  size_t n_tensors() const { return tensors_.size(); }

  /// Byte offset in the output at which the (aligned) data section begins;
  /// equals the total size when there are no tensors.
  uint64_t data_section_offset() const;
  /// Total size in bytes of the file that write() / bytes() produce.
  uint64_t size() const;

  /// The complete file contents.
  std::string bytes() const;
  /// Writes the file so that `path` holds either its old contents or the
  /// complete new file, never a partial one (temporary file in the same
  /// directory, fsync, rename; see atomic_file.hpp). Throws dspark::Error
  /// naming the path and the failing operation on any I/O error.
  void write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    uint32_t type_id;
    std::vector<int64_t> ne;
    std::string data;
    uint64_t offset;  // relative to the data section
  };
  template <typename Sink>
  void serialize(Sink&& sink) const;
  uint64_t header_size() const;
  void relayout();

  uint32_t version_;
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, GGUFValue>> kv_;
  std::map<std::string, size_t> kv_index_;
  std::vector<Tensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace dspark::io
