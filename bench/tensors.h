// Host buffers for the benchmark's inputs and outputs, and the f32 <-> bf16 and f16 conversions
// that the unfused baseline, the inputs and the result check need.
#ifndef ANYATTN_BENCH_TENSORS_H_
#define ANYATTN_BENCH_TENSORS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "anyattn/anyattn.hpp"

namespace anyattn_bench {

// Element types the benchmark runs (f16 in the decode table only).
enum class DType { kF32, kBf16, kF16 };

// "f32", "bf16" or "f16". Static storage.
const char* DTypeName(DType dtype);

// The C ABI's name of `dtype`.
anyattn_dtype AbiDType(DType dtype);

// Bytes per element of `dtype`.
size_t DTypeBytes(DType dtype);

// The pages a buffer asks the kernel for: its default (4 KiB where transparent huge pages are
// "madvise" or "never"), or transparent 2 MiB pages (madvise(MADV_HUGEPAGE) on a 2 MiB aligned
// block; the kernel may still give small pages).
enum class Pages { kDefault, kHuge };

// An owned, 64-byte aligned, uninitialised block of memory. Moves, never copies.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Allocates `bytes` bytes (rounded up to 64, or to 2 MiB for Pages::kHuge). On allocation
  // failure data() is null.
  explicit AlignedBuffer(size_t bytes, Pages pages = Pages::kDefault);

  void* data() const { return data_.get(); }
  size_t bytes() const { return bytes_; }
  float* f32() const { return static_cast<float*>(data_.get()); }
  uint16_t* u16() const { return static_cast<uint16_t*>(data_.get()); }

 private:
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, FreeDeleter> data_;
  size_t bytes_ = 0;
};

// The conversions of the installed C++ header (anyattn::BFloat16, anyattn::Float16), by bits:
// f32 rounded to nearest even (f16 past its largest finite value: infinity; NaN stays NaN), and
// 16-bit patterns widened exactly.
uint16_t F32ToBf16(float value);
float Bf16ToF32(uint16_t bits);
uint16_t F32ToF16(float value);
float F16ToF32(uint16_t bits);

// dst[i] = Bf16ToF32(src[i]) for i < count.
void ConvertBf16ToF32(const uint16_t* src, float* dst, size_t count);

// dst[i] = F32ToBf16(src[i]) for i < count.
void ConvertF32ToBf16(const float* src, uint16_t* dst, size_t count);

// Writes `count` elements of `dtype` to `data`, uniform in [-1, 1), from a deterministic generator
// seeded with `seed`. Touches every page, so later timings see no first-touch faults.
void FillUniform(void* data, DType dtype, size_t count, uint64_t seed);

// Block table (int32, in sequence-major order) of a paged KV cache of `pages` pages whose pages are
// scattered through the pool, as in a serving engine after many allocations and frees: entry i
// names page i * stride mod pages, the stride odd and coprime to `pages` (a fixed permutation);
// empty for pages <= 0.
std::vector<int32_t> ScatteredBlockTable(int64_t pages);

// Element `index` of `data` (of `dtype`) as f32.
float LoadAsF32(const void* data, DType dtype, size_t index);

}  // namespace anyattn_bench

#endif  // ANYATTN_BENCH_TENSORS_H_
