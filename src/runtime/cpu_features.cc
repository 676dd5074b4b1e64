#include "runtime/cpu_features.h"

#include <cstring>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif
#if defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#include <sys/types.h>
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

// CPUID leaf 0's vendor string (EBX, EDX, ECX), as twelve characters.
constexpr char kAmd[] = "AuthenticAMD";
constexpr char kHygon[] = "HygonGenuine";
bool vendor_is(const char (&vendor)[13]) {
  unsigned eax = 0, regs[3] = {};
  if (__get_cpuid(0, &eax, &regs[0], &regs[2], &regs[1]) == 0) return false;
  return std::memcmp(regs, vendor, 12) == 0;
}
#endif

#if defined(__aarch64__) && defined(__linux__)
// The AArch64 Linux hardware-capability bits (the kernel's uapi asm/hwcap.h; fixed ABI values,
// spelled out here so that old C libraries' headers need not define them).
constexpr unsigned long kHwcapFpHp = 1ul << 9;
constexpr unsigned long kHwcapAsimdHp = 1ul << 10;
constexpr unsigned long kHwcapAsimdFhm = 1ul << 23;
constexpr unsigned long kHwcap2Bf16 = 1ul << 14;

void detect_arm(CpuFeatures& f) {
  const unsigned long hwcap = getauxval(AT_HWCAP);
  const unsigned long hwcap2 = getauxval(AT_HWCAP2);
  // Advanced SIMD is mandatory in AArch64 (the compiler's baseline code already uses it), so
  // HWCAP_ASIMD is not consulted.
  f.neon = true;
  f.fp16_arith = (hwcap & kHwcapFpHp) != 0 && (hwcap & kHwcapAsimdHp) != 0;
  f.fp16_fml = (hwcap & kHwcapAsimdFhm) != 0;
  f.bf16 = (hwcap2 & kHwcap2Bf16) != 0;
}
#elif defined(__aarch64__) && defined(__APPLE__)
// 1 when the sysctl `name` exists and is non-zero (macOS 12 and later name each FEAT_*).
bool sysctl_flag(const char* name) {
  int value = 0;
  size_t size = sizeof(value);
  return sysctlbyname(name, &value, &size, nullptr, 0) == 0 && value != 0;
}

void detect_arm(CpuFeatures& f) {
  f.neon = true;
  f.fp16_arith = sysctl_flag("hw.optional.arm.FEAT_FP16");
  f.fp16_fml = sysctl_flag("hw.optional.arm.FEAT_FHM");
  f.bf16 = sysctl_flag("hw.optional.arm.FEAT_BF16");
}
#elif defined(__aarch64__) || defined(_M_ARM64)
// Other systems: Advanced SIMD only; the extensions stay unused.
void detect_arm(CpuFeatures& f) { f.neon = true; }
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
  f.avx512vbmi = __builtin_cpu_supports("avx512vbmi");
  // CPUID.(7, 1):EAX.AVX512_BF16 (bit 5); it uses the AVX-512 state checked above.
  f.avx512bf16 =
      f.avx512f && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && (eax & (1u << 5)) != 0;
  f.amx_bf16 = f.avx512f && detect_amx_bf16();
  const bool amd_design = vendor_is(kAmd) || vendor_is(kHygon);
  f.fast_subnormal_operands = amd_design;
  f.bf16_dot_outpaces_fma = amd_design;
#endif
#if defined(__aarch64__) || defined(_M_ARM64)
  detect_arm(f);
#endif
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

}  // namespace anyattn::runtime
