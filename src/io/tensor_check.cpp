// Finite-value check of GGUF tensors; see include/dspark/io/tensor_check.hpp.
#include "dspark/io/tensor_check.hpp"

#include <array>
#include <cstring>

#include "dspark/error.hpp"

namespace dspark::io {

namespace {

uint16_t u16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

bool f16_finite(uint16_t h) { return (h & 0x7C00u) != 0x7C00u; }
bool bf16_finite(uint16_t h) { return (h & 0x7F80u) != 0x7F80u; }
bool f32_finite(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return (v & 0x7F800000u) != 0x7F800000u;
}

// Byte offsets of the f16 scale fields inside one block of a quantized type
// (count 0: none).
struct HalfFields {
  int count = 0;
  std::array<int, 2> at{};
};
HalfFields half_fields(GGMLType t) {
  switch (t) {
    case GGMLType::Q4_0:
    case GGMLType::Q5_0:
    case GGMLType::Q8_0: return {1, {0, 0}};
    case GGMLType::Q4_1:
    case GGMLType::Q5_1:
    case GGMLType::Q8_1:
    case GGMLType::Q4_K:
    case GGMLType::Q5_K: return {2, {0, 2}};
    case GGMLType::Q2_K: return {2, {80, 82}};
    case GGMLType::Q3_K: return {1, {108, 0}};
    case GGMLType::Q6_K: return {1, {208, 0}};
    default: return {};
  }
}

[[noreturn]] void refuse(const GGUFTensorInfo& t, const std::string& path, const std::string& what, int64_t i,
                         int64_t n) {
  throw FormatError(path + ": tensor '" + t.name + "' (" + ggml_type_name(t.type_id) + ") holds a non-finite " + what +
                    " (NaN or infinity) at " + std::to_string(i) + " of " + std::to_string(n) +
                    ": the file is corrupt");
}

}  // namespace

void check_tensor_finite(const GGUFTensorInfo& t, const std::string& path) {
  const auto traits = ggml_type_traits(t.type_id);
  if (!traits || t.data == nullptr) return;
  const int64_t n = static_cast<int64_t>(t.n_bytes) / traits->block_bytes;
  const uint8_t* p = t.data;
  switch (t.type()) {
    case GGMLType::F32:
      for (int64_t i = 0; i < n; ++i)
        if (!f32_finite(p + 4 * i)) refuse(t, path, "value", i, n);
      return;
    case GGMLType::F16:
      for (int64_t i = 0; i < n; ++i)
        if (!f16_finite(u16_at(p + 2 * i))) refuse(t, path, "value", i, n);
      return;
    case GGMLType::BF16:
      for (int64_t i = 0; i < n; ++i)
        if (!bf16_finite(u16_at(p + 2 * i))) refuse(t, path, "value", i, n);
      return;
    case GGMLType::Q8_K:
      for (int64_t b = 0; b < n; ++b)
        if (!f32_finite(p + b * traits->block_bytes)) refuse(t, path, "block scale", b, n);
      return;
    default: break;
  }
  const HalfFields f = half_fields(t.type());
  for (int64_t b = 0; f.count > 0 && b < n; ++b) {
    const uint8_t* blk = p + b * traits->block_bytes;
    for (int k = 0; k < f.count; ++k)
      if (!f16_finite(u16_at(blk + f.at[static_cast<size_t>(k)]))) refuse(t, path, "block scale", b, n);
  }
}

}  // namespace dspark::io
