// anyattn._core's plain-call functions: flash_attn_func, flash_attn_varlen_func (also against a
// paged cache), flash_attn_with_kvcache, and packed queries against a cache read in place (the
// FA3/FA4 cache calls), on plain CPU torch tensors, each in one C function.
//
// A one-token decode step costs a few microseconds in the kernel, so the Python layer's argument
// handling (option objects, shape checks, tensor specs, the torch.library dispatcher) would
// otherwise dominate it. Each function takes the public function's arguments as they were passed
// and either runs the whole call or returns None, in which case the caller takes its ordinary
// path, which checks everything again and raises the error a bad call deserves. They therefore
// never raise for bad input and never decide what is legal: a call is plain only if every
// argument is of the simplest kind the checks below accept (exact CPU torch.Tensors, exact
// Python ints, floats and bools, per-head tensors and scales in float32 only, nothing autograd
// must record), and the library itself validates the rest.
//
// Tensors are read through their Python attributes (type, is_cpu, dtype, shape, stride(),
// data_ptr(), requires_grad), so no libtorch is needed at build time; the torch objects they are
// compared against are handed over once, at import, by bind_torch.
#include "torch_plain_call.h"

#include <nanobind/nanobind.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>

#include "anyattn/anyattn.h"

namespace nb = nanobind;

namespace {

// The torch objects a plain call is recognised by. Set once by bind_torch and kept for the
// process's life (never released, so interpreter shutdown order does not matter).
struct TorchObjects {
  PyObject* tensor_type = nullptr;  // torch.Tensor; subclasses (Parameter, FakeTensor) don't qualify
  PyObject* float32 = nullptr;
  PyObject* float16 = nullptr;
  PyObject* bfloat16 = nullptr;
  PyObject* int32 = nullptr;
  // The 8-bit cache dtypes (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8); None where a
  // torch lacks one.
  PyObject* float8_e4m3fn = nullptr;
  PyObject* float8_e5m2 = nullptr;
  PyObject* int8 = nullptr;
  PyObject* is_grad_enabled = nullptr;  // torch.is_grad_enabled
};
TorchObjects g_torch;

// Interned attribute and method names.
struct Names {
  PyObject *is_cpu, *dtype, *shape, *stride, *data_ptr, *requires_grad, *new_empty;
};
Names g_names;

// A new reference, released on scope exit.
class Ref {
 public:
  explicit Ref(PyObject* p) : p_(p) {}
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  ~Ref() { Py_XDECREF(p_); }
  PyObject* get() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  PyObject* p_;
};

// True if obj.attr is True; false (with no error pending) otherwise.
bool attr_is_true(PyObject* obj, PyObject* name) {
  Ref value(PyObject_GetAttr(obj, name));
  if (!value) {
    PyErr_Clear();
    return false;
  }
  return value.get() == Py_True;
}

// The anyattn dtype of a torch float dtype object, or -1.
int32_t dtype_code(PyObject* dtype) {
  if (dtype == g_torch.float32) return ANYATTN_DTYPE_F32;
  if (dtype == g_torch.float16) return ANYATTN_DTYPE_F16;
  if (dtype == g_torch.bfloat16) return ANYATTN_DTYPE_BF16;
  return -1;
}

// The anyattn dtype of a KV cache's torch dtype object (a float or an 8-bit cache dtype), or -1.
int32_t cache_dtype_code(PyObject* dtype) {
  if (dtype == g_torch.float8_e4m3fn) return ANYATTN_DTYPE_FP8_E4M3;
  if (dtype == g_torch.float8_e5m2) return ANYATTN_DTYPE_FP8_E5M2;
  if (dtype == g_torch.int8) return ANYATTN_DTYPE_I8;
  return dtype_code(dtype);
}

// Reads a tuple of `n` exact ints into dst; false if `tuple` is anything else.
bool read_ints(PyObject* tuple, int n, int64_t* dst) {
  if (!tuple || !PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != n) return false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PyTuple_GET_ITEM(tuple, i);
    if (!PyLong_CheckExact(item)) return false;
    dst[i] = PyLong_AsLongLong(item);
  }
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return true;
}

// Calls obj.method() and returns the new reference (nullptr, error cleared, on failure).
PyObject* call_method0(PyObject* obj, PyObject* name) {
  PyObject* args[] = {obj};
  PyObject* result = PyObject_VectorcallMethod(name, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                               nullptr);
  if (!result) PyErr_Clear();
  return result;
}

// What a plain call's tensor argument may hold: q's dtypes, int32 indices, or a KV cache's
// dtypes (q's, or 8-bit).
enum class Elements { kFloat, kInt32, kCache };

