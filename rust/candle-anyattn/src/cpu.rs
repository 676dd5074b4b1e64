//! The CPU side of the ops: candle storage read in place as anyattn views, the options in
//! anyattn's terms, and one typed run per op kind (dense, varlen, paged varlen).

use anyattn::{
    BlockTable, CacheSeqlens, Element, FwdOptions, KvCacheOptions, VarlenSeqs, View, ViewMut,
};
use candle_core::backend::BackendStorage;
use candle_core::WithDType;
use candle_core::{bail, CpuStorage, DType, Layout, Result, Shape, Storage, Tensor};

use crate::indices::{key_counts, read_i32, read_seqlens};
use crate::mm_prefix;
use crate::ops::{FlashAttn, FlashAttnVarLen, FlashAttnVarLenPaged};

pub(crate) fn anyattn_err(e: anyattn::Error) -> candle_core::Error {
    candle_core::Error::Msg(format!("flash-attn (anyattn): {e}")).bt()
}

/// Sets anyattn's thread count to candle's.
pub(crate) fn follow_candle_threads() {
    let n = candle_core::utils::get_num_threads();
    if anyattn::num_threads() != n {
        anyattn::set_num_threads(n);
    }
}

/// Copies a strided tensor into a C-contiguous vector.
pub(crate) fn gather<T: Copy>(data: &[T], dims: &[usize], strides: &[usize]) -> Vec<T> {
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
pub(crate) enum Input<'a, T> {
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
    pub(crate) fn new(storage: &'a CpuStorage, layout: &Layout) -> Result<Self> {
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

    /// Zeros of the given dims: the query of a call with `softmax_scale == 0`, whose scores are
    /// all zero (the C ABI reserves a scale of 0 for `1/sqrt(head_size)`, so the scale is folded
    /// into the query instead).
    pub(crate) fn zeros(dims: &[usize]) -> Self {
        Input::Copied {
            data: vec![T::from_f64(0.0); dims.iter().product()],
            dims: dims.to_vec(),
        }
    }

    /// A paged cache `(num_blocks, page, H, D)` seen as `(num_blocks * page, 1, H, D)`: one cache
    /// row per block, so that a block table can list single key positions. In place when the
    /// first two dimensions are contiguous with each other, otherwise copied.
    pub(crate) fn rows_as_pages(&self) -> Input<'_, T> {
        let merged = |dims: &[usize]| vec![dims[0] * dims[1], 1, dims[2], dims[3]];
        match self {
            Input::Strided {
                data,
                dims,
                strides,
            } if dims[0] <= 1 || strides[0] == dims[1] * strides[1] => Input::Strided {
                data,
                dims: merged(dims),
                strides: vec![strides[1], strides[1], strides[2], strides[3]],
            },
            Input::Strided {
                data,
                dims,
                strides,
            } => Input::Copied {
                data: gather(data, dims, strides),
                dims: merged(dims),
            },
            Input::Copied { data, dims } => Input::Strided {
                data: data.as_slice(),
                dims: merged(dims),
                strides: vec![dims[2] * dims[3], dims[2] * dims[3], dims[3], 1],
            },
        }
    }

    pub(crate) fn view(&self) -> Result<View<'_, T>> {
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
pub(crate) fn with_f32_view<R>(
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
pub(crate) fn check_rank(name: &str, layout: &Layout, rank: usize, what: &str) -> Result<()> {
    if layout.dims().len() != rank {
        bail!(
            "flash-attn (anyattn): {name} must have rank {rank} {what}, got shape {:?}",
            layout.dims()
        )
    }
    Ok(())
}

pub(crate) fn check_dtypes(q: &CpuStorage, k: &CpuStorage, v: &CpuStorage) -> Result<DType> {
    let (dq, dk, dv) = (q.dtype(), k.dtype(), v.dtype());
    if dq != dk || dq != dv {
        bail!("flash-attn (anyattn): q, k and v must share one dtype, got q {dq:?}, k {dk:?}, v {dv:?}")
    }
    match dq {
        DType::F32 | DType::F16 | DType::BF16 => Ok(dq),
        dt => bail!("flash-attn (anyattn): supported dtypes are f32, f16 and bf16, got {dt:?}"),
    }
}

/// An op's CPU computation for one element type; `ops::attention_op!` dispatches on the dtype.
pub(crate) trait CpuAttention {
    /// Runs the op on q, k and v of element type `T` (checked to be shared by all three).
    #[allow(clippy::too_many_arguments)]
    fn run<T: WithDType + Element>(
        &self,
        q: &CpuStorage,
        q_l: &Layout,
        k: &CpuStorage,
        k_l: &Layout,
        v: &CpuStorage,
        v_l: &Layout,
    ) -> Result<(CpuStorage, Shape)>;
}

/// The options common to every op, in candle-flash-attn's terms.
#[derive(Clone, Copy)]
pub(crate) struct Common<'a> {
    pub(crate) softmax_scale: f32,
    pub(crate) alibi_slopes: Option<&'a Tensor>,
    pub(crate) window_size_left: Option<usize>,
    pub(crate) window_size_right: Option<usize>,
    pub(crate) softcap: Option<f32>,
    pub(crate) sinks: Option<&'a Tensor>,
}

impl<'a> Common<'a> {
    pub(crate) fn dense(attn: &'a FlashAttn, sinks: Option<&'a Tensor>) -> Self {
        Common {
            softmax_scale: attn.softmax_scale,
            alibi_slopes: attn.alibi_slopes.as_ref(),
            window_size_left: attn.window_size_left,
            window_size_right: attn.window_size_right,
            softcap: attn.softcap,
            sinks,
        }
    }

    /// The query as anyattn reads it: q itself, or zeros when `softmax_scale == 0` (scores of
    /// zero, as candle-flash-attn's kernels compute them), run with a scale of 1.
    pub(crate) fn query<'s, T: WithDType + Element>(
        &self,
        q: &'s CpuStorage,
        q_l: &Layout,
    ) -> Result<Input<'s, T>> {
        if self.softmax_scale == 0.0 {
            Ok(Input::zeros(q_l.dims()))
        } else {
            Input::new(q, q_l)
        }
    }

    /// anyattn's options. A window side at least `left_limit` (left) or `right_limit` (right) is
    /// passed as unbounded, which is exactly equivalent when the limits are the key and query
    /// lengths (or upper bounds of them): it only keeps huge values inside the C ABI's int32.
    pub(crate) fn options<'v>(
        &self,
        left_limit: usize,
        right_limit: usize,
        alibi: Option<View<'v, f32>>,
        sinks: Option<View<'v, f32>>,
    ) -> FwdOptions<'v> {
        FwdOptions {
            softmax_scale: Some(if self.softmax_scale == 0.0 {
                1.0
            } else {
                self.softmax_scale
            }),
            softcap: self.softcap.filter(|&c| c > 0.0),
            causal: false,
            window_left: self.window_size_left.filter(|&w| w < left_limit),
            window_right: self.window_size_right.filter(|&w| w < right_limit),
            alibi_slopes: alibi,
            sinks,
            ..FwdOptions::default()
        }
    }

    /// Calls `f` with anyattn's options (see [`Common::options`]), the ALiBi slopes and sinks
    /// read as f32 views for the duration of the call.
    pub(crate) fn with_options<R>(
        &self,
        left_limit: usize,
        right_limit: usize,
        f: impl FnOnce(&FwdOptions<'_>) -> Result<R>,
    ) -> Result<R> {
        with_f32_view("alibi_slopes", self.alibi_slopes, |alibi| {
            with_f32_view("sinks", self.sinks, |sinks| {
                f(&self.options(left_limit, right_limit, alibi, sinks))
            })
        })
    }

    /// q (see [`Common::query`]), k and v as anyattn reads them.
    #[allow(clippy::type_complexity)]
    pub(crate) fn inputs<'s, T: WithDType + Element>(
        &self,
        (q, q_l): (&'s CpuStorage, &Layout),
        (k, k_l): (&'s CpuStorage, &Layout),
        (v, v_l): (&'s CpuStorage, &Layout),
    ) -> Result<(Input<'s, T>, Input<'s, T>, Input<'s, T>)> {
        Ok((
            self.query(q, q_l)?,
            Input::new(k, k_l)?,
            Input::new(v, v_l)?,
        ))
    }
}

/// Runs the dense op (`FlashAttn`, `FlashAttnSinks`) on `(batch, seq_len, num_heads, head_size)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dense<T: WithDType + Element>(
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
    let (qi, ki, vi) = c.inputs::<T>((q, q_l), (k, k_l), (v, v_l))?;
    let mut out = vec![T::from_f64(0.0); b * sq * hq * dv];
    c.with_options(sk, sq, |opts| {
        let mut out_view = ViewMut::contiguous(&mut out, &[b, sq, hq, dv]).map_err(anyattn_err)?;
        follow_candle_threads();
        anyattn::fwd(
            &qi.view()?,
            &ki.view()?,
            &vi.view()?,
            &mut out_view,
            None,
            opts,
        )
        .map_err(anyattn_err)
    })?;
    Ok((T::to_cpu_storage_owned(out), Shape::from((b, sq, hq, dv))))
}

impl CpuAttention for FlashAttnVarLen {
    fn run<T: WithDType + Element>(
        &self,
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
        let cu_q = read_seqlens("seqlens_q", &self.seqlens_q)?;
        let cu_k = read_seqlens("seqlens_k", &self.seqlens_k)?;
        let seqs = VarlenSeqs {
            cu_seqlens_q: &cu_q,
            cu_seqlens_k: &cu_k,
            max_seqlen_q: self.max_seqlen_q,
            max_seqlen_k: self.max_seqlen_k,
            seqused_k: None,
        };
        let c = Common {
            softmax_scale: self.softmax_scale,
            alibi_slopes: self.alibi_slopes.as_ref(),
            window_size_left: self.window_size_left,
            window_size_right: self.window_size_right,
            softcap: self.softcap,
            sinks: self.sinks.as_ref(),
        };
        let (qi, ki, vi) = c.inputs::<T>((q, q_l), (k, k_l), (v, v_l))?;
        let mut out = vec![T::from_f64(0.0); total_q * hq * dv];
        c.with_options(self.max_seqlen_k, self.max_seqlen_q, |opts| {
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
                opts,
            )
            .map_err(anyattn_err)
        })?;
        Ok((T::to_cpu_storage_owned(out), Shape::from((total_q, hq, dv))))
    }
}

