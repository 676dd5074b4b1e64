// 8-bit cache rows widened to bf16 (kv8_widen.h), on AVX512_VBMI byte permutes.
//
// Design. A table lookup per byte: the bf16 bits of all 256 codes, split into a 256-byte table of
// low bytes and one of high bytes, held in eight zmm registers for the whole call. Per 64 bytes of
// a row: one load, one VPERMB that orders the bytes for the interleave below, the top-bit mask,
// four VPERMI2B (low and high byte, codes below and from 128), two byte blends on that mask, and
// two unpacks that interleave low and high bytes into 64 bf16 values, stored as two vectors:
// eleven instructions per 64 elements, each element widened once per pass instead of once per
// tile of query rows. The rows come from L1 or L2 (the pass's prefetches are issued next to the
// loads of the same lines) and the widened rows stay in L1 for the products that follow. V rows
// for the value pairs take the same lookup with another byte order: 32 codes of each of two keys
// in one vector, ordered so that the unpacks give the two keys' values interleaved in pairs.
#include "cpu/decode/kv8_widen.h"

#include <cmath>
#include <cstring>

#include "common/kv8_convert.h"
#include "cpu/decode/fwd_decode_bf16_dot.h"
#include "cpu/simd/avx512_intrinsics.h"
#include "cpu/simd/isa_target.h"
#include "runtime/cpu_features.h"

namespace anyattn::cpu {

bool kv8_widening_available() {
#if defined(__x86_64__) || defined(_M_X64)
  const runtime::CpuFeatures& features = runtime::cpu_features();
  return features.avx512vbmi && bf16_dot_scores_available();
#else
  return false;
#endif
}

}  // namespace anyattn::cpu