// Describes a CPU torch.Tensor of `ndim` non-empty dimensions and the element kind `elements`
// (float: an anyattn dtype) as an anyattn_tensor, whatever its strides. False if `obj` is
// anything else.
bool describe_strided(PyObject* obj, int ndim, Elements elements, anyattn_tensor& t) {
  if (Py_TYPE(obj) != reinterpret_cast<PyTypeObject*>(g_torch.tensor_type)) return false;
  if (!attr_is_true(obj, g_names.is_cpu)) return false;
  Ref dtype(PyObject_GetAttr(obj, g_names.dtype));
  if (!dtype) {
    PyErr_Clear();
    return false;
  }
  if (elements == Elements::kInt32) {
    if (dtype.get() != g_torch.int32) return false;
    t.dtype = ANYATTN_DTYPE_I32;
  } else {
    t.dtype = elements == Elements::kCache ? cache_dtype_code(dtype.get())
                                           : dtype_code(dtype.get());
    if (t.dtype < 0) return false;
  }
  Ref shape(PyObject_GetAttr(obj, g_names.shape));
  if (!shape) PyErr_Clear();
  Ref strides(call_method0(obj, g_names.stride));
  if (!read_ints(shape.get(), ndim, t.shape) || !read_ints(strides.get(), ndim, t.strides)) {
    return false;
  }
  for (int i = 0; i < ndim; ++i) {
    if (t.shape[i] == 0) return false;
  }
  const int last = ndim - 1;
  if (t.shape[last] == 1) t.strides[last] = 1;  // a size-1 dimension's stride is arbitrary
  Ref pointer(call_method0(obj, g_names.data_ptr));
  if (!pointer || !PyLong_CheckExact(pointer.get())) return false;
  t.data = PyLong_AsVoidPtr(pointer.get());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  t.ndim = ndim;
  return true;
}

// describe_strided for a tensor whose last dimension has unit stride; false for a strided last
// dimension (the ordinary path copies those).
bool describe_tensor(PyObject* obj, int ndim, Elements elements, anyattn_tensor& t) {
  return describe_strided(obj, ndim, elements, t) && t.strides[ndim - 1] == 1;
}

// True if grad mode is on and any of `tensors` requires grad: autograd must then record the
// call, which the ordinary path does through the differentiable op.
bool needs_autograd(std::initializer_list<PyObject*> tensors) {
  Ref enabled(PyObject_CallNoArgs(g_torch.is_grad_enabled));
  if (!enabled) {
    PyErr_Clear();
    return true;
  }
  if (enabled.get() != Py_True) return false;
  for (PyObject* t : tensors) {
    if (t != Py_None && attr_is_true(t, g_names.requires_grad)) return true;
  }
  return false;
}

// A finite float from a Python float, a subclass's stored value included (numpy.float64 is one,
// and its float(), which the ordinary route takes, is that value), or from an exact int (not
// bool); false otherwise.
bool read_number(PyObject* obj, double& value) {
  if (PyFloat_Check(obj)) {
    value = PyFloat_AS_DOUBLE(obj);
  } else if (PyLong_CheckExact(obj)) {
    value = PyLong_AsDouble(obj);
    if (PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
  } else {
    return false;
  }
  return std::isfinite(value);
}

// An exact int >= -1 (a window side); false otherwise.
bool read_window_side(PyObject* obj, int32_t& side) {
  if (!PyLong_CheckExact(obj)) return false;
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(obj, &overflow);
  if (overflow != 0 || value < -1 || value > INT32_MAX) return false;
  side = static_cast<int32_t>(value);
  return true;
}

// The score options shared by flash_attn_func and flash_attn_with_kvcache when they describe a
// plain call: a nonzero (or default) scale, causal a bool, window sides ints >= -1, softcap >= 0.
// An explicit scale of 0, which the ordinary path implements by zeroing q, is not plain.
bool read_score_options(PyObject* softmax_scale, PyObject* causal, PyObject* window_size,
                        PyObject* softcap, anyattn_fwd_params& params) {
  double scale = 0.0, cap = 0.0;
  if (softmax_scale != Py_None && (!read_number(softmax_scale, scale) || scale == 0.0)) {
    return false;
  }
  if (causal != Py_True && causal != Py_False) return false;
  if (!read_number(softcap, cap) || cap < 0.0) return false;
  PyObject* left = nullptr;
  PyObject* right = nullptr;
  if (PyTuple_CheckExact(window_size) && PyTuple_GET_SIZE(window_size) == 2) {
    left = PyTuple_GET_ITEM(window_size, 0);
    right = PyTuple_GET_ITEM(window_size, 1);
  } else if (PyList_CheckExact(window_size) && PyList_GET_SIZE(window_size) == 2) {
    left = PyList_GET_ITEM(window_size, 0);
    right = PyList_GET_ITEM(window_size, 1);
  } else {
    return false;
  }
  anyattn_fwd_params_init(&params);
  if (!read_window_side(left, params.window_left) || !read_window_side(right, params.window_right)) {
    return false;
  }
  params.softmax_scale = static_cast<float>(scale);
  params.softcap = static_cast<float>(cap);
  params.causal = causal == Py_True ? 1 : 0;
  return true;
}

// A new contiguous tensor of `shape` (`ndim` extents) made by like.<factory>(shape), in like's
// dtype (`dtype` its anyattn code), or, when `torch_dtype` is given, in that torch dtype; and its
// description. Null on failure.
PyObject* new_tensor(PyObject* like, const int64_t* shape, int ndim, PyObject* factory,
                     int32_t dtype, PyObject* torch_dtype, anyattn_tensor& t) {
  Ref size(PyTuple_New(ndim));
  if (!size) {
    PyErr_Clear();
    return nullptr;
  }
  for (int i = 0; i < ndim; ++i) {
    PyObject* extent = PyLong_FromLongLong(shape[i]);
    if (!extent) {
      PyErr_Clear();
      return nullptr;
    }
    PyTuple_SET_ITEM(size.get(), i, extent);
  }
  PyObject* args[] = {like, size.get(), torch_dtype};
  Ref kwnames(torch_dtype ? PyTuple_Pack(1, g_names.dtype) : nullptr);
  if (torch_dtype && !kwnames) {
    PyErr_Clear();
    return nullptr;
  }
  PyObject* out = PyObject_VectorcallMethod(factory, args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                            kwnames.get());
  if (!out) {
    PyErr_Clear();
    return nullptr;
  }
  Ref pointer(call_method0(out, g_names.data_ptr));
  if (pointer) t.data = PyLong_AsVoidPtr(pointer.get());
  if (!pointer || PyErr_Occurred()) {
    PyErr_Clear();
    Py_DECREF(out);
    return nullptr;
  }
  t.dtype = dtype;
  t.ndim = ndim;
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.strides[i] = stride;
    stride *= shape[i];
  }
  return out;
}

