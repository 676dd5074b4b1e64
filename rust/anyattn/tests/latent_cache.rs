//! Shared latent caches (absorbed MLA decode): `fwd_kvcache_latent` and
//! `fwd_kvcache_varlen_latent` over float and 8-bit caches, against the dense f32 forward over
//! the keys (whole rows) and values (their first DV columns), plus the append's bytes and the
//! errors of the Rust-side checks.

use anyattn::{
    fwd, fwd_kvcache_latent, fwd_kvcache_varlen_latent, BlockTable, CacheSeqlens, F8E4M3, F8E5M2,
    FwdOptions, KvCacheOptions, LatentCache, Quantized, Rotary, Status, View, ViewMut,
};

mod common;
use common::{quantize_row, quantize_row_by_descale, values};

const HQ: usize = 8;
const HK: usize = 1;
const D: usize = 20;
const DV: usize = 16;

fn causal() -> FwdOptions<'static> {
    FwdOptions {
        causal: true,
        ..Default::default()
    }
}

/// Dense f32 causal attention of q `(1, sq, HQ, D)` over `sk` latent rows `(sk, HK, D)`: keys
/// are the rows, values their first DV columns.
fn dense_latent(q: &[f32], rows: &[f32], sq: usize, sk: usize) -> Vec<f32> {
    let values: Vec<f32> = rows.chunks(D).flat_map(|row| row[..DV].to_vec()).collect();
    let mut out = vec![0f32; sq * HQ * DV];
    fwd(
        &View::contiguous(q, &[1, sq, HQ, D]).unwrap(),
        &View::contiguous(rows, &[1, sk, HK, D]).unwrap(),
        &View::contiguous(&values, &[1, sk, HK, DV]).unwrap(),
        &mut ViewMut::contiguous(&mut out, &[1, sq, HQ, DV]).unwrap(),
        None,
        &causal(),
    )
    .unwrap();
    out
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{what}[{i}]: {g} vs {w}");
    }
}

/// A float latent cache, contiguous: two new rows are appended to each of two sequences once
/// (the row written whole from k_new) and the queries attend to the keys and their prefixes.
#[test]
fn float_latent_cache_appends_each_row_once_and_attends() {
    const B: usize = 2;
    const CAP: usize = 9;
    let (s_new, sq) = (2usize, 3usize);
    let lens = [3i32, 6];
    let before = values(B * CAP * HK * D, 0.4);
    let mut latent = before.clone();
    let k_new = values(B * s_new * HK * D, 2.2);
    let q = values(B * sq * HQ * D, 3.1);
    let mut out = vec![0f32; B * sq * HQ * DV];
    let mut lse = vec![0f32; B * HQ * sq];
    {
        let mut cache = LatentCache {
            latent: ViewMut::contiguous(&mut latent, &[B, CAP, HK, D]).unwrap(),
            dv: DV,
            descale: None,
            token_scale: None,
        };
        let opts = KvCacheOptions {
            k_new: Some(View::contiguous(&k_new, &[B, s_new, HK, D]).unwrap()),
            cache_seqlens: CacheSeqlens::PerSequence(&lens),
            ..Default::default()
        };
        fwd_kvcache_latent(
            &View::contiguous(&q, &[B, sq, HQ, D]).unwrap(),
            &mut cache,
            &mut ViewMut::contiguous(&mut out, &[B, sq, HQ, DV]).unwrap(),
            Some(&mut ViewMut::contiguous(&mut lse, &[B, HQ, sq]).unwrap()),
            &opts,
            &causal(),
        )
        .unwrap();
    }
    for b in 0..B {
        let n = lens[b] as usize + s_new;
        for p in 0..CAP {
            let row = &latent[(b * CAP + p) * D..(b * CAP + p + 1) * D];
            let want = if (lens[b] as usize..n).contains(&p) {
                let t = p - lens[b] as usize;
                &k_new[(b * s_new + t) * D..(b * s_new + t + 1) * D]
            } else {
                &before[(b * CAP + p) * D..(b * CAP + p + 1) * D]
            };
            assert_eq!(row, want, "latent row b{b} p{p}");
        }
        let rows = &latent[b * CAP * D..(b * CAP + n) * D];
        let want = dense_latent(&q[b * sq * HQ * D..(b + 1) * sq * HQ * D], rows, sq, n);
        assert_close(&out[b * sq * HQ * DV..(b + 1) * sq * HQ * DV], &want, "out");
        assert!(lse[b * HQ * sq..(b + 1) * HQ * sq].iter().all(|x| x.is_finite()));
    }
}

