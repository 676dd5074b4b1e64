// anyattn._core: the Python extension. A thin layer over the C ABI (include/anyattn/anyattn.h).
//
// Tensors cross this boundary in one of two forms, chosen by python/anyattn/_tensors.py:
//   - a "spec": a tuple (data_pointer, dtype_code, shape, strides) with strides in elements, used
//     for torch tensors. The Python caller owns the memory and keeps it alive during the call.
//   - any object exporting the buffer protocol with format 'f' (f32), 'e' (f16) or 'i' (i32),
//     used for numpy arrays; its byte strides must be whole elements. (8-bit caches come as
//     torch tensors, hence as specs.)
// Both are far cheaper than DLPack capsules (a torch __dlpack__ export costs about 2 us per
// tensor, numpy's ctypes.data about 1 us), which matters for small, latency-bound calls.
//
// Errors: every non-OK status becomes a Python exception carrying anyattn_last_error():
//   ANYATTN_E_INVALID_ARGUMENT -> ValueError, ANYATTN_E_UNSUPPORTED -> NotImplementedError,
//   ANYATTN_E_OUT_OF_MEMORY -> MemoryError, anything else -> RuntimeError.
// The GIL is released while the kernel runs (forward, backward, merge).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "anyattn/anyattn.h"
#include "code_table.h"
#include "host_openmp.h"
#include "torch_plain_call.h"

namespace nb = nanobind;

namespace {

// Raises the Python exception matching `status`, with the library's message.
[[noreturn]] void raise_status(anyattn_status status) {
  std::string msg = anyattn_last_error();
  if (msg.empty()) msg = anyattn_status_name(status);
  PyObject* type = PyExc_RuntimeError;
  switch (status) {
    case ANYATTN_E_INVALID_ARGUMENT: type = PyExc_ValueError; break;
    case ANYATTN_E_UNSUPPORTED: type = PyExc_NotImplementedError; break;
    case ANYATTN_E_OUT_OF_MEMORY: type = PyExc_MemoryError; break;
    default: break;
  }
  PyErr_SetString(type, msg.c_str());
  throw nb::python_error();
}

// Reads a tuple of at most ANYATTN_MAX_NDIM Python ints into `dst`; returns its length.
int32_t read_dims(nb::handle seq, int64_t* dst, const char* name, const char* what) {
  nb::tuple t = nb::cast<nb::tuple>(seq);
  size_t n = t.size();
  if (n > ANYATTN_MAX_NDIM) {
    throw nb::value_error((std::string(name) + ": " + what + " has " + std::to_string(n) +
                           " entries; at most " + std::to_string(ANYATTN_MAX_NDIM) +
                           " are supported")
                              .c_str());
  }
  for (size_t i = 0; i < n; ++i) dst[i] = nb::cast<int64_t>(t[i]);
  return static_cast<int32_t>(n);
}

// A Py_buffer released when it goes out of scope.
struct BufferView {
  Py_buffer view{};
  bool held = false;
  BufferView() = default;
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;
  ~BufferView() {
    if (held) PyBuffer_Release(&view);
  }
};

[[noreturn]] void buffer_error(const char* name, const std::string& what) {
  throw nb::value_error((std::string(name) + ": " + what).c_str());
}

// Describes a buffer-protocol object (a numpy array) as an anyattn_tensor; `buf` keeps it alive.
anyattn_tensor from_buffer(nb::handle obj, const char* name, bool writable, BufferView& buf) {
  int flags = PyBUF_RECORDS_RO | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), &buf.view, flags) != 0) throw nb::python_error();
  buf.held = true;
  const Py_buffer& v = buf.view;
  std::string fmt = v.format ? v.format : "B";
  if (!fmt.empty() && (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@')) fmt.erase(0, 1);
  anyattn_tensor out{};
  if (fmt == "f" && v.itemsize == 4) {
    out.dtype = ANYATTN_DTYPE_F32;
  } else if (fmt == "e" && v.itemsize == 2) {
    out.dtype = ANYATTN_DTYPE_F16;
  } else if (fmt == "i" && v.itemsize == 4) {
    out.dtype = ANYATTN_DTYPE_I32;
  } else {
    buffer_error(name, "buffer format '" + fmt + "' is not supported (float32 or float16)");
  }
  if (v.ndim < 1 || v.ndim > ANYATTN_MAX_NDIM) {
    buffer_error(name, "has " + std::to_string(v.ndim) + " dimensions; 1 to " +
                           std::to_string(ANYATTN_MAX_NDIM) + " are supported");
  }
  out.data = v.buf;
  out.ndim = v.ndim;
  for (int i = 0; i < v.ndim; ++i) {
    out.shape[i] = v.shape[i];
    if (v.strides[i] % v.itemsize != 0) {
      buffer_error(name, "byte stride " + std::to_string(v.strides[i]) +
                             " is not a whole number of elements");
    }
    out.strides[i] = v.strides[i] / v.itemsize;
  }
  // numpy reports arbitrary strides for size-1 dimensions; such a last dimension is contiguous.
  if (out.shape[v.ndim - 1] <= 1) out.strides[v.ndim - 1] = 1;
  return out;
}

// Converts a spec tuple (ptr, dtype, shape, strides) or a buffer-protocol object into an
// anyattn_tensor. `buf` holds the buffer, if one was taken, until the caller is done.
anyattn_tensor to_tensor(nb::handle spec, const char* name, BufferView& buf, bool writable = false) {
  if (!PyTuple_Check(spec.ptr())) return from_buffer(spec, name, writable, buf);
  nb::tuple t = nb::borrow<nb::tuple>(spec);
  if (t.size() != 4) {
    throw nb::value_error((std::string(name) + ": internal tensor spec must have 4 entries").c_str());
  }
  anyattn_tensor out{};
  out.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(t[0]));
  out.dtype = nb::cast<int32_t>(t[1]);
  out.ndim = read_dims(t[2], out.shape, name, "shape");
  int32_t nstrides = read_dims(t[3], out.strides, name, "strides");
  if (nstrides != out.ndim) {
    throw nb::value_error((std::string(name) + ": shape and strides differ in length").c_str());
  }
  return out;
}

