// Matrix products in bf16 for the trainer; see src/train/bf16_matmul.hpp.
#include "bf16_matmul.hpp"

#include <ATen/Context.h>

namespace dspark::train::detail {

namespace {

bool cpu_has_onednn_bf16() {
#if defined(__x86_64__)
  static const bool ok = at::hasMKLDNN() && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return ok;
#else
  return false;
#endif
}

}  // namespace

bool native_bf16_matmul(const at::Tensor& a, const at::Tensor& b) {
  if (!a.is_cpu()) return true;
  if (!cpu_has_onednn_bf16()) return false;
  const int64_t m = a.dim() >= 2 ? a.size(-2) : 1, k = a.size(-1), n = b.dim() >= 2 ? b.size(-1) : 1;
  return m * k * n > 2 * 16 * 16 * 16;  // ATen's own cut-off is 16³ (aten/src/ATen/native/mkldnn/Matmul.cpp)
}

at::Tensor matmul_bf16(const at::Tensor& a, const at::Tensor& b) {
  if (native_bf16_matmul(a, b)) return at::matmul(a.to(at::kBFloat16), b.to(at::kBFloat16));
  return at::matmul(a.to(at::kBFloat16).to(at::kFloat), b.to(at::kBFloat16).to(at::kFloat)).to(at::kBFloat16);
}

at::Tensor addmm_bf16(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double beta, double alpha) {
  if (native_bf16_matmul(a, b))
    return at::addmm(c.to(at::kBFloat16), a.to(at::kBFloat16), b.to(at::kBFloat16), beta, alpha);
  auto f = [](const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kFloat); };
  return at::addmm(f(c), f(a), f(b), beta, alpha).to(at::kBFloat16);
}

}  // namespace dspark::train::detail
