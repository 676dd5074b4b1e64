// Sequence metadata of the varlen harnesses (fuzz_varlen, fuzz_bwd_varlen): cu_seqlens with
// leading rows outside every sequence and empty sequences, optional seqused_k, max_seqlen with
// slack, valid by construction and then, for some inputs, corrupted in one of the ways the
// validation must reject (negative start, decreasing offsets, offsets past the total rows,
// lengths above max_seqlen, seqused_k beyond its sequence, negative max_seqlen_k, an offset of
// INT32_MAX), plus index tensors over real buffers.
#ifndef ANYATTN_FUZZ_FUZZ_VARLEN_META_H_
#define ANYATTN_FUZZ_FUZZ_VARLEN_META_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "fuzz_common.h"

namespace anyattn_fuzz {

// The head shape of a varlen problem, drawn from the input: one of the three dtypes, B 0..4,
// Hk 1..2, Hq a multiple of Hk up to 3x, D and Dv 1..20.
struct VarlenShape {
  int32_t dtype;
  int64_t B, Hk, Hq, D, Dv;

  explicit VarlenShape(FuzzedDataProvider& data) {
    const int32_t dtypes[] = {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16, ANYATTN_DTYPE_BF16};
    dtype = dtypes[data.ConsumeIntegralInRange<int>(0, 2)];
    B = data.ConsumeIntegralInRange<int64_t>(0, 4);
    Hk = data.ConsumeIntegralInRange<int64_t>(1, 2);
    Hq = Hk * data.ConsumeIntegralInRange<int64_t>(1, 3);
    D = data.ConsumeIntegralInRange<int64_t>(1, 20);
    Dv = data.ConsumeIntegralInRange<int64_t>(1, 20);
  }
};

struct VarlenMeta {
  std::vector<int32_t> cu_q, cu_k, used;  // (B + 1), (B + 1), (B)
  int64_t total_q = 0, total_k = 0;       // rows of the packed tensors
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  bool use_seqused = false;
  int corruption = 0;  // 0 and 8 and above: none here; 8 is left to the harness
  bool must_fail = false;
  // Rows [cu_q[0], cu_q[B]) are inside a sequence.
  int64_t rows_in_sequences() const { return cu_q.back() - cu_q.front(); }
};

// Draws the metadata of B sequences of up to 7 query rows and 7 keys each.
inline VarlenMeta make_varlen_meta(FuzzedDataProvider& data, int64_t B) {
  VarlenMeta m;
  m.cu_q.assign(static_cast<size_t>(B + 1), 0);
  m.cu_k.assign(static_cast<size_t>(B + 1), 0);
  m.used.assign(static_cast<size_t>(B), 0);
  m.cu_q[0] = data.ConsumeIntegralInRange<int32_t>(0, 2);
  m.cu_k[0] = data.ConsumeIntegralInRange<int32_t>(0, 2);
  int64_t max_q = 0, max_k = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t lq = data.ConsumeIntegralInRange<int32_t>(0, 7);
    const int32_t lk = data.ConsumeIntegralInRange<int32_t>(0, 7);
    m.cu_q[b + 1] = m.cu_q[b] + lq;
    m.cu_k[b + 1] = m.cu_k[b] + lk;
    m.used[b] = data.ConsumeIntegralInRange<int32_t>(0, lk);
    max_q = std::max<int64_t>(max_q, lq);
    max_k = std::max<int64_t>(max_k, lk);
  }
  m.total_q = m.cu_q[B] + data.ConsumeIntegralInRange<int64_t>(0, 2);
  m.total_k = m.cu_k[B] + data.ConsumeIntegralInRange<int64_t>(0, 2);
  m.max_seqlen_q = max_q + data.ConsumeIntegralInRange<int64_t>(0, 2);
  m.max_seqlen_k = max_k + data.ConsumeIntegralInRange<int64_t>(0, 2);
  m.use_seqused = data.ConsumeBool();
  m.corruption = data.ConsumeIntegralInRange<int>(0, 15);
  if (B == 0) return m;
  const int64_t b = data.ConsumeIntegralInRange<int64_t>(0, B - 1);
  switch (m.corruption) {
    case 1:
      m.cu_q[0] = -1;
      m.must_fail = true;
      break;
    case 2:  // decreasing
      if (m.cu_k[b + 1] > 0) {
        m.cu_k[b + 1] = m.cu_k[b] - 1 >= 0 && m.cu_k[b] > 0 ? m.cu_k[b] - 1 : -1;
        m.must_fail = true;
      }
      break;
    case 3:
      m.cu_q[B] = static_cast<int32_t>(m.total_q + 1);
      m.must_fail = true;
      break;
    case 4:
      if (max_q > 0) {
        m.max_seqlen_q = max_q - 1;
        m.must_fail = true;
      }
      break;
    case 5:
      if (m.use_seqused) {
        m.used[b] = m.cu_k[b + 1] - m.cu_k[b] + 1;
        m.must_fail = true;
      }
      break;
    case 6:
      m.max_seqlen_k = -1;
      m.must_fail = true;
      break;
    case 7:
      m.cu_k[b] = std::numeric_limits<int32_t>::max();
      m.must_fail = true;
      break;
    default:
      break;
  }
  return m;
}

// An int32 rank-1 tensor holding `values`, over its own buffer.
inline FuzzTensor make_index_tensor(const std::vector<int32_t>& values) {
  const int64_t shape[1] = {static_cast<int64_t>(values.size())};
  FuzzTensor t = make_tensor(ANYATTN_DTYPE_I32, 1, shape, StrideKind::kContiguous, 0, 1, 0);
  if (!values.empty()) std::memcpy(t.t.data, values.data(), values.size() * sizeof(int32_t));
  return t;
}

}  // namespace anyattn_fuzz

#endif  // ANYATTN_FUZZ_FUZZ_VARLEN_META_H_
