//! `candle-flash-attn`'s public functions, working on CPU through anyattn.
//!
//! Every function has the name, arguments and `(batch, seq_len, num_heads, head_size)` layout of
//! its `candle-flash-attn` 0.11 counterpart, so switching is one changed `use` line:
//!
//! ```
//! use candle_anyattn::flash_attn; // was: use candle_flash_attn::flash_attn;
//! # fn main() -> candle_core::Result<()> {
//! use candle_core::{DType, Device, Tensor};
//! let q = Tensor::randn(0f32, 1., (1, 5, 4, 64), &Device::Cpu)?.to_dtype(DType::BF16)?;
//! let k = Tensor::randn(0f32, 1., (1, 7, 2, 64), &Device::Cpu)?.to_dtype(DType::BF16)?;
//! let v = Tensor::randn(0f32, 1., (1, 7, 2, 64), &Device::Cpu)?.to_dtype(DType::BF16)?;
//! let out = flash_attn(&q, &k, &v, 1.0 / 8.0, true)?;
//! assert_eq!(out.dims(), &[1, 5, 4, 64]);
//! # Ok(())
//! # }
//! ```
//!
//! # Semantics
//!
//! flash-attn 2.x's, as anyattn's contract states them: `s = softmax_scale * <q_i, k_j>`, then
//! the softcap, then ALiBi (`-slope_h * |i + Sk - Sq - j|`), then the mask, aligned to the
//! bottom-right corner (key `j` is visible to query `i` iff
//! `i + Sk - Sq - window_size_left <= j <= i + Sk - Sq + window_size_right`, `None` meaning
//! unbounded). Accumulation is in f32 for every dtype. Fully masked rows give zeros.
//!
//! # Differences from `candle-flash-attn`
//!
//! Everything `candle-flash-attn` accepts is accepted, with the same result, except as listed:
//!
//! - More is accepted: f32 as well as f16/bf16; any head size from 1 to 256 (not only multiples
//!   of 8, but not up to 512); `v` with a head size different from `q`'s; ALiBi slopes of shape
//!   `(num_heads_q)` or `(batch, num_heads_q)`; tensors whose last dimension is not contiguous
//!   (copied first; every other stride is used in place).
//! - `softmax_scale == 0.0` is rejected: the C ABI reserves 0 for "1/sqrt(head_size)".
//! - A `None` window side is exactly unbounded. flash-attn's CUDA kernels replace it by
//!   `seqlen_k` when the other side is bounded, which differs only when `seq_len_q > seq_len_k`.
//! - `max_seqlen_q`/`max_seqlen_k` of the varlen functions are checked against the sequences.
//! - [`flash_attn_varlen_paged_windowed`] (paged varlen, as in candle-flash-attn's forks that
//!   have it) rejects `mm_prefix_ranges` (ranges that bypass the mask): anyattn's masks are the
//!   causal/window ones only. Any `page_block_size >= 1` works.
//!
//! Extras: [`flash_attn_sinks`] and [`flash_attn_varlen_sinks`] add per-head sink logits
//! (gpt-oss, FA4's `learnable_sink`).
//!
//! # Devices and threads
//!
//! `cpu_fwd` runs anyattn for f32, f16 and bf16. With the `cuda` feature, CUDA tensors go to
//! `candle-flash-attn` (that feature needs nvcc; the default build never does). The thread count
//! follows candle's, [`candle_core::utils::get_num_threads`], which anyattn's process-wide count
//! is set to before each CPU call. The varlen functions call anyattn's native varlen entry point
//! on the packed tensors in place (no copies).
#![warn(missing_docs)]

use anyattn::{
    BlockTable, CacheSeqlens, Element, FwdOptions, KvCacheOptions, VarlenSeqs, View, ViewMut,
};
use candle_core::backend::BackendStorage;
use candle_core::WithDType;
use candle_core::{bail, CpuStorage, CustomOp3, DType, Layout, Result, Shape, Storage, Tensor};

/// The dense flash-attention op, with the fields of `candle_flash_attn::FlashAttn`.
///
/// Prefer the functions ([`flash_attn`] and its variants); this struct is public so that it can be
/// used with [`Tensor::apply_op3`] exactly like candle-flash-attn's.
#[derive(Debug, Clone)]
pub struct FlashAttn {
    /// Multiplies `<q_i, k_j>`; must be non-zero.
    pub softmax_scale: f32,
    /// f32 ALiBi slopes of shape `(num_heads_q)` or `(batch, num_heads_q)`.
    pub alibi_slopes: Option<Tensor>,
    /// Keys visible left of the (bottom-right aligned) diagonal; `None` = unbounded.
    pub window_size_left: Option<usize>,
    /// Keys visible right of the diagonal; `None` = unbounded, `Some(0)` = causal.
    pub window_size_right: Option<usize>,
    /// `Some(c)` with `c > 0`: scores become `c * tanh(s / c)`; `None` or `c <= 0` = off.
    pub softcap: Option<f32>,
}

/// The dense op with per-head sink logits (not in candle-flash-attn).
#[derive(Debug, Clone)]
pub struct FlashAttnSinks {
    /// The options shared with [`FlashAttn`].
    pub attn: FlashAttn,
    /// f32 sink logits of shape `(num_heads_q)`, in score units (not scaled by softmax_scale).
    pub sinks: Tensor,
}

