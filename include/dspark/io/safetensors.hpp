// dspark/io/safetensors.hpp — reader and writer for safetensors checkpoints.
//
// Implements the safetensors format of huggingface/safetensors:
//
//   bytes [0, 8)        N, the header size, a little-endian u64
//   bytes [8, 8 + N)    the header: a UTF-8 JSON object, optionally padded at
//                       the end with spaces (0x20)
//   bytes [8 + N, EOF)  the data section
//
// The header maps each tensor name to
//   {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
// where [begin, end) is a byte range relative to the start of the data section,
// and may hold one extra key "__metadata__" mapping strings to strings. Tensor
// data is stored row-major (C order), little-endian, with no padding inside a
// tensor. The ranges of all tensors must tile the data section exactly: no
// overlap, no gap, nothing after the last tensor.
//
// Supported dtypes and the at::ScalarType each maps to (element size in bytes):
//   F64 kDouble (8)   F32 kFloat (4)   F16 kHalf (2)   BF16 kBFloat16 (2)
//   I64 kLong (8)     I32 kInt (4)     I16 kShort (2)  I8 kChar (1)
//   U8 kByte (1)      BOOL kBool (1, each byte 0 or 1)
// Other dtypes of the specification (U16, U32, U64, the F8/F6/F4 variants, C64)
// are rejected with a FormatError naming them.
//
// Every structural problem throws dspark::FormatError whose one-line message
// names the file, the tensor or key concerned, and what was expected versus
// found, e.g.
//   "x.safetensors: tensor 'fc.weight': data_offsets span 100 bytes, expected 48 (shape [4, 6], BF16)".
// A file that cannot be opened or read throws dspark::Error with strerror.
//
// This module assumes a little-endian host (checked at compile time).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dspark::io {

/// Largest header accepted by the readers, in bytes (the reference
/// implementation's limit). Larger values are treated as corruption.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

/// Contents of a safetensors file or sharded checkpoint.
///
/// `tensors` are CPU, contiguous, and own their memory (nothing refers back to
/// the file); the shape and dtype are those of the header (a shape of [] gives
/// a 0-dim tensor). `metadata` is the "__metadata__" object, empty when absent.
struct SafetensorsData {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

/// The at::ScalarType of a safetensors dtype string ("BF16" -> kBFloat16), or
/// std::nullopt when `dtype` is not one of the ten supported names (exact,
/// case-sensitive match).
std::optional<at::ScalarType> safetensors_scalar_type(std::string_view dtype);

/// The safetensors dtype string of `type` ("F32" for kFloat), or std::nullopt
/// when the type has no supported safetensors encoding (e.g. complex, quint8).
std::optional<std::string_view> safetensors_dtype_name(at::ScalarType type);

/// Reads and validates the safetensors file at `path`, copying every tensor
/// into freshly allocated CPU memory.
///
/// Throws dspark::Error when the file cannot be opened or read, and
/// dspark::FormatError (message starts with `path`) when: the file is shorter
/// than 8 bytes; the header size exceeds the rest of the file or
/// kSafetensorsMaxHeaderBytes; the header is not valid UTF-8 JSON, not an
/// object, or repeats a key; an entry is not an object, lacks or mistypes
/// "dtype" (string) / "shape" (array of non-negative integers) /
/// "data_offsets" (array of two non-negative integers), or has another key;
/// the dtype is unknown or unsupported; begin > end; end lies beyond the data
/// section; end - begin != numel * element size; two tensors' ranges overlap,
/// leave a gap, or do not reach the end of the data section; "__metadata__" is
/// not an object of strings; a BOOL tensor holds a byte other than 0 or 1.
SafetensorsData load_safetensors(const std::string& path);

/// Same as load_safetensors for a file already in memory; `source_name` is
/// the name used at the start of error messages.
SafetensorsData parse_safetensors(std::string_view bytes, const std::string& source_name);

/// Loads a checkpoint directory in the Hugging Face layout.
///
/// When `dir`/model.safetensors.index.json exists, it must be a JSON object
/// whose "weight_map" object maps tensor name -> shard file name (relative to
/// `dir`, without ".." components); every shard named there is loaded with
/// load_safetensors, and the result holds the union of their tensors. Each
/// tensor must appear in exactly one shard, and that shard must be the one the
/// weight_map names; tensors missing from the weight_map, absent from their
/// shard or present in two shards are FormatErrors. `metadata` is the union of
/// the shards' "__metadata__" (shards visited in file-name order; for a key
/// present in several shards the first value is kept); the index's own
/// "metadata" object (e.g. "total_size") is not returned.
///
/// Otherwise `dir`/model.safetensors is loaded. Throws dspark::Error when
/// neither file exists or `dir` is not a readable directory, FormatError for
/// a malformed index or shard.
SafetensorsData load_safetensors_dir(const std::string& dir);

/// Encodes `tensors` (in the given order, which is both the order of the
/// header's keys and of the data section) and `metadata` (as "__metadata__",
/// placed first and omitted when empty) into safetensors bytes.
///
/// Tensors on other devices are copied to the CPU and non-contiguous ones made
/// contiguous; values are copied bit for bit (NaN payloads, -0.0 included).
/// The header is compact JSON padded with spaces so that the data section
/// starts at a multiple of 8 bytes. Throws dspark::InvalidArgument when a name
/// is repeated, equals "__metadata__" or is not valid UTF-8, a tensor is
/// undefined, not strided, or of a dtype without a safetensors encoding, or a
/// metadata string is not valid UTF-8.
std::string serialize_safetensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata = {});

/// Writes the bytes serialize_safetensors would produce to `path`, atomically
/// (see dspark/io/atomic_file.hpp: an existing file is replaced only once the
/// new one is complete and synced), streaming tensor data without building the
/// whole file in memory. Throws what serialize_safetensors throws, and
/// dspark::Error (with the path and strerror) for I/O failures.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace dspark::io
