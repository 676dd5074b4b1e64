#include "runtime/kept_workspace.h"

namespace anyattn::runtime {
namespace {

struct KeptBuffer {
  AlignedBuffer<float> buffer;
  int64_t floats = 0;
};

KeptBuffer& kept_buffer() {
  static KeptBuffer kept;
  return kept;
}

}  // namespace

float* reserve_workspace(int64_t floats, const PoolLease& lease, AlignedBuffer<float>* owned) {
  if (lease.owns_pool() && floats <= kKeptWorkspaceLimitFloats) {
    KeptBuffer& kept = kept_buffer();
    if (kept.floats < floats) {
      // allocate() frees the smaller buffer first; with the size cleared before it, a failed
      // allocation (std::bad_alloc) leaves an empty buffer that the next call grows again.
      kept.floats = 0;
      kept.buffer.allocate(floats);
      kept.floats = floats;
    }
    return kept.buffer.get();
  }
  owned->allocate(floats);
  return owned->get();
}

}  // namespace anyattn::runtime