/// Two sequences of a packed batch (a decode step and a 2-query chunk) read a paged latent cache
/// whose pages are shuffled.
#[test]
fn paged_varlen_reads_a_float_latent_cache() {
    const PAGE: usize = 2;
    const BLOCKS: usize = 5;
    let table = [3i32, 1, 4, 0, 2, 2];
    let lens = [3i32, 6];
    let cu_q = [0i32, 1, 3];
    let mut latent = values(BLOCKS * PAGE * HK * D, 0.8);
    let q = values(3 * HQ * D, 1.9);
    let mut out = vec![0f32; 3 * HQ * DV];
    let cache = LatentCache {
        latent: ViewMut::contiguous(&mut latent, &[BLOCKS, PAGE, HK, D]).unwrap(),
        dv: DV,
        descale: None,
        token_scale: None,
    };
    let opts = KvCacheOptions {
        cache_seqlens: CacheSeqlens::PerSequence(&lens),
        block_table: Some(BlockTable {
            data: &table,
            blocks_per_seq: 3,
        }),
        ..Default::default()
    };
    fwd_kvcache_varlen_latent(
        &View::contiguous(&q, &[3, HQ, D]).unwrap(),
        &cache,
        &mut ViewMut::contiguous(&mut out, &[3, HQ, DV]).unwrap(),
        None,
        &cu_q,
        2,
        &opts,
        &causal(),
    )
    .unwrap();
    let data = cache.latent.data();
    for b in 0..2 {
        let n = lens[b] as usize;
        let rows: Vec<f32> = (0..n)
            .flat_map(|p| {
                let blk = table[b * 3 + p / PAGE] as usize;
                data[(blk * PAGE + p % PAGE) * D..(blk * PAGE + p % PAGE + 1) * D].to_vec()
            })
            .collect();
        let (q0, q1) = (cu_q[b] as usize, cu_q[b + 1] as usize);
        let want = dense_latent(&q[q0 * HQ * D..q1 * HQ * D], &rows, q1 - q0, n);
        assert_close(&out[q0 * HQ * DV..q1 * HQ * DV], &want, "out");
    }
}

