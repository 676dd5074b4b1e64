//! 8-bit KV caches (`F8E4M3`, `F8E5M2`, `i8`): the append's quantization against a reference
//! written from the documented rule, and attention against the dense f32 forward over the
//! dequantized cache.

use anyattn::{
    fwd, fwd_kvcache_quantized, fwd_kvcache_varlen_quantized, BlockTable, CacheSeqlens, F8E4M3,
    F8E5M2, FwdOptions, KvCacheOptions, Quantized, QuantizedKvCache, Status, TokenScales, View,
    ViewMut,
};

mod common;
use common::{quantize_row, values};

const B: usize = 2;
const HQ: usize = 4;
const HK: usize = 2;
const D: usize = 8;
const CAP: usize = 8;

/// Dense f32 attention of q `(1, sq, HQ, D)` over keys/values `(1, sk, HK, D)`, causal.
fn dense(q: &[f32], k: &[f32], v: &[f32], sq: usize, sk: usize) -> Vec<f32> {
    let mut out = vec![0f32; sq * HQ * D];
    fwd(
        &View::contiguous(q, &[1, sq, HQ, D]).unwrap(),
        &View::contiguous(k, &[1, sk, HK, D]).unwrap(),
        &View::contiguous(v, &[1, sk, HK, D]).unwrap(),
        &mut ViewMut::contiguous(&mut out, &[1, sq, HQ, D]).unwrap(),
        None,
        &FwdOptions {
            causal: true,
            ..Default::default()
        },
    )
    .unwrap();
    out
}

/// Appends 3 new positions to each of B sequences of a token-scaled cache (with a per-head key
/// descale), then checks the stored bytes, the token scales and the attention output.
fn append_and_attend<C: Quantized + PartialEq + std::fmt::Debug + Default>() {
    let (s_new, sq) = (3usize, 2usize);
    let lens = [2i32, 4];
    let mut k = vec![C::default(); B * CAP * HK * D];
    let mut v = vec![C::default(); B * CAP * HK * D];
    let mut k_scale = vec![0f32; B * CAP * HK];
    let mut v_scale = vec![0f32; B * CAP * HK];
    // The positions before lens[b] hold earlier keys: fill them through the same rule.
    let old_k = values(B * CAP * HK * D, 0.3);
    let old_v = values(B * CAP * HK * D, 1.7);
    let k_descale = [0.5f32, 2.0];
    for row in 0..B * CAP * HK {
        let h = row % HK;
        let (sk, tk) = quantize_row::<C>(&old_k[row * D..(row + 1) * D], k_descale[h]);
        let (sv, tv) = quantize_row::<C>(&old_v[row * D..(row + 1) * D], 1.0);
        k[row * D..(row + 1) * D].copy_from_slice(&sk);
        v[row * D..(row + 1) * D].copy_from_slice(&sv);
        k_scale[row] = tk;
        v_scale[row] = tv;
    }
    let k_new = values(B * s_new * HK * D, 2.9);
    let v_new = values(B * s_new * HK * D, 4.1);
    let q = values(B * sq * HQ * D, 5.3);
    let mut out = vec![0f32; B * sq * HQ * D];
    {
        let mut kv = QuantizedKvCache {
            k: ViewMut::contiguous(&mut k, &[B, CAP, HK, D]).unwrap(),
            v: ViewMut::contiguous(&mut v, &[B, CAP, HK, D]).unwrap(),
            k_descale: Some(View::contiguous(&k_descale, &[HK]).unwrap()),
            v_descale: None,
            token_scales: Some(TokenScales {
                k: ViewMut::contiguous(&mut k_scale, &[B, CAP, HK]).unwrap(),
                v: ViewMut::contiguous(&mut v_scale, &[B, CAP, HK]).unwrap(),
            }),
        };
        let cache = KvCacheOptions {
            k_new: Some(View::contiguous(&k_new, &[B, s_new, HK, D]).unwrap()),
            v_new: Some(View::contiguous(&v_new, &[B, s_new, HK, D]).unwrap()),
            cache_seqlens: CacheSeqlens::PerSequence(&lens),
            ..Default::default()
        };
        fwd_kvcache_quantized(
            &View::contiguous(&q, &[B, sq, HQ, D]).unwrap(),
            &mut kv,
            &mut ViewMut::contiguous(&mut out, &[B, sq, HQ, D]).unwrap(),
            None,
            &cache,
            &FwdOptions {
                causal: true,
                ..Default::default()
            },
        )
        .unwrap();
    }
    for b in 0..B {
        let n = lens[b] as usize + s_new;
        for t in 0..s_new {
            for h in 0..HK {
                let row = (b * CAP + lens[b] as usize + t) * HK + h;
                let new_row = ((b * s_new + t) * HK + h) * D;
                let (sk, tk) = quantize_row::<C>(&k_new[new_row..new_row + D], k_descale[h]);
                let (sv, tv) = quantize_row::<C>(&v_new[new_row..new_row + D], 1.0);
                assert_eq!(&k[row * D..(row + 1) * D], &sk[..], "key b{b} t{t} h{h}");
                assert_eq!(&v[row * D..(row + 1) * D], &sv[..], "value b{b} t{t} h{h}");
                assert_eq!(k_scale[row].to_bits(), tk.to_bits(), "key scale b{b} t{t} h{h}");
                assert_eq!(v_scale[row].to_bits(), tv.to_bits(), "value scale b{b} t{t} h{h}");
            }
        }
        // The dequantized keys/values of sequence b: stored * (descale * token_scale), the
        // factor formed in f32 first, as the kernels read them.
        let deq = |data: &[C], scale: &[f32], descale: &[f32]| -> Vec<f32> {
            (0..n * HK * D)
                .map(|i| {
                    let row = b * CAP * HK + i / D;
                    data[row * D + i % D].to_f32() * (descale[(i / D) % HK] * scale[row])
                })
                .collect()
        };
        let keys = deq(&k, &k_scale, &k_descale);
        let vals = deq(&v, &v_scale, &[1.0, 1.0]);
        let qb = &q[b * sq * HQ * D..(b + 1) * sq * HQ * D];
        let want = dense(qb, &keys, &vals, sq, n);
        let got = &out[b * sq * HQ * D..(b + 1) * sq * HQ * D];
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "out[{b}][{i}]: {g} vs {w}");
        }
    }
}

