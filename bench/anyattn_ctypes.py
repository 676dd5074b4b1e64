"""anyattn's C ABI (include/anyattn/anyattn.h) through ctypes, for the benchmark scripts.

Only what the benchmarks need: contiguous tensors, the dense and varlen forward calls, the backward
call, thread control and the error message. The structs mirror the header field by field; `AnyattnLibrary` checks that
the library's own anyattn_fwd_params_init agrees with the size ctypes computes, so a header change
that is not mirrored here fails loudly instead of corrupting memory.
"""

import ctypes
import os

DTYPE_F32 = 0
DTYPE_F16 = 1
DTYPE_BF16 = 2
DTYPE_I32 = 3
MAX_NDIM = 4
STATUS_OK = 0


class AnyattnTensor(ctypes.Structure):
    """Mirror of `anyattn_tensor`: data, dtype, ndim, shape and strides in elements."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_NDIM),
        ("strides", ctypes.c_int64 * MAX_NDIM),
    ]


class AnyattnFwdParams(ctypes.Structure):
    """Mirror of `anyattn_fwd_params`, in the header's field order."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("softmax_scale", ctypes.c_float),
        ("softcap", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("alibi_slopes", ctypes.c_void_p),
        ("sinks", ctypes.c_void_p),
        ("dropout_p", ctypes.c_float),
        ("dropout_seed", ctypes.c_uint64),
        ("dropout_offset", ctypes.c_uint64),
        ("num_splits", ctypes.c_int32),
        ("isa", ctypes.c_int32),
        ("bwd_own_forward", ctypes.c_int32),
    ]


def contiguous_tensor(data_ptr, dtype, shape):
    """An AnyattnTensor describing a C-contiguous buffer at address `data_ptr` of `shape`."""
    tensor = AnyattnTensor()
    tensor.data = data_ptr
    tensor.dtype = dtype
    tensor.ndim = len(shape)
    stride = 1
    for axis in reversed(range(len(shape))):
        tensor.shape[axis] = shape[axis]
        tensor.strides[axis] = stride
        stride *= shape[axis]
    return tensor


