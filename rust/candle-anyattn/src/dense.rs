//! The dense functions: candle-flash-attn's `flash_attn*` (same names, arguments and
//! `(batch, seq_len, num_heads, head_size)` layout) and the sinks extension.

use candle_core::{Result, Tensor};

use crate::ops::{FlashAttn, FlashAttnSinks};

/// `(window_size_left, window_size_right)` of a causal (or unmasked) call.
pub(crate) fn causal_window(causal: bool) -> (Option<usize>, Option<usize>) {
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
