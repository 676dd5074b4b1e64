//! The safe API against a plain reference written here: strided views, every option, the
//! log-sum-exp, varlen, instruction-set paths, threads and errors.

use anyattn::{
    bf16, bwd, fwd, fwd_varlen, Dropout, FwdOptions, Isa, Precision, Status, VarlenSeqs, View,
    ViewMut,
};

/// A small deterministic generator (64-bit LCG) of values in [-1, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// Problem description for the reference. Tensors are addressed through (offset, strides).
#[derive(Clone, Copy)]
struct Dims {
    b: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hk: usize,
    d: usize,
    dv: usize,
}

struct Extras<'a> {
    scale: f64,
    softcap: Option<f64>,
    window: (Option<usize>, Option<usize>),
    alibi: Option<&'a [f32]>,
    sinks: Option<&'a [f32]>,
}

/// Plain attention on contiguous `(B, S, H, D)` arrays, every intermediate rounded by `R`: f64 for
/// the oracle, f32 for the naive same-dtype baseline. Returns (out (B, Sq, Hq, Dv),
/// lse (B, Hq, Sq)).
fn reference<R: Round>(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: Dims,
    e: &Extras,
) -> (Vec<f64>, Vec<f64>) {
    let r = R::round;
    let mut out = vec![0f64; n.b * n.sq * n.hq * n.dv];
    let mut lse = vec![0f64; n.b * n.hq * n.sq];
    for b in 0..n.b {
        for h in 0..n.hq {
            let hk = h / (n.hq / n.hk);
            let slope = e.alibi.map(|a| {
                if a.len() == n.hq {
                    a[h] as f64
                } else {
                    a[b * n.hq + h] as f64
                }
            });
            for i in 0..n.sq {
                let diag = i as i64 + n.sk as i64 - n.sq as i64;
                let mut s = vec![None; n.sk];
                for (j, sj) in s.iter_mut().enumerate() {
                    let j64 = j as i64;
                    let left_ok = e.window.0.map_or(true, |w| j64 >= diag - w as i64);
                    let right_ok = e.window.1.map_or(true, |w| j64 <= diag + w as i64);
                    if !(left_ok && right_ok) {
                        continue;
                    }
                    let mut acc = 0f64;
                    for d in 0..n.d {
                        let x = q[((b * n.sq + i) * n.hq + h) * n.d + d] as f64;
                        let y = k[((b * n.sk + j) * n.hk + hk) * n.d + d] as f64;
                        acc = r(acc + r(x * y));
                    }
                    let mut x = r(acc * r(e.scale));
                    if let Some(c) = e.softcap {
                        x = r(c * r(r(x / c).tanh()));
                    }
                    if let Some(sl) = slope {
                        x = r(x - r(sl * (diag - j64).abs() as f64));
                    }
                    *sj = Some(x);
                }
                let sink = e.sinks.map(|s| s[h] as f64);
                let m = s
                    .iter()
                    .flatten()
                    .copied()
                    .chain(sink)
                    .fold(f64::NEG_INFINITY, f64::max);
                let row = ((b * n.hq + h) * n.sq) + i;
                if m == f64::NEG_INFINITY {
                    lse[row] = f64::NEG_INFINITY;
                    continue;
                }
                let p: Vec<Option<f64>> = s.iter().map(|x| x.map(|x| r(r(x - m).exp()))).collect();
                let mut den = sink.map_or(0.0, |x| r(r(x - m).exp()));
                for x in p.iter().flatten() {
                    den = r(den + x);
                }
                lse[row] = r(m + r(den.ln()));
                for dd in 0..n.dv {
                    let mut o = 0f64;
                    for (j, pj) in p.iter().enumerate() {
                        if let Some(x) = pj {
                            o = r(o + r(x * v[((b * n.sk + j) * n.hk + hk) * n.dv + dd] as f64));
                        }
                    }
                    out[((b * n.sq + i) * n.hq + h) * n.dv + dd] = r(o / den);
                }
            }
        }
    }
    (out, lse)
}

