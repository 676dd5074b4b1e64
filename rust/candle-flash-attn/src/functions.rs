//! candle-flash-attn 0.11.1's functions, same names and signatures: each checks that the tensors
//! are on the CPU, then runs candle-anyattn's function of the same name.

use candle_core::{bail, Result, Tensor};

/// This crate only has CPU kernels; other devices get an error that says what to do.
fn cpu_only(function: &str, q: &Tensor) -> Result<()> {
    if !q.device().is_cpu() {
        bail!(
            "candle_flash_attn::{function} (anyattn, CPU only): q is on {:?}; this \
             candle-flash-attn is anyattn's CPU replacement (a [patch.crates-io] entry), which has \
             no CUDA or Metal kernels. Move the tensors to the CPU, or remove the [patch] to run \
             candle-flash-attn's CUDA kernels",
            q.device().location()
        )
    }
    Ok(())
}

/// Flash attention over `(batch, seq_len, num_heads, head_size)` tensors, optionally causal (bottom-right aligned).
///
/// CPU tensors only; see `candle_anyattn::flash_attn` for the shapes and semantics.
pub fn flash_attn(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    cpu_only("flash_attn", q)?;
    candle_anyattn::flash_attn(q, k, v, softmax_scale, causal)
}

/// [`flash_attn`] with a sliding window (`None` = unbounded; `(None, Some(0))` = causal).
///
/// CPU tensors only; see `candle_anyattn::flash_attn_windowed` for the shapes and semantics.
pub fn flash_attn_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    cpu_only("flash_attn_windowed", q)?;
    candle_anyattn::flash_attn_windowed(q, k, v, softmax_scale, window_size_left, window_size_right)
}

/// [`flash_attn`] with ALiBi slopes (f32, `(num_heads_q)`).
///
/// CPU tensors only; see `candle_anyattn::flash_attn_alibi` for the shapes and semantics.
pub fn flash_attn_alibi(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    cpu_only("flash_attn_alibi", q)?;
    candle_anyattn::flash_attn_alibi(q, k, v, alibi_slopes, softmax_scale, causal)
}

/// [`flash_attn`] with ALiBi and a sliding window.
///
/// CPU tensors only; see `candle_anyattn::flash_attn_alibi_windowed` for the shapes and semantics.
pub fn flash_attn_alibi_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    cpu_only("flash_attn_alibi_windowed", q)?;
    candle_anyattn::flash_attn_alibi_windowed(
        q,
        k,
        v,
        alibi_slopes,
        softmax_scale,
        window_size_left,
        window_size_right,
    )
}

/// [`flash_attn`] with optional ALiBi, a sliding window and a softcap (`softcap <= 0` = off).
///
/// CPU tensors only; see `candle_anyattn::flash_attn_alibi_windowed_softcap` for the shapes and semantics.
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
    cpu_only("flash_attn_alibi_windowed_softcap", q)?;
    candle_anyattn::flash_attn_alibi_windowed_softcap(
        q,
        k,
        v,
        alibi_slopes,
        softmax_scale,
        window_size_left,
        window_size_right,
        softcap,
    )
}

/// Flash attention over variable-length sequences packed as `(total, num_heads, head_size)`, split by `batch + 1` cumulative offsets.
///
/// CPU tensors only; see `candle_anyattn::flash_attn_varlen` for the shapes and semantics.
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
    cpu_only("flash_attn_varlen", q)?;
    candle_anyattn::flash_attn_varlen(
        q,
        k,
        v,
        seqlens_q,
        seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        causal,
    )
}

/// [`flash_attn_varlen`] with a sliding window per sequence.
///
/// CPU tensors only; see `candle_anyattn::flash_attn_varlen_windowed` for the shapes and semantics.
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
    cpu_only("flash_attn_varlen_windowed", q)?;
    candle_anyattn::flash_attn_varlen_windowed(
        q,
        k,
        v,
        seqlens_q,
        seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        window_size_left,
        window_size_right,
    )
}

/// Packed variable-length queries against paged key/value caches `(num_blocks, page_block_size, num_heads_kv, head_size)`, with optional `mm_prefix_ranges` `(batch, max_ranges, 2)` that bypass the mask.
///
/// CPU tensors only; see `candle_anyattn::flash_attn_varlen_paged_windowed` for the shapes and semantics.
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
    cpu_only("flash_attn_varlen_paged_windowed", q)?;
    candle_anyattn::flash_attn_varlen_paged_windowed(
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
    )
}

/// [`flash_attn_varlen`] with ALiBi slopes (f32, `(num_heads_q)`).
///
/// CPU tensors only; see `candle_anyattn::flash_attn_varlen_alibi` for the shapes and semantics.
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
    cpu_only("flash_attn_varlen_alibi", q)?;
    candle_anyattn::flash_attn_varlen_alibi(
        q,
        k,
        v,
        alibi_slopes,
        seqlens_q,
        seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        causal,
    )
}

/// [`flash_attn_varlen`] with ALiBi and a sliding window.
///
/// CPU tensors only; see `candle_anyattn::flash_attn_varlen_alibi_windowed` for the shapes and semantics.
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
    cpu_only("flash_attn_varlen_alibi_windowed", q)?;
    candle_anyattn::flash_attn_varlen_alibi_windowed(
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
    )
}

/// [`flash_attn_varlen`] with optional ALiBi, a sliding window and a softcap.
///
/// CPU tensors only; see `candle_anyattn::flash_attn_varlen_alibi_windowed_softcap` for the shapes and semantics.
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
    cpu_only("flash_attn_varlen_alibi_windowed_softcap", q)?;
    candle_anyattn::flash_attn_varlen_alibi_windowed_softcap(
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
    )
}
