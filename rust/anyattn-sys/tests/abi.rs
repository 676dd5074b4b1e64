//! Keeps the hand-written declarations of `src/lib.rs` in sync with `include/anyattn/anyattn.h`.
//!
//! The layouts and constants come from `abi_check.c`, which build.rs compiles against the header.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::mem::{align_of, offset_of, size_of};
use std::os::raw::{c_char, c_int};

use anyattn_sys::*;

extern "C" {
    fn anyattn_sys_abi_field_count() -> usize;
    fn anyattn_sys_abi_field(i: usize, offset: *mut usize, size: *mut usize) -> *const c_char;
    fn anyattn_sys_abi_sizeof_tensor() -> usize;
    fn anyattn_sys_abi_alignof_tensor() -> usize;
    fn anyattn_sys_abi_sizeof_fwd_params() -> usize;
    fn anyattn_sys_abi_alignof_fwd_params() -> usize;
    fn anyattn_sys_abi_sizeof_kernel_info() -> usize;
    fn anyattn_sys_abi_sizeof_kvcache_params() -> usize;
    fn anyattn_sys_abi_sizeof_enum() -> usize;
    fn anyattn_sys_abi_constant_count() -> usize;
    fn anyattn_sys_abi_constant(i: usize, value: *mut i64) -> *const c_char;
}

/// Offset and size of every field as the Rust declarations lay them out, by "struct.field".
fn rust_fields() -> BTreeMap<&'static str, (usize, usize)> {
    macro_rules! field {
        ($map:ident, $ty:ident, $field:ident, $fty:ty) => {
            $map.insert(
                concat!(stringify!($ty), ".", stringify!($field)),
                (offset_of!($ty, $field), size_of::<$fty>()),
            );
        };
    }
    let mut m = BTreeMap::new();
    field!(m, anyattn_tensor, data, *mut std::ffi::c_void);
    field!(m, anyattn_tensor, dtype, i32);
    field!(m, anyattn_tensor, ndim, i32);
    field!(m, anyattn_tensor, shape, [i64; ANYATTN_MAX_NDIM]);
    field!(m, anyattn_tensor, strides, [i64; ANYATTN_MAX_NDIM]);
    field!(m, anyattn_fwd_params, struct_size, usize);
    field!(m, anyattn_fwd_params, softmax_scale, f32);
    field!(m, anyattn_fwd_params, softcap, f32);
    field!(m, anyattn_fwd_params, causal, i32);
    field!(m, anyattn_fwd_params, window_left, i32);
    field!(m, anyattn_fwd_params, window_right, i32);
    field!(m, anyattn_fwd_params, alibi_slopes, *const anyattn_tensor);
    field!(m, anyattn_fwd_params, sinks, *const anyattn_tensor);
    field!(m, anyattn_fwd_params, dropout_p, f32);
    field!(m, anyattn_fwd_params, dropout_seed, u64);
    field!(m, anyattn_fwd_params, dropout_offset, u64);
    field!(m, anyattn_fwd_params, num_splits, i32);
    field!(m, anyattn_fwd_params, isa, i32);
    field!(m, anyattn_fwd_params, bwd_own_forward, i32);
    field!(m, anyattn_fwd_params, precision, i32);
    field!(m, anyattn_kernel_info, name, *const c_char);
    field!(m, anyattn_kernel_info, isa, i32);
    field!(m, anyattn_kernel_info, supported, i32);
    field!(m, anyattn_kernel_info, vector_lanes, i32);
    field!(m, anyattn_kernel_info, tile_rows, i32);
    field!(m, anyattn_kernel_info, tile_keys, i32);
    field!(m, anyattn_kvcache_params, struct_size, usize);
    field!(m, anyattn_kvcache_params, k_new, *const anyattn_tensor);
    field!(m, anyattn_kvcache_params, v_new, *const anyattn_tensor);
    field!(
        m,
        anyattn_kvcache_params,
        cache_seqlens,
        *const anyattn_tensor
    );
    field!(m, anyattn_kvcache_params, cache_seqlen, i64);
    field!(
        m,
        anyattn_kvcache_params,
        cache_batch_idx,
        *const anyattn_tensor
    );
    field!(
        m,
        anyattn_kvcache_params,
        cache_leftpad,
        *const anyattn_tensor
    );
    field!(
        m,
        anyattn_kvcache_params,
        block_table,
        *const anyattn_tensor
    );
    field!(m, anyattn_kvcache_params, rotary_cos, *const anyattn_tensor);
    field!(m, anyattn_kvcache_params, rotary_sin, *const anyattn_tensor);
    field!(m, anyattn_kvcache_params, rotary_interleaved, i32);
    field!(m, anyattn_kvcache_params, k_descale, *const anyattn_tensor);
    field!(m, anyattn_kvcache_params, v_descale, *const anyattn_tensor);
    field!(m, anyattn_kvcache_params, k_token_scale, *const anyattn_tensor);
    field!(m, anyattn_kvcache_params, v_token_scale, *const anyattn_tensor);
    m
}