impl CpuAttention for FlashAttnVarLenPaged {
    fn run<T: WithDType + Element>(
        &self,
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
        if k_l.dims()[1] != self.page_block_size {
            bail!(
                "flash-attn (anyattn): page_block_size is {} but the key cache has {} positions \
                 per block (shape {:?})",
                self.page_block_size,
                k_l.dims()[1],
                k_l.dims()
            )
        }
        let (total_q, hq, _) = q_l.shape().dims3()?;
        let dv = v_l.dims()[3];
        let cu_q = read_seqlens("seqlens_q", &self.seqlens_q)?;
        let lens_k = key_counts(
            &read_seqlens("seqlens_k", &self.seqlens_k)?,
            self.max_seqlen_k,
        )?;
        if self.block_table.rank() != 2 {
            bail!(
                "flash-attn (anyattn): block_table must have rank 2 (batch, max_blocks), got \
                 shape {:?}",
                self.block_table.dims()
            )
        }
        let blocks_per_seq = self.block_table.dims()[1];
        let table = read_i32("block_table", &self.block_table)?;
        let ranges = match &self.mm_prefix_ranges {
            Some(t) => Some(mm_prefix::read_ranges(t, lens_k.len())?),
            None => None,
        };
        let cache = KvCacheOptions {
            cache_seqlens: CacheSeqlens::PerSequence(&lens_k),
            block_table: Some(BlockTable {
                data: &table,
                blocks_per_seq,
            }),
            ..Default::default()
        };
        let c = Common {
            softmax_scale: self.softmax_scale,
            alibi_slopes: self.alibi_slopes.as_ref(),
            window_size_left: self.window_size_left,
            window_size_right: self.window_size_right,
            softcap: self.softcap,
            sinks: None,
        };
        let (qi, ki, vi) = c.inputs::<T>((q, q_l), (k, k_l), (v, v_l))?;
        let mut out = vec![T::from_f64(0.0); total_q * hq * dv];
        c.with_options(self.max_seqlen_k, self.max_seqlen_q, |opts| {
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
                self.max_seqlen_q,
                &cache,
                opts,
            )
            .map_err(anyattn_err)
        })?;
        if let Some(ranges) = ranges {
            // The block table was validated by the call above for every position it read, which
            // covers every position the prefix rows read.
            let paging = mm_prefix::Paging {
                table: &table,
                blocks_per_seq,
                page_block_size: self.page_block_size,
            };
            let groups = mm_prefix::row_groups(
                &cu_q,
                &lens_k,
                &ranges,
                self.window_size_left,
                self.window_size_right,
            );
            let opts = FwdOptions {
                window_left: None,
                window_right: None,
                ..c.options(self.max_seqlen_k, self.max_seqlen_q, None, None)
            };
            mm_prefix::recompute_rows(
                &groups,
                &paging,
                &qi.view()?,
                &ki.rows_as_pages().view()?,
                &vi.rows_as_pages().view()?,
                &opts,
                &mut out,
            )?;
        }
        Ok((T::to_cpu_storage_owned(out), Shape::from((total_q, hq, dv))))
    }
}
