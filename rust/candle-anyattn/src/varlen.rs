//! The variable-length functions: candle-flash-attn's `flash_attn_varlen*` on packed
//! `(total, num_heads, head_size)` tensors, the paged varlen and the sinks extension.

use candle_core::{Result, Tensor};

use crate::dense::causal_window;
use crate::ops::{FlashAttnVarLen, FlashAttnVarLenPaged};

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
        return crate::cuda::varlen(
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
            softcap,
            sinks,
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

/// [`flash_attn_varlen`] with a sliding window per sequence (see [`crate::flash_attn_windowed`]).
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
/// [`crate::flash_attn_sinks`]). Not in candle-flash-attn.
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
/// * `mm_prefix_ranges` - optional `(batch, max_ranges, 2)` key position ranges `[start, end)`
///   (i32 as in candle-flash-attn; u32 and i64 too; empty ranges ignored): a query whose position
///   (`i + len_k - len_q` for row `i` of a sequence) lies in a range of its sequence also sees
///   every key of that range, whatever the window. They matter only when a window side is
///   bounded (causal included).
/// * `max_seqlen_q`, `max_seqlen_k` - upper bounds of the lengths (checked).
/// * `window_size_left`, `window_size_right` - as in [`crate::flash_attn_windowed`], per sequence,
///   bottom-right aligned (a sequence's queries are the last of its keys).
/// * `page_block_size` - the caches' second dimension (checked); any value from 1.
/// * `softcap` - `Some(c)` with `c > 0` applies `c * tanh(s / c)`.
///
/// Returns `(total_q, num_heads_q, head_size_v)`; rows in no sequence are zero. On the CPU the
/// caches are read in place (the rows that `mm_prefix_ranges` extends are computed again over
/// exactly their keys). CUDA tensors (with the `cuda` feature) go to candle-flash-attn's paged
/// kernel when `page_block_size` is a multiple of 32 (its requirement); otherwise each
/// sequence's pages are gathered and go to its varlen kernel, which has no `mm_prefix_ranges`.
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
    #[cfg(feature = "cuda")]
    if q.device().is_cuda() {
        return crate::cuda::varlen_paged(
            q,
            k,
            v,
            seqlens_q,
            seqlens_k,
            block_table,
            mm_prefix_ranges,
            max_seqlen_q,
            max_seqlen_k,
            softmax_scale,
            window_size_left,
            window_size_right,
            page_block_size,
            softcap,
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
            mm_prefix_ranges: mm_prefix_ranges.cloned(),
        },
    )
}
