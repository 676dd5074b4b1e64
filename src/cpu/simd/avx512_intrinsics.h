// The AVX-512 intrinsics, for the translation units that use them (x86-64 only; elsewhere this
// header includes nothing).
//
// GCC 12 reports the deliberately undefined upper halves inside its own AVX-512 intrinsics
// (_mm512_undefined_*) as uninitialised (GCC bug 105593); the warnings are false positives, and
// are silenced here for the rest of each translation unit that includes this header.
#ifndef ANYATTN_CPU_SIMD_AVX512_INTRINSICS_H_
#define ANYATTN_CPU_SIMD_AVX512_INTRINSICS_H_

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif

#endif  // ANYATTN_CPU_SIMD_AVX512_INTRINSICS_H_
