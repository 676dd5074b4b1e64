// The tensor arguments of the attention entry points, grouped as the C functions take them, so
// that the validators and the tables (entry_tables.h) share one order.
#ifndef ANYATTN_API_CALL_TENSORS_H_
#define ANYATTN_API_CALL_TENSORS_H_

#include <cstdint>

#include "anyattn/anyattn.h"

namespace anyattn::api {

// q, k, v, out and lse (NULL where the entry point allows). In a KV-cache call k and v are the
// caches.
struct AttentionTensors {
  const anyattn_tensor *q, *k, *v, *out, *lse;
};

// A backward call's gradients: dout read; dq, dk, dv written; dsinks written, or NULL without
// sinks.
struct GradientTensors {
  const anyattn_tensor *dout, *dq, *dk, *dv, *dsinks;
};

// The sequences of a packed varlen call: cu_seqlens_q/k (B + 1), seqused_k (B) or NULL, and the
// longest lengths.
struct VarlenLengths {
  const anyattn_tensor *cu_seqlens_q, *cu_seqlens_k, *seqused_k;
  int64_t max_seqlen_q, max_seqlen_k;
};

}  // namespace anyattn::api

#endif  // ANYATTN_API_CALL_TENSORS_H_
