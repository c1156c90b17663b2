// Integer matrix products on ggml-quantized weights: matrices, activation
// quantization and the driver that splits a product into 16-row tiles for the
// active kernel level; see include/dspark/ops/qmatmul.hpp for the arithmetic
// and src/ops/qformat.hpp for the pair byte orders.
#include "dspark/ops/qmatmul.hpp"

#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "dspark/error.hpp"
#include "dspark/io/dequant.hpp"
#include "kernel_table.hpp"
#include "parallel.hpp"
#include "qformat.hpp"
#include "qlinear_table.hpp"
#include "qpack.hpp"

namespace dspark::ops {

using detail::kLayouts;
using detail::kQTypeInfo;
using detail::Layout;
using detail::QType;
using detail::XPair;
using io::GGMLType;

namespace {

constexpr int64_t kPairBytes = sizeof(XPair);

QType qtype(GGMLType t) {
  const QType q = detail::qtype_of(t);
  if (q == detail::kQTypes)
    throw InvalidArgument("qlinear: unsupported weight type " + io::ggml_type_name(static_cast<uint32_t>(t)));
  return q;
}

}  // namespace

bool quant_supported(GGMLType t) { return detail::qtype_of(t) != detail::kQTypes; }

// ---- QMatrix ---------------------------------------------------------------------------

int64_t QMatrix::row_bytes() const {
  const auto& ti = kQTypeInfo[qtype(type)];
  return cols / ti.block_elems * ti.block_bytes;
}

void QMatrix::pack_for_active_level() {
  if (!detail::active_kernels().packed_weights || !data) return;
  packed = std::make_shared<const detail::PackedQ>(detail::pack_q(qtype(type), data, rows, cols, row_bytes()));
}

QMatrix QMatrix::gather_rows(const std::vector<int64_t>& ids) const {
  const int64_t rb = row_bytes();
  auto buf = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(rb) * ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= rows)
      throw InvalidArgument("QMatrix::gather_rows: row " + std::to_string(ids[i]) + " outside [0, " +
                            std::to_string(rows) + ")");
    std::memcpy(buf->data() + i * rb, row(ids[i]), static_cast<size_t>(rb));
  }
  QMatrix g;
  g.type = type;
  g.rows = static_cast<int64_t>(ids.size());
  g.cols = cols;
  g.data = buf->data();
  g.owner = std::shared_ptr<const void>(buf, buf.get());
  g.pack_for_active_level();
  return g;
}

void QMatrix::dequantize_row(int64_t r, float* out) const {
  io::dequantize_to_f32(static_cast<uint32_t>(type), row(r), out, cols);
}

QMatrix qmatrix_from_gguf(const io::GGUFTensorInfo& t) {
  const auto shape = t.shape();
  if (!quant_supported(t.type()))
    throw FormatError("tensor '" + t.name + "' has type " + io::ggml_type_name(t.type_id) +
                      ", which the quantized kernels do not support (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K)");
  if (shape.size() != 2)
    throw FormatError("tensor '" + t.name + "' is not a matrix (" + std::to_string(shape.size()) + " dims)");
  const auto& ti = kQTypeInfo[qtype(t.type())];
  QMatrix m;
  m.type = t.type();
  m.rows = shape[0];
  m.cols = shape[1];
  m.data = t.data;
  if (m.cols % ti.block_elems != 0 || m.cols % 32 != 0)
    throw FormatError("tensor '" + t.name + "': row length " + std::to_string(m.cols) +
                      " is not a whole number of " + io::ggml_type_name(t.type_id) + " blocks");
  if (static_cast<uint64_t>(m.row_bytes() * m.rows) > t.n_bytes)
    throw FormatError("tensor '" + t.name + "' is shorter than its shape needs");
  m.pack_for_active_level();
  return m;
}

int64_t QLinear::rows() const {
  int64_t n = 0;
  for (const auto& p : parts) n += p.rows;
  return n;
}

// ---- activations ------------------------------------------------------------------------

namespace {

float fp16_round(float v) { return static_cast<float>(c10::Half(v)); }

// ggml's nearest_int: round half to even via the 1.5 * 2^23 trick.
int nearest_int(float v) {
  const float f = v + 12582912.f;
  int32_t i;
  std::memcpy(&i, &f, 4);
  return (i & 0x007fffff) - 0x00400000;
}

// Codes and one scale per 256 values as ggml's Q8_K rows: the value of
// largest magnitude maps to -127, d = 1 / iscale in fp32.
void quantize256(const float* v, int8_t* codes, float& d) {
  float amax = 0.f, max = 0.f;
  for (int j = 0; j < 256; ++j) {
    const float a = v[j] < 0.f ? -v[j] : v[j];
    if (a > amax) {
      amax = a;
      max = v[j];
    }
  }
  if (amax == 0.f) {
    std::fill(codes, codes + 256, int8_t{0});
    d = 0.f;
    return;
  }
  const float iscale = -127.f / max;
  for (int j = 0; j < 256; ++j) codes[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * v[j])));
  d = 1.f / iscale;
}

