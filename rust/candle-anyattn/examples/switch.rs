//! A candle attention layer that used candle-flash-attn, now running on the CPU.
//!
//! The only change from the candle-flash-attn version of this program is the `use` line below,
//! which read `use candle_flash_attn::flash_attn;`. Everything else (arguments, the
//! (batch, seq_len, num_heads, head_size) layout, the result) is unchanged. On the CPU,
//! candle-flash-attn fails with "no cpu support for flash-attn"; candle-anyattn computes the same
//! attention with anyattn's kernels.
//!
//! Run with `cargo run --release --example switch` in `rust/`.

use candle_anyattn::flash_attn;
use candle_core::{DType, Device, Result, Tensor};

/// Causal grouped-query self-attention over `x` of shape (batch, seq_len, hidden).
fn attention(x: &Tensor, wq: &Tensor, wk: &Tensor, wv: &Tensor, head_dim: usize) -> Result<Tensor> {
    let (b, s, _) = x.dims3()?;
    let q = x.broadcast_matmul(wq)?.reshape((b, s, (), head_dim))?;
    let k = x.broadcast_matmul(wk)?.reshape((b, s, (), head_dim))?;
    let v = x.broadcast_matmul(wv)?.reshape((b, s, (), head_dim))?;
    let softmax_scale = 1.0 / (head_dim as f32).sqrt();
    let out = flash_attn(&q, &k, &v, softmax_scale, true)?;
    out.reshape((b, s, ()))
}

fn main() -> Result<()> {
    let dev = Device::Cpu;
    let (batch, seq_len, hidden, head_dim, kv_heads) = (2, 512, 1024, 64, 4);
    let dtype = DType::BF16;
    let x = Tensor::randn(0f32, 1.0, (batch, seq_len, hidden), &dev)?.to_dtype(dtype)?;
    let init = |cols: usize| -> Result<Tensor> {
        (Tensor::randn(0f32, 1.0, (hidden, cols), &dev)? / (hidden as f64).sqrt())?.to_dtype(dtype)
    };
    let (wq, wk, wv) = (
        init(hidden)?,
        init(kv_heads * head_dim)?,
        init(kv_heads * head_dim)?,
    );

    let start = std::time::Instant::now();
    let y = attention(&x, &wq, &wk, &wv, head_dim)?;
    println!(
        "attention output {:?} {:?} in {:.1} ms on {} anyattn threads ({})",
        y.dims(),
        y.dtype(),
        start.elapsed().as_secs_f64() * 1e3,
        anyattn::num_threads(),
        anyattn::Isa::resolved_default().name(),
    );
    let mean = y
        .to_dtype(DType::F32)?
        .abs()?
        .mean_all()?
        .to_scalar::<f32>()?;
    println!("mean |y| = {mean:.4}");
    Ok(())
}