// The output of a call with query `q` (its leading dimensions, then Hq and D) and values of head
// dimension `dv`: a new contiguous tensor of q's shape but Dv last, in q's dtype, made by
// q.new_empty, and its description. Null on failure.
PyObject* new_output(PyObject* q, const anyattn_tensor& tq, int64_t dv, anyattn_tensor& tout) {
  int64_t shape[ANYATTN_MAX_NDIM];
  for (int i = 0; i < tq.ndim; ++i) shape[i] = i + 1 < tq.ndim ? tq.shape[i] : dv;
  return new_tensor(q, shape, tq.ndim, g_names.new_empty, tq.dtype, nullptr, tout);
}

// The packed rows [first, last) of `total` that the sequences of `cu` (cu_seqlens_q) cover: from
// its first entry to its last, which the library writes, every one. The entries are clamped to
// the rows (the library validates them).
struct RowsInside {
  int64_t first, last;
};
RowsInside rows_inside(const anyattn_tensor& cu, int64_t total) {
  const int32_t* starts = static_cast<const int32_t*>(cu.data);
  const int64_t first = std::clamp<int64_t>(starts[0], 0, total);
  return {first, std::clamp<int64_t>(starts[cu.shape[0] - 1], first, total)};
}

// -inf in the rows of `lse` (Hq, total_q) outside every sequence of `cu`.
void clear_rows_outside(const anyattn_tensor& cu, const anyattn_tensor& lse) {
  const int64_t total = lse.shape[1];
  const RowsInside inside = rows_inside(cu, total);
  float* row = static_cast<float*>(lse.data);
  for (int64_t h = 0; h < lse.shape[0]; ++h, row += total) {
    std::fill(row, row + inside.first, -std::numeric_limits<float>::infinity());
    std::fill(row + inside.last, row + total, -std::numeric_limits<float>::infinity());
  }
}

// The output of packed queries `tq` (total_q, Hq, D) and values of head dimension `dv`, as
// new_output makes it, with 0 in the rows outside every sequence of `cu` (the ordinary path's
// value there) and the rest left to the call, which writes them all. Null on failure.
PyObject* new_packed_output(PyObject* q, const anyattn_tensor& tq, int64_t dv,
                            const anyattn_tensor& cu, anyattn_tensor& tout) {
  PyObject* out = new_output(q, tq, dv, tout);
  if (!out) return nullptr;
  const int64_t total = tout.shape[0];
  const RowsInside inside = rows_inside(cu, total);
  const int64_t row_bytes = tout.strides[0] * anyattn_dtype_size(tout.dtype);
  char* rows = static_cast<char*>(tout.data);
  std::memset(rows, 0, static_cast<size_t>(inside.first * row_bytes));
  std::memset(rows + inside.last * row_bytes, 0,
              static_cast<size_t>((total - inside.last) * row_bytes));
  return out;
}

// A new float32 LSE of `shape` (`ndim` extents) made like `q`, described in `tlse`; an invalid
// object on failure. Rows the library does not write are the caller's to fill.
nb::object new_lse(PyObject* q, const int64_t* shape, int ndim, anyattn_tensor& tlse) {
  return nb::steal(new_tensor(q, shape, ndim, g_names.new_empty, ANYATTN_DTYPE_F32,
                              g_torch.float32, tlse));
}

// The LSE of packed queries `tq` (total_q, Hq, D): (Hq, total_q) float32 made like `q`, -inf in
// the rows outside every sequence of `cu` (cu_seqlens_q); an invalid object on failure.
nb::object new_packed_lse(PyObject* q, const anyattn_tensor& tq, const anyattn_tensor& cu,
                          anyattn_tensor& tlse) {
  const int64_t shape[2] = {tq.shape[1], tq.shape[0]};
  nb::object lse = new_lse(q, shape, 2, tlse);
  if (lse.is_valid()) clear_rows_outside(cu, tlse);
  return lse;
}

// A call's result: `out` (None when the call failed), or (out, lse) when the LSE was asked for.
nb::object with_lse(nb::object out, nb::object lse) {
  if (out.is_none() || !lse.is_valid()) return out;
  return nb::make_tuple(out, lse);
}

// Runs `call` (a library call that writes `out`) with the GIL released; `out` on success, None
// on any failure (a shape the library rejects, memory), which the ordinary path then reports.
template <class Call>
nb::object run_released(PyObject* out, Call call) {
  nb::object result = nb::steal(out);
  anyattn_status status;
  {
    nb::gil_scoped_release release;
    status = call();
  }
  if (status != ANYATTN_OK) return nb::none();
  return result;
}

// The number of dimensions of a tensor-like object (its shape's length), or -1.
int tensor_rank(PyObject* obj) {
  Ref shape(PyObject_GetAttr(obj, g_names.shape));
  if (!shape || !PyTuple_Check(shape.get())) {
    PyErr_Clear();
    return -1;
  }
  return static_cast<int>(PyTuple_GET_SIZE(shape.get()));
}

