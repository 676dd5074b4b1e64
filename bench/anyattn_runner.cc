#include "anyattn_runner.h"

namespace anyattn_bench {
namespace {

// Fills `tensor` as a contiguous view of `data` with the ABI's own helper. On failure records the
// helper's status and message in *error unless an earlier failure is already there.
void DescribeContiguousAbi(anyattn_tensor* tensor, const void* data, anyattn_dtype dtype, int rank,
                           const int64_t* shape, std::string* error) {
  const anyattn_status status =
      anyattn_tensor_init_contiguous(tensor, const_cast<void*>(data), dtype, rank, shape);
  if (status != ANYATTN_OK && error->empty()) {
    *error = std::string("anyattn_tensor_init_contiguous: ") + anyattn_status_name(status) + ": " +
             anyattn_last_error();
  }
}

// DescribeContiguousAbi for a rank-4 tensor of the benchmark's `dtype`.
void DescribeContiguous(anyattn_tensor* tensor, const void* data, DType dtype, int64_t dim0,
                        int64_t dim1, int64_t dim2, int64_t dim3, std::string* error) {
  const int64_t shape[4] = {dim0, dim1, dim2, dim3};
  DescribeContiguousAbi(tensor, data, AbiDType(dtype), 4, shape, error);
}

// True for ANYATTN_OK; otherwise stores "STATUS_NAME: anyattn_last_error()" in *error (if not
// null) and returns false.
bool Succeeded(anyattn_status status, std::string* error) {
  if (status == ANYATTN_OK) return true;
  if (error != nullptr) {
    *error = std::string(anyattn_status_name(status)) + ": " + anyattn_last_error();
  }
  return false;
}

}  // namespace

AnyattnFwdCall::AnyattnFwdCall(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                               int64_t heads_k, int64_t head_dim, DType dtype, bool causal,
                               anyattn_isa isa, const void* q, const void* k, const void* v,
                               void* out) {
  DescribeContiguous(&q_, q, dtype, batch, seqlen_q, heads_q, head_dim, &setup_error_);
  DescribeContiguous(&k_, k, dtype, batch, seqlen_k, heads_k, head_dim, &setup_error_);
  DescribeContiguous(&v_, v, dtype, batch, seqlen_k, heads_k, head_dim, &setup_error_);
  DescribeContiguous(&out_, out, dtype, batch, seqlen_q, heads_q, head_dim, &setup_error_);
  anyattn_fwd_params_init(&params_);
  params_.causal = causal ? 1 : 0;
  params_.isa = isa;
}

FwdBuffers::FwdBuffers(const FwdShape& fwd_shape)
    : shape(fwd_shape),
      q_elements(shape.batch * shape.seqlen_q * shape.heads_q * shape.head_dim),
      kv_elements(shape.batch * shape.seqlen_k * shape.heads_k * shape.head_dim),
      q(q_elements * DTypeBytes(shape.dtype)),
      k(kv_elements * DTypeBytes(shape.dtype)),
      v(kv_elements * DTypeBytes(shape.dtype)),
      out(q_elements * DTypeBytes(shape.dtype)) {
  if (!ok()) return;
  FillUniform(q.data(), shape.dtype, q_elements, 1);
  FillUniform(k.data(), shape.dtype, kv_elements, 2);
  FillUniform(v.data(), shape.dtype, kv_elements, 3);
  FillUniform(out.data(), shape.dtype, q_elements, 4);
}

AnyattnFwdCall FwdBuffers::Call(anyattn_isa isa) const {
  return AnyattnFwdCall(shape.batch, shape.seqlen_q, shape.seqlen_k, shape.heads_q, shape.heads_k,
                        shape.head_dim, shape.dtype, shape.causal, isa, q.data(), k.data(),
                        v.data(), out.data());
}

void AnyattnFwdCall::UsePagedCache(int64_t page_size, const int32_t* block_table) {
  const int64_t batch = q_.shape[0];
  const int64_t seqlen_k = k_.shape[1];
  const int64_t pages_per_sequence = seqlen_k / page_size;
  const int64_t k_shape[4] = {batch * pages_per_sequence, page_size, k_.shape[2], k_.shape[3]};
  const int64_t v_shape[4] = {batch * pages_per_sequence, page_size, v_.shape[2], v_.shape[3]};
  const anyattn_dtype dtype = static_cast<anyattn_dtype>(k_.dtype);
  DescribeContiguousAbi(&k_, k_.data, dtype, 4, k_shape, &setup_error_);
  DescribeContiguousAbi(&v_, v_.data, dtype, 4, v_shape, &setup_error_);
  const int64_t table_shape[2] = {batch, pages_per_sequence};
  DescribeContiguousAbi(&block_table_, block_table, ANYATTN_DTYPE_I32, 2, table_shape,
                        &setup_error_);
  anyattn_kvcache_params_init(&cache_);
  cache_.block_table = &block_table_;
  cache_.cache_seqlen = seqlen_k;
  paged_ = true;
}

void AnyattnFwdCall::UseKv8Cache(anyattn_dtype dtype, float descale, const float* k_token_scale,
                                 const float* v_token_scale) {
  const int64_t k_shape[4] = {k_.shape[0], k_.shape[1], k_.shape[2], k_.shape[3]};
  const int64_t v_shape[4] = {v_.shape[0], v_.shape[1], v_.shape[2], v_.shape[3]};
  DescribeContiguousAbi(&k_, k_.data, dtype, 4, k_shape, &setup_error_);
  if (shared_latent_) {
    v_ = k_;  // still the K rows' first Dv columns
    v_.shape[3] = v_shape[3];
  } else {
    DescribeContiguousAbi(&v_, v_.data, dtype, 4, v_shape, &setup_error_);
  }
  if (!paged_) anyattn_kvcache_params_init(&cache_);  // the whole contiguous cache
  if (k_token_scale != nullptr) {
    DescribeContiguousAbi(&k_token_scale_, k_token_scale, ANYATTN_DTYPE_F32, 3, k_shape,
                          &setup_error_);
    DescribeContiguousAbi(&v_token_scale_, v_token_scale, ANYATTN_DTYPE_F32, 3, v_shape,
                          &setup_error_);
    cache_.k_token_scale = &k_token_scale_;
    cache_.v_token_scale = &v_token_scale_;
  } else {
    descale_value_ = descale;
    const int64_t one[1] = {1};
    DescribeContiguousAbi(&descale_, &descale_value_, ANYATTN_DTYPE_F32, 1, one, &setup_error_);
    cache_.k_descale = &descale_;
    cache_.v_descale = &descale_;
  }
  kv8_ = true;
}

void AnyattnFwdCall::SetValueHeadDim(int64_t head_dim_v, bool shared_latent) {
  const anyattn_dtype dtype = static_cast<anyattn_dtype>(k_.dtype);
  shared_latent_ = shared_latent;
  if (shared_latent) {
    v_ = k_;  // same data, strides and pages
    v_.shape[3] = head_dim_v;
  } else {
    const int64_t v_shape[4] = {k_.shape[0], k_.shape[1], k_.shape[2], head_dim_v};
    DescribeContiguousAbi(&v_, v_.data, dtype, 4, v_shape, &setup_error_);
  }
  const int64_t out_shape[4] = {out_.shape[0], out_.shape[1], out_.shape[2], head_dim_v};
  DescribeContiguousAbi(&out_, out_.data, dtype, 4, out_shape, &setup_error_);
}

void AnyattnFwdCall::SetKv(const void* k, const void* v) {
  k_.data = const_cast<void*>(k);
  v_.data = const_cast<void*>(shared_latent_ ? k : v);
}

bool AnyattnFwdCall::Run(std::string* error) const {
  if (!setup_error_.empty()) {
    if (error != nullptr) *error = setup_error_;
    return false;
  }
  if (paged_ || kv8_) {
    return Succeeded(anyattn_fwd_kvcache(&q_, &k_, &v_, &out_, nullptr, &cache_, &params_), error);
  }
  return Succeeded(anyattn_fwd(&q_, &k_, &v_, &out_, nullptr, &params_), error);
}

AnyattnBwdCall::AnyattnBwdCall(const FwdShape& shape, anyattn_isa isa, const BwdBuffers& buffers) {
  const int64_t b = shape.batch;
  const int64_t d = shape.head_dim;
  DescribeContiguous(&q_, buffers.q, shape.dtype, b, shape.seqlen_q, shape.heads_q, d,
                     &setup_error_);
  DescribeContiguous(&k_, buffers.k, shape.dtype, b, shape.seqlen_k, shape.heads_k, d,
                     &setup_error_);
  DescribeContiguous(&v_, buffers.v, shape.dtype, b, shape.seqlen_k, shape.heads_k, d,
                     &setup_error_);
  DescribeContiguous(&dout_, buffers.dout, shape.dtype, b, shape.seqlen_q, shape.heads_q, d,
                     &setup_error_);
  DescribeContiguous(&out_, buffers.out, shape.dtype, b, shape.seqlen_q, shape.heads_q, d,
                     &setup_error_);
  DescribeContiguous(&dq_, buffers.dq, shape.dtype, b, shape.seqlen_q, shape.heads_q, d,
                     &setup_error_);
  DescribeContiguous(&dk_, buffers.dk, shape.dtype, b, shape.seqlen_k, shape.heads_k, d,
                     &setup_error_);
  DescribeContiguous(&dv_, buffers.dv, shape.dtype, b, shape.seqlen_k, shape.heads_k, d,
                     &setup_error_);
  const int64_t lse_shape[3] = {b, shape.heads_q, shape.seqlen_q};
  DescribeContiguousAbi(&lse_, buffers.lse, ANYATTN_DTYPE_F32, 3, lse_shape, &setup_error_);
  anyattn_fwd_params_init(&params_);
  params_.causal = shape.causal ? 1 : 0;
  params_.isa = isa;
}

bool AnyattnBwdCall::RunForward(std::string* error) const {
  if (!setup_error_.empty()) {
    if (error != nullptr) *error = setup_error_;
    return false;
  }
  return Succeeded(anyattn_fwd(&q_, &k_, &v_, &out_, &lse_, &params_), error);
}

bool AnyattnBwdCall::Run(std::string* error) const {
  if (!setup_error_.empty()) {
    if (error != nullptr) *error = setup_error_;
    return false;
  }
  return Succeeded(
      anyattn_bwd(&dout_, &q_, &k_, &v_, &out_, &lse_, &dq_, &dk_, &dv_, nullptr, &params_), error);
}

}  // namespace anyattn_bench