#if defined(__x86_64__) || defined(_M_X64)
namespace anyattn::cpu::avx512_vbmi {
namespace {

// The bf16 bits of the 256 codes of one format (values times 2^-exponent), as low and high bytes.
struct CodeTables {
  alignas(64) uint8_t low[256];
  alignas(64) uint8_t high[256];
};

CodeTables make_tables(convert::Kv8 format, int exponent) {
  CodeTables tables;
  for (int code = 0; code < 256; ++code) {
    // Exact: each value is a bf16 value (kv8_widen.h), and so is its product by 2^-exponent.
    const float value = std::ldexp(convert::kv8_to_f32(format, static_cast<uint8_t>(code)),
                                   -exponent);
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    tables.low[code] = static_cast<uint8_t>(bits >> 16);
    tables.high[code] = static_cast<uint8_t>(bits >> 24);
  }
  return tables;
}

const CodeTables& tables_for(DType kv_dtype, int e4m3_exponent) {
  static const CodeTables e4m3 = make_tables(convert::Kv8::kFp8E4M3, 0);
  static const CodeTables e4m3_scaled = make_tables(convert::Kv8::kFp8E4M3, 8);
  static const CodeTables e5m2 = make_tables(convert::Kv8::kFp8E5M2, 0);
  static const CodeTables i8 = make_tables(convert::Kv8::kI8, 0);
  switch (kv_dtype) {
    case DType::kFp8E4M3:
      return e4m3_exponent == 0 ? e4m3 : e4m3_scaled;
    case DType::kFp8E5M2:
      return e5m2;
    case DType::kI8:
    default:
      return i8;
  }
}

// Byte orders for widen64, whose unpacks of each 16-byte lane L read output element 8L + i
// (unpacklo) from byte 16L + i and element 32 + 8L + i (unpackhi) from byte 16L + 8 + i: the
// order that takes output element e from input byte kSource(e).
template <uint8_t (*kSource)(int)>
struct UnpackOrder {
  alignas(64) uint8_t index[64];
  constexpr UnpackOrder() : index() {
    for (int lane = 0; lane < 4; ++lane) {
      for (int i = 0; i < 8; ++i) {
        index[16 * lane + i] = kSource(8 * lane + i);
        index[16 * lane + 8 + i] = kSource(32 + 8 * lane + i);
      }
    }
  }
};

// One row's 64 codes, elements in order.
constexpr uint8_t row_element(int element) { return static_cast<uint8_t>(element); }
constexpr UnpackOrder<row_element> kInterleaveOrder;

// 32 codes of key a (bytes 0 .. 31) and 32 of key b (bytes 32 .. 63) to the value pairs' words
// (fwd_decode_bf16_dot.h, chunk_pv_pairs): a0 b0 a2 b2 ... a30 b30 (the even columns' pairs), then
// a1 b1 a3 b3 ... a31 b31 (the odd columns').
constexpr uint8_t pair_element(int element) {
  const int odd = element / 32;  // the odd columns' half
  const int pair = element % 32;
  const int column = 2 * (pair / 2) + odd;
  return static_cast<uint8_t>((pair % 2) * 32 + column);
}
constexpr UnpackOrder<pair_element> kPairOrder;

}  // namespace

ANYATTN_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi")

namespace {

struct Tables {
  __m512i low[4];   // codes 0 .. 63, 64 .. 127, 128 .. 191, 192 .. 255
  __m512i high[4];
};

// 64 codes (in kInterleaveOrder) to 64 bf16 values, stored at out[0 .. 64).
__attribute__((always_inline)) inline void widen64(const Tables& t, __m512i codes,
                                                   uint16_t* out) {
  const __mmask64 upper = _mm512_movepi8_mask(codes);  // codes from 128
  const __m512i low = _mm512_mask_blend_epi8(upper, _mm512_permutex2var_epi8(t.low[0], codes,
                                                                             t.low[1]),
                                             _mm512_permutex2var_epi8(t.low[2], codes, t.low[3]));
  const __m512i high = _mm512_mask_blend_epi8(
      upper, _mm512_permutex2var_epi8(t.high[0], codes, t.high[1]),
      _mm512_permutex2var_epi8(t.high[2], codes, t.high[3]));
  _mm512_store_si512(out, _mm512_unpacklo_epi8(low, high));
  _mm512_store_si512(out + 32, _mm512_unpackhi_epi8(low, high));
}

template <bool kFarInMemoryOrder>
void widen_rows(const Tables& t, const void* const* rows, int64_t count, int64_t n,
                const PassPrefetcher* prefetch, uint16_t* out, int64_t ld_out) {
  const __m512i order = _mm512_load_si512(kInterleaveOrder.index);
  const int64_t row_lines = (n + 63) / 64;
  for (int64_t j = 0; j < count; ++j) {
    const uint8_t* row = static_cast<const uint8_t*>(rows[j]);
    uint16_t* widened = out + j * ld_out;
    int64_t c = 0;
    for (; c + 64 <= n; c += 64) {
      if (prefetch != nullptr) prefetch->line<kFarInMemoryOrder>(j, c, j * row_lines + c / 64);
      widen64(t, _mm512_permutexvar_epi8(order, _mm512_loadu_si512(row + c)), widened + c);
    }
    if (c < n) {
      if (prefetch != nullptr) prefetch->line<kFarInMemoryOrder>(j, c, j * row_lines + c / 64);
      const __mmask64 present = (uint64_t{1} << (n - c)) - 1;  // n - c < 64
      widen64(t, _mm512_permutexvar_epi8(order, _mm512_maskz_loadu_epi8(present, row + c)),
              widened + c);
    }
  }
}

template <bool kFarInMemoryOrder>
void widen_value_pairs(const Tables& t, const void* const* rows, int64_t count, int64_t n,
                       const PassPrefetcher* prefetch, uint32_t* pairs) {
  const __m512i order = _mm512_load_si512(kPairOrder.index);
  const int64_t row_lines = (n + 63) / 64;
  for (int64_t pair = 0; 2 * pair < count; ++pair) {
    const int64_t a = 2 * pair;
    const bool partner = a + 1 < count;
    const uint8_t* first = static_cast<const uint8_t*>(rows[a]);
    const uint8_t* second = partner ? static_cast<const uint8_t*>(rows[a + 1]) : nullptr;
    uint16_t* out = reinterpret_cast<uint16_t*>(pairs + pair * n);
    for (int64_t c = 0; c < n; c += 32) {
      if (prefetch != nullptr && c % 64 == 0) {
        prefetch->line<kFarInMemoryOrder>(a, c, a * row_lines + c / 64);
        if (partner) prefetch->line<kFarInMemoryOrder>(a + 1, c, (a + 1) * row_lines + c / 64);
      }
      const __m256i low_codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(first + c));
      const __m256i high_codes =
          partner ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(second + c))
                  : _mm256_setzero_si256();  // code 0 is +0 in every format
      const __m512i codes =
          _mm512_inserti64x4(_mm512_castsi256_si512(low_codes), high_codes, 1);
      widen64(t, _mm512_permutexvar_epi8(order, codes), out + 2 * c);
    }
  }
}

Tables load_tables(DType kv_dtype, int e4m3_exponent) {
  const CodeTables& codes = tables_for(kv_dtype, e4m3_exponent);
  Tables t;
  for (int i = 0; i < 4; ++i) {
    t.low[i] = _mm512_load_si512(codes.low + 64 * i);
    t.high[i] = _mm512_load_si512(codes.high + 64 * i);
  }
  return t;
}

}  // namespace

void widen_kv8_value_pairs(DType kv_dtype, int e4m3_exponent, const void* const* rows,
                           int64_t count, int64_t n, const PassPrefetcher* prefetch,
                           uint32_t* pairs) {
  const Tables t = load_tables(kv_dtype, e4m3_exponent);
  if (prefetch != nullptr && prefetch->far_in_memory_order()) {
    widen_value_pairs<true>(t, rows, count, n, prefetch, pairs);
  } else {
    widen_value_pairs<false>(t, rows, count, n, prefetch, pairs);
  }
}

void widen_kv8_rows(DType kv_dtype, int e4m3_exponent, const void* const* rows, int64_t count,
                    int64_t n, const PassPrefetcher* prefetch, uint16_t* out, int64_t ld_out) {
  const Tables t = load_tables(kv_dtype, e4m3_exponent);
  if (prefetch != nullptr && prefetch->far_in_memory_order()) {
    widen_rows<true>(t, rows, count, n, prefetch, out, ld_out);
  } else {
    widen_rows<false>(t, rows, count, n, prefetch, out, ld_out);
  }
}

ANYATTN_TARGET_END()

}  // namespace anyattn::cpu::avx512_vbmi
#endif  // x86-64
