// One path's vector math compiled as the library compiles it: the path's simd/ headers inside its
// target region (src/cpu/simd/traits_<id>.h), in namespace
// anyattn::cpu::vec_math_test::<id>, with exp2_array, tanh_array and sech2_array over arrays.
//
// Included once per path by the translation units tests/CMakeLists.txt generates with
// anyattn_isa_units (<build>/tests/isa/vec_math_<id>.cc), after ANYATTN_PATH_ID and the path's
// traits; vec_math_paths.cc collects the functions from the ISA table.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/shared/half.h"

ANYATTN_PATH_TARGET_BEGIN()
namespace anyattn::cpu::vec_math_test::ANYATTN_PATH_ID {
#include ANYATTN_PATH_VEC
#include "cpu/simd/vec_math-inl.h"
#include "internal/vec_math_arrays-inl.h"
}  // namespace anyattn::cpu::vec_math_test::ANYATTN_PATH_ID
ANYATTN_PATH_TARGET_END()