/// The variable-length op: packed `(total, num_heads, head_size)` tensors split by cumulative
/// sequence lengths.
#[derive(Debug, Clone)]
pub struct FlashAttnVarLen {
    /// Multiplies `<q_i, k_j>`; must be non-zero.
    pub softmax_scale: f32,
    /// An upper bound of every query length (checked).
    pub max_seqlen_q: usize,
    /// An upper bound of every key length (checked).
    pub max_seqlen_k: usize,
    /// `batch + 1` cumulative query offsets (u32, i32 or i64).
    pub seqlens_q: Tensor,
    /// `batch + 1` cumulative key offsets (u32, i32 or i64).
    pub seqlens_k: Tensor,
    /// f32 ALiBi slopes of shape `(num_heads_q)` or `(batch, num_heads_q)`.
    pub alibi_slopes: Option<Tensor>,
    /// Keys visible left of each sequence's (bottom-right aligned) diagonal; `None` = unbounded.
    pub window_size_left: Option<usize>,
    /// Keys visible right of the diagonal; `None` = unbounded, `Some(0)` = causal.
    pub window_size_right: Option<usize>,
    /// `Some(c)` with `c > 0`: scores become `c * tanh(s / c)`; `None` or `c <= 0` = off.
    pub softcap: Option<f32>,
    /// Optional f32 sink logits of shape `(num_heads_q)`.
    pub sinks: Option<Tensor>,
}

/// The paged varlen op: packed `(total_q, num_heads, head_size)` queries against paged key and
/// value caches `(num_blocks, page_block_size, num_heads_kv, head_size)`, which are only read.
/// Sequence `b`'s keys are its cache positions `0 .. seqlens_k[b + 1] - seqlens_k[b]`, position
/// `p` living in block `block_table[b][p / page_block_size]`, row `p % page_block_size`; its
/// queries are the last of those keys (the mask is bottom-right aligned per sequence).
#[derive(Debug, Clone)]
pub struct FlashAttnVarLenPaged {
    /// Multiplies `<q_i, k_j>`; must be non-zero.
    pub softmax_scale: f32,
    /// An upper bound of every query length (checked).
    pub max_seqlen_q: usize,
    /// An upper bound of every key length (checked).
    pub max_seqlen_k: usize,
    /// `batch + 1` cumulative query offsets (u32, i32 or i64).
    pub seqlens_q: Tensor,
    /// `batch + 1` cumulative key counts (u32, i32 or i64): sequence `b` has
    /// `seqlens_k[b + 1] - seqlens_k[b]` keys in the cache.
    pub seqlens_k: Tensor,
    /// `(batch, max_blocks)` block indices (u32, i32 or i64), each in `[0, num_blocks)` where read.
    pub block_table: Tensor,
    /// Positions per block: the caches' second dimension.
    pub page_block_size: usize,
    /// f32 ALiBi slopes of shape `(num_heads_q)` or `(batch, num_heads_q)`.
    pub alibi_slopes: Option<Tensor>,
    /// Keys visible left of each sequence's (bottom-right aligned) diagonal; `None` = unbounded.
    pub window_size_left: Option<usize>,
    /// Keys visible right of the diagonal; `None` = unbounded, `Some(0)` = causal.
    pub window_size_right: Option<usize>,
    /// `Some(c)` with `c > 0`: scores become `c * tanh(s / c)`; `None` or `c <= 0` = off.
    pub softcap: Option<f32>,
}

fn anyattn_err(e: anyattn::Error) -> candle_core::Error {
    candle_core::Error::Msg(format!("flash-attn (anyattn): {e}")).bt()
}

/// Sets anyattn's thread count to candle's.
fn follow_candle_threads() {
    let n = candle_core::utils::get_num_threads();
    if anyattn::num_threads() != n {
        anyattn::set_num_threads(n);
    }
}

/// Copies a strided tensor into a C-contiguous vector.
fn gather<T: Copy>(data: &[T], dims: &[usize], strides: &[usize]) -> Vec<T> {
    let count: usize = dims.iter().product();
    let mut out = Vec::with_capacity(count);
    let mut index = vec![0usize; dims.len()];
    let mut offset = 0usize;
    for _ in 0..count {
        out.push(data[offset]);
        for d in (0..dims.len()).rev() {
            index[d] += 1;
            offset += strides[d];
            if index[d] < dims[d] {
                break;
            }
            offset -= index[d] * strides[d];
            index[d] = 0;
        }
    }
    out
}

/// A CPU tensor as anyattn sees it: the storage itself with candle's strides, or a contiguous copy
/// when the last dimension is not contiguous.
enum Input<'a, T> {
    Strided {
        data: &'a [T],
        dims: Vec<usize>,
        strides: Vec<usize>,
    },
    Copied {
        data: Vec<T>,
        dims: Vec<usize>,
    },
}

impl<'a, T: WithDType + Element> Input<'a, T> {
    fn new(storage: &'a CpuStorage, layout: &Layout) -> Result<Self> {
        let data = &storage.as_slice::<T>()?[layout.start_offset()..];
        let dims = layout.dims().to_vec();
        let mut strides = layout.stride().to_vec();
        match (dims.last(), strides.last_mut()) {
            (Some(&1), Some(s)) => *s = 1,
            (Some(_), Some(&mut s)) if s != 1 => {
                return Ok(Input::Copied {
                    data: gather(data, &dims, &strides),
                    dims,
                })
            }
            _ => {}
        }
        Ok(Input::Strided {
            data,
            dims,
            strides,
        })
    }

