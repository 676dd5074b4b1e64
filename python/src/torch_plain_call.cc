// anyattn._core.fwd_torch_plain: the dense forward of a plain CPU torch call in one C function.
//
// A one-token decode step costs a few microseconds in the kernel, so the Python layer's argument
// handling (option objects, shape checks, tensor specs, the torch.library dispatcher) would
// otherwise dominate it. This function takes flash_attn_func's arguments as they were passed and
// either runs the whole call or returns None, in which case the caller takes its ordinary path,
// which checks everything again and raises the error a bad call deserves. It therefore never
// raises for bad input and never decides what is legal: anything it does not recognise as a plain
// call (see `PlainCall` below) goes the ordinary way.
//
// It reads torch tensors through their Python attributes (type, is_cpu, dtype, shape, stride(),
// data_ptr(), requires_grad), so it needs no libtorch at build time; the torch objects it compares
// against are handed over once by anyattn._torch_plain.bind.
#include "torch_plain_call.h"

#include <nanobind/nanobind.h>

#include <cmath>
#include <cstdint>

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

// The anyattn dtype of a torch dtype object, or -1.
int32_t dtype_code(PyObject* dtype) {
  if (dtype == g_torch.float32) return ANYATTN_DTYPE_F32;
  if (dtype == g_torch.float16) return ANYATTN_DTYPE_F16;
  if (dtype == g_torch.bfloat16) return ANYATTN_DTYPE_BF16;
  return -1;
}

// Reads a tuple of 4 exact ints into dst; false if `tuple` is anything else.
bool read_four(PyObject* tuple, int64_t* dst) {
  if (!tuple || !PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != 4) return false;
  for (Py_ssize_t i = 0; i < 4; ++i) {
    PyObject* item = PyTuple_GET_ITEM(tuple, i);
    if (!PyLong_CheckExact(item)) return false;
    dst[i] = PyLong_AsLongLong(item);
  }
  return !PyErr_Occurred();
}

// Calls obj.method() and returns the new reference (nullptr, error cleared, on failure).
PyObject* call_method0(PyObject* obj, PyObject* name) {
  PyObject* args[] = {obj};
  PyObject* result = PyObject_VectorcallMethod(name, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                               nullptr);
  if (!result) PyErr_Clear();
  return result;
}

// Describes a 4-D CPU torch.Tensor of an anyattn dtype as an anyattn_tensor. False if `obj` is not
// one, is empty, or has a strided last dimension (the ordinary path copies those).
bool describe_tensor(PyObject* obj, anyattn_tensor& t) {
  if (Py_TYPE(obj) != reinterpret_cast<PyTypeObject*>(g_torch.tensor_type)) return false;
  if (!attr_is_true(obj, g_names.is_cpu)) return false;
  Ref dtype(PyObject_GetAttr(obj, g_names.dtype));
  if (!dtype) {
    PyErr_Clear();
    return false;
  }
  t.dtype = dtype_code(dtype.get());
  if (t.dtype < 0) return false;
  Ref shape(PyObject_GetAttr(obj, g_names.shape));
  if (!shape) PyErr_Clear();
  Ref strides(call_method0(obj, g_names.stride));
  if (!read_four(shape.get(), t.shape) || !read_four(strides.get(), t.strides)) {
    PyErr_Clear();
    return false;
  }
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] == 0) return false;
  }
  if (t.shape[3] == 1) t.strides[3] = 1;  // a size-1 dimension's stride is arbitrary
  if (t.strides[3] != 1) return false;
  Ref pointer(call_method0(obj, g_names.data_ptr));
  if (!pointer || !PyLong_CheckExact(pointer.get())) return false;
  t.data = PyLong_AsVoidPtr(pointer.get());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  t.ndim = 4;
  return true;
}