/// The precision the reference computes in.
trait Round {
    fn round(x: f64) -> f64;
}

impl Round for f64 {
    fn round(x: f64) -> f64 {
        x
    }
}

impl Round for f32 {
    fn round(x: f64) -> f64 {
        x as f32 as f64
    }
}

fn max_err(a: &[f64], b: &[f64]) -> (f64, usize) {
    let mut worst = (0f64, 0usize);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let err = if x == y { 0.0 } else { (x - y).abs() };
        let err = if err.is_nan() { f64::INFINITY } else { err };
        if err > worst.0 {
            worst = (err, i);
        }
    }
    worst
}

/// flash-attn's acceptance rule: `max|got - oracle| <= 2 max|naive - oracle| + eps`.
fn assert_close(what: &str, got: &[f64], oracle: &[f64], naive: &[f64], eps: f64) {
    let (err, at) = max_err(got, oracle);
    let (base, _) = max_err(naive, oracle);
    assert!(
        err <= 2.0 * base + eps,
        "{what}: max error {err:e} at {at} (got {}, oracle {}), naive error {base:e}",
        got[at],
        oracle[at]
    );
}

const EPS_F32: f64 = 1e-5;

fn run_dense(n: Dims, e: &Extras, opts: &FwdOptions, seed: u64) {
    let mut rng = Rng(seed);
    let q = rng.vec(n.b * n.sq * n.hq * n.d);
    let k = rng.vec(n.b * n.sk * n.hk * n.d);
    let v = rng.vec(n.b * n.sk * n.hk * n.dv);
    let mut out = vec![f32::NAN; n.b * n.sq * n.hq * n.dv];
    let mut lse = vec![f32::NAN; n.b * n.hq * n.sq];
    fwd(
        &View::contiguous(&q, &[n.b, n.sq, n.hq, n.d]).unwrap(),
        &View::contiguous(&k, &[n.b, n.sk, n.hk, n.d]).unwrap(),
        &View::contiguous(&v, &[n.b, n.sk, n.hk, n.dv]).unwrap(),
        &mut ViewMut::contiguous(&mut out, &[n.b, n.sq, n.hq, n.dv]).unwrap(),
        Some(&mut ViewMut::contiguous(&mut lse, &[n.b, n.hq, n.sq]).unwrap()),
        opts,
    )
    .unwrap();
    let (o64, l64) = reference::<f64>(&q, &k, &v, n, e);
    let (o32, l32) = reference::<f32>(&q, &k, &v, n, e);
    let out: Vec<f64> = out.iter().map(|&x| x as f64).collect();
    let lse: Vec<f64> = lse.iter().map(|&x| x as f64).collect();
    assert_close("out", &out, &o64, &o32, EPS_F32);
    assert_close("lse", &lse, &l64, &l32, EPS_F32);
}

const GQA: Dims = Dims {
    b: 2,
    sq: 19,
    sk: 33,
    hq: 4,
    hk: 2,
    d: 24,
    dv: 16,
};

fn plain(scale: f64) -> Extras<'static> {
    Extras {
        scale,
        softcap: None,
        window: (None, None),
        alibi: None,
        sinks: None,
    }
}

#[test]
fn dense_default_scale_gqa_and_dv() {
    run_dense(GQA, &plain(1.0 / (24f64).sqrt()), &FwdOptions::default(), 1);
}

#[test]
fn dense_causal_with_more_queries_than_keys() {
    let n = Dims {
        sq: 40,
        sk: 23,
        ..GQA
    };
    let e = Extras {
        window: (None, Some(0)),
        ..plain(0.3)
    };
    let opts = FwdOptions {
        softmax_scale: Some(0.3),
        causal: true,
        ..Default::default()
    };
    run_dense(n, &e, &opts, 2);
}

