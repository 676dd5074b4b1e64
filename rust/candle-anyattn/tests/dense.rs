//! Every dense function against the plain candle implementation, for f32 and bf16 (and f16 once),
//! with GQA/MQA, Sq != Sk, fully masked rows and non-contiguous inputs.

mod common;

use candle_anyattn as fa;
use candle_core::{DType, Result, Tensor};
use common::{check, naive, randn, Spec};

const DTYPES: [DType; 2] = [DType::F32, DType::BF16];

/// q, k, v of the given shapes in `dtype`, contiguous.
fn qkv(seed: u64, q: [usize; 4], kv: [usize; 4], dv: usize, dtype: DType) -> [Tensor; 3] {
    let v = [kv[0], kv[1], kv[2], dv];
    [
        randn(seed, &q, dtype),
        randn(seed + 1, &kv, dtype),
        randn(seed + 2, &v, dtype),
    ]
}

/// Runs `f` on (q, k, v) and checks it against the plain implementation of `spec`.
fn check_case(
    what: &str,
    [q, k, v]: &[Tensor; 3],
    spec: &Spec,
    f: impl Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
) {
    let got = f(q, k, v).unwrap();
    assert_eq!(got.dtype(), q.dtype(), "{what}: output dtype");
    let ref64 = naive(q, k, v, spec, DType::F64).unwrap();
    let same = naive(q, k, v, spec, q.dtype()).unwrap();
    check(what, &got, &ref64, &same);
}

fn slopes(n: usize) -> Vec<f32> {
    (0..n).map(|i| 0.5f32.powi(i as i32 % 8 + 1)).collect()
}

#[test]
fn flash_attn_plain_and_causal_gqa() {
    for dtype in DTYPES {
        // Sq < Sk, GQA 2:1, non-causal and causal.
        let t = qkv(10, [2, 37, 4, 64], [2, 53, 2, 64], 64, dtype);
        for causal in [false, true] {
            let spec = Spec {
                scale: 0.125,
                window_right: causal.then_some(0),
                ..Default::default()
            };
            check_case(
                &format!("flash_attn causal={causal}"),
                &t,
                &spec,
                |q, k, v| fa::flash_attn(q, k, v, 0.125, causal),
            );
        }
        // Sq > Sk causal: the first Sq - Sk rows see no key and must be zero. MQA.
        let t = qkv(20, [1, 45, 3, 32], [1, 29, 1, 32], 32, dtype);
        let spec = Spec {
            scale: 0.2,
            window_right: Some(0),
            ..Default::default()
        };
        check_case("flash_attn causal Sq > Sk MQA", &t, &spec, |q, k, v| {
            fa::flash_attn(q, k, v, 0.2, true)
        });
        let out = fa::flash_attn(&t[0], &t[1], &t[2], 0.2, true).unwrap();
        let masked = out.narrow(1, 0, 45 - 29).unwrap().abs().unwrap();
        let max = masked.flatten_all().unwrap().max(0).unwrap();
        assert_eq!(
            max.to_dtype(DType::F32)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap(),
            0.0
        );
    }
}

#[test]
fn flash_attn_windowed_variants() {
    for dtype in DTYPES {
        let t = qkv(30, [2, 40, 4, 48], [2, 57, 4, 48], 40, dtype);
        for (wl, wr) in [
            (Some(8), Some(3)),
            (Some(5), None),
            (None, Some(2)),
            (Some(0), Some(0)),
            (Some(1000), Some(1000)),
        ] {
            let spec = Spec {
                scale: 0.15,
                window_left: wl,
                window_right: wr,
                ..Default::default()
            };
            check_case(
                &format!("flash_attn_windowed ({wl:?}, {wr:?})"),
                &t,
                &spec,
                |q, k, v| fa::flash_attn_windowed(q, k, v, 0.15, wl, wr),
            );
        }
        // Sq > Sk with a window: some rows fully masked.
        let t = qkv(31, [1, 50, 2, 16], [1, 20, 2, 16], 16, dtype);
        let spec = Spec {
            scale: 0.3,
            window_left: Some(4),
            window_right: Some(1),
            ..Default::default()
        };
        check_case("flash_attn_windowed Sq > Sk", &t, &spec, |q, k, v| {
            fa::flash_attn_windowed(q, k, v, 0.3, Some(4), Some(1))
        });
    }
}