// A finite float from an exact Python float or int (not bool); false otherwise.
bool read_number(PyObject* obj, double& value) {
  if (PyFloat_CheckExact(obj)) {
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

// flash_attn_func's scalar options when they describe a plain call: no dropout, a nonzero (or
// default) scale, causal a bool, window sides ints >= -1, softcap >= 0. An explicit scale of 0,
// which the ordinary path implements by zeroing q, is not plain.
bool read_plain_options(PyObject* dropout_p, PyObject* softmax_scale, PyObject* causal,
                        PyObject* window_size, PyObject* softcap, anyattn_fwd_params& params) {
  double dropout = 0.0, scale = 0.0, cap = 0.0;
  if (!read_number(dropout_p, dropout) || dropout != 0.0) return false;
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

// A new tensor like `q` (its dtype and device) of shape (b, s, h, d), or nullptr.
PyObject* new_empty(PyObject* q, int64_t b, int64_t s, int64_t h, int64_t d) {
  Ref shape(Py_BuildValue("(LLLL)", static_cast<long long>(b), static_cast<long long>(s),
                          static_cast<long long>(h), static_cast<long long>(d)));
  if (!shape) {
    PyErr_Clear();
    return nullptr;
  }
  PyObject* args[] = {q, shape.get()};
  PyObject* out = PyObject_VectorcallMethod(g_names.new_empty, args,
                                            2 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  if (!out) PyErr_Clear();
  return out;
}

nb::object fwd_torch_plain(nb::handle q, nb::handle k, nb::handle v, nb::handle dropout_p,
                           nb::handle softmax_scale, nb::handle causal, nb::handle window_size,
                           nb::handle softcap, nb::handle alibi_slopes, nb::handle return_attn_probs,
                           nb::handle sinks) {
  if (!g_torch.tensor_type) return nb::none();
  if (!alibi_slopes.is_none() || !sinks.is_none() || return_attn_probs.ptr() != Py_False) {
    return nb::none();
  }
  anyattn_fwd_params params;
  if (!read_plain_options(dropout_p.ptr(), softmax_scale.ptr(), causal.ptr(), window_size.ptr(),
                          softcap.ptr(), params)) {
    return nb::none();
  }
  anyattn_tensor tq{}, tk{}, tv{};
  if (!describe_tensor(q.ptr(), tq) || !describe_tensor(k.ptr(), tk) ||
      !describe_tensor(v.ptr(), tv) || tk.dtype != tq.dtype || tv.dtype != tq.dtype) {
    return nb::none();
  }
  // Autograd must record the call: the ordinary path goes through the differentiable op.
  Ref grad_enabled(PyObject_CallNoArgs(g_torch.is_grad_enabled));
  if (!grad_enabled) {
    PyErr_Clear();
    return nb::none();
  }
  if (grad_enabled.get() == Py_True &&
      (attr_is_true(q.ptr(), g_names.requires_grad) || attr_is_true(k.ptr(), g_names.requires_grad) ||
       attr_is_true(v.ptr(), g_names.requires_grad))) {
    return nb::none();
  }
  const int64_t b = tq.shape[0], sq = tq.shape[1], hq = tq.shape[2], dv = tv.shape[3];
  PyObject* out = new_empty(q.ptr(), b, sq, hq, dv);
  if (!out) return nb::none();
  nb::object result = nb::steal(out);
  anyattn_tensor tout{};
  tout.dtype = tq.dtype;
  tout.ndim = 4;
  const int64_t shape[4] = {b, sq, hq, dv};
  int64_t stride = 1;
  for (int i = 3; i >= 0; --i) {
    tout.shape[i] = shape[i];
    tout.strides[i] = stride;
    stride *= shape[i];
  }
  Ref pointer(call_method0(out, g_names.data_ptr));
  if (!pointer) return nb::none();
  tout.data = PyLong_AsVoidPtr(pointer.get());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return nb::none();
  }
  anyattn_status status;
  {
    nb::gil_scoped_release release;
    status = anyattn_fwd(&tq, &tk, &tv, &tout, nullptr, &params);
  }
  // Any failure (a shape the library rejects, memory) is reported by the ordinary path.
  if (status != ANYATTN_OK) return nb::none();
  return result;
}

PyObject* intern(const char* name) { return PyUnicode_InternFromString(name); }

void bind_torch(nb::handle tensor_type, nb::handle float32, nb::handle float16,
                nb::handle bfloat16, nb::handle is_grad_enabled) {
  if (!PyType_Check(tensor_type.ptr())) throw nb::type_error("tensor_type: expected a type");
  g_names = {intern("is_cpu"), intern("dtype"),         intern("shape"),    intern("stride"),
             intern("data_ptr"), intern("requires_grad"), intern("new_empty")};
  g_torch = {tensor_type.inc_ref().ptr(), float32.inc_ref().ptr(), float16.inc_ref().ptr(),
             bfloat16.inc_ref().ptr(), is_grad_enabled.inc_ref().ptr()};
}

}  // namespace

void register_torch_plain_call(nb::module_& m) {
  m.def("bind_torch", &bind_torch, nb::arg("tensor_type"), nb::arg("float32"), nb::arg("float16"),
        nb::arg("bfloat16"), nb::arg("is_grad_enabled"),
        "Hands fwd_torch_plain the torch objects it recognises plain calls by (once, at import).");
  // Every argument may be None (the ordinary path then decides what it means).
  m.def("fwd_torch_plain", &fwd_torch_plain, nb::arg("q").none(), nb::arg("k").none(),
        nb::arg("v").none(), nb::arg("dropout_p").none(), nb::arg("softmax_scale").none(),
        nb::arg("causal").none(), nb::arg("window_size").none(), nb::arg("softcap").none(),
        nb::arg("alibi_slopes").none(), nb::arg("return_attn_probs").none(),
        nb::arg("sinks").none(),
        "flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, "
        "alibi_slopes, return_attn_probs, sinks) run entirely here when it is a plain CPU call "
        "that needs no autograd record; otherwise None, and nothing is changed. Releases the GIL "
        "while the kernel runs.");
}