/// An 8-bit latent cache with a descale and, when `token_scaled`, per-token scales: the append
/// quantizes each new row once over all D columns, and the values read the keys' factors.
fn quantized_latent_appends_and_attends<C: Quantized + PartialEq + std::fmt::Debug + Default>(
    token_scaled: bool,
) {
    const B: usize = 2;
    const CAP: usize = 8;
    let (s_new, sq) = (2usize, 2usize);
    let lens = [2i32, 5];
    let descale = 0.25f32;
    let old = values(B * CAP * HK * D, 0.3);
    let mut latent = vec![C::default(); B * CAP * HK * D];
    let mut scales = vec![1f32; B * CAP * HK];
    for row in 0..B * CAP * HK {
        let x = &old[row * D..(row + 1) * D];
        let stored = if token_scaled {
            let (stored, token) = quantize_row::<C>(x, descale);
            scales[row] = token;
            stored
        } else {
            quantize_row_by_descale::<C>(x, descale)
        };
        latent[row * D..(row + 1) * D].copy_from_slice(&stored);
    }
    let k_new = values(B * s_new * HK * D, 2.9);
    let q = values(B * sq * HQ * D, 5.3);
    let descales = [descale];
    let mut out = vec![0f32; B * sq * HQ * DV];
    {
        let mut cache = LatentCache {
            latent: ViewMut::contiguous(&mut latent, &[B, CAP, HK, D]).unwrap(),
            dv: DV,
            descale: Some(View::contiguous(&descales, &[1]).unwrap()),
            token_scale: token_scaled
                .then(|| ViewMut::contiguous(&mut scales, &[B, CAP, HK]).unwrap()),
        };
        let opts = KvCacheOptions {
            k_new: Some(View::contiguous(&k_new, &[B, s_new, HK, D]).unwrap()),
            cache_seqlens: CacheSeqlens::PerSequence(&lens),
            ..Default::default()
        };
        fwd_kvcache_latent(
            &View::contiguous(&q, &[B, sq, HQ, D]).unwrap(),
            &mut cache,
            &mut ViewMut::contiguous(&mut out, &[B, sq, HQ, DV]).unwrap(),
            None,
            &opts,
            &causal(),
        )
        .unwrap();
    }
    for b in 0..B {
        let n = lens[b] as usize + s_new;
        for t in 0..s_new {
            let row = b * CAP + lens[b] as usize + t;
            let x = &k_new[(b * s_new + t) * D..(b * s_new + t + 1) * D];
            let (want, token) = if token_scaled {
                quantize_row::<C>(x, descale)
            } else {
                (quantize_row_by_descale::<C>(x, descale), 1.0)
            };
            assert_eq!(&latent[row * D..(row + 1) * D], &want[..], "latent b{b} t{t}");
            assert_eq!(scales[row].to_bits(), token.to_bits(), "token scale b{b} t{t}");
        }
        // stored * (descale * token_scale), the factor formed in f32 first, as the kernels do.
        let rows: Vec<f32> = (0..n * D)
            .map(|i| {
                let row = b * CAP + i / D;
                latent[row * D + i % D].to_f32() * (descale * scales[row])
            })
            .collect();
        let want = dense_latent(&q[b * sq * HQ * D..(b + 1) * sq * HQ * D], &rows, sq, n);
        assert_close(&out[b * sq * HQ * DV..(b + 1) * sq * HQ * DV], &want, "out");
    }
}

#[test]
fn fp8_e4m3_latent_cache_appends_and_attends() {
    quantized_latent_appends_and_attends::<F8E4M3>(false);
    quantized_latent_appends_and_attends::<F8E4M3>(true);
}

#[test]
fn fp8_e5m2_latent_cache_appends_and_attends() {
    quantized_latent_appends_and_attends::<F8E5M2>(false);
}

#[test]
fn int8_latent_cache_appends_and_attends() {
    quantized_latent_appends_and_attends::<i8>(true);
}

/// Paged varlen over an int8 latent cache with per-sequence descales `(B, Hk)` and token scales.
#[test]
fn paged_varlen_reads_an_int8_latent_cache() {
    const PAGE: usize = 2;
    const BLOCKS: usize = 4;
    let table = [3i32, 1, 0, 2];
    let lens = [3i32, 4];
    let cu_q = [0i32, 1, 3];
    let mut latent: Vec<i8> = (0..BLOCKS * PAGE * HK * D).map(|i| ((i * 37) % 255) as i8).collect();
    let mut tokens: Vec<f32> = (0..BLOCKS * PAGE * HK).map(|i| 0.5 + 0.125 * i as f32).collect();
    let descale = [0.01f32, 0.03]; // (B, HK)
    let q = values(3 * HQ * D, 0.9);
    let mut out = vec![0f32; 3 * HQ * DV];
    let cache = LatentCache {
        latent: ViewMut::contiguous(&mut latent, &[BLOCKS, PAGE, HK, D]).unwrap(),
        dv: DV,
        descale: Some(View::contiguous(&descale, &[2, HK]).unwrap()),
        token_scale: Some(ViewMut::contiguous(&mut tokens, &[BLOCKS, PAGE, HK]).unwrap()),
    };
    let opts = KvCacheOptions {
        cache_seqlens: CacheSeqlens::PerSequence(&lens),
        block_table: Some(BlockTable {
            data: &table,
            blocks_per_seq: 2,
        }),
        ..Default::default()
    };
    fwd_kvcache_varlen_latent(
        &View::contiguous(&q, &[3, HQ, D]).unwrap(),
        &cache,
        &mut ViewMut::contiguous(&mut out, &[3, HQ, DV]).unwrap(),
        None,
        &cu_q,
        2,
        &opts,
        &causal(),
    )
    .unwrap();
    let (data, scales) = (cache.latent.data(), cache.token_scale.as_ref().unwrap().data());
    for b in 0..2 {
        let n = lens[b] as usize;
        let rows: Vec<f32> = (0..n * D)
            .map(|i| {
                let p = i / D;
                let slot = table[b * 2 + p / PAGE] as usize * PAGE + p % PAGE;
                f32::from(data[slot * D + i % D]) * (descale[b] * scales[slot])
            })
            .collect();
        let (q0, q1) = (cu_q[b] as usize, cu_q[b + 1] as usize);
        let want = dense_latent(&q[q0 * HQ * D..q1 * HQ * D], &rows, q1 - q0, n);
        assert_close(&out[q0 * HQ * DV..q1 * HQ * DV], &want, "out");
    }
}