#[test]
fn struct_layouts_match_the_header() {
    let rust = rust_fields();
    let mut seen = 0;
    for i in 0..unsafe { anyattn_sys_abi_field_count() } {
        let (mut offset, mut size) = (0usize, 0usize);
        let name = unsafe { CStr::from_ptr(anyattn_sys_abi_field(i, &mut offset, &mut size)) };
        let name = name.to_str().unwrap();
        let Some(&(rust_offset, rust_size)) = rust.get(name) else {
            panic!("field {name} of anyattn.h is not declared in anyattn-sys");
        };
        assert_eq!(
            (rust_offset, rust_size),
            (offset, size),
            "field {name}: Rust (offset, size) differs from C"
        );
        seen += 1;
    }
    assert_eq!(
        seen,
        rust.len(),
        "abi_check.c and the Rust field list differ"
    );
    unsafe {
        assert_eq!(size_of::<anyattn_tensor>(), anyattn_sys_abi_sizeof_tensor());
        assert_eq!(
            align_of::<anyattn_tensor>(),
            anyattn_sys_abi_alignof_tensor()
        );
        assert_eq!(
            size_of::<anyattn_fwd_params>(),
            anyattn_sys_abi_sizeof_fwd_params()
        );
        assert_eq!(
            align_of::<anyattn_fwd_params>(),
            anyattn_sys_abi_alignof_fwd_params()
        );
        assert_eq!(
            size_of::<anyattn_kernel_info>(),
            anyattn_sys_abi_sizeof_kernel_info()
        );
        assert_eq!(
            size_of::<anyattn_kvcache_params>(),
            anyattn_sys_abi_sizeof_kvcache_params()
        );
        assert_eq!(size_of::<c_int>(), anyattn_sys_abi_sizeof_enum());
    }
}

#[test]
fn constants_match_the_header() {
    let rust: BTreeMap<&str, i64> = DECLARED_CONSTANTS.iter().copied().collect();
    let count = unsafe { anyattn_sys_abi_constant_count() };
    assert_eq!(
        count,
        rust.len(),
        "abi_check.c and DECLARED_CONSTANTS differ"
    );
    for i in 0..count {
        let mut value = 0i64;
        let name = unsafe { CStr::from_ptr(anyattn_sys_abi_constant(i, &mut value)) };
        let name = name.to_str().unwrap();
        assert_eq!(
            rust.get(name).copied(),
            Some(value),
            "constant {name} differs between anyattn.h and anyattn-sys"
        );
    }
}

/// Every `anyattn_*` function the header exports (the name before the first `(` of each
/// `ANYATTN_API` declaration).
fn header_functions() -> Vec<String> {
    let header = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../include/anyattn/anyattn.h"
    );
    let text = std::fs::read_to_string(header).expect("read anyattn.h");
    let mut names = Vec::new();
    let mut rest = text.as_str();
    while let Some(pos) = rest.find("ANYATTN_API ") {
        rest = &rest[pos + "ANYATTN_API ".len()..];
        let decl = &rest[..rest.find('(').expect("declaration without '('")];
        let name = decl
            .rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .next()
            .unwrap();
        if name.starts_with("anyattn_") {
            names.push(name.to_string());
        }
    }
    names
}

#[test]
fn every_header_function_is_declared() {
    let header = header_functions();
    assert!(
        header.len() >= 10,
        "parsed too few functions from anyattn.h: {header:?}"
    );
    let declared: Vec<String> = DECLARED_FUNCTIONS.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        header, declared,
        "anyattn.h exports functions that anyattn-sys does not declare (or the reverse)"
    );
}

#[test]
fn linked_library_matches_the_header_version() {
    let version = unsafe { anyattn_version() };
    assert_eq!(version, ANYATTN_VERSION);
    let s = unsafe { CStr::from_ptr(anyattn_version_string()) };
    assert_eq!(
        s.to_str().unwrap(),
        format!("{ANYATTN_VERSION_MAJOR}.{ANYATTN_VERSION_MINOR}.{ANYATTN_VERSION_PATCH}")
    );
}