// An optional tensor: nullptr for None, else `t` filled from the spec.
const anyattn_tensor* optional_tensor(nb::handle spec, const char* name, BufferView& buf,
                                      anyattn_tensor& t, bool writable = false) {
  if (spec.is_none()) return nullptr;
  t = to_tensor(spec, name, buf, writable);
  return &t;
}

// The score options of every attention call, as the one tuple anyattn._kernel_options.py builds:
//   (softmax_scale, softcap, causal, window_left, window_right, alibi_slopes, sinks, num_splits,
//    dropout_p, dropout_seed, dropout_offset)
// with alibi_slopes and sinks tensor specs or None. This is the one place where they become
// anyattn_fwd_params. Not copyable: the params point at the tensors held here.
class ScoreParams {
 public:
  explicit ScoreParams(nb::handle options) {
    const nb::tuple t = nb::borrow<nb::tuple>(options);
    if (t.size() != 12) {
      throw nb::value_error("options: expected the 12-tuple of anyattn._kernel_options");
    }
    anyattn_fwd_params_init(&params_);
    params_.softmax_scale = nb::cast<float>(t[0]);
    params_.softcap = nb::cast<float>(t[1]);
    params_.causal = nb::cast<bool>(t[2]) ? 1 : 0;
    params_.window_left = nb::cast<int32_t>(t[3]);
    params_.window_right = nb::cast<int32_t>(t[4]);
    params_.alibi_slopes = optional_tensor(t[5], "alibi_slopes", alibi_buf_, alibi_);
    params_.sinks = optional_tensor(t[6], "sinks", sinks_buf_, sinks_);
    params_.num_splits = nb::cast<int32_t>(t[7]);
    params_.dropout_p = nb::cast<float>(t[8]);
    params_.dropout_seed = nb::cast<uint64_t>(t[9]);
    params_.dropout_offset = nb::cast<uint64_t>(t[10]);
    params_.bwd_own_forward = nb::cast<bool>(t[11]) ? 1 : 0;
  }
  ScoreParams(const ScoreParams&) = delete;
  ScoreParams& operator=(const ScoreParams&) = delete;

