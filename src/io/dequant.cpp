// dequant.cpp — decoding of ggml tensor blocks to fp32 (see dequant.hpp).
//
// Block layouts (all multi-byte fields little-endian, f16 = IEEE binary16):
//
//   Q4_0  32 elems, 18 bytes:  f16 d | u8 qs[16]
//         element j      = ((qs[j] & 0xF) - 8) * d     (j = 0..15)
//         element j + 16 = ((qs[j] >> 4)  - 8) * d
//   Q4_1  32 elems, 20 bytes:  f16 d | f16 m | u8 qs[16]
//         same nibble order, value = q * d + m
//   Q5_0  32 elems, 22 bytes:  f16 d | u32 qh | u8 qs[16]
//         q_j = nibble as in Q4_0 | (bit j of qh) << 4, value = (q_j - 16) * d
//   Q8_0  32 elems, 34 bytes:  f16 d | i8 qs[32]; value = qs[j] * d
//
//   Q4_K  256 elems, 144 bytes: f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
//         Eight sub-blocks of 32 elements, each with a 6-bit scale sc[k] and a
//         6-bit min mn[k] packed into `scales`:
//           k < 4:  sc[k] = scales[k]   & 63
//                   mn[k] = scales[k+4] & 63
//           k >= 4: sc[k] = (scales[k+4] & 0xF) | ((scales[k-4] >> 6) << 4)
//                   mn[k] = (scales[k+4] >> 4)  | ((scales[k]   >> 6) << 4)
//         qs is four 32-byte groups; group g holds sub-block 2g in its low
//         nibbles and sub-block 2g+1 in its high nibbles.
//         value = (d * sc[k]) * q - (dmin * mn[k])
//
//   Q6_K  256 elems, 210 bytes: u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d
//         Two halves of 128 elements; half h uses ql[64h..64h+63] and
//         qh[32h..32h+31]. For l = 0..31 within a half:
//           elem l      : low  nibble of ql[l],    qh[l] bits 0-1
//           elem l + 32 : low  nibble of ql[l+32], qh[l] bits 2-3
//           elem l + 64 : high nibble of ql[l],    qh[l] bits 4-5
//           elem l + 96 : high nibble of ql[l+32], qh[l] bits 6-7
//         q = (nibble | (two qh bits << 4)) - 32, and element i of the block
//         uses scale scales[i / 16]: value = (d * scales[i/16]) * q
//
//   F32 / F16 / BF16: one element per "block" of 4 / 2 / 2 bytes.
#include "dspark/io/dequant.hpp"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "dspark/error.hpp"

namespace dspark::io {
namespace {

constexpr int64_t kQK = 32;    // elements per Q4_0 / Q4_1 / Q8_0 block
constexpr int64_t kQKK = 256;  // elements per K-quant super-block

constexpr int64_t kQ4_0Bytes = 2 + kQK / 2;
constexpr int64_t kQ4_1Bytes = 4 + kQK / 2;
constexpr int64_t kQ5_0Bytes = 2 + 4 + kQK / 2;
constexpr int64_t kQ8_0Bytes = 2 + kQK;
constexpr int64_t kQ4_KBytes = 2 + 2 + 12 + kQKK / 2;
constexpr int64_t kQ6_KBytes = kQKK / 2 + kQKK / 4 + kQKK / 16 + 2;

inline uint16_t load_u16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// IEEE binary16 -> binary32, exact for every input (subnormals, inf, NaN).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t mag = h & 0x7FFFu;
  if (mag >= 0x7C00u) {  // inf / NaN: keep the payload
    return bits_to_float(sign | 0x7F800000u | ((mag & 0x3FFu) << 13));
  }
  if (mag >= 0x0400u) {  // normal: rebias the exponent from 15 to 127
    return bits_to_float(sign | ((mag << 13) + (112u << 23)));
  }
  // zero or subnormal: mantissa * 2^-24, exact in fp32
  const float v = static_cast<float>(mag) * 5.9604644775390625e-08f;
  return sign ? -v : v;
}

inline float load_half(const uint8_t* p) { return half_to_float(load_u16(p)); }

inline float bf16_to_float(uint16_t b) { return bits_to_float(static_cast<uint32_t>(b) << 16); }

// Each decoder handles `n_blocks` consecutive blocks starting at `src`.

void decode_f32(const uint8_t* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void decode_f16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = load_half(src + 2 * i);
}

void decode_bf16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(load_u16(src + 2 * i));
}

void decode_q4_0(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += kQ4_0Bytes, dst += kQK) {
    const float d = load_half(src);
    const uint8_t* qs = src + 2;
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
      dst[j + kQK / 2] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

void decode_q4_1(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += kQ4_1Bytes, dst += kQK) {
    const float d = load_half(src);
    const float m = load_half(src + 2);
    const uint8_t* qs = src + 4;
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
      dst[j + kQK / 2] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  }
}

