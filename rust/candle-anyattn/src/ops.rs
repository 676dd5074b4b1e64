//! The ops, as candle `CustomOp3`s: their public fields (`FlashAttn`'s are candle-flash-attn's)
//! and one `CustomOp3` implementation, generated per op by `attention_op!`, that dispatches CPU
//! storage on the dtype and CUDA storage to the CUDA route.

use anyattn::Element;
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor, WithDType};

use crate::cpu::{check_dtypes, dense, Common, CpuAttention};

/// The dense flash-attention op, with the fields of `candle_flash_attn::FlashAttn`.
///
/// Prefer the functions ([`flash_attn`] and its variants); this struct is public so that it can be
/// used with [`Tensor::apply_op3`] exactly like candle-flash-attn's.
#[derive(Debug, Clone)]
pub struct FlashAttn {
    /// Multiplies `<q_i, k_j>`; 0 makes every score 0, as in candle-flash-attn.
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
    /// Multiplies `<q_i, k_j>`; 0 makes every score 0, as in candle-flash-attn.
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
    /// Multiplies `<q_i, k_j>`; 0 makes every score 0, as in candle-flash-attn.
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
    /// `(batch, max_ranges, 2)` key position ranges `[start, end)` (i32, u32 or i64) that bypass
    /// the mask for the queries inside them; see [`crate::flash_attn_varlen_paged_windowed`].
    pub mm_prefix_ranges: Option<Tensor>,
}

impl CpuAttention for FlashAttn {
    fn run<T: WithDType + Element>(
        &self,
        q: &CpuStorage,
        q_l: &Layout,
        k: &CpuStorage,
        k_l: &Layout,
        v: &CpuStorage,
        v_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        dense::<T>(&Common::dense(self, None), q, q_l, k, k_l, v, v_l)
    }
}

impl CpuAttention for FlashAttnSinks {
    fn run<T: WithDType + Element>(
        &self,
        q: &CpuStorage,
        q_l: &Layout,
        k: &CpuStorage,
        k_l: &Layout,
        v: &CpuStorage,
        v_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let common = Common::dense(&self.attn, Some(&self.sinks));
        dense::<T>(&common, q, q_l, k, k_l, v, v_l)
    }
}

/// Implements `CustomOp3` for an op that implements `CpuAttention` (and, with the `cuda`
/// feature, `cuda::CudaRoute`).
macro_rules! attention_op {
    ($op:ty, $name:literal) => {
        impl CustomOp3 for $op {
            fn name(&self) -> &'static str {
                $name
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
                    DType::F32 => self.run::<f32>(q, q_l, k, k_l, v, v_l),
                    DType::F16 => self.run::<half::f16>(q, q_l, k, k_l, v, v_l),
                    _ => self.run::<half::bf16>(q, q_l, k, k_l, v, v_l),
                }
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
                crate::cuda::CudaRoute::cuda_fwd(self, q, q_l, k, k_l, v, v_l)
            }
        }
    };
}

attention_op!(FlashAttn, "flash-attn");
attention_op!(FlashAttnSinks, "flash-attn-sinks");
attention_op!(FlashAttnVarLen, "flash-attn-varlen");
attention_op!(FlashAttnVarLenPaged, "flash-attn-varlen-paged");
