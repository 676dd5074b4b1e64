// The head dims anyattn supports, as the constants the API's checks and every buffer the kernels
// size from them use. Their values are the public ANYATTN_MAX_HEAD_DIM(_V) of anyattn.h, which
// the Python and Rust bindings read too: one definition.
//
// D (q and k) reaches 576 and Dv (v and out) 512: the absorbed multi-head latent attention (MLA)
// of DeepSeek-style models decodes with q and k of 512 latent + 64 rotary dims against one latent
// cache whose first 512 columns are also v (docs/semantics.md, "Shared latent cache").
#ifndef ANYATTN_COMMON_HEAD_DIMS_H_
#define ANYATTN_COMMON_HEAD_DIMS_H_

#include <cstdint>

#include "anyattn/anyattn.h"

namespace anyattn {

// Largest D: the head dim of q and k (and of k_new, dq, dk). Public as ANYATTN_MAX_HEAD_DIM.
constexpr int64_t kMaxHeadDim = ANYATTN_MAX_HEAD_DIM;
// Largest Dv: the head dim of v and out (and of v_new, dv, dout, the merged states). Public as
// ANYATTN_MAX_HEAD_DIM_V.
constexpr int64_t kMaxHeadDimV = ANYATTN_MAX_HEAD_DIM_V;
static_assert(kMaxHeadDimV <= kMaxHeadDim, "buffers of either head dim are sized by kMaxHeadDim");
static_assert(kMaxHeadDim % 16 == 0 && kMaxHeadDimV % 16 == 0,
              "rows padded to whole 16-float vectors fit buffers of the largest head dim");

}  // namespace anyattn

#endif  // ANYATTN_COMMON_HEAD_DIMS_H_
