// The vector math of every path this build compiles, one entry per row of src/cpu/isa_table.inc:
// each path's functions are compiled by vec_math_path-inl.h, with that path's target features.
#include "internal/vec_math_paths.h"

#include "cpu/isa_table.h"

namespace anyattn::cpu::vec_math_test {

#define ANYATTN_ISA(id, isa, arch, ...)                          \
  ANYATTN_IF_ARCH_##arch(namespace id {                          \
    void exp2_array(const float* x, int64_t n, float* y);       \
    void tanh_array(const float* x, int64_t n, float* y);       \
    void sech2_array(const float* x, int64_t n, float* y);      \
    void f16_array(const float* x, int64_t n, uint16_t* y);     \
    void e4m3_direct_array(const uint8_t* x, int64_t n, float* y); \
    extern const int kE4m3DirectExponent;                       \
  })
#include "cpu/isa_table.inc"
#undef ANYATTN_ISA

namespace {

#define ANYATTN_ISA(id, isa, arch, ...) \
  ANYATTN_IF_ARCH_##arch(                                                           \
      VecMathPath{isa,                                                              \
                  &id::exp2_array,                                                  \
                  &id::tanh_array,                                                  \
                  &id::sech2_array,                                                 \
                  &id::f16_array,                                                   \
                  &id::e4m3_direct_array,                                           \
                  id::kE4m3DirectExponent}, )
const VecMathPath kPaths[] = {
#include "cpu/isa_table.inc"
};
#undef ANYATTN_ISA

}  // namespace

const VecMathPath* find_vec_math_path(anyattn_isa isa) {
  for (const VecMathPath& path : kPaths) {
    if (path.isa == isa) return &path;
  }
  return nullptr;
}

}  // namespace anyattn::cpu::vec_math_test
