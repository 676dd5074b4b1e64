#include "tensors.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>

namespace anyattn_bench {

const char* DTypeName(DType dtype) {
  return dtype == DType::kF32 ? "f32" : dtype == DType::kBf16 ? "bf16" : "f16";
}

anyattn_dtype AbiDType(DType dtype) {
  return dtype == DType::kF32    ? ANYATTN_DTYPE_F32
         : dtype == DType::kBf16 ? ANYATTN_DTYPE_BF16
                                 : ANYATTN_DTYPE_F16;
}

size_t DTypeBytes(DType dtype) {
  return dtype == DType::kF32 ? 4 : 2;
}

void AlignedBuffer::FreeDeleter::operator()(void* p) const {
  std::free(p);
}

AlignedBuffer::AlignedBuffer(size_t bytes, Pages pages) {
  const size_t alignment = pages == Pages::kHuge ? size_t{2} << 20 : 64;
  const size_t rounded = std::max<size_t>((bytes + alignment - 1) / alignment * alignment, 64);
  data_.reset(std::aligned_alloc(alignment, rounded));
  if (data_ && pages == Pages::kHuge) madvise(data_.get(), rounded, MADV_HUGEPAGE);
  bytes_ = data_ ? bytes : 0;
}

uint16_t F32ToBf16(float value) { return anyattn::BFloat16::from_float(value).bits; }
float Bf16ToF32(uint16_t bits) { return anyattn::BFloat16{bits}.to_float(); }
uint16_t F32ToF16(float value) { return anyattn::Float16::from_float(value).bits; }
float F16ToF32(uint16_t bits) { return anyattn::Float16{bits}.to_float(); }

void ConvertBf16ToF32(const uint16_t* src, float* dst, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = Bf16ToF32(src[i]);
}

void ConvertF32ToBf16(const float* src, uint16_t* dst, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = F32ToBf16(src[i]);
}

void FillUniform(void* data, DType dtype, size_t count, uint64_t seed) {
  // splitmix64: a tiny counter-based generator; its top 24 bits make a uniform float in [0, 1).
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < count; ++i) {
    state += 0x9e3779b97f4a7c15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float value = static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
    if (dtype == DType::kF32) {
      static_cast<float*>(data)[i] = value;
    } else if (dtype == DType::kBf16) {
      static_cast<uint16_t*>(data)[i] = F32ToBf16(value);
    } else {
      static_cast<uint16_t*>(data)[i] = F32ToF16(value);
    }
  }
}

std::vector<int32_t> ScatteredBlockTable(int64_t pages) {
  if (pages <= 0) return {};
  int64_t stride = 7919;  // a prime: coprime to every page count it does not divide
  while (std::gcd(stride, pages) != 1) stride += 2;
  std::vector<int32_t> table(pages);
  for (int64_t i = 0; i < pages; ++i) table[i] = static_cast<int32_t>(i * stride % pages);
  return table;
}

float LoadAsF32(const void* data, DType dtype, size_t index) {
  if (dtype == DType::kF32) return static_cast<const float*>(data)[index];
  const uint16_t bits = static_cast<const uint16_t*>(data)[index];
  return dtype == DType::kBf16 ? Bf16ToF32(bits) : F16ToF32(bits);
}

}  // namespace anyattn_bench
