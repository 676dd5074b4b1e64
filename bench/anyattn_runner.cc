#include "anyattn_runner.h"

namespace anyattn_bench {
namespace {

// Fills `tensor` as a contiguous rank-4 view of `data` with the ABI's own helper. On failure
// records the helper's status and message in *error unless an earlier failure is already there.
void DescribeContiguous(anyattn_tensor* tensor, const void* data, DType dtype, int64_t dim0,
                        int64_t dim1, int64_t dim2, int64_t dim3, std::string* error) {
  const int64_t shape[4] = {dim0, dim1, dim2, dim3};
  const anyattn_dtype abi_dtype = dtype == DType::kF32 ? ANYATTN_DTYPE_F32 : ANYATTN_DTYPE_BF16;
  const anyattn_status status =
      anyattn_tensor_init_contiguous(tensor, const_cast<void*>(data), abi_dtype, 4, shape);
  if (status != ANYATTN_OK && error->empty()) {
    *error = std::string("anyattn_tensor_init_contiguous: ") + anyattn_status_name(status) + ": " +
             anyattn_last_error();
  }
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

void AnyattnFwdCall::SetKv(const void* k, const void* v) {
  k_.data = const_cast<void*>(k);
  v_.data = const_cast<void*>(v);
}

bool AnyattnFwdCall::Run(std::string* error) const {
  if (!setup_error_.empty()) {
    if (error != nullptr) *error = setup_error_;
    return false;
  }
  const anyattn_status status = anyattn_fwd(&q_, &k_, &v_, &out_, nullptr, &params_);
  if (status == ANYATTN_OK) return true;
  if (error != nullptr) {
    *error = std::string(anyattn_status_name(status)) + ": " + anyattn_last_error();
  }
  return false;
}

}  // namespace anyattn_bench
