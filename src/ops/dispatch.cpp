// Kernel levels: CPU detection, the per-level tables and the process's choice;
// see include/dspark/ops/kernel_level.hpp and kernel_table.hpp.
#include <cstdlib>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "kernel_table.hpp"
#include "level_kernels.hpp"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace dspark::ops {

namespace detail {

// Tables: the fp32 kernels, activation quantization and bf16 products of a
// level, and its quantized tiles (a variant's tiles where the CPU has more).
#define DSPARK_FLOAT_ENTRIES(ns)                                                                     \
  ns::dot, ns::scores, ns::softmax_num, ns::pv, ns::rmsnorm, ns::rope, ns::silu_mul, ns::gelu_tanh_mul, \
      ns::softcap
#define DSPARK_QTILES(ns) \
  { ns::qtile_q8_0, ns::qtile_q4_0, ns::qtile_q4_1, ns::qtile_q5_0, ns::qtile_q4_k, ns::qtile_q6_k }

const KernelTable kPortableKernels = {KernelLevel::Portable, false, DSPARK_QTILES(portable), portable::quantize32,
                                      portable::bf16_block, DSPARK_FLOAT_ENTRIES(portable)};
#if defined(__x86_64__)
const KernelTable kAvx2Kernels = {KernelLevel::Avx2, true, DSPARK_QTILES(avx2), avx2::quantize32, avx2::bf16_block,
                                  DSPARK_FLOAT_ENTRIES(avx2)};
const KernelTable kAvx2VnniKernels = {KernelLevel::Avx2, true, DSPARK_QTILES(avx2vnni), avx2::quantize32,
                                      avx2::bf16_block, DSPARK_FLOAT_ENTRIES(avx2)};
const KernelTable kAvx2VnniEvexKernels = {KernelLevel::Avx2, true, DSPARK_QTILES(avx2vnni_evex), avx2::quantize32,
                                          avx2::bf16_block, DSPARK_FLOAT_ENTRIES(avx2)};
// AVX-512: its own quantized tiles (vpdpbusd on the packed tiles' 16 rows at
// once), bf16 products and fp32 kernels (one zmm per 16-lane vector); the
// activation quantization runs the AVX2 kernel, which every AVX-512 CPU has.
const KernelTable kAvx512Kernels = {KernelLevel::Avx512, true, DSPARK_QTILES(avx512), avx2::quantize32,
                                    avx512::bf16_block, DSPARK_FLOAT_ENTRIES(avx512)};
#endif
#if defined(__aarch64__)
const KernelTable kNeonKernels = {KernelLevel::Neon, true, DSPARK_QTILES(neon), neon::quantize32, neon::bf16_block,
                                  DSPARK_FLOAT_ENTRIES(neon)};
const KernelTable kNeonI8mmKernels = {KernelLevel::Neon, true, DSPARK_QTILES(neoni8mm), neon::quantize32,
                                      neon::bf16_block, DSPARK_FLOAT_ENTRIES(neon)};
#endif

#undef DSPARK_FLOAT_ENTRIES
#undef DSPARK_QTILES

namespace {

struct Cpu {
  bool avx2 = false, avxvnni = false, avx512 = false, dotprod = false, i8mm = false;
};

Cpu detect() {
  Cpu c;
#if defined(__x86_64__)
  __builtin_cpu_init();
  c.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  c.avxvnni = c.avx2 && __builtin_cpu_supports("avxvnni");
  c.avx512 = c.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512vnni");
#elif defined(__aarch64__) && defined(__linux__)
  c.dotprod = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
  c.i8mm = c.dotprod && (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0;
#endif
  return c;
}

const Cpu& cpu() {
  static const Cpu c = detect();
  return c;
}

}  // namespace

std::vector<const KernelTable*> runnable_tables() {
  std::vector<const KernelTable*> t = {&kPortableKernels};
  [[maybe_unused]] const Cpu& c = cpu();
#if defined(__x86_64__)
  if (c.avx2) t.push_back(&kAvx2Kernels);
  if (c.avxvnni) t.push_back(&kAvx2VnniKernels);
  if (c.avx512) t.push_back(&kAvx512Kernels);
#endif
#if defined(__aarch64__)
  if (c.dotprod) t.push_back(&kNeonKernels);
  if (c.i8mm) t.push_back(&kNeonI8mmKernels);
#endif
  return t;
}

std::vector<const KernelTable*> checked_tables() {
  std::vector<const KernelTable*> t = runnable_tables();
#if defined(__x86_64__)
  if (cpu().avx512 && !cpu().avxvnni) t.push_back(&kAvx2VnniEvexKernels);
#endif
  return t;
}

const KernelTable& kernel_table(KernelLevel level) {
  // The last runnable table of a level is its fullest variant.
  const KernelTable* found = nullptr;
  for (const KernelTable* t : runnable_tables())
    if (t->level == level) found = t;
  if (!found) {
    std::string have;
    for (KernelLevel l : supported_kernel_levels()) have += (have.empty() ? "" : ", ") + to_string(l);
    throw InvalidArgument("this CPU does not run the " + to_string(level) + " kernels (it runs: " + have + ")");
  }
  return *found;
}

const KernelTable& active_kernels() {
  static const KernelTable& t = kernel_table(active_kernel_level());
  return t;
}

}  // namespace detail

std::string to_string(KernelLevel level) {
  switch (level) {
    case KernelLevel::Portable: return "portable";
    case KernelLevel::Avx2: return "avx2";
    case KernelLevel::Avx512: return "avx512";
    case KernelLevel::Neon: return "neon";
  }
  return "?";
}

KernelLevel kernel_level_from_string(const std::string& name) {
  for (KernelLevel l : {KernelLevel::Portable, KernelLevel::Avx2, KernelLevel::Avx512, KernelLevel::Neon})
    if (to_string(l) == name) return l;
  throw InvalidArgument("unknown kernel level '" + name + "' (known: portable, avx2, avx512, neon)");
}

std::vector<KernelLevel> supported_kernel_levels() {
  std::vector<KernelLevel> out;
  for (const detail::KernelTable* t : detail::runnable_tables())
    if (out.empty() || out.back() != t->level) out.push_back(t->level);
  return out;
}

KernelLevel active_kernel_level() {
  static const KernelLevel level = [] {
    const auto levels = supported_kernel_levels();
    const char* forced = std::getenv("DSPARK_KERNELS");
    if (!forced || !*forced) return levels.back();
    KernelLevel want;
    try {
      want = kernel_level_from_string(forced);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(std::string("DSPARK_KERNELS: ") + e.what());
    }
    for (KernelLevel l : levels)
      if (l == want) return want;
    std::string have;
    for (KernelLevel l : levels) have += (have.empty() ? "" : ", ") + to_string(l);
    throw InvalidArgument(std::string("DSPARK_KERNELS=") + forced + ": this CPU does not run the " + forced +
                          " kernels (it runs: " + have + ")");
  }();
  return level;
}

std::string kernel_description() {
  const KernelLevel level = active_kernel_level();
  const detail::KernelTable& t = detail::kernel_table(level);
  std::string s = to_string(level);
#if defined(__x86_64__)
  if (level == KernelLevel::Avx2) s += &t == &detail::kAvx2VnniKernels ? "+f16c+avxvnni" : "+f16c";
  if (level == KernelLevel::Avx512) s += "+vnni";
#endif
#if defined(__aarch64__)
  if (level == KernelLevel::Neon) s += &t == &detail::kNeonI8mmKernels ? "+dotprod+i8mm" : "+dotprod";
#endif
  (void)t;
  return s;
}

}  // namespace dspark::ops