#[test]
fn flash_attn_alibi_variants() {
    for dtype in DTYPES {
        let t = qkv(40, [2, 33, 8, 64], [2, 41, 2, 64], 64, dtype);
        let s = slopes(8);
        let alibi = Tensor::new(s.as_slice(), t[0].device()).unwrap();
        for causal in [false, true] {
            let spec = Spec {
                scale: 0.125,
                window_right: causal.then_some(0),
                alibi: Some(s.clone()),
                ..Default::default()
            };
            check_case(
                &format!("flash_attn_alibi causal={causal}"),
                &t,
                &spec,
                |q, k, v| fa::flash_attn_alibi(q, k, v, &alibi, 0.125, causal),
            );
        }
        let spec = Spec {
            scale: 0.125,
            window_left: Some(6),
            window_right: Some(4),
            alibi: Some(s.clone()),
            ..Default::default()
        };
        check_case("flash_attn_alibi_windowed", &t, &spec, |q, k, v| {
            fa::flash_attn_alibi_windowed(q, k, v, &alibi, 0.125, Some(6), Some(4))
        });
        // Per-batch slopes (B, Hq), an anyattn extension.
        let sb = slopes(16).into_iter().rev().collect::<Vec<_>>();
        let alibi_b = Tensor::from_slice(&sb, (2, 8), t[0].device()).unwrap();
        let spec = Spec {
            scale: 0.125,
            window_right: Some(0),
            alibi: Some(sb.clone()),
            ..Default::default()
        };
        check_case("flash_attn_alibi (B, Hq) slopes", &t, &spec, |q, k, v| {
            fa::flash_attn_alibi(q, k, v, &alibi_b, 0.125, true)
        });
    }
}

#[test]
fn flash_attn_alibi_windowed_softcap_variants() {
    for dtype in DTYPES {
        let t = qkv(50, [2, 29, 4, 32], [2, 35, 2, 32], 32, dtype);
        let s = slopes(4);
        let alibi = Tensor::new(s.as_slice(), t[0].device()).unwrap();
        // A large scale so that the softcap actually bends the scores.
        for (with_alibi, wl, wr, cap) in [
            (false, None, None, 2.0f32),
            (true, Some(7), Some(0), 5.0),
            (true, None, Some(3), 1.5),
            (false, Some(3), Some(3), 0.0),
        ] {
            let spec = Spec {
                scale: 1.0,
                window_left: wl,
                window_right: wr,
                softcap: (cap > 0.0).then_some(cap),
                alibi: with_alibi.then(|| s.clone()),
                ..Default::default()
            };
            check_case(
                &format!("flash_attn_alibi_windowed_softcap alibi={with_alibi} ({wl:?}, {wr:?}) cap={cap}"),
                &t,
                &spec,
                |q, k, v| {
                    fa::flash_attn_alibi_windowed_softcap(
                        q,
                        k,
                        v,
                        with_alibi.then_some(&alibi),
                        1.0,
                        wl,
                        wr,
                        cap,
                    )
                },
            );
        }
    }
}

#[test]
fn flash_attn_sinks_variants() {
    for dtype in DTYPES {
        let t = qkv(60, [2, 31, 4, 64], [2, 23, 2, 64], 64, dtype);
        let sink_values = vec![0.5f32, -2.0, 3.0, 0.0];
        let sinks = Tensor::new(sink_values.as_slice(), t[0].device()).unwrap();
        let s = slopes(4);
        let alibi = Tensor::new(s.as_slice(), t[0].device()).unwrap();
        for (with_alibi, wl, wr, cap) in [
            (false, None, None, 0.0f32),
            (false, None, Some(0), 0.0),
            (true, Some(4), Some(0), 3.0),
        ] {
            let spec = Spec {
                scale: 0.125,
                window_left: wl,
                window_right: wr,
                softcap: (cap > 0.0).then_some(cap),
                alibi: with_alibi.then(|| s.clone()),
                sinks: Some(sink_values.clone()),
                ..Default::default()
            };
            check_case(
                &format!("flash_attn_sinks alibi={with_alibi} ({wl:?}, {wr:?}) cap={cap}"),
                &t,
                &spec,
                |q, k, v| {
                    fa::flash_attn_sinks(
                        q,
                        k,
                        v,
                        &sinks,
                        with_alibi.then_some(&alibi),
                        0.125,
                        wl,
                        wr,
                        cap,
                    )
                },
            );
        }
    }
}