    fn view(&self) -> Result<View<'_, T>> {
        match self {
            Input::Strided {
                data,
                dims,
                strides,
            } => View::new(data, dims, strides),
            Input::Copied { data, dims } => View::contiguous(data, dims),
        }
        .map_err(anyattn_err)
    }
}

/// Reads an optional f32 side tensor (ALiBi slopes, sinks) on the CPU and calls `f` with its view.
fn with_f32_view<R>(
    name: &str,
    tensor: Option<&Tensor>,
    f: impl FnOnce(Option<View<'_, f32>>) -> Result<R>,
) -> Result<R> {
    let Some(tensor) = tensor else {
        return f(None);
    };
    if tensor.dtype() != DType::F32 {
        bail!(
            "flash-attn (anyattn): {name} must be f32, got {:?}",
            tensor.dtype()
        )
    }
    let (storage, layout) = tensor.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        bail!(
            "flash-attn (anyattn): {name} must be on the CPU like q, got {:?}",
            tensor.device().location()
        )
    };
    let input = Input::<f32>::new(cpu, layout)?;
    f(Some(input.view()?))
}

/// The candle name and layout of a tensor's expected rank, for error messages.
fn check_rank(name: &str, layout: &Layout, rank: usize, what: &str) -> Result<()> {
    if layout.dims().len() != rank {
        bail!(
            "flash-attn (anyattn): {name} must have rank {rank} {what}, got shape {:?}",
            layout.dims()
        )
    }
    Ok(())
}

fn check_dtypes(q: &CpuStorage, k: &CpuStorage, v: &CpuStorage) -> Result<DType> {
    let (dq, dk, dv) = (q.dtype(), k.dtype(), v.dtype());
    if dq != dk || dq != dv {
        bail!("flash-attn (anyattn): q, k and v must share one dtype, got q {dq:?}, k {dk:?}, v {dv:?}")
    }
    match dq {
        DType::F32 | DType::F16 | DType::BF16 => Ok(dq),
        dt => bail!("flash-attn (anyattn): supported dtypes are f32, f16 and bf16, got {dt:?}"),
    }
}

/// The options common to every op, in candle-flash-attn's terms.
#[derive(Clone, Copy)]
struct Common<'a> {
    softmax_scale: f32,
    alibi_slopes: Option<&'a Tensor>,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: Option<f32>,
    sinks: Option<&'a Tensor>,
}

impl<'a> Common<'a> {
    fn dense(attn: &'a FlashAttn, sinks: Option<&'a Tensor>) -> Self {
        Common {
            softmax_scale: attn.softmax_scale,
            alibi_slopes: attn.alibi_slopes.as_ref(),
            window_size_left: attn.window_size_left,
            window_size_right: attn.window_size_right,
            softcap: attn.softcap,
            sinks,
        }
    }

    /// anyattn's options. A window side at least `left_limit` (left) or `right_limit` (right) is
    /// passed as unbounded, which is exactly equivalent when the limits are the key and query
    /// lengths (or upper bounds of them): it only keeps huge values inside the C ABI's int32.
    fn options<'v>(
        &self,
        left_limit: usize,
        right_limit: usize,
        alibi: Option<View<'v, f32>>,
        sinks: Option<View<'v, f32>>,
    ) -> FwdOptions<'v> {
        FwdOptions {
            softmax_scale: Some(self.softmax_scale),
            softcap: self.softcap.filter(|&c| c > 0.0),
            causal: false,
            window_left: self.window_size_left.filter(|&w| w < left_limit),
            window_right: self.window_size_right.filter(|&w| w < right_limit),
            alibi_slopes: alibi,
            sinks,
            ..FwdOptions::default()
        }
    }
}

fn dense_typed<T: WithDType + Element>(
    c: &Common<'_>,
    q: &CpuStorage,
    q_l: &Layout,
    k: &CpuStorage,
    k_l: &Layout,
    v: &CpuStorage,
    v_l: &Layout,
) -> Result<(CpuStorage, Shape)> {
    let what = "(batch, seq_len, num_heads, head_size)";
    check_rank("q", q_l, 4, what)?;
    check_rank("k", k_l, 4, what)?;
    check_rank("v", v_l, 4, what)?;
    let (b, sq, hq, _) = q_l.shape().dims4()?;
    let sk = k_l.dims()[1];
    let dv = v_l.dims()[3];
    let (qi, ki, vi) = (
        Input::<T>::new(q, q_l)?,
        Input::<T>::new(k, k_l)?,
        Input::<T>::new(v, v_l)?,
    );
    let mut out = vec![T::from_f64(0.0); b * sq * hq * dv];
    with_f32_view("alibi_slopes", c.alibi_slopes, |alibi| {
        with_f32_view("sinks", c.sinks, |sinks| {
            let opts = c.options(sk, sq, alibi, sinks);
            let mut out_view =
                ViewMut::contiguous(&mut out, &[b, sq, hq, dv]).map_err(anyattn_err)?;
            follow_candle_threads();
            anyattn::fwd(
                &qi.view()?,
                &ki.view()?,
                &vi.view()?,
                &mut out_view,
                None,
                &opts,
            )
            .map_err(anyattn_err)
        })
    })?;
    Ok((T::to_cpu_storage_owned(out), Shape::from((b, sq, hq, dv))))
}

