// Runs a validated backward call (dense or varlen) on the CPU: allocates all workspace up front
// (so an allocation failure leaves the gradients untouched), then runs on the thread pool:
//   0. delta = rowsum(dout * out) per query row, and dsinks from it (bf16 and f16 calls with
//      own_forward: after phase 1, from the tiles' terms, tile_gradients);
//   1. the fused pass, one task per (sequence, kv head, head split, key chunk): dK and dV of the
//      chunk from the split's query heads and their dQ contributions (bwd_kernel-inl.h);
//   2. dQ of sequences split into several key chunks, and dK and dV of calls with several head
//      splits: the partials summed in chunk and split order.
// Every gradient element is written by exactly one task in a fixed summation order, and the
// splits depend on the shape only, so results are bitwise identical for any thread count.
// Workspace: total query rows (B * Hq * Sq dense) floats for delta, per thread
// BwdLayout::scratch_floats() (the packed key chunk and its accumulators plus 64-row tiles), with
// several chunks num_chunks * total query rows * d_pad floats of dQ partials, and with several
// head splits head_splits * total key rows * (d_pad + dv_pad) floats of dK/dV partials (each
// bounded by 128 MiB), and for dsinks from the tiles one double per task and query head of its
// group. Nothing grows with Sq x Sk.
#ifndef ANYATTN_CPU_BACKWARD_BWD_DRIVER_H_
#define ANYATTN_CPU_BACKWARD_BWD_DRIVER_H_

#include "anyattn/anyattn.h"
#include "common/bwd_args.h"

namespace anyattn::cpu {

// `isa` must be resolved and runnable (api::resolve_isa). Throws std::bad_alloc when workspace
// cannot be allocated, before anything is written. With B = 0 only dsinks is written (zeros);
// with Hq = 0 nothing; calls with D = 0 or Dv = 0 run with head dim 1 (cpu/shared/unit_head_dims.h).
void run_bwd(const BwdArgs& args, anyattn_isa isa);

// The registry name of the backward kernel for `isa` (e.g. "bwd_f32acc_avx512_6x64"), or nullptr
// when this build has none.
const char* bwd_kernel_name(anyattn_isa isa);

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_BACKWARD_BWD_DRIVER_H_
