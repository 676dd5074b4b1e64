#include "runtime/cpu_features.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace anyattn::runtime {
namespace {

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
// True when the CPU has AMX-TILE and AMX-BF16, the OS enables the tile state in XCR0 (bits 17
// and 18) and, on Linux, grants this process the tile data state (arch_prctl
// ARCH_REQ_XCOMP_PERM, Linux 5.16 and later; the grant covers every thread). Other systems: false.
bool detect_amx_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  const bool amx_bf16 = (edx & (1u << 22)) != 0;
  const bool amx_tile = (edx & (1u << 24)) != 0;
  if (!amx_bf16 || !amx_tile) return false;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & bit_OSXSAVE) == 0) return false;
  unsigned xcr0_low = 0, xcr0_high = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  constexpr unsigned kTileStateBits = (1u << 17) | (1u << 18);
  if ((xcr0_low & kTileStateBits) != kTileStateBits) return false;
#if defined(__linux__) && defined(__x86_64__)
  constexpr long kArchRequestComponentPermission = 0x1023;
  constexpr long kTileDataComponent = 18;
  return syscall(SYS_arch_prctl, kArchRequestComponentPermission, kTileDataComponent) == 0;
#else
  return false;
#endif
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  // __builtin_cpu_supports also checks that the OS saves the AVX / AVX-512 register state.
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  // clang <= 14 rejects "f16c" in __builtin_cpu_supports: read CPUID.1:ECX.F16C directly. F16C
  // uses the AVX register state, which the avx2 check above already requires of the OS.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  f.f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  // CPUID.(7, 1):EAX.AVX512_BF16 (bit 5); it uses the AVX-512 state checked above.
  f.avx512bf16 =
      f.avx512f && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && (eax & (1u << 5)) != 0;
  f.amx_bf16 = f.avx512f && detect_amx_bf16();
#endif
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

}  // namespace anyattn::runtime
