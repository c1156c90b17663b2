// Linear layers over GGUF weights; see include/dspark/ops/linear.hpp.
#include "dspark/ops/linear.hpp"

#include <ATen/Parallel.h>

#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "dspark/error.hpp"
#include "dspark/io/dequant.hpp"
#include "dspark/ops/kernels.hpp"

namespace dspark::ops {

std::string to_string(Compute c) { return c == Compute::Quant ? "quant" : "bf16"; }

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out;
  for (auto d : s) out += (out.empty() ? "" : ", ") + std::to_string(d);
  return "[" + out + "]";
}

}  // namespace

Linear Linear::load(const io::GGUFFile& f, const std::vector<std::string>& names,
                    const std::vector<int64_t>& rows, int64_t cols, Compute compute) {
  if (names.size() != rows.size() || names.empty())
    throw InvalidArgument("Linear::load: one row count per tensor name is required");
  Linear L;
  L.cols_ = cols;
  std::vector<at::Tensor> pending;  // consecutive bf16 tensors, concatenated into one part
  auto flush = [&] {
    if (pending.empty()) return;
    Part p;
    p.bf16 = pending.size() == 1 ? pending[0] : at::cat(pending).contiguous();
    p.rows = p.bf16.size(0);
    L.parts_.push_back(std::move(p));
    pending.clear();
  };
  for (size_t i = 0; i < names.size(); ++i) {
    const auto& t = f.tensor(names[i]);
    const auto shape = t.shape();
    if (shape.size() != 2 || shape[0] != rows[i] || shape[1] != cols)
      throw FormatError(f.path() + ": tensor '" + names[i] + "' has shape " + shape_str(shape) + ", expected " +
                        shape_str({rows[i], cols}));
    if (compute == Compute::Quant && quant_supported(t.type())) {
      flush();
      Part p;
      p.q = qmatrix_from_gguf(t);
      p.rows = rows[i];
      L.parts_.push_back(std::move(p));
    } else {
      pending.push_back(io::dequantize_tensor(t, at::kBFloat16));
    }
    L.rows_ += rows[i];
  }
  flush();
  L.make_runs();
  return L;
}

Linear Linear::from_tensor(const at::Tensor& w) {
  if (w.dim() != 2) throw InvalidArgument("Linear::from_tensor: expected a matrix, got " + c10::str(w.sizes()));
  Linear L;
  Part p;
  p.bf16 = w.to(at::kBFloat16).contiguous();
  p.rows = w.size(0);
  L.rows_ = w.size(0);
  L.cols_ = w.size(1);
  L.parts_.push_back(std::move(p));
  L.make_runs();
  return L;
}

Linear Linear::from_tensor_q8_0(const at::Tensor& w) {
  if (w.dim() != 2) throw InvalidArgument("Linear::from_tensor_q8_0: expected a matrix, got " + c10::str(w.sizes()));
  const int64_t R = w.size(0), C = w.size(1);
  if (C % 32 != 0)
    throw InvalidArgument("Linear::from_tensor_q8_0: " + std::to_string(C) + " columns, expected a multiple of 32");
  const at::Tensor f = w.to(at::kFloat).contiguous();
  const float* src = f.data_ptr<float>();
  constexpr int64_t kBlockBytes = 34;  // fp16 scale, 32 int8 codes
  auto buf = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(R * (C / 32) * kBlockBytes));
  uint8_t* out = buf->data();
  for (int64_t b = 0; b < R * (C / 32); ++b, src += 32, out += kBlockBytes) {
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(src[i]));
    const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
    const uint16_t dh = c10::Half(d).x;
    std::memcpy(out, &dh, 2);
    for (int i = 0; i < 32; ++i) out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(src[i] * id)));
  }
  QMatrix q;
  q.type = io::GGMLType::Q8_0;
  q.rows = R;
  q.cols = C;
  q.data = buf->data();
  q.owner = std::shared_ptr<const void>(buf, buf->data());
  q.pack_for_active_level();
  Linear L;
  Part p;
  p.q = std::move(q);
  p.rows = R;
  L.rows_ = R;
  L.cols_ = C;
  L.parts_.push_back(std::move(p));
  L.make_runs();
  return L;
}

bool Linear::quantized() const {
  if (parts_.empty()) return false;
  for (const auto& p : parts_)
    if (!p.q.data) return false;
  return true;
}

