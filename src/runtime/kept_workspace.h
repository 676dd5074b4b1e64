// Workspace memory of one call, kept between calls for the caller that holds the thread pool.
//
// The forward packs K and V and the backward writes its dQ partials into tens of MiB of
// workspace. Fresh pages on every call would be faulted in and zeroed by the kernel each time,
// which costs about as much as the packing itself. Only one caller at a time holds the pool
// (PoolLease::owns_pool), so that caller may reuse one buffer without a lock; the forward and the
// backward share it. Requests above kKeptWorkspaceLimitFloats, and callers without the pool, get
// a buffer of their own for the call. The buffer only grows, and lives until the process ends.
#ifndef ANYATTN_RUNTIME_KEPT_WORKSPACE_H_
#define ANYATTN_RUNTIME_KEPT_WORKSPACE_H_

#include <cstdint>

#include "runtime/aligned_buffer.h"
#include "runtime/thread_pool.h"

namespace anyattn::runtime {

// The largest workspace kept between calls: 256 MiB, which holds the backward's dQ partials at
// their budget (128 MiB, plan/bwd_plan.cc) with its per-thread chunk scratch for a few dozen
// threads at Sk 2048 (5.2 MiB each at D 128), and the forward's packing groups (48 MiB). A call
// that needs more pays for fresh pages each time, which a call of that size hardly notices; one
// that fits in it pays once. Keeping it costs no peak memory: each call that fills it would
// allocate as much for itself otherwise.
constexpr int64_t kKeptWorkspaceLimitFloats = int64_t{256} << 18;

// At least `floats` uninitialised, 64-byte aligned floats for the call that holds `lease`: the
// kept buffer (grown if needed) when the lease owns the pool and `floats` is within the limit,
// else `owned`, allocated here and freed with it. Throws std::bad_alloc like AlignedBuffer. The
// memory is valid until the lease ends or `owned` is destroyed, whichever comes first.
float* reserve_workspace(int64_t floats, const PoolLease& lease, AlignedBuffer<float>* owned);

}  // namespace anyattn::runtime

#endif  // ANYATTN_RUNTIME_KEPT_WORKSPACE_H_