  const anyattn_fwd_params* get() const { return &params_; }

 private:
  BufferView alibi_buf_, sinks_buf_;
  anyattn_tensor alibi_{}, sinks_{};
  anyattn_fwd_params params_;
};

// Dense forward. See anyattn_fwd in anyattn.h for shapes and semantics; `lse` may be None.
void fwd(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse,
         nb::handle options) {
  BufferView bq, bk, bv, bout, blse;
  const anyattn_tensor tq = to_tensor(q, "q", bq);
  const anyattn_tensor tk = to_tensor(k, "k", bk);
  const anyattn_tensor tv = to_tensor(v, "v", bv);
  const anyattn_tensor tout = to_tensor(out, "out", bout, /*writable=*/true);
  anyattn_tensor tlse{};
  const anyattn_tensor* plse = optional_tensor(lse, "lse", blse, tlse, /*writable=*/true);
  const ScoreParams params(options);
  anyattn_status status;
  {
    nb::gil_scoped_release release;
    status = anyattn_fwd(&tq, &tk, &tv, &tout, plse, params.get());
  }
  if (status != ANYATTN_OK) raise_status(status);
}

// Variable-length forward. See anyattn_fwd_varlen in anyattn.h; lse, seqused_k, alibi_slopes and
// sinks may be None.
void fwd_varlen(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse,
                nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, nb::handle seqused_k,
                int64_t max_seqlen_q, int64_t max_seqlen_k, nb::handle options) {
  BufferView bq, bk, bv, bout, blse, bcq, bck, bused;
  const anyattn_tensor tq = to_tensor(q, "q", bq);
  const anyattn_tensor tk = to_tensor(k, "k", bk);
  const anyattn_tensor tv = to_tensor(v, "v", bv);
  const anyattn_tensor tout = to_tensor(out, "out", bout, /*writable=*/true);
  const anyattn_tensor tcq = to_tensor(cu_seqlens_q, "cu_seqlens_q", bcq);
  const anyattn_tensor tck = to_tensor(cu_seqlens_k, "cu_seqlens_k", bck);
  anyattn_tensor tlse{}, tused{};
  const anyattn_tensor* plse = optional_tensor(lse, "lse", blse, tlse, /*writable=*/true);
  const anyattn_tensor* pused = optional_tensor(seqused_k, "seqused_k", bused, tused);
  const ScoreParams params(options);
  anyattn_status status;
  {
    nb::gil_scoped_release release;
    status = anyattn_fwd_varlen(&tq, &tk, &tv, &tout, plse, &tcq, &tck, pused, max_seqlen_q,
                                max_seqlen_k, params.get());
  }
  if (status != ANYATTN_OK) raise_status(status);
}

// The cache's read-side arguments (lengths, batch indices, left padding, block table) of
// anyattn_kvcache_params, with the buffers they view; each handle may be None.
struct CacheLayoutArgs {
  BufferView seqlens_buf, batch_idx_buf, leftpad_buf, block_table_buf;
  anyattn_tensor seqlens{}, batch_idx{}, leftpad{}, block_table{};

  void fill(nb::handle cache_seqlens, int64_t cache_seqlen, nb::handle cache_batch_idx,
            nb::handle cache_leftpad, nb::handle block_table_spec, anyattn_kvcache_params* c) {
    c->cache_seqlens = optional_tensor(cache_seqlens, "cache_seqlens", seqlens_buf, seqlens);
    c->cache_seqlen = cache_seqlen;
    c->cache_batch_idx =
        optional_tensor(cache_batch_idx, "cache_batch_idx", batch_idx_buf, batch_idx);
    c->cache_leftpad = optional_tensor(cache_leftpad, "cache_leftpad", leftpad_buf, leftpad);
    c->block_table = optional_tensor(block_table_spec, "block_table", block_table_buf, block_table);
  }
};

