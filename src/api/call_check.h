// Declarative validation: an entry point describes its tensors in a table (entry_tables.h), and
// CallCheck checks a call's descriptors against it. This is the one place that writes the
// messages about tensor descriptors:
//   - each descriptor: non-null unless optional, its rank, its dtype, a unit last stride and an
//     extent that fits the address space (tensor_checks.h);
//   - the dtype shared by the floating-point tensors of the call;
//   - the shapes against the table's symbolic dims (B, Sq, Hq, D, ...): a dim takes its value
//     from the first tensor that has it, and every later tensor must agree;
//   - the rules of the dims themselves: D up to 576 and Dv up to 512
//     (common/head_dims.h), Hq a multiple of Hk, sizes that fit
//     int32;
//   - memory: a written tensor addresses each element once and shares no byte with any other
//     tensor of the call, except an in-place output that is exactly the view of its input.
// Several tables can be checked in turn against one CallCheck: the bindings of the dims and the
// tensors already checked carry over, so the backward checks the forward's table and then its
// gradients', and an append checks its new keys against the cache's dims. Nothing is allocated
// unless a check fails.
#ifndef ANYATTN_API_CALL_CHECK_H_
#define ANYATTN_API_CALL_CHECK_H_

#include <cstddef>
#include <cstdint>

#include "anyattn/anyattn.h"
#include "api/tensor_checks.h"

namespace anyattn::api {

// The symbolic dims a table can name. dim_name() gives each one's name in messages; the rule a
// dim obeys is set next to its name (call_check.cc).
enum class Dim : uint8_t {
  kNone,  // past a tensor's last dimension
  // Attention.
  kB, kSq, kSk, kHq, kHk, kD, kDv,
  // Packed varlen rows.
  kTotalQ, kTotalK,
  // KV cache: contiguous (B_cache, S_cache) or paged (num_blocks, page_size), and appended rows.
  kCacheBatches, kCacheLen, kPages, kPageSize, kNewTokens,
  // Rotary tables: (S_rotary, rotary_dim / 2).
  kRotaryPositions, kRotaryHalf,
  // Merge of attention states: (T, H, Dv) or (B, S, H, Dv).
  kMergeT, kMergeS, kMergeH, kMergeDv,
  kCount
};
const char* dim_name(Dim dim);

// The dtypes a tensor accepts.
enum class DTypes : uint8_t {
  kShared,  // f32, f16 or bf16, the same for every kShared tensor of the call
  kF32,
  kAnyFloat,  // f32, f16 or bf16, whatever the other tensors are
  // A KV cache: one dtype for every kKvCache tensor of the call; a float one must also be the
  // kShared dtype, an 8-bit one (fp8_e4m3, fp8_e5m2, i8) stands apart from it.
  kKvCache,
};

// How the call uses a tensor.
enum class Role : uint8_t {
  kInput,   // read only
  kOutput,  // written: addresses each element once, overlaps no other tensor of the call
  kCache,   // read here and written by an append: addresses each element once; its
            // disjointness from the appended keys is the append's step (require_disjoint)
};

// One tensor of an entry point, by the name its messages use ("q", "cache->k_new").
struct TensorSpec {
  const char* name;
  Dim dims[ANYATTN_MAX_NDIM];  // Dim::kNone after the last: the rank is the count before it
  DTypes dtypes;
  Role role;
  bool optional = false;  // NULL allowed
  // An output may be exactly the view of an input of the same nonzero group (an in-place update,
  // as the merge allows); any other overlap is rejected.
  uint8_t in_place_group = 0;

  constexpr int rank() const {
    int r = 0;
    while (r < ANYATTN_MAX_NDIM && dims[r] != Dim::kNone) ++r;
    return r;
  }
};

// An entry point's tensors, in the order its C function takes them, and the text a dtype
// mismatch ends with ("q, k, v and out must share one dtype").
struct TensorTable {
  const TensorSpec* specs;
  int count;
  const char* shared_dtype_rule;
};

template <size_t kCount>
constexpr TensorTable make_table(const TensorSpec (&specs)[kCount], const char* shared_dtype_rule) {
  return TensorTable{specs, static_cast<int>(kCount), shared_dtype_rule};
}

class CallCheck {
 public:
  // `function` starts every message: the entry point the caller called.
  explicit CallCheck(const char* function) : function_(function) {}

  const char* function() const { return function_; }

  // Checks `tensors` (table.count of them, in the table's order) against `table`, in this order:
  // each descriptor, the shared dtype, the head dims, the shapes, Hq against Hk, the int32 sizes,
  // then each written tensor against every tensor checked so far by this CallCheck. The rules of
  // a dim apply where this table binds it. Throws ApiError.
  void check(const TensorTable& table, const anyattn_tensor* const* tensors);

  // Adds a side input (ALiBi slopes, sinks) already validated by its own rules: the tensors
  // written must not overlap it.
  void add_side_input(const char* name, const anyattn_tensor* t);

  // Throws if the checked tensors named `written` and `other` share a byte: for a tensor that a
  // later step writes, such as a cache the new keys are appended to.
  void require_disjoint(const char* written, const char* other) const;

  // The value of a dim bound by a checked tensor.
  int64_t operator[](Dim dim) const { return bindings_[static_cast<int>(dim)].value; }

 private:
  // Where a dim got its value: tensor `source`, dimension `axis`.
  struct Binding {
    int64_t value = 0;
    const TensorSpec* source = nullptr;
    int axis = 0;
  };
  struct Checked {
    const char* name;
    const anyattn_tensor* tensor;
    Role role;
    uint8_t in_place_group;
    TensorExtent extent;
  };
  static constexpr int kMaxTensors = 16;

  void check_descriptors(const TensorTable& table, const anyattn_tensor* const* tensors);
  void check_shared_dtype(const TensorTable& table, const anyattn_tensor* const* tensors);
  // Binds every dim the table names that is still unbound; returns a mask of the new ones.
  uint32_t bind_dims(const TensorTable& table, const anyattn_tensor* const* tensors);
  void check_head_dims(uint32_t new_dims) const;
  void check_shapes(const TensorTable& table, const anyattn_tensor* const* tensors) const;
  void check_gqa(uint32_t new_dims) const;
  void check_extents(uint32_t new_dims) const;
  // Self-overlap of the written tensors from `first` on, and disjointness of every pair with a
  // member from `first` on and an output among the two.
  void check_memory(int first) const;
  const Checked& find(const char* name) const;
  void add(const char* name, const anyattn_tensor* t, Role role, uint8_t in_place_group,
           const TensorExtent& extent);
  [[noreturn]] void fail_shape(const TensorSpec& spec, const anyattn_tensor* t, int axis) const;

  const char* function_;
  Binding bindings_[static_cast<int>(Dim::kCount)];
  Checked checked_[kMaxTensors];
  int count_ = 0;
  const anyattn_tensor* shared_dtype_tensor_ = nullptr;  // the first kShared tensor checked
  const char* shared_dtype_name_ = nullptr;
  const anyattn_tensor* cache_dtype_tensor_ = nullptr;  // the first kKvCache tensor checked
  const char* cache_dtype_name_ = nullptr;
};

}  // namespace anyattn::api

#endif  // ANYATTN_API_CALL_CHECK_H_