fn dense_cpu(
    c: &Common<'_>,
    q: &CpuStorage,
    q_l: &Layout,
    k: &CpuStorage,
    k_l: &Layout,
    v: &CpuStorage,
    v_l: &Layout,
) -> Result<(CpuStorage, Shape)> {
    match check_dtypes(q, k, v)? {
        DType::F32 => dense_typed::<f32>(c, q, q_l, k, k_l, v, v_l),
        DType::F16 => dense_typed::<half::f16>(c, q, q_l, k, k_l, v, v_l),
        _ => dense_typed::<half::bf16>(c, q, q_l, k, k_l, v, v_l),
    }
}

/// Reads cumulative sequence lengths (u32, i32 or i64, rank 1) as i32.
fn read_seqlens(name: &str, t: &Tensor) -> Result<Vec<i32>> {
    if t.rank() != 1 {
        bail!(
            "flash-attn (anyattn): {name} must have rank 1 (batch + 1), got shape {:?}",
            t.dims()
        )
    }
    read_i32(name, t)
}

/// Reads an index tensor (u32, i32 or i64, any rank, any device) as row-major i32 values.
fn read_i32(name: &str, t: &Tensor) -> Result<Vec<i32>> {
    let t = t.flatten_all()?;
    let wide: Vec<i64> = match t.dtype() {
        DType::U32 => t.to_vec1::<u32>()?.into_iter().map(i64::from).collect(),
        DType::I32 => t.to_vec1::<i32>()?.into_iter().map(i64::from).collect(),
        DType::I64 => t.to_vec1::<i64>()?,
        dt => bail!("flash-attn (anyattn): {name} must be u32, i32 or i64, got {dt:?}"),
    };
    wide.into_iter()
        .enumerate()
        .map(|(i, x)| {
            i32::try_from(x).map_err(|_| {
                candle_core::Error::Msg(format!(
                    "flash-attn (anyattn): {name}[{i}] = {x} is outside int32"
                ))
            })
        })
        .collect()
}

/// Per-sequence key counts from cumulative offsets: non-decreasing, each at most `max_seqlen_k`.
fn key_counts(cu_k: &[i32], max_seqlen_k: usize) -> Result<Vec<i32>> {
    cu_k.windows(2)
        .enumerate()
        .map(|(b, w)| {
            let n = i64::from(w[1]) - i64::from(w[0]);
            if n < 0 || n as u64 > max_seqlen_k as u64 {
                bail!(
                    "flash-attn (anyattn): seqlens_k gives sequence {b} {n} keys \
                     (seqlens_k[{}] = {}, seqlens_k[{b}] = {}); supported 0 to max_seqlen_k = \
                     {max_seqlen_k}",
                    b + 1,
                    w[1],
                    w[0]
                )
            }
            Ok(n as i32)
        })
        .collect()
}

fn paged_typed<T: WithDType + Element>(
    op: &FlashAttnVarLenPaged,
    q: &CpuStorage,
    q_l: &Layout,
    k: &CpuStorage,
    k_l: &Layout,
    v: &CpuStorage,
    v_l: &Layout,
) -> Result<(CpuStorage, Shape)> {
    check_rank("q", q_l, 3, "(total_q, num_heads, head_size)")?;
    let what = "(num_blocks, page_block_size, num_heads_kv, head_size)";
    check_rank("k", k_l, 4, what)?;
    check_rank("v", v_l, 4, what)?;
    if k_l.dims()[1] != op.page_block_size {
        bail!(
            "flash-attn (anyattn): page_block_size is {} but the key cache has {} positions per \
             block (shape {:?})",
            op.page_block_size,
            k_l.dims()[1],
            k_l.dims()
        )
    }
    let (total_q, hq, _) = q_l.shape().dims3()?;
    let dv = v_l.dims()[3];
    let cu_q = read_seqlens("seqlens_q", &op.seqlens_q)?;
    let lens_k = key_counts(&read_seqlens("seqlens_k", &op.seqlens_k)?, op.max_seqlen_k)?;
    if op.block_table.rank() != 2 {
        bail!(
            "flash-attn (anyattn): block_table must have rank 2 (batch, max_blocks), got shape {:?}",
            op.block_table.dims()
        )
    }
    let table = read_i32("block_table", &op.block_table)?;
    let cache = KvCacheOptions {
        cache_seqlens: CacheSeqlens::PerSequence(&lens_k),
        block_table: Some(BlockTable {
            data: &table,
            blocks_per_seq: op.block_table.dims()[1],
        }),
        ..Default::default()
    };
    let c = Common {
        softmax_scale: op.softmax_scale,
        alibi_slopes: op.alibi_slopes.as_ref(),
        window_size_left: op.window_size_left,
        window_size_right: op.window_size_right,
        softcap: op.softcap,
        sinks: None,
    };
    let (qi, ki, vi) = (
        Input::<T>::new(q, q_l)?,
        Input::<T>::new(k, k_l)?,
        Input::<T>::new(v, v_l)?,
    );
    let mut out = vec![T::from_f64(0.0); total_q * hq * dv];
    with_f32_view("alibi_slopes", c.alibi_slopes, |alibi| {
        let opts = c.options(op.max_seqlen_k, op.max_seqlen_q, alibi, None);
        let mut out_view =
            ViewMut::contiguous(&mut out, &[total_q, hq, dv]).map_err(anyattn_err)?;
        follow_candle_threads();
        anyattn::fwd_kvcache_varlen(
            &qi.view()?,
            &ki.view()?,
            &vi.view()?,
            &mut out_view,
            None,
            &cu_q,
            op.max_seqlen_q,
            &cache,
            &opts,
        )
        .map_err(anyattn_err)
    })?;
    Ok((T::to_cpu_storage_owned(out), Shape::from((total_q, hq, dv))))
}

