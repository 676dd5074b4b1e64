#include "api/call_check.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "api/errors.h"

namespace anyattn::api {
namespace {

// What a dim must satisfy besides agreeing across tensors.
enum class DimRule : uint8_t {
  kNone,
  kHeadDim,       // D: 0..kMaxHeadDim, else ANYATTN_E_INVALID_ARGUMENT
  kHeadDimV,      // Dv: 0..kMaxHeadDimV, else ANYATTN_E_INVALID_ARGUMENT
  kMergeHeadDim,  // the merged states' Dv: up to kMaxHeadDimV, else ANYATTN_E_UNSUPPORTED
  kExtent,        // up to kMaxExtent (int32), else ANYATTN_E_UNSUPPORTED
};

struct DimInfo {
  const char* name;
  DimRule rule;
};

// Indexed by Dim.
constexpr DimInfo kDimInfo[] = {
    {"", DimRule::kNone},
    {"B", DimRule::kExtent},
    {"Sq", DimRule::kExtent},
    {"Sk", DimRule::kExtent},
    {"Hq", DimRule::kExtent},
    {"Hk", DimRule::kNone},  // divides Hq
    {"D", DimRule::kHeadDim},
    {"Dv", DimRule::kHeadDimV},
    {"total_q", DimRule::kNone},
    {"total_k", DimRule::kNone},
    {"B_cache", DimRule::kNone},
    {"S_cache", DimRule::kExtent},
    {"num_blocks", DimRule::kNone},
    {"page_size", DimRule::kExtent},
    {"S_new", DimRule::kNone},
    {"S_rotary", DimRule::kNone},
    {"rotary_dim / 2", DimRule::kNone},
    {"T", DimRule::kNone},
    {"S", DimRule::kNone},
    {"H", DimRule::kNone},
    {"Dv", DimRule::kMergeHeadDim},
};
static_assert(sizeof(kDimInfo) / sizeof(kDimInfo[0]) == static_cast<size_t>(Dim::kCount),
              "one DimInfo per Dim");
static_assert(static_cast<int>(Dim::kCount) <= 32, "new-dim masks are 32 bits");

DimRule dim_rule(Dim dim) { return kDimInfo[static_cast<int>(dim)].rule; }

// The largest value a head dim of `rule` may take; kMaxExtent for the other rules.
int64_t head_dim_limit(DimRule rule) {
  switch (rule) {
    case DimRule::kHeadDim:
      return kMaxHeadDim;
    case DimRule::kHeadDimV:
    case DimRule::kMergeHeadDim:
      return kMaxHeadDimV;
    default:
      return kMaxExtent;
  }
}

uint32_t bit(Dim dim) { return uint32_t{1} << static_cast<int>(dim); }

std::initializer_list<int32_t> allowed_dtypes(DTypes dtypes) {
  static constexpr std::initializer_list<int32_t> kF32Only = {ANYATTN_DTYPE_F32};
  if (dtypes == DTypes::kKvCache) return kCacheDtypes;
  return dtypes == DTypes::kF32 ? kF32Only : kFloatDtypes;
}

// "(B, Sq, Hq, D)": the dims of `spec` by name. Only built for a message.
std::string dims_text(const TensorSpec& spec) {
  std::string text = "(";
  for (int d = 0; d < spec.rank(); ++d) {
    if (d > 0) text += ", ";
    text += dim_name(spec.dims[d]);
  }
  return text + ")";
}

// "(2, 5, 4, 16)". Only built for a message.
template <class Value>
std::string tuple_text(int count, Value value) {
  std::string text = "(";
  for (int d = 0; d < count; ++d) {
    if (d > 0) text += ", ";
    text += std::to_string(value(d));
  }
  return text + ")";
}

// True when `a` and `b` address exactly the same elements in the same order.
bool same_view(const anyattn_tensor* a, const anyattn_tensor* b) {
  if (a->data != b->data || a->dtype != b->dtype || a->ndim != b->ndim) return false;
  for (int d = 0; d < a->ndim; ++d) {
    if (a->shape[d] != b->shape[d] || (a->shape[d] > 1 && a->strides[d] != b->strides[d])) {
      return false;
    }
  }
  return true;
}

}  // namespace

const char* dim_name(Dim dim) { return kDimInfo[static_cast<int>(dim)].name; }

void CallCheck::check(const TensorTable& table, const anyattn_tensor* const* tensors) {
  const int first = count_;
  check_descriptors(table, tensors);
  check_shared_dtype(table, tensors);
  const uint32_t new_dims = bind_dims(table, tensors);
  check_head_dims(new_dims);
  check_shapes(table, tensors);
  check_gqa(new_dims);
  check_extents(new_dims);
  check_memory(first);
}

void CallCheck::add_side_input(const char* name, const anyattn_tensor* t) {
  require_descriptor(function_, name, t);
  add(name, t, Role::kInput, 0, check_layout(function_, name, t, allowed_dtypes(DTypes::kF32)));
  check_memory(count_ - 1);
}

void CallCheck::require_disjoint(const char* written, const char* other) const {
  check_disjoint(function_, written, find(written).extent, other, find(other).extent);
}

const CallCheck::Checked& CallCheck::find(const char* name) const {
  for (int i = 0; i < count_; ++i) {
    if (std::strcmp(checked_[i].name, name) == 0) return checked_[i];
  }
  throw std::logic_error("CallCheck: no checked tensor of that name");
}

void CallCheck::add(const char* name, const anyattn_tensor* t, Role role, uint8_t in_place_group,
                    const TensorExtent& extent) {
  if (count_ == kMaxTensors) throw std::logic_error("CallCheck: more tensors than kMaxTensors");
  checked_[count_++] = Checked{name, t, role, in_place_group, extent};
}

void CallCheck::check_descriptors(const TensorTable& table, const anyattn_tensor* const* tensors) {
  for (int i = 0; i < table.count; ++i) {
    const TensorSpec& spec = table.specs[i];
    const anyattn_tensor* t = tensors[i];
    if (t == nullptr && spec.optional) continue;
    require_descriptor(function_, spec.name, t);
    if (t->ndim != spec.rank()) {
      fail_invalid(function_, ": ", spec.name, ".ndim is ", t->ndim, "; expected ", spec.rank(),
                   " ", dims_text(spec));
    }
    add(spec.name, t, spec.role, spec.in_place_group,
        check_layout(function_, spec.name, t, allowed_dtypes(spec.dtypes)));
  }
}

void CallCheck::check_shared_dtype(const TensorTable& table, const anyattn_tensor* const* tensors) {
  for (int i = 0; i < table.count; ++i) {
    const anyattn_tensor* t = tensors[i];
    if (t == nullptr) continue;
    if (table.specs[i].dtypes == DTypes::kKvCache) {
      if (cache_dtype_tensor_ == nullptr) {
        cache_dtype_tensor_ = t;
        cache_dtype_name_ = table.specs[i].name;
      } else if (t->dtype != cache_dtype_tensor_->dtype) {
        fail_invalid(function_, ": ", table.specs[i].name, ".dtype is ", dtype_name(t->dtype),
                     " but ", cache_dtype_name_, ".dtype is ",
                     dtype_name(cache_dtype_tensor_->dtype),
                     "; k_cache and v_cache share one dtype (f32, f16 or bf16 as q, or one of "
                     "fp8_e4m3, fp8_e5m2, i8)");
      }
      if (is_8bit_dtype(t->dtype)) continue;  // an 8-bit cache: not q's dtype
    } else if (table.specs[i].dtypes != DTypes::kShared) {
      continue;
    }
    if (shared_dtype_tensor_ == nullptr) {
      shared_dtype_tensor_ = t;
      shared_dtype_name_ = table.specs[i].name;
    } else if (t->dtype != shared_dtype_tensor_->dtype) {
      fail_invalid(function_, ": ", table.specs[i].name, ".dtype is ", dtype_name(t->dtype),
                   " but ", shared_dtype_name_, ".dtype is ",
                   dtype_name(shared_dtype_tensor_->dtype), "; ", table.shared_dtype_rule);
    }
  }
}

uint32_t CallCheck::bind_dims(const TensorTable& table, const anyattn_tensor* const* tensors) {
  uint32_t new_dims = 0;
  for (int i = 0; i < table.count; ++i) {
    const TensorSpec& spec = table.specs[i];
    if (tensors[i] == nullptr) continue;
    for (int axis = 0; axis < spec.rank(); ++axis) {
      Binding& binding = bindings_[static_cast<int>(spec.dims[axis])];
      if (binding.source != nullptr) continue;
      binding = Binding{tensors[i]->shape[axis], &spec, axis};
      new_dims |= bit(spec.dims[axis]);
    }
  }
  return new_dims;
}

void CallCheck::check_head_dims(uint32_t new_dims) const {
  for (int d = 0; d < static_cast<int>(Dim::kCount); ++d) {
    const Dim dim = static_cast<Dim>(d);
    const Binding& b = bindings_[d];
    const DimRule rule = dim_rule(dim);
    const int64_t limit = head_dim_limit(rule);
    if (!(new_dims & bit(dim)) || b.value <= limit) continue;
    if (rule == DimRule::kHeadDim || rule == DimRule::kHeadDimV) {
      fail_invalid(function_, ": ", b.source->name, ".shape[", b.axis, "] (head dim ",
                   dim_name(dim), ") is ", b.value, "; supported: 0..", limit);
    }
    if (rule == DimRule::kMergeHeadDim) {
      fail_unsupported(function_, ": the head dim (", b.source->name, ".shape[", b.axis,
                       "], the last dimension) is ", b.value, "; supported: up to ", limit);
    }
  }
}

void CallCheck::check_shapes(const TensorTable& table, const anyattn_tensor* const* tensors) const {
  for (int i = 0; i < table.count; ++i) {
    const TensorSpec& spec = table.specs[i];
    const anyattn_tensor* t = tensors[i];
    if (t == nullptr) continue;
    for (int axis = 0; axis < spec.rank(); ++axis) {
      if (t->shape[axis] != (*this)[spec.dims[axis]]) fail_shape(spec, t, axis);
    }
  }
}

void CallCheck::fail_shape(const TensorSpec& spec, const anyattn_tensor* t, int axis) const {
  const Dim dim = spec.dims[axis];
  const Binding& b = bindings_[static_cast<int>(dim)];
  fail_invalid(function_, ": ", spec.name, ".shape is ",
               tuple_text(t->ndim, [&](int d) { return t->shape[d]; }), "; expected ",
               dims_text(spec), " = ",
               tuple_text(spec.rank(), [&](int d) { return (*this)[spec.dims[d]]; }), ": ",
               spec.name, ".shape[", axis, "] is ", t->shape[axis], ", but ", dim_name(dim),
               " is ", b.value, " (", b.source->name, ".shape[", b.axis, "])");
}

void CallCheck::check_gqa(uint32_t new_dims) const {
  if (!(new_dims & (bit(Dim::kHq) | bit(Dim::kHk)))) return;
  const Binding& q = bindings_[static_cast<int>(Dim::kHq)];
  const Binding& k = bindings_[static_cast<int>(Dim::kHk)];
  if (q.source == nullptr || k.source == nullptr) return;
  if (k.value == 0 && q.value > 0) {
    fail_invalid(function_, ": ", k.source->name, ".shape[", k.axis, "] (Hk) is 0 but ",
                 q.source->name, ".shape[", q.axis, "] (Hq) is ", q.value,
                 "; there are no key/value heads to attend with (Hk must be >= 1 unless Hq = 0)");
  }
  if (k.value > 0 && q.value % k.value != 0) {
    fail_invalid(function_, ": Hq = ", q.value, " is not a multiple of Hk = ", k.value,
                 "; GQA/MQA need Hq % Hk == 0");
  }
}

void CallCheck::check_extents(uint32_t new_dims) const {
  for (int d = 0; d < static_cast<int>(Dim::kCount); ++d) {
    const Dim dim = static_cast<Dim>(d);
    const Binding& b = bindings_[d];
    if ((new_dims & bit(dim)) && dim_rule(dim) == DimRule::kExtent && b.value > kMaxExtent) {
      fail_unsupported(function_, ": ", dim_name(dim), " is ", b.value, " (", b.source->name,
                       ".shape[", b.axis, "]); supported: up to ", kMaxExtent);
    }
  }
}

void CallCheck::check_memory(int first) const {
  for (int i = first; i < count_; ++i) {
    if (checked_[i].role != Role::kInput) {
      check_no_self_overlap(function_, checked_[i].name, checked_[i].tensor);
    }
  }
  for (int i = first; i < count_; ++i) {
    for (int j = 0; j < i; ++j) {
      const Checked& a = checked_[i];
      const Checked& b = checked_[j];
      if (a.role != Role::kOutput && b.role != Role::kOutput) continue;
      if (a.in_place_group != 0 && a.in_place_group == b.in_place_group &&
          same_view(a.tensor, b.tensor)) {
        continue;
      }
      const Checked& written = a.role == Role::kOutput ? a : b;
      const Checked& other = a.role == Role::kOutput ? b : a;
      check_disjoint(function_, written.name, written.extent, other.name, other.extent);
    }
  }
}

}  // namespace anyattn::api