// The 8-bit cache scales of anyattn_kvcache_params, from the one tuple _cache.py builds:
//   (k_descale, v_descale, k_token_scale, v_token_scale), each a spec or None,
// or None for a cache without scales. The token scales are written when the call appends.
struct CacheScaleArgs {
  BufferView k_descale_buf, v_descale_buf, k_token_buf, v_token_buf;
  anyattn_tensor k_descale{}, v_descale{}, k_token{}, v_token{};

  void fill(nb::handle scales, bool appends, anyattn_kvcache_params* c) {
    if (scales.is_none()) return;
    const nb::tuple t = nb::borrow<nb::tuple>(scales);
    if (t.size() != 4) {
      throw nb::value_error("scales: expected (k_descale, v_descale, k_token_scale, "
                            "v_token_scale)");
    }
    c->k_descale = optional_tensor(t[0], "k_descale", k_descale_buf, k_descale);
    c->v_descale = optional_tensor(t[1], "v_descale", v_descale_buf, v_descale);
    c->k_token_scale = optional_tensor(t[2], "k_token_scale", k_token_buf, k_token, appends);
    c->v_token_scale = optional_tensor(t[3], "v_token_scale", v_token_buf, v_token, appends);
  }
};

// KV-cache forward with optional in-place append. See anyattn_fwd_kvcache in anyattn.h.
// k_cache / v_cache are written when k_new / v_new are given; every optional tensor may be None.
// cache_seqlen is used when cache_seqlens is None (-1 = the whole cache).
void fwd_kvcache(nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle out,
                 nb::handle lse, nb::handle k_new, nb::handle v_new, nb::handle cache_seqlens,
                 int64_t cache_seqlen, nb::handle cache_batch_idx, nb::handle cache_leftpad,
                 nb::handle block_table, nb::handle rotary_cos, nb::handle rotary_sin,
                 bool rotary_interleaved, nb::handle options, nb::handle scales) {
  BufferView bq, bkc, bvc, bout, blse, bkn, bvn, bcos, bsin;
  const anyattn_tensor tq = to_tensor(q, "q", bq);
  const bool appends = !k_new.is_none();
  const anyattn_tensor tkc = to_tensor(k_cache, "k_cache", bkc, appends);
  const anyattn_tensor tvc = to_tensor(v_cache, "v_cache", bvc, appends);
  const anyattn_tensor tout = to_tensor(out, "out", bout, /*writable=*/true);
  anyattn_tensor tlse{}, tkn{}, tvn{}, tcos{}, tsin{};
  const anyattn_tensor* plse = optional_tensor(lse, "lse", blse, tlse, /*writable=*/true);
  anyattn_kvcache_params cache;
  anyattn_kvcache_params_init(&cache);
  CacheLayoutArgs layout;
  layout.fill(cache_seqlens, cache_seqlen, cache_batch_idx, cache_leftpad, block_table, &cache);
  cache.k_new = optional_tensor(k_new, "k", bkn, tkn);
  cache.v_new = optional_tensor(v_new, "v", bvn, tvn);
  cache.rotary_cos = optional_tensor(rotary_cos, "rotary_cos", bcos, tcos);
  cache.rotary_sin = optional_tensor(rotary_sin, "rotary_sin", bsin, tsin);
  cache.rotary_interleaved = rotary_interleaved ? 1 : 0;
  CacheScaleArgs scale_args;
  scale_args.fill(scales, appends, &cache);
  const ScoreParams params(options);
  anyattn_status status;
  {
    nb::gil_scoped_release release;
    status = anyattn_fwd_kvcache(&tq, &tkc, &tvc, &tout, plse, &cache, params.get());
  }
  if (status != ANYATTN_OK) raise_status(status);
}

