//! Strided views over slices: the safe counterpart of `anyattn_tensor`.

use std::os::raw::c_void;

use anyattn_sys as sys;

use crate::error::{Error, Result};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
    impl Sealed for crate::fp8::F8E4M3 {}
    impl Sealed for crate::fp8::F8E5M2 {}
    impl Sealed for i8 {}
}

/// The element types of anyattn's tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// IEEE binary32 (`f32`).
    F32,
    /// IEEE binary16 (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`).
    BF16,
    /// float8 e4m3 ([`F8E4M3`](crate::F8E4M3)): quantized KV caches only.
    FP8E4M3,
    /// float8 e5m2 ([`F8E5M2`](crate::F8E5M2)): quantized KV caches only.
    FP8E5M2,
    /// int8 (`i8`): quantized KV caches only.
    I8,
}

impl DType {
    fn raw(self) -> sys::anyattn_dtype {
        match self {
            DType::F32 => sys::ANYATTN_DTYPE_F32,
            DType::F16 => sys::ANYATTN_DTYPE_F16,
            DType::BF16 => sys::ANYATTN_DTYPE_BF16,
            DType::FP8E4M3 => sys::ANYATTN_DTYPE_FP8_E4M3,
            DType::FP8E5M2 => sys::ANYATTN_DTYPE_FP8_E5M2,
            DType::I8 => sys::ANYATTN_DTYPE_I8,
        }
    }
}

/// A Rust type a [`View`] can hold: the compute types ([`Element`]) and the quantized KV-cache
/// types ([`Quantized`]). Sealed: no other type can implement it.
pub trait Storage: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The anyattn dtype of this type.
    const DTYPE: DType;
}

/// A type anyattn computes with: `f32`, `half::f16` or `half::bf16` (q, k, v, out, new keys).
pub trait Element: Storage {}

/// An 8-bit KV-cache element: [`F8E4M3`](crate::F8E4M3), [`F8E5M2`](crate::F8E5M2) or `i8`,
/// read as `stored * descale * token_scale` (see [`QuantizedKvCache`](crate::QuantizedKvCache)).
pub trait Quantized: Storage {
    /// The largest magnitude the library's append stores (int8: the symmetric 127).
    const QMAX: f32;
    /// `x` rounded to nearest (ties to even) and saturated, as the library's append stores it.
    fn quantize(x: f32) -> Self;
    /// The stored value.
    fn to_f32(self) -> f32;
}

impl Storage for f32 {
    const DTYPE: DType = DType::F32;
}
impl Storage for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl Storage for half::bf16 {
    const DTYPE: DType = DType::BF16;
}
impl Storage for crate::fp8::F8E4M3 {
    const DTYPE: DType = DType::FP8E4M3;
}
impl Storage for crate::fp8::F8E5M2 {
    const DTYPE: DType = DType::FP8E5M2;
}
impl Storage for i8 {
    const DTYPE: DType = DType::I8;
}
impl Element for f32 {}
impl Element for half::f16 {}
impl Element for half::bf16 {}

impl Quantized for crate::fp8::F8E4M3 {
    const QMAX: f32 = crate::fp8::F8E4M3::MAX;
    fn quantize(x: f32) -> Self {
        crate::fp8::F8E4M3::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        crate::fp8::F8E4M3::to_f32(self)
    }
}
impl Quantized for crate::fp8::F8E5M2 {
    const QMAX: f32 = crate::fp8::F8E5M2::MAX;
    fn quantize(x: f32) -> Self {
        crate::fp8::F8E5M2::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        crate::fp8::F8E5M2::to_f32(self)
    }
}
impl Quantized for i8 {
    const QMAX: f32 = 127.0;
    fn quantize(x: f32) -> Self {
        crate::fp8::i8_from_f32(x)
    }
    fn to_f32(self) -> f32 {
        f32::from(self)
    }
}

/// The largest rank a view can have (`ANYATTN_MAX_NDIM`).
pub const MAX_NDIM: usize = sys::ANYATTN_MAX_NDIM;

/// Checks a shape and strides against a slice of `len` elements: the rank is 1 to `MAX_NDIM`, and
/// every element the view can address lies inside the slice. Returns the rank.
fn check_fits(shape: &[usize], strides: &[usize], len: usize) -> Result<usize> {
    if shape.is_empty() || shape.len() > MAX_NDIM {
        return Err(Error::invalid(format!(
            "strided view: rank {} given, supported 1 to {MAX_NDIM}",
            shape.len()
        )));
    }
    if strides.len() != shape.len() {
        return Err(Error::invalid(format!(
            "strided view: {} strides given for a shape of rank {}",
            strides.len(),
            shape.len()
        )));
    }
    for &extent in shape {
        if i64::try_from(extent).is_err() {
            return Err(Error::invalid(format!(
                "strided view: extent {extent} does not fit in int64"
            )));
        }
    }
    for &stride in strides {
        if i64::try_from(stride).is_err() {
            return Err(Error::invalid(format!(
                "strided view: stride {stride} does not fit in int64"
            )));
        }
    }
    if shape.contains(&0) {
        return Ok(shape.len());
    }
    let mut last = 0usize;
    for (&extent, &stride) in shape.iter().zip(strides) {
        last = (extent - 1)
            .checked_mul(stride)
            .and_then(|x| x.checked_add(last))
            .ok_or_else(|| {
                Error::invalid(format!(
                    "strided view: shape {shape:?} with strides {strides:?} overflows usize"
                ))
            })?;
    }
    if last >= len {
        return Err(Error::invalid(format!(
            "strided view: shape {shape:?} with strides {strides:?} reaches element {last}, but \
             the slice holds {len} elements"
        )));
    }
    Ok(shape.len())
}

