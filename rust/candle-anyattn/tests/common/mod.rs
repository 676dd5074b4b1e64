//! A plain candle implementation of attention (matmul + softmax + matmul with explicit masks,
//! bottom-right aligned) and flash-attn's acceptance rule, shared by the integration tests.
#![allow(dead_code)]

use candle_core::{DType, Device, Result, Tensor, D};

/// Everything that changes the result besides q, k and v.
#[derive(Clone, Default)]
pub struct Spec {
    pub scale: f32,
    pub window_left: Option<usize>,
    pub window_right: Option<usize>,
    pub softcap: Option<f32>,
    /// (Hq) or (B, Hq) slopes.
    pub alibi: Option<Vec<f32>>,
    /// (Hq) sink logits.
    pub sinks: Option<Vec<f32>>,
    /// candle-flash-attn's `mm_prefix_ranges`, per batch entry (dense) or sequence (varlen):
    /// half-open key position ranges `[start, end)`; a query whose position (its diagonal
    /// `i + Sk - Sq`) lies in a range also sees every key of that range.
    pub prefix_ranges: Vec<Vec<(i64, i64)>>,
}

/// Plain attention computed in `dtype` on `(B, S, H, D)` tensors; returns `(B, Sq, Hq, Dv)` in
/// `dtype`. Rows that see no key (and have no sink) are zero.
pub fn naive(q: &Tensor, k: &Tensor, v: &Tensor, spec: &Spec, dtype: DType) -> Result<Tensor> {
    let (b, sq, hq, _) = q.dims4()?;
    let (_, sk, hk, _) = k.dims4()?;
    let group = hq / hk;
    let q = q.to_dtype(dtype)?.transpose(1, 2)?.contiguous()?;
    let expand = |t: &Tensor| -> Result<Tensor> {
        let t = t.to_dtype(dtype)?.transpose(1, 2)?;
        let (b, h, s, d) = t.dims4()?;
        t.unsqueeze(2)?
            .expand((b, h, group, s, d))?
            .reshape((b, h * group, s, d))
    };
    let k = expand(k)?;
    let v = expand(v)?;
    let mut s = (q.matmul(&k.t()?.contiguous()?)? * spec.scale as f64)?;
    if let Some(c) = spec.softcap {
        s = ((s / c as f64)?.tanh()? * c as f64)?;
    }

    // Additive bias (ALiBi and the mask) and the visibility of each row, built on the host.
    let mut bias = vec![0f32; b * hq * sq * sk];
    let mut row_visible = vec![0u8; b * hq * sq];
    for bi in 0..b {
        for h in 0..hq {
            let slope = spec
                .alibi
                .as_ref()
                .map(|a| if a.len() == hq { a[h] } else { a[bi * hq + h] });
            for i in 0..sq {
                let diag = i as i64 + sk as i64 - sq as i64;
                for j in 0..sk {
                    let j64 = j as i64;
                    let left = spec.window_left.is_none_or(|w| j64 >= diag - w as i64);
                    let right = spec.window_right.is_none_or(|w| j64 <= diag + w as i64);
                    let prefix = spec.prefix_ranges.get(bi).is_some_and(|ranges| {
                        ranges
                            .iter()
                            .any(|&(s, e)| s <= diag && diag < e && s <= j64 && j64 < e)
                    });
                    let idx = ((bi * hq + h) * sq + i) * sk + j;
                    if (left && right) || prefix {
                        bias[idx] = slope.map_or(0.0, |sl| -sl * (diag - j64).abs() as f32);
                        row_visible[(bi * hq + h) * sq + i] = 1;
                    } else {
                        bias[idx] = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
    let dev = &Device::Cpu;
    let bias = Tensor::from_vec(bias, (b, hq, sq, sk), dev)?.to_dtype(dtype)?;
    let s = (s + bias)?;
    let s = match &spec.sinks {
        Some(sinks) => {
            let col = Tensor::from_slice(sinks, (1, hq, 1, 1), dev)?
                .to_dtype(dtype)?
                .broadcast_as((b, hq, sq, 1))?;
            Tensor::cat(&[&s, &col], 3)?
        }
        None => s,
    };
    let max = s.max_keepdim(D::Minus1)?;
    let e = s.broadcast_sub(&max)?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    let p = p.narrow(3, 0, sk)?;
    let out = p.matmul(&v.contiguous()?)?;
    let out = if spec.sinks.is_some() {
        out
    } else {
        // Fully masked rows are 0/0 above; the contract makes them zero.
        let keep = Tensor::from_vec(row_visible, (b, hq, sq, 1), dev)?.broadcast_as(out.shape())?;
        keep.where_cond(&out, &out.zeros_like()?)?
    };
    out.transpose(1, 2)?.contiguous()
}

/// Plain varlen attention: the dense reference applied to each sequence, concatenated.
pub fn naive_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_q: &[usize],
    cu_k: &[usize],
    spec: &Spec,
    dtype: DType,
) -> Result<Tensor> {
    let (total_q, hq, _) = q.dims3()?;
    let dv = v.dim(2)?;
    let mut parts = Vec::new();
    for bi in 0..cu_q.len() - 1 {
        let (q0, lq) = (cu_q[bi], cu_q[bi + 1] - cu_q[bi]);
        let (k0, lk) = (cu_k[bi], cu_k[bi + 1] - cu_k[bi]);
        if lq == 0 {
            continue;
        }
        let mut s = spec.clone();
        s.prefix_ranges = spec.prefix_ranges.get(bi).into_iter().cloned().collect();
        if let Some(a) = &spec.alibi {
            if a.len() != hq {
                s.alibi = Some(a[bi * hq..(bi + 1) * hq].to_vec());
            }
        }
        let out = if lk == 0 {
            Tensor::zeros((1, lq, hq, dv), dtype, &Device::Cpu)?
        } else {
            naive(
                &q.narrow(0, q0, lq)?.unsqueeze(0)?,
                &k.narrow(0, k0, lk)?.unsqueeze(0)?,
                &v.narrow(0, k0, lk)?.unsqueeze(0)?,
                &s,
                dtype,
            )?
        };
        parts.push(out.squeeze(0)?);
    }
    let covered = *cu_q.last().unwrap();
    if covered < total_q {
        parts.push(Tensor::zeros(
            (total_q - covered, hq, dv),
            dtype,
            &Device::Cpu,
        )?);
    }
    Tensor::cat(&parts, 0)
}

/// `max |a - b|` over all elements (f64); NaN counts as infinite.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    let a = a.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let b = b.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    assert_eq!(a.len(), b.len());
    Ok(a.iter()
        .zip(&b)
        .map(|(x, y)| {
            let d = (x - y).abs();
            if d.is_nan() {
                f64::INFINITY
            } else {
                d
            }
        })
        .fold(0.0, f64::max))
}

/// The absolute slack added to flash-attn's rule.
pub fn eps(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        _ => 1e-3,
    }
}

/// flash-attn's acceptance rule: `max|got - ref64| <= 2 max|naive_same_dtype - ref64| + eps`,
/// where ref64 is the plain computation in f64 on the same (already rounded) inputs.
pub fn check(what: &str, got: &Tensor, ref64: &Tensor, naive_same: &Tensor) {
    assert_eq!(got.dims(), ref64.dims(), "{what}: shape");
    let err = max_abs_diff(got, ref64).unwrap();
    let base = max_abs_diff(naive_same, ref64).unwrap();
    let bound = 2.0 * base + eps(got.dtype());
    assert!(
        err <= bound,
        "{what} ({:?}): max error {err:e} > bound {bound:e} (naive error {base:e})",
        got.dtype()
    );
}

/// Deterministic random `(dims)` tensor in `dtype`, values ~ N(0, 1).
pub fn randn(seed: u64, dims: &[usize], dtype: DType) -> Tensor {
    let n: usize = dims.iter().product();
    let mut state = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let data: Vec<f32> = (0..n)
        .map(|_| {
            let (u1, u2) = (uniform(), uniform());
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
        })
        .collect();
    Tensor::from_vec(data, dims, &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}