void decode_q5_0(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += kQ5_0Bytes, dst += kQK) {
    const float d = load_half(src);
    uint32_t qh;
    std::memcpy(&qh, src + 2, 4);
    const uint8_t* qs = src + 6;
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      dst[j] = static_cast<float>(lo - 16) * d;
      dst[j + kQK / 2] = static_cast<float>(hi - 16) * d;
    }
  }
}

void decode_q8_0(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += kQ8_0Bytes, dst += kQK) {
    const float d = load_half(src);
    const auto* qs = reinterpret_cast<const int8_t*>(src + 2);
    for (int j = 0; j < kQK; ++j) dst[j] = static_cast<float>(qs[j]) * d;
  }
}

// Unpacks the 6-bit scale and min of Q4_K sub-block k (0..7).
inline void q4k_scale_min(const uint8_t* s, int k, uint8_t& sc, uint8_t& mn) {
  if (k < 4) {
    sc = s[k] & 63;
    mn = s[k + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((s[k + 4] & 0x0F) | ((s[k - 4] >> 6) << 4));
    mn = static_cast<uint8_t>((s[k + 4] >> 4) | ((s[k] >> 6) << 4));
  }
}

void decode_q4_k(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += kQ4_KBytes, dst += kQKK) {
    const float d = load_half(src);
    const float dmin = load_half(src + 2);
    const uint8_t* scales = src + 4;
    const uint8_t* qs = src + 16;
    float* y = dst;
    for (int g = 0; g < 4; ++g, qs += 32, y += 64) {
      uint8_t sc_lo, mn_lo, sc_hi, mn_hi;
      q4k_scale_min(scales, 2 * g, sc_lo, mn_lo);
      q4k_scale_min(scales, 2 * g + 1, sc_hi, mn_hi);
      const float d_lo = d * sc_lo, m_lo = dmin * mn_lo;
      const float d_hi = d * sc_hi, m_hi = dmin * mn_hi;
      for (int l = 0; l < 32; ++l) {
        y[l] = d_lo * static_cast<float>(qs[l] & 0x0F) - m_lo;
        y[l + 32] = d_hi * static_cast<float>(qs[l] >> 4) - m_hi;
      }
    }
  }
}

void decode_q6_k(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += kQ6_KBytes, dst += kQKK) {
    const uint8_t* ql = src;
    const uint8_t* qh = src + kQKK / 2;
    const auto* sc = reinterpret_cast<const int8_t*>(src + kQKK / 2 + kQKK / 4);
    const float d = load_half(src + kQKK / 2 + kQKK / 4 + kQKK / 16);
    float* y = dst;
    for (int h = 0; h < 2; ++h, ql += 64, qh += 32, sc += 8, y += 128) {
      for (int l = 0; l < 32; ++l) {
        const int s = l / 16;
        const int q0 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q1 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[s]) * static_cast<float>(q0);
        y[l + 32] = d * static_cast<float>(sc[s + 2]) * static_cast<float>(q1);
        y[l + 64] = d * static_cast<float>(sc[s + 4]) * static_cast<float>(q2);
        y[l + 96] = d * static_cast<float>(sc[s + 6]) * static_cast<float>(q3);
      }
    }
  }
}

using DecodeFn = void (*)(const uint8_t*, float*, int64_t);

struct Codec {
  int64_t block_elems;
  int64_t block_bytes;
  DecodeFn decode;  // takes a count of blocks
};

// Geometry of the supported types; nullptr decode means unsupported.
Codec codec_for(uint32_t type_id) {
  switch (static_cast<GGMLType>(type_id)) {
    case GGMLType::F32: return {1, 4, decode_f32};
    case GGMLType::F16: return {1, 2, decode_f16};
    case GGMLType::BF16: return {1, 2, decode_bf16};
    case GGMLType::Q4_0: return {kQK, kQ4_0Bytes, decode_q4_0};
    case GGMLType::Q4_1: return {kQK, kQ4_1Bytes, decode_q4_1};
    case GGMLType::Q5_0: return {kQK, kQ5_0Bytes, decode_q5_0};
    case GGMLType::Q8_0: return {kQK, kQ8_0Bytes, decode_q8_0};
    case GGMLType::Q4_K: return {kQKK, kQ4_KBytes, decode_q4_k};
    case GGMLType::Q6_K: return {kQKK, kQ6_KBytes, decode_q6_k};
    default: return {0, 0, nullptr};
  }
}

std::string type_label(uint32_t type_id) {
  return ggml_type_name(type_id) + " (id " + std::to_string(type_id) + ")";
}

// Validates the type and count; returns the codec with the block geometry
// taken from ggml_type_traits. `what` prefixes every message.
Codec checked_codec(uint32_t type_id, int64_t n_elements, const std::string& what) {
  Codec c = codec_for(type_id);
  const auto traits = ggml_type_traits(type_id);
  if (c.decode == nullptr || !traits) {
    throw FormatError(what + "unsupported ggml type " + type_label(type_id) +
                      " for dequantization (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, "
                      "Q4_K, Q6_K)");
  }
  if (traits->block_elems != c.block_elems || traits->block_bytes != c.block_bytes) {
    throw FormatError(what + "ggml type " + type_label(type_id) + " has block geometry " +
                      std::to_string(traits->block_elems) + " elements / " +
                      std::to_string(traits->block_bytes) + " bytes, expected " +
                      std::to_string(c.block_elems) + " / " + std::to_string(c.block_bytes));
  }
  if (n_elements < 0 || n_elements % c.block_elems != 0) {
    throw FormatError(what + "element count " + std::to_string(n_elements) + " of type " +
                      type_label(type_id) + " is not a whole number of " +
                      std::to_string(c.block_elems) + "-element blocks");
  }
  return c;
}

