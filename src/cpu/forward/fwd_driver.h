// Runs a validated forward call on the CPU: plans it, allocates all workspace up front (so an
// allocation failure leaves the outputs untouched), then runs the pack, attend and merge phases on
// the thread pool.
#ifndef ANYATTN_CPU_FORWARD_FWD_DRIVER_H_
#define ANYATTN_CPU_FORWARD_FWD_DRIVER_H_

#include "anyattn/anyattn.h"
#include "common/fwd_args.h"

namespace anyattn::cpu {

// `isa` must be resolved and runnable (api::resolve_isa). Throws std::bad_alloc when workspace
// cannot be allocated, before anything is written. Empty calls (B, Sq or Hq = 0) write nothing;
// calls with D = 0 or Dv = 0 run with head dim 1 (cpu/shared/unit_head_dims.h), so the kernels only
// ever see head dims >= 1 and Hq, Hk >= 1.
void run_fwd(const FwdArgs& args, anyattn_isa isa);

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_FORWARD_FWD_DRIVER_H_