fn varlen_typed<T: WithDType + Element>(
    op: &FlashAttnVarLen,
    q: &CpuStorage,
    q_l: &Layout,
    k: &CpuStorage,
    k_l: &Layout,
    v: &CpuStorage,
    v_l: &Layout,
) -> Result<(CpuStorage, Shape)> {
    let what = "(total, num_heads, head_size)";
    check_rank("q", q_l, 3, what)?;
    check_rank("k", k_l, 3, what)?;
    check_rank("v", v_l, 3, what)?;
    let (total_q, hq, _) = q_l.shape().dims3()?;
    let dv = v_l.dims()[2];
    let cu_q = read_seqlens("seqlens_q", &op.seqlens_q)?;
    let cu_k = read_seqlens("seqlens_k", &op.seqlens_k)?;
    let seqs = VarlenSeqs {
        cu_seqlens_q: &cu_q,
        cu_seqlens_k: &cu_k,
        max_seqlen_q: op.max_seqlen_q,
        max_seqlen_k: op.max_seqlen_k,
        seqused_k: None,
    };
    let c = Common {
        softmax_scale: op.softmax_scale,
        alibi_slopes: op.alibi_slopes.as_ref(),
        window_size_left: op.window_size_left,
        window_size_right: op.window_size_right,
        softcap: op.softcap,
        sinks: op.sinks.as_ref(),
    };
    let (qi, ki, vi) = (
        Input::<T>::new(q, q_l)?,
        Input::<T>::new(k, k_l)?,
        Input::<T>::new(v, v_l)?,
    );
    let mut out = vec![T::from_f64(0.0); total_q * hq * dv];
    with_f32_view("alibi_slopes", c.alibi_slopes, |alibi| {
        with_f32_view("sinks", c.sinks, |sinks| {
            let opts = c.options(op.max_seqlen_k, op.max_seqlen_q, alibi, sinks);
            let mut out_view =
                ViewMut::contiguous(&mut out, &[total_q, hq, dv]).map_err(anyattn_err)?;
            follow_candle_threads();
            anyattn::fwd_varlen(
                &qi.view()?,
                &ki.view()?,
                &vi.view()?,
                &mut out_view,
                None,
                &seqs,
                &opts,
            )
            .map_err(anyattn_err)
        })
    })?;
    Ok((T::to_cpu_storage_owned(out), Shape::from((total_q, hq, dv))))
}

impl CustomOp3 for FlashAttn {
    fn name(&self) -> &'static str {
        "flash-attn"
    }

    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        q_l: &Layout,
        k: &CpuStorage,
        k_l: &Layout,
        v: &CpuStorage,
        v_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        dense_cpu(&Common::dense(self, None), q, q_l, k, k_l, v, v_l)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        q_l: &Layout,
        k: &candle_core::CudaStorage,
        k_l: &Layout,
        v: &candle_core::CudaStorage,
        v_l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let op = candle_flash_attn::FlashAttn {
            softmax_scale: self.softmax_scale,
            alibi_slopes: self.alibi_slopes.clone(),
            window_size_left: self.window_size_left,
            window_size_right: self.window_size_right,
            softcap: self.softcap,
        };
        op.cuda_fwd(q, q_l, k, k_l, v, v_l)
    }
}

impl CustomOp3 for FlashAttnSinks {
    fn name(&self) -> &'static str {
        "flash-attn-sinks"
    }

    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        q_l: &Layout,
        k: &CpuStorage,
        k_l: &Layout,
        v: &CpuStorage,
        v_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        dense_cpu(
            &Common::dense(&self.attn, Some(&self.sinks)),
            q,
            q_l,
            k,
            k_l,
            v,
            v_l,
        )
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        bail!("flash-attn-sinks: candle-flash-attn has no sinks, so CUDA tensors are not supported; move them to the CPU")
    }
}

impl CustomOp3 for FlashAttnVarLen {
    fn name(&self) -> &'static str {
        "flash-attn-varlen"
    }

    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        q_l: &Layout,
        k: &CpuStorage,
        k_l: &Layout,
        v: &CpuStorage,
        v_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        match check_dtypes(q, k, v)? {
            DType::F32 => varlen_typed::<f32>(self, q, q_l, k, k_l, v, v_l),
            DType::F16 => varlen_typed::<half::f16>(self, q, q_l, k, k_l, v, v_l),
            _ => varlen_typed::<half::bf16>(self, q, q_l, k, k_l, v, v_l),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        bail!("flash-attn-varlen: CUDA tensors are handled by the candle_anyattn::flash_attn_varlen* functions (through candle-flash-attn), not by this op")
    }
}