// The per-head tensors of a call into `params`, described in `talibi` and `tsinks`: ALiBi slopes
// (Hq) or (B, Hq) and sink logits (Hq), each None or a float32 CPU tensor that needs no gradient
// (the library checks their shapes). False for anything else, which the ordinary path converts
// or rejects.
bool read_head_tensors(PyObject* alibi_slopes, PyObject* sinks, anyattn_tensor& talibi,
                       anyattn_tensor& tsinks, anyattn_fwd_params& params) {
  if (alibi_slopes != Py_None) {
    const int rank = tensor_rank(alibi_slopes);
    if ((rank != 1 && rank != 2) ||
        !describe_tensor(alibi_slopes, rank, Elements::kFloat, talibi) ||
        talibi.dtype != ANYATTN_DTYPE_F32) {
      return false;
    }
    params.alibi_slopes = &talibi;
  }
  if (sinks != Py_None) {
    if (!describe_tensor(sinks, 1, Elements::kFloat, tsinks) ||
        tsinks.dtype != ANYATTN_DTYPE_F32) {
      return false;
    }
    params.sinks = &tsinks;
  }
  return !needs_autograd({alibi_slopes, sinks});
}

// The options of flash_attn_func and flash_attn_varlen_func (with or without a paged cache) when
// they describe a plain call: no dropout, float32 per-head tensors (read_head_tensors, described
// in `talibi` and `tsinks`), plain score options, and return_attn_probs a bool (`want_lse`).
bool read_attention_options(PyObject* dropout_p, PyObject* softmax_scale, PyObject* causal,
                            PyObject* window_size, PyObject* softcap, PyObject* alibi_slopes,
                            PyObject* return_attn_probs, PyObject* sinks,
                            anyattn_fwd_params& params, anyattn_tensor& talibi,
                            anyattn_tensor& tsinks, bool& want_lse) {
  if (return_attn_probs != Py_True && return_attn_probs != Py_False) return false;
  want_lse = return_attn_probs == Py_True;
  double dropout = 0.0;
  if (!read_number(dropout_p, dropout) || dropout != 0.0) return false;
  return read_score_options(softmax_scale, causal, window_size, softcap, params) &&
         read_head_tensors(alibi_slopes, sinks, talibi, tsinks, params);
}

// q, k and v of `ndim` dimensions and one float dtype, none of which autograd must record.
bool describe_qkv(nb::handle q, nb::handle k, nb::handle v, int ndim, anyattn_tensor& tq,
                  anyattn_tensor& tk, anyattn_tensor& tv) {
  return describe_tensor(q.ptr(), ndim, Elements::kFloat, tq) &&
         describe_tensor(k.ptr(), ndim, Elements::kFloat, tk) &&
         describe_tensor(v.ptr(), ndim, Elements::kFloat, tv) && tk.dtype == tq.dtype &&
         tv.dtype == tq.dtype && !needs_autograd({q.ptr(), k.ptr(), v.ptr()});
}

nb::object fwd_torch_plain(nb::handle q, nb::handle k, nb::handle v, nb::handle dropout_p,
                           nb::handle softmax_scale, nb::handle causal, nb::handle window_size,
                           nb::handle softcap, nb::handle alibi_slopes, nb::handle return_attn_probs,
                           nb::handle sinks) {
  if (!g_torch.tensor_type) return nb::none();
  anyattn_fwd_params params;
  bool want_lse = false;
  anyattn_tensor tq{}, tk{}, tv{}, talibi{}, tsinks{}, tlse{};
  if (!read_attention_options(dropout_p.ptr(), softmax_scale.ptr(), causal.ptr(),
                              window_size.ptr(), softcap.ptr(), alibi_slopes.ptr(),
                              return_attn_probs.ptr(), sinks.ptr(), params, talibi, tsinks,
                              want_lse) ||
      !describe_qkv(q, k, v, 4, tq, tk, tv)) {
    return nb::none();
  }
  nb::object lse;
  if (want_lse) {  // (B, Hq, Sq): every row is written
    const int64_t shape[3] = {tq.shape[0], tq.shape[2], tq.shape[1]};
    lse = new_lse(q.ptr(), shape, 3, tlse);
    if (!lse.is_valid()) return nb::none();
  }
  anyattn_tensor tout{};
  PyObject* out = new_output(q.ptr(), tq, tv.shape[3], tout);
  if (!out) return nb::none();
  return with_lse(run_released(out, [&] {
                    return anyattn_fwd(&tq, &tk, &tv, &tout, want_lse ? &tlse : nullptr, &params);
                  }),
                  lse);
}

// An exact int >= 0 (a maximum sequence length); false otherwise.
bool read_length(PyObject* obj, int64_t& length) {
  if (!PyLong_CheckExact(obj)) return false;
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(obj, &overflow);
  if (overflow != 0 || value < 0) return false;
  length = value;
  return true;
}