#[test]
fn dense_window_softcap_alibi_sinks() {
    let slopes: Vec<f32> = (0..GQA.b * GQA.hq).map(|i| 0.05 * (i + 1) as f32).collect();
    let sinks = [0.5f32, -1.0, 2.0, 0.0];
    let e = Extras {
        scale: 1.5,
        softcap: Some(3.0),
        window: (Some(6), Some(2)),
        alibi: Some(&slopes),
        sinks: Some(&sinks),
    };
    let opts = FwdOptions {
        softmax_scale: Some(1.5),
        softcap: Some(3.0),
        window_left: Some(6),
        window_right: Some(2),
        alibi_slopes: Some(View::contiguous(&slopes, &[GQA.b, GQA.hq]).unwrap()),
        sinks: Some(View::contiguous(&sinks, &[GQA.hq]).unwrap()),
        ..Default::default()
    };
    run_dense(GQA, &e, &opts, 3);
}

#[test]
fn every_supported_isa_gives_the_reference() {
    let mut ran = 0;
    for isa in Isa::ALL {
        if !isa.is_supported() {
            continue;
        }
        ran += 1;
        let opts = FwdOptions {
            softmax_scale: Some(0.2),
            causal: true,
            isa,
            ..Default::default()
        };
        let e = Extras {
            window: (None, Some(0)),
            ..plain(0.2)
        };
        run_dense(GQA, &e, &opts, 4);
    }
    assert!(ran >= 2, "Auto and Portable are always supported");
    assert!(Isa::Portable.is_supported());
    assert_ne!(Isa::resolved_default(), Isa::Auto);
    assert_eq!(Isa::Avx512.name(), "avx512");
}

#[test]
fn strided_views_in_place() {
    // q, k and v are slices of one packed (B, S, 3, H, D) buffer; out is written into every other
    // row of a larger buffer, and lse is (B, Hq, Sq) with a padded row stride.
    let (b, s, h, d) = (2, 11, 2, 8);
    let mut rng = Rng(5);
    let packed = rng.vec(b * s * 3 * h * d);
    let st = [s * 3 * h * d, 3 * h * d, d, 1];
    let q = View::new(&packed, &[b, s, h, d], &st).unwrap();
    let k = View::new(&packed[h * d..], &[b, s, h, d], &st).unwrap();
    let v = View::new(&packed[2 * h * d..], &[b, s, h, d], &st).unwrap();
    let mut out = vec![7f32; b * 2 * s * h * d];
    let mut lse = vec![7f32; b * h * (s + 3)];
    {
        let mut o =
            ViewMut::new(&mut out, &[b, s, h, d], &[2 * s * h * d, 2 * h * d, d, 1]).unwrap();
        let mut l = ViewMut::new(&mut lse, &[b, h, s], &[h * (s + 3), s + 3, 1]).unwrap();
        fwd(&q, &k, &v, &mut o, Some(&mut l), &FwdOptions::default()).unwrap();
    }
    // The same problem from contiguous copies.
    let mut qc = Vec::new();
    let mut kc = Vec::new();
    let mut vc = Vec::new();
    for bi in 0..b {
        for si in 0..s {
            for part in 0..3 {
                let base = bi * st[0] + si * st[1] + part * h * d;
                [&mut qc, &mut kc, &mut vc][part].extend_from_slice(&packed[base..base + h * d]);
            }
        }
    }
    let mut out_c = vec![0f32; b * s * h * d];
    let mut lse_c = vec![0f32; b * h * s];
    fwd(
        &View::contiguous(&qc, &[b, s, h, d]).unwrap(),
        &View::contiguous(&kc, &[b, s, h, d]).unwrap(),
        &View::contiguous(&vc, &[b, s, h, d]).unwrap(),
        &mut ViewMut::contiguous(&mut out_c, &[b, s, h, d]).unwrap(),
        Some(&mut ViewMut::contiguous(&mut lse_c, &[b, h, s]).unwrap()),
        &FwdOptions::default(),
    )
    .unwrap();
    for bi in 0..b {
        for si in 0..s {
            let got = &out[(bi * 2 * s + 2 * si) * h * d..][..h * d];
            let want = &out_c[(bi * s + si) * h * d..][..h * d];
            assert_eq!(got, want, "row b={bi} s={si}");
            let gap = &out[(bi * 2 * s + 2 * si + 1) * h * d..][..h * d];
            assert!(gap.iter().all(|&x| x == 7.0), "gap row written");
        }
        for hi in 0..h {
            let got = &lse[(bi * h + hi) * (s + 3)..][..s];
            assert_eq!(got, &lse_c[(bi * h + hi) * s..][..s]);
            assert!(lse[(bi * h + hi) * (s + 3) + s..][..3]
                .iter()
                .all(|&x| x == 7.0));
        }
    }
}