impl CustomOp3 for FlashAttnVarLenPaged {
    fn name(&self) -> &'static str {
        "flash-attn-varlen-paged"
    }

    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        q_l: &Layout,
        k: &CpuStorage,
        k_l: &Layout,
        v: &CpuStorage,
        v_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        match check_dtypes(q, k, v)? {
            DType::F32 => paged_typed::<f32>(self, q, q_l, k, k_l, v, v_l),
            DType::F16 => paged_typed::<half::f16>(self, q, q_l, k, k_l, v, v_l),
            _ => paged_typed::<half::bf16>(self, q, q_l, k, k_l, v, v_l),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        bail!("flash-attn-varlen-paged: CUDA tensors are handled by candle_anyattn::flash_attn_varlen_paged_windowed (pages gathered, then candle-flash-attn), not by this op")
    }
}

fn causal_window(causal: bool) -> (Option<usize>, Option<usize>) {
    (None, if causal { Some(0) } else { None })
}

/// Flash attention: `softmax(Q @ K^T * softmax_scale) @ V`, optionally causal.
///
/// Grouped-query and multi-query attention use `k`/`v` with fewer heads than `q`; the number of
/// kv heads must divide the number of query heads.
///
/// * `q` - `(batch, seq_len_q, num_heads_q, head_size)`.
/// * `k` - `(batch, seq_len_kv, num_heads_kv, head_size)`.
/// * `v` - `(batch, seq_len_kv, num_heads_kv, head_size_v)`.
/// * `causal` - bottom-right aligned causal mask (query `i` sees keys up to
///   `i + seq_len_kv - seq_len_q`).
///
/// Returns `(batch, seq_len_q, num_heads_q, head_size_v)` in `q`'s dtype.
pub fn flash_attn(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let (window_size_left, window_size_right) = causal_window(causal);
    flash_attn_windowed(q, k, v, softmax_scale, window_size_left, window_size_right)
}

/// Flash attention with a sliding window: query `i` sees keys `j` with
/// `i + Sk - Sq - window_size_left <= j <= i + Sk - Sq + window_size_right`; `None` = unbounded.
/// `window_size_left = None, window_size_right = Some(0)` is causal.
///
/// Shapes as in [`flash_attn`].
pub fn flash_attn_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    q.apply_op3(
        k,
        v,
        FlashAttn {
            softmax_scale,
            alibi_slopes: None,
            window_size_left,
            window_size_right,
            softcap: None,
        },
    )
}

/// Flash attention with ALiBi: `score += -alibi_slopes[h] * |i + Sk - Sq - j|`, optionally causal.
///
/// `alibi_slopes` is f32 of shape `(num_heads_q)` (or `(batch, num_heads_q)`). Shapes as in
/// [`flash_attn`].
pub fn flash_attn_alibi(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let (window_size_left, window_size_right) = causal_window(causal);
    flash_attn_alibi_windowed(
        q,
        k,
        v,
        alibi_slopes,
        softmax_scale,
        window_size_left,
        window_size_right,
    )
}

/// Flash attention with ALiBi and a sliding window; see [`flash_attn_alibi`] and
/// [`flash_attn_windowed`].
pub fn flash_attn_alibi_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    q.apply_op3(
        k,
        v,
        FlashAttn {
            softmax_scale,
            alibi_slopes: Some(alibi_slopes.clone()),
            window_size_left,
            window_size_right,
            softcap: None,
        },
    )
}

/// Flash attention with optional ALiBi, a sliding window and a Gemma-style softcap: scores become
/// `softcap * tanh(score / softcap)` before ALiBi and masking (`softcap <= 0` = off).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_alibi_windowed_softcap(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<Tensor> {
    q.apply_op3(
        k,
        v,
        FlashAttn {
            softmax_scale,
            alibi_slopes: alibi_slopes.cloned(),
            window_size_left,
            window_size_right,
            softcap: Some(softcap),
        },
    )
}

/// Flash attention with per-head sink logits (gpt-oss, FA4's `learnable_sink`), plus every option
/// of [`flash_attn_alibi_windowed_softcap`]. Not in candle-flash-attn.
///
/// `sinks` is f32 of shape `(num_heads_q)`, in score units (not scaled by `softmax_scale`): the
/// sink joins the softmax denominator and contributes no value,
/// `o_i = sum_j e^{s_ij} v_j / (e^{sink_h} + sum_j e^{s_ij})`. A row that sees no key gives zeros.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_sinks(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    sinks: &Tensor,
    alibi_slopes: Option<&Tensor>,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<Tensor> {
    q.apply_op3(
        k,
        v,
        FlashAttnSinks {
            attn: FlashAttn {
                softmax_scale,
                alibi_slopes: alibi_slopes.cloned(),
                window_size_left,
                window_size_right,
                softcap: Some(softcap),
            },
            sinks: sinks.clone(),
        },
    )
}