nb::object fwd_varlen_torch_plain(nb::handle q, nb::handle k, nb::handle v,
                                  nb::handle cu_seqlens_q, nb::handle cu_seqlens_k,
                                  nb::handle max_seqlen_q, nb::handle max_seqlen_k,
                                  nb::handle dropout_p, nb::handle softmax_scale,
                                  nb::handle causal, nb::handle window_size, nb::handle softcap,
                                  nb::handle alibi_slopes, nb::handle return_attn_probs,
                                  nb::handle sinks, nb::handle seqused_k) {
  if (!g_torch.tensor_type) return nb::none();
  anyattn_fwd_params params;
  bool want_lse = false;
  int64_t max_q = 0, max_k = 0;
  anyattn_tensor tq{}, tk{}, tv{}, tcq{}, tck{}, tused{}, talibi{}, tsinks{}, tlse{};
  if (!read_attention_options(dropout_p.ptr(), softmax_scale.ptr(), causal.ptr(),
                              window_size.ptr(), softcap.ptr(), alibi_slopes.ptr(),
                              return_attn_probs.ptr(), sinks.ptr(), params, talibi, tsinks,
                              want_lse) ||
      !read_length(max_seqlen_q.ptr(), max_q) || !read_length(max_seqlen_k.ptr(), max_k) ||
      !describe_qkv(q, k, v, 3, tq, tk, tv) ||
      !describe_tensor(cu_seqlens_q.ptr(), 1, Elements::kInt32, tcq) ||
      !describe_tensor(cu_seqlens_k.ptr(), 1, Elements::kInt32, tck) ||
      (!seqused_k.is_none() && !describe_tensor(seqused_k.ptr(), 1, Elements::kInt32, tused))) {
    return nb::none();
  }
  nb::object lse;
  if (want_lse) {
    lse = new_packed_lse(q.ptr(), tq, tcq, tlse);
    if (!lse.is_valid()) return nb::none();
  }
  anyattn_tensor tout{};
  PyObject* out = new_packed_output(q.ptr(), tq, tv.shape[2], tcq, tout);
  if (!out) return nb::none();
  const anyattn_tensor* used = seqused_k.is_none() ? nullptr : &tused;
  return with_lse(run_released(out, [&] {
                    return anyattn_fwd_varlen(&tq, &tk, &tv, &tout, want_lse ? &tlse : nullptr,
                                              &tcq, &tck, used, max_q, max_k, &params);
                  }),
                  lse);
}

// cache_seqlens of a plain call: None (the whole cache), an exact int >= 0, or an int32 (B,)
// tensor.
bool read_cache_seqlens(PyObject* obj, anyattn_tensor& tensor, anyattn_kvcache_params& cache) {
  if (obj == Py_None) return true;
  if (PyLong_CheckExact(obj)) {
    int overflow = 0;
    const long long value = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow != 0 || value < 0) return false;
    cache.cache_seqlen = value;
    return true;
  }
  if (!describe_tensor(obj, 1, Elements::kInt32, tensor)) return false;
  cache.cache_seqlens = &tensor;
  return true;
}

// The scales of an 8-bit cache into `cache`, described in `tensors`: k_descale and v_descale
// (1), (Hk) or (B, Hk), k_token_scale and v_token_scale (the cache's first three dimensions),
// each None or a float32 CPU tensor that needs no gradient; the library checks that they fit
// the cache and its dtype. False for anything else (a float, another dtype), which the ordinary
// path converts or rejects.
bool read_cache_scales(nb::handle k_descale, nb::handle v_descale, nb::handle k_token_scale,
                       nb::handle v_token_scale, anyattn_tensor (&tensors)[4],
                       anyattn_kvcache_params& cache) {
  PyObject* const given[4] = {k_descale.ptr(), v_descale.ptr(), k_token_scale.ptr(),
                              v_token_scale.ptr()};
  const anyattn_tensor** const slots[4] = {&cache.k_descale, &cache.v_descale,
                                           &cache.k_token_scale, &cache.v_token_scale};
  for (int i = 0; i < 4; ++i) {
    if (given[i] == Py_None) continue;
    const int rank = tensor_rank(given[i]);
    const bool descale = i < 2;
    // A descale may be strided: sglang and vLLM pass FA3 one scale per tensor expanded to
    // (B, Hk), all strides 0, which the library reads entry by entry.
    const bool described =
        descale ? (rank == 1 || rank == 2) &&
                      describe_strided(given[i], rank, Elements::kFloat, tensors[i])
                : rank == 3 && describe_tensor(given[i], rank, Elements::kFloat, tensors[i]);
    if (!described || tensors[i].dtype != ANYATTN_DTYPE_F32) {
      return false;
    }
    *slots[i] = &tensors[i];
  }
  return !needs_autograd({given[0], given[1], given[2], given[3]});
}

// An exact int in 0 .. INT32_MAX (num_splits) into params.num_splits; false otherwise.
bool read_num_splits(PyObject* obj, anyattn_fwd_params& params) {
  if (!PyLong_CheckExact(obj)) return false;
  int overflow = 0;
  const long long splits = PyLong_AsLongLongAndOverflow(obj, &overflow);
  if (overflow != 0 || splits < 0 || splits > INT32_MAX) return false;
  params.num_splits = static_cast<int32_t>(splits);
  return true;
}

// An optional int32 (B) index tensor (cache_batch_idx, cache_leftpad) into `slot`.
bool read_optional_indices(PyObject* obj, anyattn_tensor& tensor, const anyattn_tensor*& slot) {
  if (obj == Py_None) return true;
  if (!describe_tensor(obj, 1, Elements::kInt32, tensor)) return false;
  slot = &tensor;
  return true;
}