// One activation row xr [K] into its pairs for every needed layout
// (out[l]: the row's n_pairs XPairs of layout l); codes and dx are scratch.
void quantize_row(const float* xr, int64_t K, int64_t n_pairs, const bool* need, const detail::KernelTable& kt,
                  std::vector<int8_t>& codes, std::vector<float>& dx, uint8_t* const* out) {
  const int64_t nb = K / 32;
  for (int k256 = 0; k256 < 2; ++k256) {
    const bool wide = k256 == 1;
    if (!(wide ? need[detail::kNatural32K] || need[detail::kNatural16K]
               : need[detail::kNatural32] || need[detail::kNibble32]))
      continue;
    std::fill(codes.begin(), codes.end(), 0);
    std::fill(dx.begin(), dx.end(), 0.f);
    if (wide) {
      for (int64_t b = 0; b < K / 256; ++b) {
        quantize256(xr + b * 256, codes.data() + b * 256, dx[8 * b]);
        for (int i = 1; i < 8; ++i) dx[8 * b + i] = dx[8 * b];
      }
    } else {
      kt.quantize32(xr, nb, codes.data(), dx.data());
    }
    for (int l = 0; l < kLayouts; ++l) {
      const Layout lay = static_cast<Layout>(l);
      if (!need[l] || detail::per256(lay) != wide) continue;
      const int U = detail::units_of(lay), per_unit = 64 / U;
      auto* pairs = reinterpret_cast<XPair*>(out[l]);
      for (int64_t p = 0; p < n_pairs; ++p) {
        XPair& a = pairs[p];
        const int8_t* c = codes.data() + p * 64;
        // detail::byte_of in runs of 16 elements (the nibble layout moves
        // whole 16-byte halves of its two blocks; the others keep the order).
        for (int e = 0; e < 64; e += 16) std::memcpy(a.q + detail::byte_of(lay, e), c + e, 16);
        for (int u = 0; u < U; ++u) {
          int32_t sum = 0;
          for (int e = u * per_unit; e < (u + 1) * per_unit; ++e) sum += c[e];
          const float d = dx[static_cast<size_t>(2 * p + (u * per_unit) / 32)];
          a.s[u] = sum;
          // Q8_0 / Q8_1 keep d and d·Σq as binary16; Q8_K keeps d in fp32.
          a.dx[u] = wide ? d : fp16_round(d);
          a.sdx[u] = wide ? d * static_cast<float>(sum) : fp16_round(d * static_cast<float>(sum));
        }
      }
    }
  }
}

}  // namespace

QActivations::QActivations(const float* x, int64_t N, int64_t K, const QLinear& layer)
    : QActivations(x, N, K, layer, active_kernel_level()) {}

QActivations::QActivations(const float* x, int64_t N, int64_t K, const QLinear& layer, KernelLevel level)
    : n_(N), k_(K), n_pairs_((K / 32 + 1) / 2) {
  if (K <= 0 || K % 32 != 0)
    throw InvalidArgument("qlinear: inner dimension " + std::to_string(K) + " is not a positive multiple of 32");
  const detail::KernelTable& kt = detail::kernel_table(level);
  bool need[kLayouts] = {false, false, false, false};
  for (const auto& p : layer.parts) {
    const auto& ti = kQTypeInfo[qtype(p.type)];
    if (K % ti.block_elems != 0)
      throw InvalidArgument("qlinear: inner dimension " + std::to_string(K) + " is not a whole number of " +
                            io::ggml_type_name(static_cast<uint32_t>(p.type)) + " blocks");
    need[ti.layout] = true;
  }
  for (int l = 0; l < kLayouts; ++l)
    if (need[l]) buf_[l].assign(static_cast<size_t>(N * n_pairs_ * kPairBytes), 0);
  // Rows are independent: one task per row, so that a verify block's rows
  // are quantized on every thread (a serial pass here would leave the other
  // threads waiting past their spin, to be woken again for the product).
  detail::parallel_tasks(0, N, 1, [&](int64_t n0, int64_t n1) {
    std::vector<int8_t> codes(static_cast<size_t>(n_pairs_ * 64));
    std::vector<float> dx(static_cast<size_t>(n_pairs_ * 2));
    for (int64_t n = n0; n < n1; ++n) {
      uint8_t* out[kLayouts];
      for (int l = 0; l < kLayouts; ++l) out[l] = need[l] ? buf_[l].data() + n * n_pairs_ * kPairBytes : nullptr;
      quantize_row(x + n * K, K, n_pairs_, need, kt, codes, dx, out);
    }
  });
}

