// What the running CPU can execute, detected once: on x86-64 from CPUID (and the OS's saved-state
// support), on AArch64 from the kernel's hardware capabilities (Linux getauxval, macOS sysctl).
#ifndef ANYATTN_RUNTIME_CPU_FEATURES_H_
#define ANYATTN_RUNTIME_CPU_FEATURES_H_

namespace anyattn::runtime {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512bf16 = false;
  bool avx512vbmi = false;  // byte permutes (VPERMB, VPERMI2B)
  // AMX-TILE and AMX-BF16, with the tile state enabled by the OS and granted to this process.
  bool amx_bf16 = false;
  // Properties of the x86 core design that CPUID does not report, inferred from the vendor
  // (measured: bench/MEASUREMENTS.md, "e4m3 keys as f32 subnormals on an Intel Xeon" and "bf16
  // decode scores on an Intel Xeon"):
  //   fast_subnormal_operands  f32 arithmetic takes subnormal operands at full speed: AMD and
  //                            Hygon cores. Intel cores take a microcode assist for each
  //                            instruction with a subnormal input (unless MXCSR.DAZ is set),
  //                            a hundred cycles or more; other vendors are assumed to as well.
  //   bf16_dot_outpaces_fma    VDPBF16PS issues at the rate of a 512-bit FMA, so bf16 products
  //                            on it take half the instructions of widened f32 FMAs: AMD and
  //                            Hygon cores. Intel cores issue 512-bit FMAs on two ports, and
  //                            the widened FMAs ran faster there.
  bool fast_subnormal_operands = false;
  bool bf16_dot_outpaces_fma = false;

  // AArch64 Advanced SIMD: part of every AArch64 CPU, so true on every AArch64 build.
  bool neon = false;
  // AArch64 extensions, recorded for products that need them: FEAT_FP16 (f16 arithmetic, scalar
  // and vector), FEAT_FHM (FMLAL/FMLAL2: f16 products accumulated in f32) and FEAT_BF16 (BFDOT,
  // BFMMLA, BFCVT).
  bool fp16_arith = false;
  bool fp16_fml = false;
  bool bf16 = false;

  // The AVX2 path needs AVX2, FMA and F16C.
  bool has_avx2_path() const { return avx2 && fma && f16c; }
  // The AVX-512 path needs F, BW, VL and DQ (Skylake-SP and later, Zen 4 and later).
  bool has_avx512_path() const { return avx512f && avx512bw && avx512vl && avx512dq; }
  // The AVX-512 path with bf16 tile products: also AVX512_BF16 and usable AMX-BF16 tiles
  // (Sapphire Rapids and later).
  bool has_avx512_amx_path() const { return has_avx512_path() && avx512bf16 && amx_bf16; }
  // The NEON path needs Advanced SIMD only.
  bool has_neon_path() const { return neon; }
};

// Detected on first use; safe to call from any thread.
const CpuFeatures& cpu_features();

}  // namespace anyattn::runtime

#endif  // ANYATTN_RUNTIME_CPU_FEATURES_H_