nb::object fwd_kvcache_torch_plain(nb::handle q, nb::handle k_cache, nb::handle v_cache,
                                   nb::handle k, nb::handle v, nb::handle rotary_cos,
                                   nb::handle rotary_sin, nb::handle cache_seqlens,
                                   nb::handle cache_batch_idx, nb::handle cache_leftpad,
                                   nb::handle block_table, nb::handle softmax_scale,
                                   nb::handle causal, nb::handle window_size, nb::handle softcap,
                                   nb::handle rotary_interleaved, nb::handle alibi_slopes,
                                   nb::handle num_splits, nb::handle return_softmax_lse,
                                   nb::handle sinks, nb::handle k_descale, nb::handle v_descale,
                                   nb::handle k_token_scale, nb::handle v_token_scale) {
  if (!g_torch.tensor_type) return nb::none();
  if (return_softmax_lse.ptr() != Py_True && return_softmax_lse.ptr() != Py_False) {
    return nb::none();
  }
  const bool want_lse = return_softmax_lse.ptr() == Py_True;
  anyattn_fwd_params params;
  anyattn_tensor talibi{}, tsinks{};
  if (!read_score_options(softmax_scale.ptr(), causal.ptr(), window_size.ptr(), softcap.ptr(),
                          params) ||
      !read_num_splits(num_splits.ptr(), params) ||
      !read_head_tensors(alibi_slopes.ptr(), sinks.ptr(), talibi, tsinks, params)) {
    return nb::none();
  }

  anyattn_kvcache_params cache;
  anyattn_kvcache_params_init(&cache);
  anyattn_tensor tq{}, tkc{}, tvc{}, tk{}, tv{}, tseqlens{}, tblocks{}, tscales[4]{};
  anyattn_tensor tbatch{}, tleftpad{}, tcos{}, tsin{};
  if (!describe_tensor(q.ptr(), 4, Elements::kFloat, tq) ||
      !describe_tensor(k_cache.ptr(), 4, Elements::kCache, tkc) ||
      !describe_tensor(v_cache.ptr(), 4, Elements::kCache, tvc) ||
      !read_cache_seqlens(cache_seqlens.ptr(), tseqlens, cache) ||
      !read_cache_scales(k_descale, v_descale, k_token_scale, v_token_scale, tscales, cache) ||
      !read_optional_indices(cache_batch_idx.ptr(), tbatch, cache.cache_batch_idx) ||
      !read_optional_indices(cache_leftpad.ptr(), tleftpad, cache.cache_leftpad)) {
    return nb::none();
  }
  if (k.is_none() != v.is_none() || rotary_cos.is_none() != rotary_sin.is_none()) {
    return nb::none();
  }
  if (!k.is_none()) {
    if (!describe_tensor(k.ptr(), 4, Elements::kFloat, tk) ||
        !describe_tensor(v.ptr(), 4, Elements::kFloat, tv)) {
      return nb::none();
    }
    cache.k_new = &tk;
    cache.v_new = &tv;
  }
  if (!rotary_cos.is_none()) {  // rotary_interleaved matters only here
    if (!describe_tensor(rotary_cos.ptr(), 2, Elements::kFloat, tcos) ||
        !describe_tensor(rotary_sin.ptr(), 2, Elements::kFloat, tsin) ||
        (rotary_interleaved.ptr() != Py_True && rotary_interleaved.ptr() != Py_False)) {
      return nb::none();
    }
    cache.rotary_cos = &tcos;
    cache.rotary_sin = &tsin;
    cache.rotary_interleaved = rotary_interleaved.ptr() == Py_True ? 1 : 0;
  }
  if (!block_table.is_none()) {
    if (!describe_tensor(block_table.ptr(), 2, Elements::kInt32, tblocks)) return nb::none();
    cache.block_table = &tblocks;
  }
  if (needs_autograd({q.ptr(), k_cache.ptr(), v_cache.ptr(), k.ptr(), v.ptr(), rotary_cos.ptr(),
                      rotary_sin.ptr()})) {
    return nb::none();
  }
  anyattn_tensor tlse{};
  nb::object lse;
  if (want_lse) {  // (B, Hq, Sq): every row is written
    const int64_t shape[3] = {tq.shape[0], tq.shape[2], tq.shape[1]};
    lse = new_lse(q.ptr(), shape, 3, tlse);
    if (!lse.is_valid()) return nb::none();
  }
  anyattn_tensor tout{};
  PyObject* out = new_output(q.ptr(), tq, tvc.shape[3], tout);
  if (!out) return nb::none();
  return with_lse(run_released(out, [&] {
                    return anyattn_fwd_kvcache(&tq, &tkc, &tvc, &tout, want_lse ? &tlse : nullptr,
                                               &cache, &params);
                  }),
                  lse);
}

// The longest sequence of a cu_seqlens tensor (i32, 1-D, unit stride, as describe_tensor
// accepts it); false if it ever decreases (the library then names the error).
bool longest_sequence(const anyattn_tensor& cu, int64_t& longest) {
  const int32_t* starts = static_cast<const int32_t*>(cu.data);
  longest = 0;
  for (int64_t b = 0; b + 1 < cu.shape[0]; ++b) {
    const int64_t length = int64_t{starts[b + 1]} - starts[b];
    if (length < 0) return false;
    if (length > longest) longest = length;
  }
  return true;
}

// The row [first | second] of two tensors described in `first` and `second` whose last
// dimensions are column ranges of the same rows: one dtype, shape but for the last dimension,
// strides, and `second` starting where `first` ends. The row is described in `row` (first's
// data, the two widths together); false if the two are anything else.
bool adjacent_columns(const anyattn_tensor& first, const anyattn_tensor& second,
                      anyattn_tensor& row) {
  if (first.dtype != second.dtype || first.ndim != second.ndim) return false;
  const int last = first.ndim - 1;
  for (int d = 0; d < first.ndim; ++d) {
    if ((d < last && first.shape[d] != second.shape[d]) || first.strides[d] != second.strides[d]) {
      return false;
    }
  }
  if (static_cast<const char*>(second.data) !=
      static_cast<const char*>(first.data) + first.shape[last] * anyattn_dtype_size(first.dtype)) {
    return false;
  }
  row = first;
  row.shape[last] = first.shape[last] + second.shape[last];
  return true;
}