/// Dense q, k and v of `n` (batch 1) drawn from `seed` and rounded to bf16.
fn bf16_inputs(n: Dims, seed: u64) -> (Vec<bf16>, Vec<bf16>, Vec<bf16>) {
    let mut rng = Rng(seed);
    let round = |x: Vec<f32>| -> Vec<bf16> { x.into_iter().map(bf16::from_f32).collect() };
    (
        round(rng.vec(n.sq * n.hq * n.d)),
        round(rng.vec(n.sk * n.hk * n.d)),
        round(rng.vec(n.sk * n.hk * n.dv)),
    )
}

/// `fwd` of bf16 inputs of `n` (batch 1) with `opts`, and the f64 reference of the same values.
fn bf16_forward(
    n: Dims,
    qkv: &(Vec<bf16>, Vec<bf16>, Vec<bf16>),
    opts: &FwdOptions,
    scale: f64,
) -> (Vec<bf16>, Vec<f64>) {
    let (q, k, v) = qkv;
    let mut out = vec![bf16::ZERO; n.sq * n.hq * n.dv];
    fwd(
        &View::contiguous(q, &[1, n.sq, n.hq, n.d]).unwrap(),
        &View::contiguous(k, &[1, n.sk, n.hk, n.d]).unwrap(),
        &View::contiguous(v, &[1, n.sk, n.hk, n.dv]).unwrap(),
        &mut ViewMut::contiguous(&mut out, &[1, n.sq, n.hq, n.dv]).unwrap(),
        None,
        opts,
    )
    .unwrap();
    let f = |x: &[bf16]| -> Vec<f32> { x.iter().map(|y| y.to_f32()).collect() };
    let (o64, _) = reference::<f64>(&f(q), &f(k), &f(v), n, &plain(scale));
    (out, o64)
}

#[test]
fn bf16_runs_and_matches_f32_inputs() {
    // bf16 inputs that are exactly representable: the result must match the f32 path on the same
    // values to bf16 output rounding.
    let n = Dims {
        b: 1,
        sq: 9,
        sk: 12,
        hq: 2,
        hk: 1,
        d: 16,
        dv: 16,
    };
    let qkv = bf16_inputs(n, 6);
    let (out, o64) = bf16_forward(n, &qkv, &FwdOptions::default(), 0.25);
    for (i, (got, want)) in out.iter().zip(&o64).enumerate() {
        let err = (got.to_f64() - want).abs();
        // One bf16 rounding of a value below 1 in magnitude: at most 2^-9.
        assert!(err <= 2f64.powi(-9), "index {i}: got {got} want {want}");
    }
}