#[allow(clippy::too_many_arguments)]
fn varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: Option<f32>,
    sinks: Option<&Tensor>,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if q.device().is_cuda() {
        if sinks.is_some() {
            bail!("flash-attn-varlen-sinks: candle-flash-attn has no sinks, so CUDA tensors are not supported; move them to the CPU")
        }
        return candle_flash_attn::flash_attn_varlen_alibi_windowed_softcap(
            q,
            k,
            v,
            alibi_slopes,
            seqlens_q,
            seqlens_k,
            max_seqlen_q,
            max_seqlen_k,
            softmax_scale,
            window_size_left,
            window_size_right,
            softcap.unwrap_or(0.0),
        );
    }
    q.apply_op3(
        k,
        v,
        FlashAttnVarLen {
            softmax_scale,
            max_seqlen_q,
            max_seqlen_k,
            seqlens_q: seqlens_q.clone(),
            seqlens_k: seqlens_k.clone(),
            alibi_slopes: alibi_slopes.cloned(),
            window_size_left,
            window_size_right,
            softcap,
            sinks: sinks.cloned(),
        },
    )
}

/// Flash attention over variable-length sequences packed along the first dimension.
///
/// * `q` - `(total_q, num_heads_q, head_size)`.
/// * `k` - `(total_kv, num_heads_kv, head_size)`.
/// * `v` - `(total_kv, num_heads_kv, head_size_v)`.
/// * `seqlens_q`, `seqlens_k` - `batch + 1` cumulative offsets (`0, len_1, len_1 + len_2, ...`),
///   u32, i32 or i64; sequence `b` owns rows `seqlens[b]..seqlens[b + 1]`.
/// * `max_seqlen_q`, `max_seqlen_k` - upper bounds of the lengths (checked).
/// * `causal` - bottom-right aligned per sequence.
///
/// Returns `(total_q, num_heads_q, head_size_v)`; rows in no sequence are zero.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let (window_size_left, window_size_right) = causal_window(causal);
    varlen(
        q,
        k,
        v,
        None,
        seqlens_q,
        seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        window_size_left,
        window_size_right,
        None,
        None,
    )
}

/// [`flash_attn_varlen`] with a sliding window per sequence (see [`flash_attn_windowed`]).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    varlen(
        q,
        k,
        v,
        None,
        seqlens_q,
        seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        window_size_left,
        window_size_right,
        None,
        None,
    )
}

/// [`flash_attn_varlen`] with ALiBi; positions are per sequence. `alibi_slopes` is f32 of shape
/// `(num_heads_q)` or `(batch, num_heads_q)`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let (window_size_left, window_size_right) = causal_window(causal);
    varlen(
        q,
        k,
        v,
        Some(alibi_slopes),
        seqlens_q,
        seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        window_size_left,
        window_size_right,
        None,
        None,
    )
}

/// [`flash_attn_varlen`] with ALiBi and a sliding window.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    varlen(
        q,
        k,
        v,
        Some(alibi_slopes),
        seqlens_q,
        seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        window_size_left,
        window_size_right,
        None,
        None,
    )
}

/// [`flash_attn_varlen`] with optional ALiBi, a sliding window and a softcap (`softcap <= 0` =
/// off).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi_windowed_softcap(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<Tensor> {
    varlen(
        q,
        k,
        v,
        alibi_slopes,
        seqlens_q,
        seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        window_size_left,
        window_size_right,
        Some(softcap),
        None,
    )
}

/// [`flash_attn_varlen_alibi_windowed_softcap`] with per-head sink logits (see
/// [`flash_attn_sinks`]). Not in candle-flash-attn.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_sinks(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    sinks: &Tensor,
    alibi_slopes: Option<&Tensor>,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<Tensor> {
    varlen(
        q,
        k,
        v,
        alibi_slopes,
        seqlens_q,
        seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        window_size_left,
        window_size_right,
        Some(softcap),
        Some(sinks),
    )
}

/// Gathers each sequence's keys and values from the paged caches into packed `(total_k, H, D)`
/// tensors on the caches' device, with the cumulative key offsets `(batch + 1)` u32. The route for
/// devices whose flash attention has no paged varlen (CUDA through candle-flash-attn).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn gather_pages(
    k: &Tensor,
    v: &Tensor,
    seqlens_k: &Tensor,
    block_table: &Tensor,
    max_seqlen_k: usize,
    page_block_size: usize,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (num_blocks, page, hk, d) = k.dims4()?;
    if page != page_block_size {
        bail!("flash-attn (anyattn): page_block_size is {page_block_size} but the key cache has {page} positions per block")
    }
    let lens = key_counts(&read_seqlens("seqlens_k", seqlens_k)?, max_seqlen_k)?;
    let (batch, max_blocks) = block_table.dims2()?;
    let table = read_i32("block_table", block_table)?;
    if lens.len() != batch {
        bail!(
            "flash-attn (anyattn): block_table has {batch} rows, seqlens_k gives {} sequences",
            lens.len()
        )
    }
    let mut rows = Vec::new();
    for (b, &n) in lens.iter().enumerate() {
        for p in 0..n as usize {
            let block = p / page;
            let entry = table
                .get(b * max_blocks + block)
                .copied()
                .filter(|_| block < max_blocks);
            match entry {
                Some(e) if e >= 0 && (e as usize) < num_blocks => rows.push((e as usize * page + p % page) as u32),
                _ => bail!("flash-attn (anyattn): block_table[{b}][{block}] is {entry:?}; supported 0 to {} for the {n} keys of sequence {b}", num_blocks as i64 - 1),
            }
        }
    }
    let mut cu: Vec<u32> = vec![0];
    for &n in &lens {
        cu.push(cu.last().copied().unwrap_or(0) + n as u32);
    }
    let index = Tensor::new(rows.as_slice(), k.device())?;
    let flat_k = k
        .reshape((num_blocks * page, hk, d))?
        .index_select(&index, 0)?;
    let dv = v.dims4()?.3;
    let flat_v = v
        .reshape((num_blocks * page, hk, dv))?
        .index_select(&index, 0)?;
    Ok((flat_k, flat_v, Tensor::new(cu.as_slice(), k.device())?))
}