// Packed varlen queries against a KV cache, which is only read. See anyattn_fwd_kvcache_varlen
// in anyattn.h; lse and every cache argument but the caches may be None.
void fwd_kvcache_varlen(nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle out,
                        nb::handle lse, nb::handle cu_seqlens_q, int64_t max_seqlen_q,
                        nb::handle cache_seqlens, int64_t cache_seqlen, nb::handle cache_batch_idx,
                        nb::handle cache_leftpad, nb::handle block_table, nb::handle options,
                        nb::handle scales) {
  BufferView bq, bkc, bvc, bout, blse, bcq;
  const anyattn_tensor tq = to_tensor(q, "q", bq);
  const anyattn_tensor tkc = to_tensor(k_cache, "k_cache", bkc);
  const anyattn_tensor tvc = to_tensor(v_cache, "v_cache", bvc);
  const anyattn_tensor tout = to_tensor(out, "out", bout, /*writable=*/true);
  const anyattn_tensor tcq = to_tensor(cu_seqlens_q, "cu_seqlens_q", bcq);
  anyattn_tensor tlse{};
  const anyattn_tensor* plse = optional_tensor(lse, "lse", blse, tlse, /*writable=*/true);
  anyattn_kvcache_params cache;
  anyattn_kvcache_params_init(&cache);
  CacheLayoutArgs layout;
  layout.fill(cache_seqlens, cache_seqlen, cache_batch_idx, cache_leftpad, block_table, &cache);
  CacheScaleArgs scale_args;
  scale_args.fill(scales, /*appends=*/false, &cache);
  const ScoreParams params(options);
  anyattn_status status;
  {
    nb::gil_scoped_release release;
    status = anyattn_fwd_kvcache_varlen(&tq, &tkc, &tvc, &tout, plse, &tcq, max_seqlen_q, &cache,
                                        params.get());
  }
  if (status != ANYATTN_OK) raise_status(status);
}

// Merge of two partial attentions. See anyattn_merge_attention_states in anyattn.h; out may be
// out_a or out_b (and lse_out lse_a or lse_b, or None).
void merge_attention_states(nb::handle out_a, nb::handle lse_a, nb::handle out_b,
                            nb::handle lse_b, nb::handle out, nb::handle lse_out) {
  BufferView ba, bla, bb, blb, bo, blo;
  const anyattn_tensor ta = to_tensor(out_a, "out_a", ba);
  const anyattn_tensor tla = to_tensor(lse_a, "lse_a", bla);
  const anyattn_tensor tb = to_tensor(out_b, "out_b", bb);
  const anyattn_tensor tlb = to_tensor(lse_b, "lse_b", blb);
  const anyattn_tensor to = to_tensor(out, "out", bo, /*writable=*/true);
  anyattn_tensor tlo{};
  const anyattn_tensor* plo = optional_tensor(lse_out, "lse_out", blo, tlo, /*writable=*/true);
  anyattn_status status;
  {
    nb::gil_scoped_release release;
    status = anyattn_merge_attention_states(&ta, &tla, &tb, &tlb, &to, plo);
  }
  if (status != ANYATTN_OK) raise_status(status);
}

// Dense backward. See anyattn_bwd in anyattn.h: dq, dk, dv (and dsinks, f32 (Hq), when `sinks`
// is given; else None) are written. The score options, dropout seed and offset must be the
// forward's.
void bwd(nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse,
         nb::handle dq, nb::handle dk, nb::handle dv, nb::handle dsinks, nb::handle options) {
  BufferView bdo, bq, bk, bv, bout, blse, bdq, bdk, bdv, bds;
  const anyattn_tensor tdo = to_tensor(dout, "dout", bdo);
  const anyattn_tensor tq = to_tensor(q, "q", bq);
  const anyattn_tensor tk = to_tensor(k, "k", bk);
  const anyattn_tensor tv = to_tensor(v, "v", bv);
  const anyattn_tensor tout = to_tensor(out, "out", bout);
  const anyattn_tensor tlse = to_tensor(lse, "lse", blse);
  const anyattn_tensor tdq = to_tensor(dq, "dq", bdq, /*writable=*/true);
  const anyattn_tensor tdk = to_tensor(dk, "dk", bdk, /*writable=*/true);
  const anyattn_tensor tdv = to_tensor(dv, "dv", bdv, /*writable=*/true);
  anyattn_tensor tds{};
  const anyattn_tensor* pds = optional_tensor(dsinks, "dsinks", bds, tds, /*writable=*/true);
  const ScoreParams params(options);
  anyattn_status status;
  {
    nb::gil_scoped_release release;
    status = anyattn_bwd(&tdo, &tq, &tk, &tv, &tout, &tlse, &tdq, &tdk, &tdv, pds, params.get());
  }
  if (status != ANYATTN_OK) raise_status(status);
}

