// dspark/ops/kernel_level.hpp — which instruction set the CPU kernels run on.
//
// Every hot kernel (quantized and bf16 products, activation quantization,
// attention, norms, RoPE, softmax, activations) exists once per kernel level
// (src/ops/portable, src/ops/arch/x86/avx2, src/ops/arch/x86/avx512,
// src/ops/arch/arm/neon) behind one dispatch table. A process runs one level,
// chosen at its first kernel call: the best this CPU runs, or the level named
// by the environment variable DSPARK_KERNELS (portable | avx2 | avx512 | neon),
// which may only name a level this CPU runs (a lower one forces it down).
//
// Every level computes the same bits: each output is one fixed sequence of
// fp32 operations (multiplies and adds never fused, reductions over 16 lanes in
// one pairwise order, exp from one polynomial) and exact integer sums, so the
// batch-invariance contract of docs/compute.md holds across levels too.
#pragma once

#include <string>
#include <vector>

namespace dspark::ops {

enum class KernelLevel {
  Portable,  // any CPU: plain C++ the compiler vectorizes as it can
  Avx2,      // x86-64 AVX2 + F16C (256-bit AVX-VNNI vpdpbusd when present)
  Avx512,    // x86-64 AVX-512 F/BW/DQ/VL/VNNI
  Neon,      // aarch64 Advanced SIMD with the dot-product extension
};

/// "portable", "avx2", "avx512", "neon".
std::string to_string(KernelLevel level);
/// The level of a name as to_string writes it. Throws InvalidArgument naming
/// the known levels otherwise.
KernelLevel kernel_level_from_string(const std::string& name);

/// The levels this CPU runs, portable first.
std::vector<KernelLevel> supported_kernel_levels();

/// The level this process runs: DSPARK_KERNELS when set, the best supported
/// level otherwise; fixed at the first call. Throws InvalidArgument when
/// DSPARK_KERNELS names an unknown level or one this CPU cannot run.
KernelLevel active_kernel_level();

/// The active level with the optional extensions it uses, e.g. "avx2+f16c" or
/// "avx2+f16c+avxvnni", "neon+dotprod" (for --version, bench and profile).
std::string kernel_description();

}  // namespace dspark::ops
