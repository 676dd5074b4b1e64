// Runs a validated backward call on the CPU: allocates all workspace up front (so an allocation
// failure leaves the gradients untouched), then runs three phases on the thread pool:
//   0. delta = rowsum(dout * out) per query row, and dsinks from it;
//   1. dK and dV, one task per (batch, kv head, 64-key block);
//   2. dQ, one task per (batch, query head, 64-row query block).
// Every gradient element is written by exactly one task in a fixed summation order, so results are
// bitwise identical for any thread count. Workspace: B * Hq * Sq floats for delta plus one
// BwdLayout::scratch_floats() buffer per thread; nothing grows with Sq x Sk.
#ifndef ANYATTN_CPU_BWD_DRIVER_H_
#define ANYATTN_CPU_BWD_DRIVER_H_

#include "anyattn/anyattn.h"
#include "cpu/bwd_args.h"

namespace anyattn::cpu {

// `isa` must be resolved and runnable (api::resolve_isa). Throws std::bad_alloc when workspace
// cannot be allocated, before anything is written.
void run_bwd(const BwdArgs& args, anyattn_isa isa);

// The registry name of the backward kernel for `isa` (e.g. "bwd_f32acc_avx512_6x64"), or nullptr
// when this build has none.
const char* bwd_kernel_name(anyattn_isa isa);

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_BWD_DRIVER_H_