#[test]
fn bf16_fast_precision_stays_within_two_bf16_roundings() {
    // Precision::Fast may round each probability to bf16 (relative error <= 2^-9 per term, so at
    // most 2^-9 max|v| in out) on top of out's own rounding (2^-9 for |out| < 1): 2^-8 in all,
    // with |v| <= 1. 70 query rows per kv head take the packed path, 131 keys end on an odd key.
    let n = Dims {
        b: 1,
        sq: 70,
        sk: 131,
        hq: 4,
        hk: 1,
        d: 64,
        dv: 64,
    };
    let qkv = bf16_inputs(n, 11);
    assert!(qkv.2.iter().all(|x| x.to_f32().abs() <= 1.0));
    for precision in [Precision::Fast, Precision::Accurate] {
        let opts = FwdOptions {
            precision,
            ..Default::default()
        };
        let (out, o64) = bf16_forward(n, &qkv, &opts, 0.125);
        let bound = if precision == Precision::Fast { 2f64.powi(-8) } else { 2f64.powi(-9) };
        for (i, (got, want)) in out.iter().zip(&o64).enumerate() {
            let err = (got.to_f64() - want).abs();
            assert!(err <= bound, "{precision:?} index {i}: got {got} want {want}");
        }
    }
}

#[test]
fn varlen_matches_per_sequence_reference() {
    let (hq, hk, d) = (4, 2, 8);
    let cu_q = [0i32, 5, 5, 17, 26];
    let cu_k = [0i32, 9, 12, 12, 31];
    let (total_q, total_k) = (26, 31);
    let mut rng = Rng(7);
    let q = rng.vec(total_q * hq * d);
    let k = rng.vec(total_k * hk * d);
    let v = rng.vec(total_k * hk * d);
    let slopes: Vec<f32> = (0..4 * hq).map(|i| 0.1 + 0.01 * i as f32).collect();
    let mut out = vec![f32::NAN; total_q * hq * d];
    let mut lse = vec![f32::NAN; hq * total_q];
    let opts = FwdOptions {
        softmax_scale: Some(0.4),
        window_left: Some(4),
        causal: true,
        alibi_slopes: Some(View::contiguous(&slopes, &[4, hq]).unwrap()),
        ..Default::default()
    };
    fwd_varlen(
        &View::contiguous(&q, &[total_q, hq, d]).unwrap(),
        &View::contiguous(&k, &[total_k, hk, d]).unwrap(),
        &View::contiguous(&v, &[total_k, hk, d]).unwrap(),
        &mut ViewMut::contiguous(&mut out, &[total_q, hq, d]).unwrap(),
        Some(&mut ViewMut::contiguous(&mut lse, &[hq, total_q]).unwrap()),
        &VarlenSeqs {
            cu_seqlens_q: &cu_q,
            cu_seqlens_k: &cu_k,
            max_seqlen_q: 12,
            max_seqlen_k: 19,
            seqused_k: None,
        },
        &opts,
    )
    .unwrap();
    for bidx in 0..4 {
        let (q0, q1) = (cu_q[bidx] as usize, cu_q[bidx + 1] as usize);
        let (k0, k1) = (cu_k[bidx] as usize, cu_k[bidx + 1] as usize);
        let n = Dims {
            b: 1,
            sq: q1 - q0,
            sk: k1 - k0,
            hq,
            hk,
            d,
            dv: d,
        };
        let e = Extras {
            window: (Some(4), Some(0)),
            alibi: Some(&slopes[bidx * hq..(bidx + 1) * hq]),
            ..plain(0.4)
        };
        let qs = &q[q0 * hq * d..q1 * hq * d];
        let ks = &k[k0 * hk * d..k1 * hk * d];
        let vs = &v[k0 * hk * d..k1 * hk * d];
        let (o64, l64) = reference::<f64>(qs, ks, vs, n, &e);
        let (o32, l32) = reference::<f32>(qs, ks, vs, n, &e);
        let got: Vec<f64> = out[q0 * hq * d..q1 * hq * d]
            .iter()
            .map(|&x| x as f64)
            .collect();
        assert_close(
            &format!("varlen out, sequence {bidx}"),
            &got,
            &o64,
            &o32,
            EPS_F32,
        );
        let mut got_lse = Vec::new();
        for h in 0..hq {
            got_lse.extend(
                lse[h * total_q + q0..h * total_q + q1]
                    .iter()
                    .map(|&x| x as f64),
            );
        }
        assert_close(
            &format!("varlen lse, sequence {bidx}"),
            &got_lse,
            &l64,
            &l32,
            EPS_F32,
        );
    }
}