#[test]
fn params_init_sets_struct_size_and_defaults() {
    let mut p = std::mem::MaybeUninit::<anyattn_fwd_params>::zeroed();
    let p = unsafe {
        anyattn_fwd_params_init(p.as_mut_ptr());
        p.assume_init()
    };
    assert_eq!(p.struct_size, size_of::<anyattn_fwd_params>());
    assert_eq!(p.softmax_scale, 0.0);
    assert_eq!(p.softcap, 0.0);
    assert_eq!(p.causal, 0);
    assert_eq!((p.window_left, p.window_right), (-1, -1));
    assert!(p.alibi_slopes.is_null() && p.sinks.is_null());
    assert_eq!(p.dropout_p, 0.0);
    assert_eq!(p.num_splits, 0);
    assert_eq!(p.isa, ANYATTN_ISA_AUTO);
    assert_eq!(p.bwd_own_forward, 0);
    assert_eq!(p.precision, ANYATTN_PRECISION_DEFAULT);
}

#[test]
fn raw_forward_call_and_error_message() {
    // One query, two keys, D = 1: out = softmax(s) . v with s = [q*k0, q*k1] (scale 1).
    let q = [1.0f32];
    let k = [0.0f32, 2.0f32];
    let v = [3.0f32, 5.0f32];
    let mut out = [0.0f32];
    let mut lse = [0.0f32];
    let shape_q = [1i64, 1, 1, 1];
    let shape_k = [1i64, 2, 1, 1];
    let shape_lse = [1i64, 1, 1];
    unsafe {
        let mut tq = std::mem::zeroed::<anyattn_tensor>();
        let mut tk = tq;
        let mut tv = tq;
        let mut to = tq;
        let mut tl = tq;
        let ok = ANYATTN_OK;
        let p = |x: &[f32]| x.as_ptr() as *mut std::ffi::c_void;
        assert_eq!(
            anyattn_tensor_init_contiguous(&mut tq, p(&q), ANYATTN_DTYPE_F32, 4, shape_q.as_ptr()),
            ok
        );
        assert_eq!(
            anyattn_tensor_init_contiguous(&mut tk, p(&k), ANYATTN_DTYPE_F32, 4, shape_k.as_ptr()),
            ok
        );
        assert_eq!(
            anyattn_tensor_init_contiguous(&mut tv, p(&v), ANYATTN_DTYPE_F32, 4, shape_k.as_ptr()),
            ok
        );
        assert_eq!(
            anyattn_tensor_init_contiguous(
                &mut to,
                out.as_mut_ptr().cast(),
                ANYATTN_DTYPE_F32,
                4,
                shape_q.as_ptr()
            ),
            ok
        );
        assert_eq!(
            anyattn_tensor_init_contiguous(
                &mut tl,
                lse.as_mut_ptr().cast(),
                ANYATTN_DTYPE_F32,
                3,
                shape_lse.as_ptr()
            ),
            ok
        );
        let mut params = std::mem::zeroed::<anyattn_fwd_params>();
        anyattn_fwd_params_init(&mut params);
        params.softmax_scale = 1.0;
        assert_eq!(anyattn_fwd(&tq, &tk, &tv, &to, &tl, &params), ok);
        let e2 = 2.0f64.exp();
        let expected = (3.0 + 5.0 * e2) / (1.0 + e2);
        assert!(
            (out[0] as f64 - expected).abs() < 1e-5,
            "out {} expected {expected}",
            out[0]
        );
        assert!(
            (lse[0] as f64 - (1.0 + e2).ln()).abs() < 1e-5,
            "lse {}",
            lse[0]
        );
        assert_eq!(CStr::from_ptr(anyattn_last_error()).to_bytes(), b"");

        // Mismatched head dimension of k: an error that names the parameter. The buffer is big
        // enough for the shape given, so nothing is read out of bounds even if it were accepted.
        let k2 = [0.0f32; 4];
        let shape_k2 = [1i64, 2, 1, 2];
        assert_eq!(
            anyattn_tensor_init_contiguous(
                &mut tk,
                p(&k2),
                ANYATTN_DTYPE_F32,
                4,
                shape_k2.as_ptr()
            ),
            ok
        );
        let status = anyattn_fwd(&tq, &tk, &tv, &to, &tl, &params);
        assert_eq!(status, ANYATTN_E_INVALID_ARGUMENT);
        let msg = CStr::from_ptr(anyattn_last_error()).to_str().unwrap();
        assert!(msg.contains('k'), "message does not name k: {msg:?}");
        let name = CStr::from_ptr(anyattn_status_name(status))
            .to_str()
            .unwrap();
        assert_eq!(name, "ANYATTN_E_INVALID_ARGUMENT");
    }
}