// Elements decoded per work item: a multiple of every block size, small
// enough that the fp32 scratch for a bf16 destination stays in L1/L2.
constexpr int64_t kChunkElems = 16 * kQKK;

}  // namespace

float half_to_float(uint16_t h) { return load_half(reinterpret_cast<const uint8_t*>(&h)); }

bool dequant_supported(uint32_t type_id) { return codec_for(type_id).decode != nullptr; }

void dequantize_to_f32(uint32_t type_id, const uint8_t* src, float* dst, int64_t n_elements) {
  const Codec c = checked_codec(type_id, n_elements, "dequantize: ");
  if (n_elements == 0) return;
  c.decode(src, dst, n_elements / c.block_elems);
}

at::Tensor dequantize_tensor(const GGUFTensorInfo& info, at::ScalarType dtype) {
  const std::string what = "tensor '" + info.name + "': ";
  const int64_t n = info.n_elements();
  const Codec c = checked_codec(info.type_id, n, what);

  const std::vector<int64_t> shape = info.shape();
  int64_t shape_elems = 1;
  for (int64_t s : shape) shape_elems *= s;
  if (shape_elems != n) {
    throw FormatError(what + "shape has " + std::to_string(shape_elems) +
                      " elements but the tensor declares " + std::to_string(n));
  }
  const int64_t n_blocks = n / c.block_elems;
  const uint64_t need = static_cast<uint64_t>(n_blocks) * static_cast<uint64_t>(c.block_bytes);
  if (info.n_bytes < need) {
    throw FormatError(what + "data of type " + type_label(info.type_id) + " holds " +
                      std::to_string(info.n_bytes) + " bytes, expected " + std::to_string(need));
  }
  if (n > 0 && info.data == nullptr) throw FormatError(what + "tensor data is not mapped");

  const bool to_bf16 = dtype == at::kBFloat16;
  const at::ScalarType work_dtype = to_bf16 ? at::kBFloat16 : at::kFloat;
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(work_dtype).device(at::kCPU));
  if (n == 0) return dtype == work_dtype ? out : out.to(dtype);

  const uint8_t* src = info.data;
  const int64_t n_chunks = (n + kChunkElems - 1) / kChunkElems;
  const bool raw_copy = (to_bf16 && info.type() == GGMLType::BF16) ||
                        (!to_bf16 && info.type() == GGMLType::F32);

  auto chunk_span = [&](int64_t chunk, int64_t& first, int64_t& count) {
    first = chunk * kChunkElems;
    count = std::min(kChunkElems, n - first);
  };

  if (raw_copy) {
    // Same bit layout on both sides: copy the bytes, in parallel so the
    // page faults on the mapped file are spread over threads too.
    auto* dst = static_cast<uint8_t*>(out.data_ptr());
    const int64_t elem_bytes = c.block_bytes;
    at::parallel_for(0, n_chunks, 4, [&](int64_t begin, int64_t end) {
      for (int64_t ch = begin; ch < end; ++ch) {
        int64_t first, count;
        chunk_span(ch, first, count);
        std::memcpy(dst + first * elem_bytes, src + first * elem_bytes,
                    static_cast<size_t>(count * elem_bytes));
      }
    });
  } else if (!to_bf16) {
    float* dst = out.data_ptr<float>();
    at::parallel_for(0, n_chunks, 4, [&](int64_t begin, int64_t end) {
      for (int64_t ch = begin; ch < end; ++ch) {
        int64_t first, count;
        chunk_span(ch, first, count);
        c.decode(src + (first / c.block_elems) * c.block_bytes, dst + first,
                 count / c.block_elems);
      }
    });
  } else {
    // Decode each chunk into a small fp32 scratch buffer, then round to bf16
    // (round-to-nearest-even), so no full fp32 copy of the tensor is built.
    auto* dst = out.data_ptr<c10::BFloat16>();
    at::parallel_for(0, n_chunks, 4, [&](int64_t begin, int64_t end) {
      std::vector<float> scratch(static_cast<size_t>(kChunkElems));
      for (int64_t ch = begin; ch < end; ++ch) {
        int64_t first, count;
        chunk_span(ch, first, count);
        c.decode(src + (first / c.block_elems) * c.block_bytes, scratch.data(),
                 count / c.block_elems);
        c10::BFloat16* o = dst + first;
        for (int64_t i = 0; i < count; ++i) o[i] = c10::BFloat16(scratch[static_cast<size_t>(i)]);
      }
    });
  }
  return dtype == work_dtype ? out : out.to(dtype);
}

}  // namespace dspark::io