#[test]
fn views_that_do_not_fit_are_rejected() {
    let data = [0f32; 10];
    assert!(View::new(&data, &[2, 3], &[5, 2]).is_ok());
    let e = View::new(&data, &[2, 3], &[6, 2]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(
        e.message()
            .contains("reaches element 10, but the slice holds 10"),
        "{e}"
    );
    let e = View::contiguous(&data, &[11]).unwrap_err();
    assert!(
        e.message()
            .contains("reaches element 10, but the slice holds 10"),
        "{e}"
    );
    let e = View::new(&data, &[1, 1, 1, 1, 1], &[1, 1, 1, 1, 1]).unwrap_err();
    assert!(e.message().contains("rank 5"), "{e}");
    // An empty view fits anywhere.
    assert!(View::new(&data[..0], &[0, 4], &[4, 1]).is_ok());
    let mut buf = [0f32; 16];
    let e = ViewMut::new(&mut buf, &[4, 4], &[1, 1]).unwrap_err();
    assert!(e.message().contains("addresses some elements twice"), "{e}");
    assert!(ViewMut::new(&mut buf, &[4, 4], &[1, 4]).is_ok());
}

#[test]
fn library_errors_carry_its_message() {
    let q = [0f32; 2 * 577];
    let mut out = [0f32; 2 * 577];
    let view = View::contiguous(&q, &[1, 2, 1, 577]).unwrap();
    let e = fwd(
        &view,
        &view,
        &view,
        &mut ViewMut::contiguous(&mut out, &[1, 2, 1, 577]).unwrap(),
        None,
        &FwdOptions::default(),
    )
    .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(
        e.message()
            .contains("q.shape[3] (head dim D) is 577; supported: 0..576"),
        "message should name the tensor, the value and what is supported: {e}"
    );
    assert!(e.to_string().starts_with("ANYATTN_E_INVALID_ARGUMENT: "));
    assert_eq!(out, [0f32; 2 * 577], "nothing written on error");

    let small = [0f32; 8];
    let mut o = [0f32; 8];
    let v8 = View::contiguous(&small, &[1, 1, 1, 8]).unwrap();
    let e = fwd(
        &v8,
        &v8,
        &v8,
        &mut ViewMut::contiguous(&mut o, &[1, 1, 1, 8]).unwrap(),
        None,
        &FwdOptions {
            dropout: Some(Dropout {
                p: 1.5,
                seed: 1,
                offset: 0,
            }),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().contains("dropout_p"), "{e}");

    let e = fwd(
        &v8,
        &v8,
        &v8,
        &mut ViewMut::contiguous(&mut o, &[1, 1, 1, 8]).unwrap(),
        None,
        &FwdOptions {
            softmax_scale: Some(0.0),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(e.message().starts_with("softmax_scale: 0 given"), "{e}");
}

#[test]
fn varlen_argument_errors() {
    let q = [0f32; 6 * 8];
    let mut out = [0f32; 6 * 8];
    let view = View::contiguous(&q, &[6, 1, 8]).unwrap();
    let mut run = |cu_q: &[i32], cu_k: &[i32], max_q: usize| {
        fwd_varlen(
            &view,
            &view,
            &view,
            &mut ViewMut::contiguous(&mut out, &[6, 1, 8]).unwrap(),
            None,
            &VarlenSeqs {
                cu_seqlens_q: cu_q,
                cu_seqlens_k: cu_k,
                max_seqlen_q: max_q,
                max_seqlen_k: 6,
                seqused_k: None,
            },
            &FwdOptions::default(),
        )
        .unwrap_err()
        .to_string()
    };
    assert!(run(&[0, 4, 2], &[0, 3, 6], 6).contains("non-decreasing"));
    assert!(run(&[0, 4, 7], &[0, 3, 6], 6).contains("exceeds the 6 packed rows"));
    assert!(run(&[0, 6], &[0, 3, 6], 6).contains("both must be B + 1"));
    assert!(run(&[0, 4, 6], &[0, 3, 6], 3).contains("max_seqlen_q: 3 given, but sequence 0 has 4"));
    assert!(run(&[0], &[0], 3).contains("supported B + 1 >= 2"));
    assert!(run(&[-1, 6], &[0, 6], 6).contains("must be >= 0"));
}

#[test]
fn thread_control_round_trips() {
    anyattn::set_num_threads(3);
    assert_eq!(anyattn::num_threads(), 3);
    anyattn::set_num_threads(0);
    assert!(anyattn::num_threads() >= 1);
    let (major, minor, patch) = anyattn::version();
    assert_eq!(
        anyattn::version_string(),
        format!("{major}.{minor}.{patch}")
    );
}

#[test]
fn backward_with_a_single_key_is_exact() {
    // With one key every softmax weight is 1: out_i = v_0, so dL/dv_0 = sum of dout over the
    // queries and the query heads of the group, and dq = dk = 0 exactly.
    let (b, sq, hq, hk, d) = (2, 5, 4, 2, 8);
    let mut rng = Rng(11);
    let q = rng.vec(b * sq * hq * d);
    let k = rng.vec(b * hk * d);
    let v = rng.vec(b * hk * d);
    let dout = rng.vec(b * sq * hq * d);
    let mut out = vec![0f32; b * sq * hq * d];
    let mut lse = vec![0f32; b * hq * sq];
    let (qv, kv, vv) = (
        View::contiguous(&q, &[b, sq, hq, d]).unwrap(),
        View::contiguous(&k, &[b, 1, hk, d]).unwrap(),
        View::contiguous(&v, &[b, 1, hk, d]).unwrap(),
    );
    let opts = FwdOptions::default();
    fwd(
        &qv,
        &kv,
        &vv,
        &mut ViewMut::contiguous(&mut out, &[b, sq, hq, d]).unwrap(),
        Some(&mut ViewMut::contiguous(&mut lse, &[b, hq, sq]).unwrap()),
        &opts,
    )
    .unwrap();
    let mut dq = vec![f32::NAN; q.len()];
    let mut dk = vec![f32::NAN; k.len()];
    let mut dv = vec![f32::NAN; v.len()];
    bwd(
        &View::contiguous(&dout, &[b, sq, hq, d]).unwrap(),
        &qv,
        &kv,
        &vv,
        &View::contiguous(&out, &[b, sq, hq, d]).unwrap(),
        &View::contiguous(&lse, &[b, hq, sq]).unwrap(),
        &mut ViewMut::contiguous(&mut dq, &[b, sq, hq, d]).unwrap(),
        &mut ViewMut::contiguous(&mut dk, &[b, 1, hk, d]).unwrap(),
        &mut ViewMut::contiguous(&mut dv, &[b, 1, hk, d]).unwrap(),
        None,
        &opts,
    )
    .unwrap();
    assert!(dq.iter().all(|&x| x.abs() < 1e-6), "dq must vanish: {dq:?}");
    assert!(dk.iter().all(|&x| x.abs() < 1e-6), "dk must vanish: {dk:?}");
    let group = hq / hk;
    for bi in 0..b {
        for g in 0..hk {
            for dd in 0..d {
                let mut want = 0f64;
                for i in 0..sq {
                    for h in g * group..(g + 1) * group {
                        want += dout[((bi * sq + i) * hq + h) * d + dd] as f64;
                    }
                }
                let got = dv[(bi * hk + g) * d + dd] as f64;
                assert!(
                    (got - want).abs() < 1e-5,
                    "dv[{bi}, {g}, {dd}] = {got}, want {want}"
                );
            }
        }
    }
}