/// The Rust-side checks (dv, v_new) and the library's (scales on a float cache, rotary) name the
/// parameter, and leave the cache and out untouched.
#[test]
fn bad_latent_calls_are_rejected_naming_the_parameter() {
    const CAP: usize = 4;
    let before = values(CAP * HK * D, 0.1);
    let mut latent = before.clone();
    let k_new = values(HK * D, 0.7);
    let v_new = values(HK * DV, 0.9);
    let q = values(HQ * D, 1.3);
    let (cos, sin) = (vec![1f32; CAP * 2], vec![0f32; CAP * 2]);
    let descale = [1f32];
    let mut out = vec![7f32; HQ * DV];
    let call = |latent: &mut [f32], out: &mut [f32], dv, descale, opts: &KvCacheOptions<f32>| {
        let mut cache = LatentCache {
            latent: ViewMut::contiguous(latent, &[1, CAP, HK, D]).unwrap(),
            dv,
            descale,
            token_scale: None,
        };
        fwd_kvcache_latent(
            &View::contiguous(&q, &[1, 1, HQ, D]).unwrap(),
            &mut cache,
            &mut ViewMut::contiguous(out, &[1, 1, HQ, dv.min(DV)]).unwrap(),
            None,
            opts,
            &FwdOptions::default(),
        )
        .unwrap_err()
    };
    let append = KvCacheOptions {
        k_new: Some(View::contiguous(&k_new, &[1, 1, HK, D]).unwrap()),
        cache_seqlens: CacheSeqlens::Uniform(1),
        ..Default::default()
    };
    let cases = [
        (D + 1, None, append, Status::InvalidArgument, "dv: 21 given, supported 0 to 20"),
        (
            DV,
            None,
            KvCacheOptions {
                v_new: Some(View::contiguous(&v_new, &[1, 1, HK, DV]).unwrap()),
                ..append
            },
            Status::InvalidArgument,
            "cache.v_new",
        ),
        (
            DV,
            Some(View::contiguous(&descale, &[1]).unwrap()),
            append,
            Status::InvalidArgument,
            "k_descale",
        ),
        (
            DV,
            None,
            KvCacheOptions {
                rotary: Some(Rotary {
                    cos: View::contiguous(&cos, &[CAP, 2]).unwrap(),
                    sin: View::contiguous(&sin, &[CAP, 2]).unwrap(),
                    interleaved: false,
                }),
                ..append
            },
            Status::Unsupported,
            "rotary",
        ),
    ];
    for (dv, descale, opts, status, needle) in cases {
        let err = call(&mut latent, &mut out, dv, descale, &opts);
        assert_eq!(err.status(), status, "{needle}: {}", err.message());
        assert!(err.message().contains(needle), "{needle}: {}", err.message());
        assert_eq!(latent, before, "{needle}: the cache was written");
        assert!(out.iter().all(|&x| x == 7.0), "{needle}: out was written");
    }
}
