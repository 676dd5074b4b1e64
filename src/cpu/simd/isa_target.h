// Function-level instruction-set selection without -m flags.
//
// ANYATTN_TARGET_BEGIN("avx2,fma,f16c") ... ANYATTN_TARGET_END() compiles every function defined in
// between for that target, while the rest of the translation unit (and every inline function or
// template from headers included BEFORE the region, e.g. the standard library) stays at the
// baseline. Per-file -m flags would instead let an AVX-512 copy of some inline function win at link
// time and crash older CPUs. Code inside a region must live in an ISA-specific namespace and must
// not define lambdas (clang's attribute push does not reach them).
#ifndef ANYATTN_CPU_SIMD_ISA_TARGET_H_
#define ANYATTN_CPU_SIMD_ISA_TARGET_H_

#define ANYATTN_PRAGMA(text) _Pragma(#text)

#if defined(__clang__)
#define ANYATTN_TARGET_BEGIN(features) \
  ANYATTN_PRAGMA(clang attribute push(__attribute__((target(features))), apply_to = function))
#define ANYATTN_TARGET_END() ANYATTN_PRAGMA(clang attribute pop)
#elif defined(__GNUC__)
#define ANYATTN_TARGET_BEGIN(features) \
  ANYATTN_PRAGMA(GCC push_options) ANYATTN_PRAGMA(GCC target(features))
#define ANYATTN_TARGET_END() ANYATTN_PRAGMA(GCC pop_options)
#else
#error "anyattn's ISA paths need GCC or Clang"
#endif

#endif  // ANYATTN_CPU_SIMD_ISA_TARGET_H_