const uint8_t* QActivations::pairs(int layout, int64_t n) const {
  return buf_[layout].data() + n * n_pairs_ * kPairBytes;
}

// ---- qlinear ------------------------------------------------------------------------------

namespace detail {

void qlinear_table(const QActivations& x, const QLinear& layer, float* y, int64_t ldy, const KernelTable& kt) {
  const int64_t N = x.n(), K = x.k(), O = layer.rows();
  if (K != layer.cols())
    throw InvalidArgument("qlinear: activations have " + std::to_string(K) + " columns, the weights " +
                          std::to_string(layer.cols()));
  if (ldy < O) throw InvalidArgument("qlinear: output row stride " + std::to_string(ldy) + " < " + std::to_string(O));
  if (N == 0 || O == 0) return;

  // Packed tiles for levels that read them; matrices packed for another
  // level (or not at all) are packed for this call.
  std::vector<std::shared_ptr<const PackedQ>> packs;
  for (const auto& part : layer.parts) {
    if (part.cols != K) throw InvalidArgument("qlinear: parts of one layer must have the same column count");
    if (!kt.packed_weights) packs.push_back(nullptr);
    else if (part.packed) packs.push_back(part.packed);
    else packs.push_back(std::make_shared<const PackedQ>(pack_q(qtype(part.type), part.data, part.rows, part.cols,
                                                                part.row_bytes())));
  }
  // Work units: 16 output rows of one part, numbered across the parts in
  // order (a layer has at most a few parts; the head has 16,384 units).
  struct Part {
    const QMatrix* m;
    const PackedQ* packed;
    QType type;
    int layout;
    int64_t row_bytes, first_unit, out0;
  };
  std::vector<Part> parts;
  int64_t n_units = 0, out0 = 0;
  for (size_t i = 0; i < layer.parts.size(); ++i) {
    const QMatrix& m = layer.parts[i];
    const QType t = qtype(m.type);
    parts.push_back({&m, packs[i].get(), t, kQTypeInfo[t].layout, m.row_bytes(), n_units, out0});
    n_units += (m.rows + kTileRows - 1) / kTileRows;
    out0 += m.rows;
  }
  const int64_t n_blocks32 = K / 32;
  std::vector<const XPair*> xp[kLayouts];
  for (const auto& part : parts) {
    auto& v = xp[part.layout];
    if (!v.empty()) continue;
    v.resize(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) v[n] = reinterpret_cast<const XPair*>(x.pairs(part.layout, n));
  }
  // Activation rows in chunks: a chunk's pairs stay in L2 while every unit reads them.
  const int64_t chunk = std::clamp<int64_t>((256 * 1024) / ((K / 64 + 1) * kPairBytes), 1, 64);
  const int64_t unit_bytes = kTileRows * parts.front().row_bytes;
  const int64_t grain = std::max<int64_t>(1, (32 * 1024) / std::max<int64_t>(1, unit_bytes));
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    const int64_t nn = std::min(chunk, N - n0);
    detail::parallel_tasks(0, n_units, grain, [&](int64_t u0, int64_t u1) {
      std::vector<float> scratch_buf(static_cast<size_t>(32 * nn + 16));
      float* scratch =
          reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scratch_buf.data()) + 63) & ~uintptr_t{63});
      size_t pi = 0;
      for (int64_t u = u0; u < u1; ++u) {
        while (pi + 1 < parts.size() && u >= parts[pi + 1].first_unit) ++pi;
        const Part& part = parts[pi];
        const int64_t tile = u - part.first_unit, r = tile * kTileRows;
        const QTile qt{part.m->row(r), part.row_bytes, part.packed ? part.packed->tile(tile) : nullptr,
                       static_cast<int>(std::min<int64_t>(kTileRows, part.m->rows - r))};
        kt.qtile[part.type](qt, xp[part.layout].data() + n0, nn, n_blocks32, y + n0 * ldy + part.out0 + r, ldy,
                            scratch);
      }
    });
  }
}

}  // namespace detail

void qlinear(const QActivations& x, const QLinear& layer, float* y, int64_t ldy) {
  detail::qlinear_table(x, layer, y, ldy, detail::active_kernels());
}

void qlinear(const QActivations& x, const QLinear& layer, float* y, int64_t ldy, KernelLevel level) {
  detail::qlinear_table(x, layer, y, ldy, detail::kernel_table(level));
}

void qlinear(const float* x, int64_t N, const QLinear& layer, float* y, int64_t ldy) {
  const QActivations xq(x, N, layer.cols(), layer);
  qlinear(xq, layer, y, ldy);
}

void qlinear(const float* x, int64_t N, const QLinear& layer, float* y, int64_t ldy, KernelLevel level) {
  const QActivations xq(x, N, layer.cols(), layer, level);
  qlinear(xq, layer, y, ldy, level);
}

}  // namespace dspark::ops