// Variable-length backward. See anyattn_bwd_varlen in anyattn.h; dq, dk, dv (and dsinks when
// `sinks` is given, else None) are written for the rows of every sequence. The lengths, score
// options, dropout seed and offset must be the forward's.
void bwd_varlen(nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out,
                nb::handle lse, nb::handle dq, nb::handle dk, nb::handle dv, nb::handle dsinks,
                nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, nb::handle seqused_k,
                int64_t max_seqlen_q, int64_t max_seqlen_k, nb::handle options) {
  BufferView bdo, bq, bk, bv, bout, blse, bdq, bdk, bdv, bds, bcq, bck, bused;
  const anyattn_tensor tdo = to_tensor(dout, "dout", bdo);
  const anyattn_tensor tq = to_tensor(q, "q", bq);
  const anyattn_tensor tk = to_tensor(k, "k", bk);
  const anyattn_tensor tv = to_tensor(v, "v", bv);
  const anyattn_tensor tout = to_tensor(out, "out", bout);
  const anyattn_tensor tlse = to_tensor(lse, "lse", blse);
  const anyattn_tensor tdq = to_tensor(dq, "dq", bdq, /*writable=*/true);
  const anyattn_tensor tdk = to_tensor(dk, "dk", bdk, /*writable=*/true);
  const anyattn_tensor tdv = to_tensor(dv, "dv", bdv, /*writable=*/true);
  const anyattn_tensor tcq = to_tensor(cu_seqlens_q, "cu_seqlens_q", bcq);
  const anyattn_tensor tck = to_tensor(cu_seqlens_k, "cu_seqlens_k", bck);
  anyattn_tensor tds{}, tused{};
  const anyattn_tensor* pds = optional_tensor(dsinks, "dsinks", bds, tds, /*writable=*/true);
  const anyattn_tensor* pused = optional_tensor(seqused_k, "seqused_k", bused, tused);
  const ScoreParams params(options);
  anyattn_status status;
  {
    nb::gil_scoped_release release;
    status = anyattn_bwd_varlen(&tdo, &tq, &tk, &tv, &tout, &tlse, &tdq, &tdk, &tdv, pds, &tcq,
                                &tck, pused, max_seqlen_q, max_seqlen_k, params.get());
  }
  if (status != ANYATTN_OK) raise_status(status);
}

