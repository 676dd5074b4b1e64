//! Every varlen function against the plain candle implementation applied per sequence, for f32
//! and bf16, with GQA, empty sequences, Sq != Sk per sequence and non-contiguous packed inputs.

mod common;

use candle_anyattn as fa;
use candle_core::{DType, Device, Result, Tensor};
use common::{check, naive_varlen, randn, Spec};

const DTYPES: [DType; 2] = [DType::F32, DType::BF16];

/// Sequence 1 has no queries, sequence 2 no keys, the others differ in Sq and Sk.
const CU_Q: [usize; 5] = [0, 7, 7, 19, 43];
const CU_K: [usize; 5] = [0, 11, 20, 20, 38];
const HQ: usize = 4;
const HK: usize = 2;

struct Case {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    seqlens_q: Tensor,
    seqlens_k: Tensor,
}

fn case(seed: u64, dtype: DType, seqlens_dtype: DType) -> Case {
    let (total_q, total_k, d) = (*CU_Q.last().unwrap(), *CU_K.last().unwrap(), 32);
    let to = |cu: &[usize]| {
        let v: Vec<u32> = cu.iter().map(|&x| x as u32).collect();
        Tensor::new(v.as_slice(), &Device::Cpu)
            .unwrap()
            .to_dtype(seqlens_dtype)
            .unwrap()
    };
    Case {
        q: randn(seed, &[total_q, HQ, d], dtype),
        k: randn(seed + 1, &[total_k, HK, d], dtype),
        v: randn(seed + 2, &[total_k, HK, d], dtype),
        seqlens_q: to(&CU_Q),
        seqlens_k: to(&CU_K),
    }
}

fn check_varlen(what: &str, c: &Case, spec: &Spec, f: impl Fn(&Case) -> Result<Tensor>) {
    let got = f(c).unwrap();
    let ref64 = naive_varlen(&c.q, &c.k, &c.v, &CU_Q, &CU_K, spec, DType::F64).unwrap();
    let same = naive_varlen(&c.q, &c.k, &c.v, &CU_Q, &CU_K, spec, c.q.dtype()).unwrap();
    check(what, &got, &ref64, &same);
}

const MAX_Q: usize = 24;
const MAX_K: usize = 18;

#[test]
fn varlen_plain_and_causal() {
    for dtype in DTYPES {
        for seqlens_dtype in [DType::U32, DType::I64] {
            let c = case(100, dtype, seqlens_dtype);
            for causal in [false, true] {
                let spec = Spec {
                    scale: 0.18,
                    window_right: causal.then_some(0),
                    ..Default::default()
                };
                check_varlen(
                    &format!("flash_attn_varlen causal={causal}"),
                    &c,
                    &spec,
                    |c| {
                        fa::flash_attn_varlen(
                            &c.q,
                            &c.k,
                            &c.v,
                            &c.seqlens_q,
                            &c.seqlens_k,
                            MAX_Q,
                            MAX_K,
                            0.18,
                            causal,
                        )
                    },
                );
            }
        }
    }
}

#[test]
fn varlen_windowed() {
    for dtype in DTYPES {
        let c = case(110, dtype, DType::U32);
        for (wl, wr) in [(Some(3), Some(1)), (Some(2), None), (None, Some(0))] {
            let spec = Spec {
                scale: 0.18,
                window_left: wl,
                window_right: wr,
                ..Default::default()
            };
            check_varlen(
                &format!("flash_attn_varlen_windowed ({wl:?}, {wr:?})"),
                &c,
                &spec,
                |c| {
                    fa::flash_attn_varlen_windowed(
                        &c.q,
                        &c.k,
                        &c.v,
                        &c.seqlens_q,
                        &c.seqlens_k,
                        MAX_Q,
                        MAX_K,
                        0.18,
                        wl,
                        wr,
                    )
                },
            );
        }
    }
}