std::string Linear::type_name() const {
  std::vector<std::string> names;
  for (const auto& p : parts_) {
    const std::string n = p.q.data ? io::ggml_type_name(static_cast<uint32_t>(p.q.type)) : "bf16";
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  }
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : "+") + n;
  return out;
}

int64_t Linear::weight_bytes() const {
  int64_t b = 0;
  for (const auto& p : parts_) b += p.q.data ? p.q.row_bytes() * p.rows : p.rows * cols_ * 2;
  return b;
}

void Linear::make_runs() {
  runs_.clear();
  int64_t row0 = 0;
  for (size_t i = 0; i < parts_.size(); ++i) {
    if (parts_[i].q.data && !runs_.empty() && !runs_.back().q.parts.empty()) {
      runs_.back().q.parts.push_back(parts_[i].q);
    } else {
      Run r;
      if (parts_[i].q.data) r.q.parts.push_back(parts_[i].q);
      r.part = i;
      r.row0 = row0;
      runs_.push_back(std::move(r));
    }
    row0 += parts_[i].rows;
  }
}

void Linear::forward(const float* x, int64_t N, float* y, int64_t ldy) const {
  if (N == 0) return;
  if (ldy < rows_) throw InvalidArgument("Linear::forward: output stride " + std::to_string(ldy) + " < " + std::to_string(rows_));
  std::vector<uint16_t> xb;  // bf16 copy of x, made once if a bf16 part needs it
  for (const Run& r : runs_) {
    if (!r.q.parts.empty()) {
      qlinear(x, N, r.q, y + r.row0, ldy);
      continue;
    }
    if (xb.empty()) {
      xb.resize(static_cast<size_t>(N * cols_));
      for (size_t k = 0; k < xb.size(); ++k) xb[k] = ops::f32_to_bf16(x[k]);
    }
    const Part& p = parts_[r.part];
    ops::linear_bf16(xb.data(), N, reinterpret_cast<const uint16_t*>(p.bf16.data_ptr<at::BFloat16>()), p.rows, cols_,
                     y + r.row0, ldy);
  }
}

void Linear::row_f32(int64_t r, float* out) const {
  if (r < 0 || r >= rows_) throw InvalidArgument("Linear::row_f32: row " + std::to_string(r) + " outside [0, " + std::to_string(rows_) + ")");
  for (const auto& p : parts_) {
    if (r < p.rows) {
      if (p.q.data) {
        p.q.dequantize_row(r, out);
      } else {
        const auto* w = reinterpret_cast<const uint16_t*>(p.bf16.data_ptr<at::BFloat16>()) + r * cols_;
        for (int64_t k = 0; k < cols_; ++k) out[k] = ops::bf16_to_f32(w[k]);
      }
      return;
    }
    r -= p.rows;
  }
}

Linear Linear::gather_rows(const std::vector<int64_t>& ids) const {
  for (int64_t id : ids)
    if (id < 0 || id >= rows_)
      throw InvalidArgument("Linear::gather_rows: row " + std::to_string(id) + " outside [0, " + std::to_string(rows_) + ")");
  Linear L;
  L.cols_ = cols_;
  L.rows_ = static_cast<int64_t>(ids.size());
  Part p;
  p.rows = L.rows_;
  if (parts_.size() == 1 && parts_[0].q.data) {
    p.q = parts_[0].q.gather_rows(ids);
  } else if (parts_.size() == 1) {
    p.bf16 = parts_[0].bf16.index_select(0, at::tensor(ids, at::kLong)).contiguous();
  } else {
    std::vector<float> row(static_cast<size_t>(cols_));
    at::Tensor t = at::empty({L.rows_, cols_}, at::kFloat);
    for (size_t i = 0; i < ids.size(); ++i) {
      row_f32(ids[i], row.data());
      std::memcpy(t.data_ptr<float>() + static_cast<int64_t>(i) * cols_, row.data(), sizeof(float) * cols_);
    }
    p.bf16 = t.to(at::kBFloat16);
  }
  L.parts_.push_back(std::move(p));
  L.make_runs();
  return L;
}

at::Tensor Linear::dequantized(at::ScalarType dtype) const {
  at::Tensor out = at::empty({rows_, cols_}, at::kFloat);
  float* o = out.data_ptr<float>();
  at::parallel_for(0, rows_, 256, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) row_f32(r, o + r * cols_);
  });
  return out.to(dtype).contiguous();
}

}  // namespace dspark::ops