class AnyattnLibrary:
    """The loaded libanyattn.so with typed entry points."""

    def __init__(self, path):
        """Loads the shared library at `path`; raises OSError if it cannot be loaded."""
        self.path = os.path.abspath(path)
        self._lib = ctypes.CDLL(self.path)
        lib = self._lib
        lib.anyattn_version_string.restype = ctypes.c_char_p
        lib.anyattn_last_error.restype = ctypes.c_char_p
        lib.anyattn_status_name.restype = ctypes.c_char_p
        lib.anyattn_status_name.argtypes = [ctypes.c_int]
        lib.anyattn_set_num_threads.argtypes = [ctypes.c_int]
        lib.anyattn_get_num_threads.restype = ctypes.c_int
        lib.anyattn_fwd_params_init.argtypes = [ctypes.POINTER(AnyattnFwdParams)]
        pointer = ctypes.POINTER(AnyattnTensor)
        lib.anyattn_fwd.argtypes = [pointer, pointer, pointer, pointer, pointer,
                                    ctypes.POINTER(AnyattnFwdParams)]
        lib.anyattn_fwd.restype = ctypes.c_int
        lib.anyattn_fwd_varlen.argtypes = [pointer] * 8 + [ctypes.c_int64, ctypes.c_int64,
                                                           ctypes.POINTER(AnyattnFwdParams)]
        lib.anyattn_fwd_varlen.restype = ctypes.c_int
        lib.anyattn_bwd.argtypes = [pointer] * 10 + [ctypes.POINTER(AnyattnFwdParams)]
        lib.anyattn_bwd.restype = ctypes.c_int
        probe = AnyattnFwdParams()
        lib.anyattn_fwd_params_init(ctypes.byref(probe))
        if probe.struct_size != ctypes.sizeof(AnyattnFwdParams):
            raise OSError(
                f"anyattn_fwd_params is {probe.struct_size} bytes in {self.path} but "
                f"{ctypes.sizeof(AnyattnFwdParams)} in anyattn_ctypes.py; update the mirror")

    def version(self):
        """The loaded library's "major.minor.patch"."""
        return self._lib.anyattn_version_string().decode()

    def set_num_threads(self, threads):
        """anyattn_set_num_threads(threads); returns the count the library then reports."""
        self._lib.anyattn_set_num_threads(threads)
        return self._lib.anyattn_get_num_threads()

    def _checked(self, entry_point, refs, keepalive):
        """A zero-argument function calling entry_point(*refs) that raises RuntimeError with
        anyattn's message when the status is not OK."""
        def run():
            status = entry_point(*refs)
            if status != STATUS_OK:
                name = self._lib.anyattn_status_name(status).decode()
                raise RuntimeError(f"{name}: {self._lib.anyattn_last_error().decode()}")

        run.keepalive = keepalive
        return run

    def _params(self, causal):
        params = AnyattnFwdParams()
        self._lib.anyattn_fwd_params_init(ctypes.byref(params))
        params.causal = 1 if causal else 0
        return params

    def fwd_call(self, q_ptr, k_ptr, v_ptr, out_ptr, dtype, batch, seqlen_q, seqlen_k, heads_q,
                 heads_k, head_dim, causal, lse_ptr=None):
        """A zero-argument function that runs one dense forward call on contiguous (B, S, H, D)
        buffers at the given addresses (and writes the f32 (B, Hq, Sq) LSE at lse_ptr when given)
        and raises RuntimeError with anyattn's message on failure. The descriptors are built once,
        so calling it times only the library."""
        q = contiguous_tensor(q_ptr, dtype, (batch, seqlen_q, heads_q, head_dim))
        k = contiguous_tensor(k_ptr, dtype, (batch, seqlen_k, heads_k, head_dim))
        v = contiguous_tensor(v_ptr, dtype, (batch, seqlen_k, heads_k, head_dim))
        out = contiguous_tensor(out_ptr, dtype, (batch, seqlen_q, heads_q, head_dim))
        lse = (contiguous_tensor(lse_ptr, DTYPE_F32, (batch, heads_q, seqlen_q))
               if lse_ptr is not None else None)
        params = self._params(causal)
        refs = (ctypes.byref(q), ctypes.byref(k), ctypes.byref(v), ctypes.byref(out),
                ctypes.byref(lse) if lse is not None else None, ctypes.byref(params))
        return self._checked(self._lib.anyattn_fwd, refs, (q, k, v, out, lse, params))

    def fwd_varlen_call(self, q_ptr, k_ptr, v_ptr, out_ptr, cu_seqlens_ptr, dtype, batch, total,
                        max_seqlen, heads_q, heads_k, head_dim, causal):
        """A zero-argument function that runs one varlen forward call (anyattn_fwd_varlen) on
        packed contiguous (total, H, D) buffers whose `batch` sequences are given by the i32
        (batch + 1) cu_seqlens at cu_seqlens_ptr, the same for queries and keys; raises
        RuntimeError with anyattn's message on failure."""
        q = contiguous_tensor(q_ptr, dtype, (total, heads_q, head_dim))
        k = contiguous_tensor(k_ptr, dtype, (total, heads_k, head_dim))
        v = contiguous_tensor(v_ptr, dtype, (total, heads_k, head_dim))
        out = contiguous_tensor(out_ptr, dtype, (total, heads_q, head_dim))
        cu_seqlens = contiguous_tensor(cu_seqlens_ptr, DTYPE_I32, (batch + 1,))
        params = self._params(causal)
        refs = (ctypes.byref(q), ctypes.byref(k), ctypes.byref(v), ctypes.byref(out), None,
                ctypes.byref(cu_seqlens), ctypes.byref(cu_seqlens), None, max_seqlen, max_seqlen,
                ctypes.byref(params))
        return self._checked(self._lib.anyattn_fwd_varlen, refs, (q, k, v, out, cu_seqlens, params))

    def bwd_call(self, dout_ptr, q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, dq_ptr, dk_ptr, dv_ptr,
                 dtype, batch, seqlen_q, seqlen_k, heads_q, heads_k, head_dim, causal):
        """A zero-argument function that runs one dense backward call (anyattn_bwd) on contiguous
        (B, S, H, D) buffers, out and the f32 (B, Hq, Sq) lse from a forward call on the same
        inputs, writing dq, dk, dv; raises RuntimeError with anyattn's message on failure."""
        q_shape = (batch, seqlen_q, heads_q, head_dim)
        k_shape = (batch, seqlen_k, heads_k, head_dim)
        tensors = (contiguous_tensor(dout_ptr, dtype, q_shape),
                   contiguous_tensor(q_ptr, dtype, q_shape),
                   contiguous_tensor(k_ptr, dtype, k_shape),
                   contiguous_tensor(v_ptr, dtype, k_shape),
                   contiguous_tensor(out_ptr, dtype, q_shape),
                   contiguous_tensor(lse_ptr, DTYPE_F32, (batch, heads_q, seqlen_q)),
                   contiguous_tensor(dq_ptr, dtype, q_shape),
                   contiguous_tensor(dk_ptr, dtype, k_shape),
                   contiguous_tensor(dv_ptr, dtype, k_shape))
        params = self._params(causal)
        refs = tuple(ctypes.byref(t) for t in tensors) + (None, ctypes.byref(params))
        return self._checked(self._lib.anyattn_bwd, refs, tensors + (params,))


def find_library(explicit_path=None):
    """`explicit_path` if given, else the first libanyattn.so in the usual build folders of this
    repository, else None."""
    if explicit_path:
        return explicit_path
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for build in ("build-bench", "build", "build-release"):
        for sub in ("src", "."):
            candidate = os.path.join(repo, build, sub, "libanyattn.so")
            if os.path.exists(candidate):
                return candidate
    return None