#[test]
fn varlen_alibi_variants() {
    for dtype in DTYPES {
        let c = case(120, dtype, DType::U32);
        let per_head: Vec<f32> = (0..HQ).map(|h| 0.25 / (h + 1) as f32).collect();
        let per_seq: Vec<f32> = (0..4 * HQ).map(|i| 0.02 * (i + 1) as f32).collect();
        let dev = &Device::Cpu;
        for (name, slopes, tensor) in [
            (
                "(Hq)",
                &per_head,
                Tensor::new(per_head.as_slice(), dev).unwrap(),
            ),
            (
                "(B, Hq)",
                &per_seq,
                Tensor::from_slice(&per_seq, (4, HQ), dev).unwrap(),
            ),
        ] {
            for causal in [false, true] {
                let spec = Spec {
                    scale: 0.18,
                    window_right: causal.then_some(0),
                    alibi: Some(slopes.clone()),
                    ..Default::default()
                };
                check_varlen(
                    &format!("flash_attn_varlen_alibi {name} causal={causal}"),
                    &c,
                    &spec,
                    |c| {
                        fa::flash_attn_varlen_alibi(
                            &c.q,
                            &c.k,
                            &c.v,
                            &tensor,
                            &c.seqlens_q,
                            &c.seqlens_k,
                            MAX_Q,
                            MAX_K,
                            0.18,
                            causal,
                        )
                    },
                );
            }
            let spec = Spec {
                scale: 0.18,
                window_left: Some(4),
                window_right: Some(2),
                alibi: Some(slopes.clone()),
                ..Default::default()
            };
            check_varlen(
                &format!("flash_attn_varlen_alibi_windowed {name}"),
                &c,
                &spec,
                |c| {
                    fa::flash_attn_varlen_alibi_windowed(
                        &c.q,
                        &c.k,
                        &c.v,
                        &tensor,
                        &c.seqlens_q,
                        &c.seqlens_k,
                        MAX_Q,
                        MAX_K,
                        0.18,
                        Some(4),
                        Some(2),
                    )
                },
            );
            let spec = Spec {
                scale: 1.0,
                window_left: Some(5),
                window_right: Some(0),
                softcap: Some(2.5),
                alibi: Some(slopes.clone()),
                ..Default::default()
            };
            check_varlen(
                &format!("flash_attn_varlen_alibi_windowed_softcap {name}"),
                &c,
                &spec,
                |c| {
                    fa::flash_attn_varlen_alibi_windowed_softcap(
                        &c.q,
                        &c.k,
                        &c.v,
                        Some(&tensor),
                        &c.seqlens_q,
                        &c.seqlens_k,
                        MAX_Q,
                        MAX_K,
                        1.0,
                        Some(5),
                        Some(0),
                        2.5,
                    )
                },
            );
        }
        let spec = Spec {
            scale: 1.0,
            softcap: Some(4.0),
            ..Default::default()
        };
        check_varlen(
            "flash_attn_varlen_alibi_windowed_softcap no alibi",
            &c,
            &spec,
            |c| {
                fa::flash_attn_varlen_alibi_windowed_softcap(
                    &c.q,
                    &c.k,
                    &c.v,
                    None,
                    &c.seqlens_q,
                    &c.seqlens_k,
                    MAX_Q,
                    MAX_K,
                    1.0,
                    None,
                    None,
                    4.0,
                )
            },
        );
    }
}

#[test]
fn varlen_sinks() {
    for dtype in DTYPES {
        let c = case(130, dtype, DType::I64);
        let sink_values = vec![1.0f32, -1.0, 0.25, 4.0];
        let sinks = Tensor::new(sink_values.as_slice(), &Device::Cpu).unwrap();
        let spec = Spec {
            scale: 0.18,
            window_left: Some(6),
            window_right: Some(0),
            sinks: Some(sink_values.clone()),
            ..Default::default()
        };
        check_varlen("flash_attn_varlen_sinks", &c, &spec, |c| {
            fa::flash_attn_varlen_sinks(
                &c.q,
                &c.k,
                &c.v,
                &sinks,
                None,
                &c.seqlens_q,
                &c.seqlens_k,
                MAX_Q,
                MAX_K,
                0.18,
                Some(6),
                Some(0),
                0.0,
            )
        });
    }
}

#[test]
fn varlen_packed_qkv_is_used_in_place() {
    for dtype in DTYPES {
        // One packed (total, 3 * H, D) tensor with q, k and v as views, like a fused QKV
        // projection; total_q == total_k here.
        let cu = [0usize, 9, 25, 31];
        let h = 2;
        let qkv = randn(140, &[31, 3 * h, 16], dtype);
        let q = qkv.narrow(1, 0, h).unwrap();
        let k = qkv.narrow(1, h, h).unwrap();
        let v = qkv.narrow(1, 2 * h, h).unwrap();
        let seqlens = Tensor::new(&[0u32, 9, 25, 31], &Device::Cpu).unwrap();
        let spec = Spec {
            scale: 0.25,
            window_right: Some(0),
            ..Default::default()
        };
        let got =
            fa::flash_attn_varlen(&q, &k, &v, &seqlens, &seqlens, 16, 16, 0.25, true).unwrap();
        let ref64 = naive_varlen(&q, &k, &v, &cu, &cu, &spec, DType::F64).unwrap();
        let same = naive_varlen(&q, &k, &v, &cu, &cu, &spec, dtype).unwrap();
        check("varlen packed qkv", &got, &ref64, &same);
    }
}

/// `softmax_scale == 0` as in candle-flash-attn: every score 0, each query averages its values.
#[test]
fn varlen_zero_softmax_scale() {
    for dtype in DTYPES {
        let c = case(140, dtype, DType::U32);
        let spec = Spec {
            scale: 0.0,
            window_right: Some(0),
            ..Default::default()
        };
        check_varlen("flash_attn_varlen scale 0", &c, &spec, |c| {
            fa::flash_attn_varlen(
                &c.q,
                &c.k,
                &c.v,
                &c.seqlens_q,
                &c.seqlens_k,
                MAX_Q,
                MAX_K,
                0.0,
                true,
            )
        });
    }
}