// The path named `name`, among every name the library gives (anyattn_isa_name answers "unknown"
// past the last value).
anyattn_isa isa_from_name(const std::string& name) {
  std::string known;
  for (int32_t value = ANYATTN_ISA_AUTO;; ++value) {
    const char* path = anyattn_isa_name(static_cast<anyattn_isa>(value));
    if (std::strcmp(path, "unknown") == 0) break;
    if (name == path) return static_cast<anyattn_isa>(value);
    known += (known.empty() ? "" : ", ") + std::string(path);
  }
  throw nb::value_error(("isa: unknown name '" + name + "'; expected one of " + known).c_str());
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "Low-level binding of the anyattn C ABI. Use the anyattn package, not this module.";

  m.attr("DTYPE_F32") = static_cast<int>(ANYATTN_DTYPE_F32);
  m.attr("DTYPE_F16") = static_cast<int>(ANYATTN_DTYPE_F16);
  m.attr("DTYPE_BF16") = static_cast<int>(ANYATTN_DTYPE_BF16);
  m.attr("DTYPE_I32") = static_cast<int>(ANYATTN_DTYPE_I32);
  m.attr("DTYPE_FP8_E4M3") = static_cast<int>(ANYATTN_DTYPE_FP8_E4M3);
  m.attr("DTYPE_FP8_E5M2") = static_cast<int>(ANYATTN_DTYPE_FP8_E5M2);
  m.attr("DTYPE_I8") = static_cast<int>(ANYATTN_DTYPE_I8);
  m.attr("MAX_NDIM") = static_cast<int>(ANYATTN_MAX_NDIM);
  m.attr("MAX_HEAD_DIM") = static_cast<int>(ANYATTN_MAX_HEAD_DIM);
  m.attr("MAX_HEAD_DIM_V") = static_cast<int>(ANYATTN_MAX_HEAD_DIM_V);

  m.def("version", &anyattn_version, "The loaded library's version, major*10000+minor*100+patch.");
  m.def("version_string", []() { return std::string(anyattn_version_string()); },
        "The loaded library's version as 'major.minor.patch'.");
  m.def("set_num_threads", &anyattn_set_num_threads, nb::arg("n"),
        "Threads used by later calls, process-wide; n <= 0 restores the default.");
  m.def("get_num_threads", &anyattn_get_num_threads, "Threads later calls will use.");
  m.def("isa_default", []() { return std::string(anyattn_isa_name(anyattn_isa_default())); },
        "Name of the instruction-set path chosen automatically on this CPU.");
  m.def("isa_supported",
        [](const std::string& name) { return anyattn_isa_supported(isa_from_name(name)) != 0; },
        nb::arg("name"), "True if this build and CPU can run the named ISA path.");
  m.def("isa_code", [](const std::string& name) { return static_cast<int>(isa_from_name(name)); },
        nb::arg("name"), "The anyattn_isa value of an ISA name.");
  m.def("fwd", &fwd, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(),
        nb::arg("options"),
        "Dense forward attention over tensor specs or buffer-protocol arrays. Releases the GIL.");
  m.def("fwd_varlen", &fwd_varlen, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"),
        nb::arg("seqused_k").none(), nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"),
        nb::arg("options"),
        "Variable-length forward attention (anyattn_fwd_varlen). Releases the GIL.");
  m.def("fwd_kvcache", &fwd_kvcache, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"),
        nb::arg("out"), nb::arg("lse").none(), nb::arg("k_new").none(), nb::arg("v_new").none(),
        nb::arg("cache_seqlens").none(), nb::arg("cache_seqlen"),
        nb::arg("cache_batch_idx").none(), nb::arg("cache_leftpad").none(),
        nb::arg("block_table").none(), nb::arg("rotary_cos").none(), nb::arg("rotary_sin").none(),
        nb::arg("rotary_interleaved"), nb::arg("options"), nb::arg("scales").none() = nb::none(),
        "KV-cache forward attention with in-place append (anyattn_fwd_kvcache); `scales` is None "
        "or (k_descale, v_descale, k_token_scale, v_token_scale) for an 8-bit cache. Releases the "
        "GIL.");
  m.def("fwd_kvcache_varlen", &fwd_kvcache_varlen, nb::arg("q"), nb::arg("k_cache"),
        nb::arg("v_cache"), nb::arg("out"), nb::arg("lse").none(), nb::arg("cu_seqlens_q"),
        nb::arg("max_seqlen_q"), nb::arg("cache_seqlens").none(), nb::arg("cache_seqlen"),
        nb::arg("cache_batch_idx").none(), nb::arg("cache_leftpad").none(),
        nb::arg("block_table").none(), nb::arg("options"), nb::arg("scales").none() = nb::none(),
        "Packed varlen queries against a KV cache (anyattn_fwd_kvcache_varlen); `scales` as in "
        "fwd_kvcache. Releases the GIL.");
  m.def("merge_attention_states", &merge_attention_states, nb::arg("out_a"), nb::arg("lse_a"),
        nb::arg("out_b"), nb::arg("lse_b"), nb::arg("out"), nb::arg("lse_out").none(),
        "Merges two partial attentions (anyattn_merge_attention_states). Releases the GIL.");
  m.def("bwd", &bwd, nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("dsinks").none(),
        nb::arg("options"),
        "Dense backward attention (anyattn_bwd): writes dq, dk, dv (and dsinks). Releases the GIL.");
  m.def("bwd_varlen", &bwd_varlen, nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("out"), nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"),
        nb::arg("dsinks").none(), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"),
        nb::arg("seqused_k").none(), nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"),
        nb::arg("options"),
        "Variable-length backward (anyattn_bwd_varlen): writes dq, dk, dv (and dsinks). Releases "
        "the GIL.");
  register_torch_plain_call(m);
  register_host_openmp(m);
  register_code_table(m);
}