nb::object fwd_kvcache_varlen_torch_plain(nb::handle q, nb::handle k_cache, nb::handle v_cache,
                                          nb::handle cu_seqlens_q, nb::handle max_seqlen_q,
                                          nb::handle cache_seqlens, nb::handle block_table,
                                          nb::handle dropout_p, nb::handle softmax_scale,
                                          nb::handle causal, nb::handle window_size,
                                          nb::handle softcap, nb::handle alibi_slopes,
                                          nb::handle return_attn_probs, nb::handle sinks,
                                          nb::handle num_splits, nb::handle k_descale,
                                          nb::handle v_descale, nb::handle k_token_scale,
                                          nb::handle v_token_scale, nb::handle qv) {
  if (!g_torch.tensor_type) return nb::none();
  anyattn_fwd_params params;
  bool want_lse = false;
  anyattn_tensor talibi{}, tsinks{};
  if (!read_attention_options(dropout_p.ptr(), softmax_scale.ptr(), causal.ptr(),
                              window_size.ptr(), softcap.ptr(), alibi_slopes.ptr(),
                              return_attn_probs.ptr(), sinks.ptr(), params, talibi, tsinks,
                              want_lse) ||
      !read_num_splits(num_splits.ptr(), params)) {
    return nb::none();
  }
  anyattn_kvcache_params cache;
  anyattn_kvcache_params_init(&cache);
  anyattn_tensor tq{}, tkc{}, tvc{}, tcq{}, tseqlens{}, tblocks{}, tscales[4]{};
  if (!describe_tensor(q.ptr(), 3, Elements::kFloat, tq) ||
      !describe_tensor(k_cache.ptr(), 4, Elements::kCache, tkc) ||
      !describe_tensor(v_cache.ptr(), 4, Elements::kCache, tvc) ||
      !describe_tensor(cu_seqlens_q.ptr(), 1, Elements::kInt32, tcq) ||
      !read_cache_seqlens(cache_seqlens.ptr(), tseqlens, cache) ||
      !read_cache_scales(k_descale, v_descale, k_token_scale, v_token_scale, tscales, cache)) {
    return nb::none();
  }
  if (!qv.is_none()) {
    // FA3's qv (absorbed MLA): scores q . k + qv . v, which is attention of the query [qv | q]
    // against the keys [v | k]. Plain where both are column ranges of one row, as DeepSeek's
    // latent cache and sglang's sliced query are: the row is the shared latent cache (v_cache
    // its column prefix, K's scales for V: the library checks v_descale and v_token_scale).
    anyattn_tensor tqv{}, tq_row{}, tkc_row{};
    if (!describe_tensor(qv.ptr(), 3, Elements::kFloat, tqv) ||
        !adjacent_columns(tqv, tq, tq_row) || !adjacent_columns(tvc, tkc, tkc_row) ||
        needs_autograd({qv.ptr()})) {
      return nb::none();
    }
    tq = tq_row;
    tkc = tkc_row;
  }
  if (!block_table.is_none()) {
    if (!describe_tensor(block_table.ptr(), 2, Elements::kInt32, tblocks)) return nb::none();
    cache.block_table = &tblocks;
  }
  int64_t max_q = 0;
  if (max_seqlen_q.is_none() ? !longest_sequence(tcq, max_q)
                             : !read_length(max_seqlen_q.ptr(), max_q)) {
    return nb::none();
  }
  if (needs_autograd({q.ptr(), k_cache.ptr(), v_cache.ptr()})) return nb::none();
  anyattn_tensor tlse{};
  nb::object lse;
  if (want_lse) {
    lse = new_packed_lse(q.ptr(), tq, tcq, tlse);
    if (!lse.is_valid()) return nb::none();
  }
  anyattn_tensor tout{};
  PyObject* out = new_packed_output(q.ptr(), tq, tvc.shape[3], tcq, tout);
  if (!out) return nb::none();
  return with_lse(run_released(out, [&] {
                    return anyattn_fwd_kvcache_varlen(&tq, &tkc, &tvc, &tout,
                                                      want_lse ? &tlse : nullptr, &tcq, max_q,
                                                      &cache, &params);
                  }),
                  lse);
}

PyObject* intern(const char* name) { return PyUnicode_InternFromString(name); }

void bind_torch(nb::handle tensor_type, nb::handle float32, nb::handle float16,
                nb::handle bfloat16, nb::handle int32, nb::handle float8_e4m3fn,
                nb::handle float8_e5m2, nb::handle int8, nb::handle is_grad_enabled) {
  if (!PyType_Check(tensor_type.ptr())) throw nb::type_error("tensor_type: expected a type");
  g_names = {intern("is_cpu"),   intern("dtype"),         intern("shape"),
             intern("stride"),   intern("data_ptr"),      intern("requires_grad"),
             intern("new_empty")};
  g_torch = {tensor_type.inc_ref().ptr(),   float32.inc_ref().ptr(),
             float16.inc_ref().ptr(),       bfloat16.inc_ref().ptr(),
             int32.inc_ref().ptr(),         float8_e4m3fn.inc_ref().ptr(),
             float8_e5m2.inc_ref().ptr(),   int8.inc_ref().ptr(),
             is_grad_enabled.inc_ref().ptr()};
}

}  // namespace

