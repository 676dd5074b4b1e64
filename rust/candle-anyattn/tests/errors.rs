//! Bad inputs give candle errors whose messages say what is wrong.

mod common;

use candle_anyattn as fa;
use candle_core::{DType, Device, Tensor};
use common::randn;

fn err(r: candle_core::Result<Tensor>) -> String {
    match r {
        Ok(t) => panic!("expected an error, got a tensor of shape {:?}", t.dims()),
        Err(e) => e.to_string(),
    }
}

fn assert_has(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} lacks {p:?}");
    }
}

#[test]
fn dense_argument_errors() {
    let q = randn(1, &[1, 4, 4, 16], DType::F32);
    let k = randn(2, &[1, 5, 2, 16], DType::F32);
    let v = randn(3, &[1, 5, 2, 16], DType::F32);

    let kb = k.to_dtype(DType::BF16).unwrap();
    assert_has(
        &err(fa::flash_attn(&q, &kb, &v, 0.25, false)),
        &["q, k and v must share one dtype", "k BF16"],
    );

    let q3 = q.squeeze(0).unwrap();
    let k3 = k.squeeze(0).unwrap();
    let v3 = v.squeeze(0).unwrap();
    assert_has(
        &err(fa::flash_attn(&q3, &k3, &v3, 0.25, false)),
        &[
            "q must have rank 4",
            "(batch, seq_len, num_heads, head_size)",
            "[4, 4, 16]",
        ],
    );

    let qi = Tensor::zeros((1, 4, 4, 16), DType::U8, &Device::Cpu).unwrap();
    let ki = Tensor::zeros((1, 5, 2, 16), DType::U8, &Device::Cpu).unwrap();
    assert_has(
        &err(fa::flash_attn(&qi, &ki, &ki, 0.25, false)),
        &["supported dtypes are f32, f16 and bf16", "U8"],
    );

    // 4 query heads cannot share 3 kv heads: the C library's message comes through.
    let k3h = randn(4, &[1, 5, 3, 16], DType::F32);
    assert_has(
        &err(fa::flash_attn(&q, &k3h, &k3h, 0.25, false)),
        &["flash-attn (anyattn)", "ANYATTN_E_INVALID_ARGUMENT"],
    );

    // Head size above 576 (q, k) and 512 (v).
    let qb = randn(5, &[1, 2, 1, 577], DType::F32);
    assert_has(
        &err(fa::flash_attn(&qb, &qb, &qb, 0.1, false)),
        &["ANYATTN_E_INVALID_ARGUMENT", "(head dim D) is 577; supported: 0..576"],
    );
    let qm = randn(5, &[1, 2, 1, 576], DType::F32);
    let vb = randn(6, &[1, 2, 1, 513], DType::F32);
    assert_has(
        &err(fa::flash_attn(&qm, &qm, &vb, 0.1, false)),
        &["ANYATTN_E_INVALID_ARGUMENT", "(head dim Dv) is 513; supported: 0..512"],
    );

    // Batch mismatch between q and k.
    let k2 = randn(6, &[2, 5, 2, 16], DType::F32);
    assert_has(
        &err(fa::flash_attn(&q, &k2, &k2, 0.25, false)),
        &["ANYATTN_E_INVALID_ARGUMENT"],
    );

    let alibi_f16 = Tensor::ones(4, DType::F16, &Device::Cpu).unwrap();
    assert_has(
        &err(fa::flash_attn_alibi(&q, &k, &v, &alibi_f16, 0.25, false)),
        &["alibi_slopes must be f32", "F16"],
    );
    let alibi_3 = Tensor::ones(3, DType::F32, &Device::Cpu).unwrap();
    assert_has(
        &err(fa::flash_attn_alibi(&q, &k, &v, &alibi_3, 0.25, false)),
        &["ANYATTN_E_INVALID_ARGUMENT", "alibi"],
    );

    let sinks_2 = Tensor::ones(2, DType::F32, &Device::Cpu).unwrap();
    assert_has(
        &err(fa::flash_attn_sinks(
            &q, &k, &v, &sinks_2, None, 0.25, None, None, 0.0,
        )),
        &["ANYATTN_E_INVALID_ARGUMENT", "sinks"],
    );
    let sinks_bf16 = Tensor::ones(4, DType::BF16, &Device::Cpu).unwrap();
    assert_has(
        &err(fa::flash_attn_sinks(
            &q,
            &k,
            &v,
            &sinks_bf16,
            None,
            0.25,
            None,
            None,
            0.0,
        )),
        &["sinks must be f32"],
    );
}

#[test]
fn varlen_argument_errors() {
    let q = randn(10, &[10, 2, 8], DType::F32);
    let k = randn(11, &[12, 2, 8], DType::F32);
    let dev = &Device::Cpu;
    let cu = |v: &[u32]| Tensor::new(v, dev).unwrap();
    let run = |sq: &Tensor, sk: &Tensor, max_q: usize, max_k: usize| {
        err(fa::flash_attn_varlen(
            &q, &k, &k, sq, sk, max_q, max_k, 0.3, true,
        ))
    };
    assert_has(
        &run(&cu(&[0, 6, 4, 10]), &cu(&[0, 4, 8, 12]), 10, 12),
        &[
            "cu_seqlens_q[2]: 4 is less than cu_seqlens_q[1] = 6",
            "non-decreasing",
        ],
    );
    assert_has(
        &run(&cu(&[0, 6, 11]), &cu(&[0, 4, 12]), 10, 12),
        &["cu_seqlens_q[2]: 11 exceeds the 10 packed rows"],
    );
    assert_has(
        &run(&cu(&[0, 6, 10]), &cu(&[0, 4, 8, 12]), 10, 12),
        &["both must be B + 1"],
    );
    assert_has(
        &run(&cu(&[0, 6, 10]), &cu(&[0, 4, 12]), 10, 7),
        &["max_seqlen_k: 7 given, but sequence 1 has 8 keys"],
    );
    let f = Tensor::new(&[0f32, 10.0], dev).unwrap();
    assert_has(
        &run(&f, &cu(&[0, 12]), 10, 12),
        &["seqlens_q must be u32, i32 or i64", "F32"],
    );
    let two_d = Tensor::zeros((2, 2), DType::U32, dev).unwrap();
    assert_has(
        &run(&two_d, &cu(&[0, 12]), 10, 12),
        &["seqlens_q must have rank 1"],
    );
    let q4 = q.unsqueeze(0).unwrap();
    assert_has(
        &err(fa::flash_attn_varlen(
            &q4,
            &k,
            &k,
            &cu(&[0, 10]),
            &cu(&[0, 12]),
            10,
            12,
            0.3,
            true,
        )),
        &["q must have rank 3", "(total, num_heads, head_size)"],
    );
    let alibi_bad = Tensor::ones((3, 2), DType::F32, dev).unwrap();
    assert_has(
        &err(fa::flash_attn_varlen_alibi(
            &q,
            &k,
            &k,
            &alibi_bad,
            &cu(&[0, 6, 10]),
            &cu(&[0, 4, 12]),
            10,
            12,
            0.3,
            true,
        )),
        &["alibi_slopes: shape [3, 2] given, supported (2) or (2, 2)"],
    );
}