/// Flash attention of packed variable-length queries against a paged KV cache (paged varlen):
/// the decode and chunked-prefill batches of a serving engine, in one call.
///
/// * `q` - `(total_q, num_heads_q, head_size)`.
/// * `k`, `v` - the caches, `(num_blocks, page_block_size, num_heads_kv, head_size[_v])`; read,
///   never written.
/// * `seqlens_q` - `batch + 1` cumulative query offsets (u32, i32 or i64).
/// * `seqlens_k` - `batch + 1` cumulative key counts: sequence `b` has
///   `seqlens_k[b + 1] - seqlens_k[b]` keys, its cache positions `0 ..` that count.
/// * `block_table` - `(batch, max_blocks)`: position `p` of sequence `b` is row
///   `p % page_block_size` of block `block_table[b][p / page_block_size]`.
/// * `mm_prefix_ranges` - must be `None`: ranges that bypass the mask are not supported.
/// * `max_seqlen_q`, `max_seqlen_k` - upper bounds of the lengths (checked).
/// * `window_size_left`, `window_size_right` - as in [`flash_attn_windowed`], per sequence,
///   bottom-right aligned (a sequence's queries are the last of its keys).
/// * `page_block_size` - the caches' second dimension (checked); any value from 1.
/// * `softcap` - `Some(c)` with `c > 0` applies `c * tanh(s / c)`.
///
/// Returns `(total_q, num_heads_q, head_size_v)`; rows in no sequence are zero. On the CPU the
/// caches are read in place; CUDA tensors (with the `cuda` feature) have each sequence's pages
/// gathered, then go to candle-flash-attn's varlen kernel.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_paged_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    block_table: &Tensor,
    mm_prefix_ranges: Option<&Tensor>,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    page_block_size: usize,
    softcap: Option<f32>,
) -> Result<Tensor> {
    if let Some(ranges) = mm_prefix_ranges {
        bail!(
            "flash-attn (anyattn): mm_prefix_ranges (shape {:?}) is not supported: anyattn's \
             masks are causal and sliding-window only; pass None",
            ranges.dims()
        )
    }
    #[cfg(feature = "cuda")]
    if q.device().is_cuda() {
        let (flat_k, flat_v, cu_k) =
            gather_pages(k, v, seqlens_k, block_table, max_seqlen_k, page_block_size)?;
        return varlen(
            q,
            &flat_k,
            &flat_v,
            None,
            seqlens_q,
            &cu_k,
            max_seqlen_q,
            max_seqlen_k,
            softmax_scale,
            window_size_left,
            window_size_right,
            softcap,
            None,
        );
    }
    q.apply_op3(
        k,
        v,
        FlashAttnVarLenPaged {
            softmax_scale,
            max_seqlen_q,
            max_seqlen_k,
            seqlens_q: seqlens_q.clone(),
            seqlens_k: seqlens_k.clone(),
            block_table: block_table.clone(),
            page_block_size,
            alibi_slopes: None,
            window_size_left,
            window_size_right,
            softcap,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The gather route (used for CUDA tensors) reads exactly the keys the native paged op reads:
    /// on CPU tensors, varlen over the gathered keys equals the paged op.
    #[test]
    fn gathered_pages_give_the_paged_result() -> Result<()> {
        let dev = &Device::Cpu;
        let (blocks, page, hk, d) = (6, 3, 2, 8);
        let k = Tensor::randn(0f32, 1., (blocks, page, hk, d), dev)?;
        let v = Tensor::randn(0f32, 1., (blocks, page, hk, d), dev)?;
        let q = Tensor::randn(0f32, 1., (6, 4, d), dev)?;
        let seqlens_q = Tensor::new(&[0u32, 1, 6], dev)?;
        let seqlens_k = Tensor::new(&[0u32, 4, 12], dev)?;
        let table = Tensor::new(&[[5u32, 0, 0], [2, 4, 1]], dev)?;
        let paged = flash_attn_varlen_paged_windowed(
            &q,
            &k,
            &v,
            &seqlens_q,
            &seqlens_k,
            &table,
            None,
            5,
            8,
            0.3,
            None,
            Some(0),
            page,
            None,
        )?;
        let (flat_k, flat_v, cu_k) = gather_pages(&k, &v, &seqlens_k, &table, 8, page)?;
        assert_eq!(cu_k.to_vec1::<u32>()?, vec![0, 4, 12]);
        let packed = flash_attn_varlen(&q, &flat_k, &flat_v, &seqlens_q, &cu_k, 5, 8, 0.3, true)?;
        let diff = (paged - packed)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff <= 1e-6, "max difference {diff}");
        let bad = Tensor::new(&[[5u32, 0, 0], [2, 9, 1]], dev)?;
        let err = gather_pages(&k, &v, &seqlens_k, &bad, 8, page).unwrap_err();
        assert!(err.to_string().contains("block_table[1][1]"), "{err}");
        Ok(())
    }
}
