//! candle-anyattn against candle-nn's CPU flash attention and the naive candle attention
//! (matmul + softmax + matmul), in the same run.
//!
//! ```text
//! cargo run --release --features bench --example bench -- [--causal] [--heads N] [--reps N]
//! ```
//!
//! Shapes: batch 1, S in {512, 2048, 4096} for both queries and keys, D in {64, 128}, f32 and
//! bf16, `--heads` query and kv heads (default 4). Each time is the median of `--reps` runs
//! (default 3) after one warm-up. GFLOP/s counts `4 * B * H * D * visible pairs`.

use candle_core::{DType, Device, Result, Tensor, D};
use candle_nn::attention::{flash_attn as nn_flash_attn, AttnMask};

fn median_seconds(reps: usize, mut f: impl FnMut() -> Result<Tensor>) -> Result<f64> {
    f()?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = std::time::Instant::now();
        let out = f()?;
        // Make sure the work is done (candle is eager on CPU, this only touches the result).
        let _ = out.dims();
        times.push(start.elapsed().as_secs_f64());
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[times.len() / 2])
}

/// The attention a candle user writes by hand: (B, S, H, D) in, (B, S, H, D) out.
fn naive(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, causal: bool) -> Result<Tensor> {
    let q = q.transpose(1, 2)?.contiguous()?;
    let k = k.transpose(1, 2)?.contiguous()?;
    let v = v.transpose(1, 2)?.contiguous()?;
    let mut s = (q.matmul(&k.t()?)? * scale)?;
    if causal {
        let n = s.dim(D::Minus1)?;
        let mask: Vec<f32> = (0..n * n)
            .map(|i| {
                if i % n > i / n {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let mask = Tensor::from_vec(mask, (n, n), q.device())?.to_dtype(s.dtype())?;
        s = s.broadcast_add(&mask)?;
    }
    let p = candle_nn::ops::softmax_last_dim(&s)?;
    p.matmul(&v)?.transpose(1, 2)?.contiguous()
}

fn candle_nn_flash(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32, causal: bool) -> Result<Tensor> {
    let mask = if causal {
        AttnMask::causal()
    } else {
        AttnMask::None
    };
    match q.dtype() {
        DType::F32 => nn_flash_attn::<f32>(q, k, v, scale, mask, None, None),
        DType::BF16 => nn_flash_attn::<half::bf16>(q, k, v, scale, mask, None, None),
        dt => candle_core::bail!("unsupported dtype {dt:?}"),
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let causal = args.iter().any(|a| a == "--causal");
    let value = |flag: &str, default: usize| -> usize {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let heads = value("--heads", 4);
    let reps = value("--reps", 3);
    let dev = Device::Cpu;
    println!(
        "candle threads {}, anyattn path {}, heads {heads}, causal {causal}, median of {reps}",
        candle_core::utils::get_num_threads(),
        anyattn::Isa::resolved_default().name()
    );
    println!(
        "{:>5} {:>4} {:>5} | {:>10} {:>8} | {:>12} {:>8} | {:>10} {:>8} | {:>9} {:>9}",
        "S",
        "D",
        "dtype",
        "anyattn ms",
        "GFLOP/s",
        "candle-nn ms",
        "GFLOP/s",
        "naive ms",
        "GFLOP/s",
        "x nn",
        "x naive"
    );
    for s in [512usize, 2048, 4096] {
        for d in [64usize, 128] {
            for dtype in [DType::F32, DType::BF16] {
                let shape = (1, s, heads, d);
                let q = Tensor::randn(0f32, 1.0, shape, &dev)?.to_dtype(dtype)?;
                let k = Tensor::randn(0f32, 1.0, shape, &dev)?.to_dtype(dtype)?;
                let v = Tensor::randn(0f32, 1.0, shape, &dev)?.to_dtype(dtype)?;
                let scale = 1.0 / (d as f32).sqrt();
                let pairs = if causal { s * (s + 1) / 2 } else { s * s } as f64;
                let gflop = 4.0 * heads as f64 * d as f64 * pairs / 1e9;
                let t_any = median_seconds(reps, || {
                    candle_anyattn::flash_attn(&q, &k, &v, scale, causal)
                })?;
                let t_nn = median_seconds(reps, || candle_nn_flash(&q, &k, &v, scale, causal))?;
                let t_naive = median_seconds(reps, || naive(&q, &k, &v, scale as f64, causal))?;
                println!(
                    "{s:>5} {d:>4} {:>5} | {:>10.2} {:>8.1} | {:>12.2} {:>8.1} | {:>10.2} {:>8.1} | {:>8.2}x {:>8.2}x",
                    format!("{dtype:?}").to_lowercase(),
                    t_any * 1e3,
                    gflop / t_any,
                    t_nn * 1e3,
                    gflop / t_nn,
                    t_naive * 1e3,
                    gflop / t_naive,
                    t_nn / t_any,
                    t_naive / t_any,
                );
            }
        }
    }
    Ok(())
}