/// Checks that no two indices of a writable view address the same element, so concurrent writes
/// by the library's threads never race. Dimensions of extent 1 are ignored.
fn check_no_self_overlap(shape: &[usize], strides: &[usize]) -> Result<()> {
    if shape.contains(&0) {
        return Ok(());
    }
    let mut dims: Vec<(usize, usize)> = shape
        .iter()
        .zip(strides)
        .filter(|(&extent, _)| extent > 1)
        .map(|(&extent, &stride)| (stride, extent))
        .collect();
    dims.sort_unstable();
    let mut reach = 0usize;
    for (stride, extent) in dims {
        if stride <= reach {
            return Err(Error::invalid(format!(
                "strided view: writable view with shape {shape:?} and strides {strides:?} \
                 addresses some elements twice"
            )));
        }
        reach += (extent - 1) * stride;
    }
    Ok(())
}

/// C-contiguous (row-major) strides of a shape.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0usize; shape.len()];
    let mut acc = 1usize;
    for (s, &extent) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(extent);
    }
    strides
}

fn describe(
    ptr: *mut c_void,
    dtype: sys::anyattn_dtype,
    ndim: usize,
    shape: &[usize],
    strides: &[usize],
) -> sys::anyattn_tensor {
    let mut t = sys::anyattn_tensor {
        data: ptr,
        dtype,
        ndim: ndim as i32,
        shape: [0; MAX_NDIM],
        strides: [0; MAX_NDIM],
    };
    for i in 0..ndim {
        // check_fits guarantees both fit in i64.
        t.shape[i] = shape[i] as i64;
        t.strides[i] = strides[i] as i64;
    }
    t
}

/// A read-only strided view of a slice: shape and strides in elements, element (0, ..., 0) at
/// `data[0]`.
///
/// Construction checks that every addressable element lies inside the slice, so the library never
/// reads outside it. Strides are non-negative; the last dimension must have stride 1 for anyattn
/// to accept the view (the library checks that and says so).
#[derive(Debug, Clone, Copy)]
pub struct View<'a, T: Storage> {
    data: &'a [T],
    ndim: usize,
    shape: [usize; MAX_NDIM],
    strides: [usize; MAX_NDIM],
}

impl<'a, T: Storage> View<'a, T> {
    /// A view with the given shape and element strides over `data`.
    pub fn new(data: &'a [T], shape: &[usize], strides: &[usize]) -> Result<Self> {
        let ndim = check_fits(shape, strides, data.len())?;
        let mut s = [0usize; MAX_NDIM];
        let mut st = [0usize; MAX_NDIM];
        s[..ndim].copy_from_slice(shape);
        st[..ndim].copy_from_slice(strides);
        Ok(View {
            data,
            ndim,
            shape: s,
            strides: st,
        })
    }

    /// A C-contiguous view of the given shape over `data` (which may be longer).
    pub fn contiguous(data: &'a [T], shape: &[usize]) -> Result<Self> {
        View::new(data, shape, &contiguous_strides(shape))
    }

    /// The extent of each dimension.
    pub fn shape(&self) -> &[usize] {
        &self.shape[..self.ndim]
    }

    /// The stride of each dimension, in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides[..self.ndim]
    }

    /// The slice the view starts at.
    pub fn data(&self) -> &'a [T] {
        self.data
    }

    pub(crate) fn raw(&self) -> sys::anyattn_tensor {
        describe(
            self.data.as_ptr() as *mut c_void,
            T::DTYPE.raw(),
            self.ndim,
            self.shape(),
            self.strides(),
        )
    }
}

/// A writable strided view of a slice. Like [`View`], and in addition no two indices may address
/// the same element.
#[derive(Debug)]
pub struct ViewMut<'a, T: Storage> {
    data: &'a mut [T],
    ndim: usize,
    shape: [usize; MAX_NDIM],
    strides: [usize; MAX_NDIM],
}

impl<'a, T: Storage> ViewMut<'a, T> {
    /// A writable view with the given shape and element strides over `data`.
    pub fn new(data: &'a mut [T], shape: &[usize], strides: &[usize]) -> Result<Self> {
        let ndim = check_fits(shape, strides, data.len())?;
        check_no_self_overlap(shape, strides)?;
        let mut s = [0usize; MAX_NDIM];
        let mut st = [0usize; MAX_NDIM];
        s[..ndim].copy_from_slice(shape);
        st[..ndim].copy_from_slice(strides);
        Ok(ViewMut {
            data,
            ndim,
            shape: s,
            strides: st,
        })
    }

    /// A C-contiguous writable view of the given shape over `data` (which may be longer).
    pub fn contiguous(data: &'a mut [T], shape: &[usize]) -> Result<Self> {
        let strides = contiguous_strides(shape);
        ViewMut::new(data, shape, &strides)
    }

    /// The extent of each dimension.
    pub fn shape(&self) -> &[usize] {
        &self.shape[..self.ndim]
    }

    /// The stride of each dimension, in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides[..self.ndim]
    }

    /// The slice the view starts at.
    pub fn data(&self) -> &[T] {
        self.data
    }

    /// A descriptor for a call that only reads the view.
    pub(crate) fn raw_read(&self) -> sys::anyattn_tensor {
        describe(
            self.data.as_ptr() as *mut c_void,
            T::DTYPE.raw(),
            self.ndim,
            &self.shape[..self.ndim],
            &self.strides[..self.ndim],
        )
    }

    pub(crate) fn raw(&mut self) -> sys::anyattn_tensor {
        describe(
            self.data.as_mut_ptr() as *mut c_void,
            T::DTYPE.raw(),
            self.ndim,
            &self.shape[..self.ndim],
            &self.strides[..self.ndim],
        )
    }
}