void register_torch_plain_call(nb::module_& m) {
  m.def("bind_torch", &bind_torch, nb::arg("tensor_type"), nb::arg("float32"), nb::arg("float16"),
        nb::arg("bfloat16"), nb::arg("int32"), nb::arg("float8_e4m3fn").none(),
        nb::arg("float8_e5m2").none(), nb::arg("int8"), nb::arg("is_grad_enabled"),
        "Hands the plain-call functions the torch objects they recognise plain calls by (once, at "
        "import).");
  // Every argument may be None (the ordinary path then decides what it means).
  m.def("fwd_torch_plain", &fwd_torch_plain, nb::arg("q").none(), nb::arg("k").none(),
        nb::arg("v").none(), nb::arg("dropout_p").none(), nb::arg("softmax_scale").none(),
        nb::arg("causal").none(), nb::arg("window_size").none(), nb::arg("softcap").none(),
        nb::arg("alibi_slopes").none(), nb::arg("return_attn_probs").none(),
        nb::arg("sinks").none(),
        "flash_attn_func's arguments, in its order: the output, or (out, lse (B, Hq, Sq)) with "
        "return_attn_probs, when the call is plain (see torch_plain_call.cc) and ran; otherwise "
        "None, with nothing changed. Releases the GIL while the kernel runs.");
  m.def("fwd_varlen_torch_plain", &fwd_varlen_torch_plain, nb::arg("q").none(),
        nb::arg("k").none(), nb::arg("v").none(), nb::arg("cu_seqlens_q").none(),
        nb::arg("cu_seqlens_k").none(), nb::arg("max_seqlen_q").none(),
        nb::arg("max_seqlen_k").none(), nb::arg("dropout_p").none(),
        nb::arg("softmax_scale").none(), nb::arg("causal").none(), nb::arg("window_size").none(),
        nb::arg("softcap").none(), nb::arg("alibi_slopes").none(),
        nb::arg("return_attn_probs").none(), nb::arg("sinks").none(), nb::arg("seqused_k").none(),
        "flash_attn_varlen_func's arguments (without block_table and scales): the output, or "
        "(out, lse (Hq, total_q)) with return_attn_probs, when the call is plain and ran (rows "
        "outside every sequence 0 in out, -inf in lse); otherwise None, with nothing changed. "
        "Releases the GIL while the kernel runs.");
  m.def("fwd_kvcache_torch_plain", &fwd_kvcache_torch_plain, nb::arg("q").none(),
        nb::arg("k_cache").none(), nb::arg("v_cache").none(), nb::arg("k").none(),
        nb::arg("v").none(), nb::arg("rotary_cos").none(), nb::arg("rotary_sin").none(),
        nb::arg("cache_seqlens").none(), nb::arg("cache_batch_idx").none(),
        nb::arg("cache_leftpad").none(), nb::arg("block_table").none(),
        nb::arg("softmax_scale").none(), nb::arg("causal").none(), nb::arg("window_size").none(),
        nb::arg("softcap").none(), nb::arg("rotary_interleaved").none(),
        nb::arg("alibi_slopes").none(), nb::arg("num_splits").none(),
        nb::arg("return_softmax_lse").none(), nb::arg("sinks").none(),
        nb::arg("k_descale").none() = nb::none(), nb::arg("v_descale").none() = nb::none(),
        nb::arg("k_token_scale").none() = nb::none(),
        nb::arg("v_token_scale").none() = nb::none(),
        "flash_attn_with_kvcache's arguments, in its order: the output, or (out, lse) with "
        "return_softmax_lse, when the call is plain and ran (new keys and values appended in "
        "place, rotated first with rotary tables, quantized into an 8-bit cache); otherwise None, "
        "with nothing changed. ALiBi slopes, sinks and scales in float32. Releases the GIL while "
        "the kernel runs.");
  m.def("fwd_kvcache_varlen_torch_plain", &fwd_kvcache_varlen_torch_plain,
        nb::arg("q").none(), nb::arg("k_cache").none(), nb::arg("v_cache").none(),
        nb::arg("cu_seqlens_q").none(), nb::arg("max_seqlen_q").none(),
        nb::arg("cache_seqlens").none(), nb::arg("block_table").none(),
        nb::arg("dropout_p").none(), nb::arg("softmax_scale").none(), nb::arg("causal").none(),
        nb::arg("window_size").none(), nb::arg("softcap").none(), nb::arg("alibi_slopes").none(),
        nb::arg("return_attn_probs").none(), nb::arg("sinks").none(),
        nb::arg("num_splits").none(), nb::arg("k_descale").none() = nb::none(),
        nb::arg("v_descale").none() = nb::none(), nb::arg("k_token_scale").none() = nb::none(),
        nb::arg("v_token_scale").none() = nb::none(), nb::arg("qv").none() = nb::none(),
        "Packed queries against a cache read in place (anyattn_fwd_kvcache_varlen: "
        "flash_attn_varlen_func with block_table and seqused_k, the FA3/FA4 cache calls with "
        "cu_seqlens_q): the output when the call is plain and ran (rows outside every sequence "
        "0); otherwise None, with nothing changed. max_seqlen_q None: the longest sequence of "
        "cu_seqlens_q; ALiBi slopes, sinks and the scales of an 8-bit cache in float32; "
        "return_attn_probs: (out, lse (Hq, total_q) float32, -inf outside every sequence) "
        "instead of out. qv (FA3's value-side query): plain only where q's columns follow qv's "
        "in one tensor and k_cache's follow v_cache's (one latent row [v | k]). Releases the GIL "
        "while the kernel runs.");
}