#[test]
fn non_contiguous_inputs() {
    for dtype in DTYPES {
        let (b, sq, sk, hq, hk, d) = (2, 26, 34, 4, 2, 32);
        // q stored as (B, Hq, Sq, D) and viewed as (B, Sq, Hq, D).
        let q = randn(70, &[b, hq, sq, d], dtype).transpose(1, 2).unwrap();
        // k and v are two halves of one packed (B, Sk, 2 * Hk, D) tensor.
        let kv = randn(71, &[b, sk, 2 * hk, d], dtype);
        let k = kv.narrow(2, 0, hk).unwrap();
        let v = kv.narrow(2, hk, hk).unwrap();
        assert!(!q.is_contiguous() && !k.is_contiguous() && !v.is_contiguous());
        let spec = Spec {
            scale: 0.17,
            window_right: Some(0),
            ..Default::default()
        };
        check_case("strided q, packed k/v", &[q, k, v], &spec, |q, k, v| {
            fa::flash_attn(q, k, v, 0.17, true)
        });

        // A last dimension that is not contiguous (copied internally), and a sliced batch.
        let q = randn(72, &[3, sq, d, hq], dtype)
            .transpose(2, 3)
            .unwrap()
            .narrow(0, 1, 2)
            .unwrap();
        let k = randn(73, &[b, sk, hk, d], dtype);
        let v = randn(74, &[b, d, sk, hk], dtype)
            .permute((0, 2, 3, 1))
            .unwrap();
        let spec = Spec {
            scale: 0.2,
            window_left: Some(9),
            window_right: Some(2),
            ..Default::default()
        };
        check_case("non-unit last stride", &[q, k, v], &spec, |q, k, v| {
            fa::flash_attn_windowed(q, k, v, 0.2, Some(9), Some(2))
        });
    }
}

#[test]
fn f16_and_head_dims_that_are_not_multiples_of_8() {
    let t = qkv(80, [1, 17, 2, 59], [1, 21, 1, 59], 37, DType::F16);
    let spec = Spec {
        scale: 0.13,
        window_right: Some(0),
        ..Default::default()
    };
    check_case("f16 D=59 Dv=37", &t, &spec, |q, k, v| {
        fa::flash_attn(q, k, v, 0.13, true)
    });
}

#[test]
fn thread_count_follows_candle() {
    let t = qkv(90, [1, 8, 2, 16], [1, 8, 2, 16], 16, DType::F32);
    anyattn::set_num_threads(1);
    fa::flash_attn(&t[0], &t[1], &t[2], 0.25, false).unwrap();
    assert_eq!(
        anyattn::num_threads(),
        candle_core::utils::get_num_threads()
    );
}

#[test]
fn apply_op3_with_the_public_struct() {
    let t = qkv(95, [1, 12, 2, 16], [1, 15, 2, 16], 16, DType::F32);
    let op = fa::FlashAttn {
        softmax_scale: 0.25,
        alibi_slopes: None,
        window_size_left: Some(3),
        window_size_right: Some(0),
        softcap: None,
    };
    let via_struct = t[0].apply_op3(&t[1], &t[2], op).unwrap();
    let via_fn = fa::flash_attn_windowed(&t[0], &t[1], &t[2], 0.25, Some(3), Some(0)).unwrap();
    assert_eq!(common::max_abs_diff(&via_struct, &via_fn).unwrap(), 0.0);
}

/// `softmax_scale == 0` is candle-flash-attn's plain scale of 0: every score is 0 (then the
/// softcap and ALiBi), so each query averages the values it sees.
#[test]
fn zero_softmax_scale_makes_every_score_zero() {
    for dtype in DTYPES {
        let t = qkv(90, [2, 9, 4, 32], [2, 13, 2, 32], 32, dtype);
        let spec = Spec {
            scale: 0.0,
            window_left: Some(4),
            window_right: Some(0),
            ..Default::default()
        };
        check_case("flash_attn_windowed scale 0", &t, &spec, |q, k, v| {
            fa::flash_attn_windowed(q, k, v, 0.0, Some(4), Some(0))
        });
        let alibi = slopes(4);
        let spec = Spec {
            scale: 0.0,
            softcap: Some(2.0),
            alibi: Some(alibi.clone()),
            ..Default::default()
        };
        let alibi = Tensor::new(alibi.as_slice(), &candle_core::Device::Cpu).unwrap();
        check_case("softcap + alibi, scale 0", &t, &spec, |q, k, v| {
            fa::flash_attn_alibi_windowed_softcap(q, k, v, Some(&alibi), 0.0, None, None, 2.0)
        });
    }
}