#[test]
fn fp8_e4m3_append_and_attend() {
    append_and_attend::<F8E4M3>();
}

#[test]
fn fp8_e5m2_append_and_attend() {
    append_and_attend::<F8E5M2>();
}

#[test]
fn int8_append_and_attend() {
    append_and_attend::<i8>();
}

#[test]
fn paged_varlen_reads_an_int8_cache_with_sequence_descales() {
    // Two sequences over 4 pages of 2 positions: sequence 0 in pages {3, 1}, sequence 1 in {0, 2}.
    let page = 2usize;
    let stored: Vec<i8> = (0..4 * page * HK * D)
        .map(|i| ((i * 37) % 255) as i8)
        .collect();
    let values8: Vec<i8> = (0..4 * page * HK * D)
        .map(|i| ((i * 91) % 255) as i8)
        .collect();
    let descale = [0.01f32, 0.02, 0.03, 0.04]; // (B, HK)
    let table = [3i32, 1, 0, 2];
    let lens = [3i32, 4];
    let cu_q = [0i32, 1, 3];
    let q = values(3 * HQ * D, 0.9);
    let mut k8 = stored.clone();
    let mut v8 = values8.clone();
    let mut out = vec![0f32; 3 * HQ * D];
    let kv = QuantizedKvCache {
        k: ViewMut::contiguous(&mut k8, &[4, page, HK, D]).unwrap(),
        v: ViewMut::contiguous(&mut v8, &[4, page, HK, D]).unwrap(),
        k_descale: Some(View::contiguous(&descale, &[B, HK]).unwrap()),
        v_descale: Some(View::contiguous(&descale, &[B, HK]).unwrap()),
        token_scales: None,
    };
    let cache = KvCacheOptions {
        cache_seqlens: CacheSeqlens::PerSequence(&lens),
        block_table: Some(BlockTable {
            data: &table,
            blocks_per_seq: 2,
        }),
        ..Default::default()
    };
    let opts = FwdOptions {
        causal: true,
        ..Default::default()
    };
    fwd_kvcache_varlen_quantized(
        &View::contiguous(&q, &[3, HQ, D]).unwrap(),
        &kv,
        &mut ViewMut::contiguous(&mut out, &[3, HQ, D]).unwrap(),
        None,
        &cu_q,
        2,
        &cache,
        &opts,
    )
    .unwrap();
    for b in 0..B {
        let n = lens[b] as usize;
        let deq = |data: &[i8]| -> Vec<f32> {
            (0..n * HK * D)
                .map(|i| {
                    let (p, h, e) = (i / (HK * D), (i / D) % HK, i % D);
                    let blk = table[b * 2 + p / page] as usize;
                    f32::from(data[((blk * page + p % page) * HK + h) * D + e]) * descale[b * HK + h]
                })
                .collect()
        };
        let (q0, q1) = (cu_q[b] as usize, cu_q[b + 1] as usize);
        let want = dense(&q[q0 * HQ * D..q1 * HQ * D], &deq(&stored), &deq(&values8), q1 - q0, n);
        for (i, (g, w)) in out[q0 * HQ * D..q1 * HQ * D].iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "out[{b}][{i}]: {g} vs {w}");
        }
    }
}

#[test]
fn a_descale_of_the_wrong_shape_is_rejected_naming_it() {
    let mut k8 = vec![0i8; CAP * HK * D];
    let mut v8 = vec![0i8; CAP * HK * D];
    let bad = [1f32; 3];
    let q = vec![0f32; HQ * D];
    let mut out = vec![0f32; HQ * D];
    let mut kv = QuantizedKvCache {
        k: ViewMut::contiguous(&mut k8, &[1, CAP, HK, D]).unwrap(),
        v: ViewMut::contiguous(&mut v8, &[1, CAP, HK, D]).unwrap(),
        k_descale: Some(View::contiguous(&bad, &[3]).unwrap()),
        v_descale: None,
        token_scales: None,
    };
    let err = fwd_kvcache_quantized(
        &View::contiguous(&q, &[1, 1, HQ, D]).unwrap(),
        &mut kv,
        &mut ViewMut::contiguous(&mut out, &[1, 1, HQ, D]).unwrap(),
        None,
        &KvCacheOptions::default(),
        &FwdOptions::default(),
    )
    .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("k_descale"), "{}", err.message());
}
