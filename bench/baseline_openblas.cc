#include "baseline_openblas.h"

#include <cblas.h>

#include <cmath>

#include "baseline_softmax.h"

namespace anyattn_bench {
namespace {

// Elements of a (B, S, H, D) tensor.
size_t Elements(int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim) {
  return static_cast<size_t>(batch * seqlen * heads * head_dim);
}

}  // namespace

UnfusedBaseline::UnfusedBaseline(const FwdShape& shape, int threads)
    : shape_(shape), team_(threads) {
  openblas_set_num_threads(threads);
  scores_ = AlignedBuffer(static_cast<size_t>(ScoreBytes(shape)));
  ok_ = scores_.data() != nullptr;
  if (shape.dtype == DType::kBf16) {
    const size_t q_elements = Elements(shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim);
    const size_t kv_elements = Elements(shape.batch, shape.seqlen_k, shape.heads_k, shape.head_dim);
    q_f32_ = AlignedBuffer(q_elements * sizeof(float));
    k_f32_ = AlignedBuffer(kv_elements * sizeof(float));
    v_f32_ = AlignedBuffer(kv_elements * sizeof(float));
    out_f32_ = AlignedBuffer(q_elements * sizeof(float));
    ok_ = ok_ && q_f32_.data() && k_f32_.data() && v_f32_.data() && out_f32_.data();
  }
}

double UnfusedBaseline::ScoreBytes(const FwdShape& shape) {
  return static_cast<double>(shape.seqlen_q) * shape.seqlen_k * sizeof(float);
}

std::string UnfusedBaseline::Description() {
  return "per (b,h): cblas_sgemm S=QK^T*scale; row softmax (causal: masked entries 0); "
         "cblas_sgemm O=PV; bf16 widened to f32 before and rounded after, inside the timing";
}

void UnfusedBaseline::Run(const void* q, const void* k, const void* v, void* out) {
  if (shape_.dtype == DType::kF32) {
    RunF32(static_cast<const float*>(q), static_cast<const float*>(k), static_cast<const float*>(v),
           static_cast<float*>(out));
    return;
  }
  // Widen with the whole team, as a framework's dtype cast would.
  auto widen = [&](const void* src, float* dst, size_t count) {
    team_.ParallelFor(static_cast<int64_t>(count), [&](int64_t begin, int64_t end) {
      ConvertBf16ToF32(static_cast<const uint16_t*>(src) + begin, dst + begin, end - begin);
    });
  };
  widen(q, q_f32_.f32(), q_f32_.bytes() / sizeof(float));
  widen(k, k_f32_.f32(), k_f32_.bytes() / sizeof(float));
  widen(v, v_f32_.f32(), v_f32_.bytes() / sizeof(float));
  RunF32(q_f32_.f32(), k_f32_.f32(), v_f32_.f32(), out_f32_.f32());
  const int64_t out_elements = static_cast<int64_t>(out_f32_.bytes() / sizeof(float));
  team_.ParallelFor(out_elements, [&](int64_t begin, int64_t end) {
    ConvertF32ToBf16(out_f32_.f32() + begin, static_cast<uint16_t*>(out) + begin, end - begin);
  });
}

void UnfusedBaseline::RunF32(const float* q, const float* k, const float* v, float* out) {
  const int64_t sq = shape_.seqlen_q;
  const int64_t sk = shape_.seqlen_k;
  const int64_t hq = shape_.heads_q;
  const int64_t hk = shape_.heads_k;
  const int64_t d = shape_.head_dim;
  const int64_t group = hq / hk;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  float* scores = scores_.f32();
  for (int64_t b = 0; b < shape_.batch; ++b) {
    for (int64_t h = 0; h < hq; ++h) {
      // Head h of a (B, S, H, D) tensor is a row-major S x D matrix with leading dimension H * D.
      const float* q_head = q + (b * sq * hq + h) * d;
      const float* k_head = k + (b * sk * hk + h / group) * d;
      const float* v_head = v + (b * sk * hk + h / group) * d;
      float* out_head = out + (b * sq * hq + h) * d;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, sq, sk, d, scale, q_head, hq * d, k_head,
                  hk * d, 0.0f, scores, sk);
      team_.ParallelFor(sq, [&](int64_t begin, int64_t end) {
        SoftmaxRowsInPlace(scores, sk, begin, end, shape_.causal, sk - sq);
      });
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, sq, d, sk, 1.0f, scores, sk, v_head,
                  hk * d, 0.0f, out_head, hq * d);
    }
  }
}

}  // namespace anyattn_bench
