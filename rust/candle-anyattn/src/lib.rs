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
//! - More is accepted: f32 as well as f16/bf16; any head size from 1 to 512, and up to 576 for
//!   `q` and `k` (not only multiples of 8); `v` with a head size different from `q`'s; ALiBi slopes of shape
//!   `(num_heads_q)` or `(batch, num_heads_q)`; tensors whose last dimension is not contiguous
//!   (copied first; every other stride is used in place).
//! - A `None` window side is exactly unbounded. flash-attn's CUDA kernels replace it by
//!   `seqlen_k` when the other side is bounded, which differs only when `seq_len_q > seq_len_k`.
//! - `max_seqlen_q`/`max_seqlen_k` of the varlen functions are checked against the sequences.
//! - [`flash_attn_varlen_paged_windowed`] takes any `page_block_size >= 1` (candle-flash-attn:
//!   multiples of 32).
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

mod cpu;
mod cuda;
mod dense;
mod indices;
mod mm_prefix;
mod ops;
mod varlen;

pub use dense::{
    flash_attn, flash_attn_alibi, flash_attn_alibi_windowed, flash_attn_alibi_windowed_softcap,
    flash_attn_sinks, flash_attn_windowed,
};
pub use ops::{FlashAttn, FlashAttnSinks, FlashAttnVarLen, FlashAttnVarLenPaged};
pub use varlen::{
    flash_attn_varlen, flash_attn_varlen_alibi, flash_attn_varlen_alibi_windowed,
    flash_attn_varlen_alibi_windowed_softcap, flash_attn_varlen_paged_windowed,
    flash_attn_varlen_sinks, flash_attn_varlen_windowed,
};
