//! Helpers shared by the 8-bit cache tests: deterministic values and the append's quantization
//! rule written from anyattn.h. Each test crate uses a subset of them.
#![allow(dead_code)]

use anyattn::Quantized;

/// Deterministic values in about [-3, 3), with one large outlier every 29 values.
pub fn values(n: usize, seed: f32) -> Vec<f32> {
    (0..n)
        .map(|i| (i as f32 * 0.731 + seed).sin() * 3.0 + if i % 29 == 0 { 40.0 } else { 0.0 })
        .collect()
}

/// The append's rule for one row with token scales, as anyattn.h states it: (stored,
/// token_scale). Quotients in f64, clamped to ±2 QMAX, rounded to f32, then quantized.
pub fn quantize_row<C: Quantized>(x: &[f32], descale: f32) -> (Vec<C>, f32) {
    let qmax = f64::from(C::QMAX);
    let amax = x
        .iter()
        .filter(|v| v.is_finite())
        .fold(0f64, |m, v| m.max(f64::from(v.abs())));
    let token = (amax / (qmax * f64::from(descale))).min(f64::from(f32::MAX)) as f32;
    let divisor = f64::from(descale) * f64::from(token);
    let stored = x
        .iter()
        .map(|&v| {
            if token == 0.0 {
                C::quantize(0.0)
            } else {
                C::quantize((f64::from(v) / divisor).clamp(-2.0 * qmax, 2.0 * qmax) as f32)
            }
        })
        .collect();
    (stored, token)
}

/// The append's rule for one row without token scales: `Q(x / descale)`, the quotient formed
/// in f64 and clamped to ±2 QMAX.
pub fn quantize_row_by_descale<C: Quantized>(x: &[f32], descale: f32) -> Vec<C> {
    let qmax = f64::from(C::QMAX);
    x.iter()
        .map(|&v| {
            let quotient = f64::from(v) / f64::from(descale);
            C::quantize(quotient.clamp(-2.0 * qmax, 2.0 * qmax) as f32)
        })
        .collect()
}
