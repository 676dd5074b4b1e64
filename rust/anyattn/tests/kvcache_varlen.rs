//! `fwd_kvcache_varlen` (paged varlen): every sequence of a packed batch against dense attention
//! over the keys gathered from its pages, and the errors of the read-only cache call.

use anyattn::{
    fwd, fwd_kvcache_varlen, BlockTable, CacheSeqlens, FwdOptions, KvCacheOptions, Status, View,
    ViewMut,
};

/// A small deterministic generator (64-bit LCG) of values in [-1, 1).
struct Rng(u64);

impl Rng {
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 = self
                    .0
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

const HQ: usize = 4;
const HK: usize = 2;
const D: usize = 8;
const PAGE: usize = 4;
const BLOCKS: usize = 12;
/// A decode step, a sequence with no queries, a 5-token prefill chunk and a full prefill.
const CU_Q: [i32; 5] = [0, 1, 1, 6, 9];
const LENS_K: [i32; 4] = [9, 3, 14, 3];
/// Sequence b's page j is block TABLE[b * 4 + j]; the blocks are shuffled.
const TABLE: [i32; 16] = [7, 2, 11, 0, 5, 1, 1, 1, 3, 9, 4, 10, 8, 6, 6, 6];

struct Case {
    q: Vec<f32>,
    k_cache: Vec<f32>,
    v_cache: Vec<f32>,
}

fn case() -> Case {
    let mut rng = Rng(3);
    let total_q = CU_Q[4] as usize;
    Case {
        q: rng.vec(total_q * HQ * D),
        k_cache: rng.vec(BLOCKS * PAGE * HK * D),
        v_cache: rng.vec(BLOCKS * PAGE * HK * D),
    }
}

fn cache_options<'a>() -> KvCacheOptions<'a, f32> {
    KvCacheOptions {
        cache_seqlens: CacheSeqlens::PerSequence(&LENS_K),
        block_table: Some(BlockTable {
            data: &TABLE,
            blocks_per_seq: 4,
        }),
        ..Default::default()
    }
}

/// Sequence b's keys (or values) in position order, `(n, HK, D)`.
fn gather(cache: &[f32], b: usize) -> Vec<f32> {
    let row = HK * D;
    (0..LENS_K[b] as usize)
        .flat_map(|p| {
            let start = (TABLE[b * 4 + p / PAGE] as usize * PAGE + p % PAGE) * row;
            cache[start..start + row].to_vec()
        })
        .collect()
}

#[test]
fn each_sequence_equals_dense_attention_over_its_pages() {
    let c = case();
    let total_q = CU_Q[4] as usize;
    for opts in [
        FwdOptions::default(),
        FwdOptions {
            causal: true,
            softcap: Some(5.0),
            ..Default::default()
        },
        FwdOptions {
            window_left: Some(3),
            window_right: Some(0),
            ..Default::default()
        },
    ] {
        let mut out = vec![0f32; total_q * HQ * D];
        let mut lse = vec![0f32; HQ * total_q];
        fwd_kvcache_varlen(
            &View::contiguous(&c.q, &[total_q, HQ, D]).unwrap(),
            &View::contiguous(&c.k_cache, &[BLOCKS, PAGE, HK, D]).unwrap(),
            &View::contiguous(&c.v_cache, &[BLOCKS, PAGE, HK, D]).unwrap(),
            &mut ViewMut::contiguous(&mut out, &[total_q, HQ, D]).unwrap(),
            Some(&mut ViewMut::contiguous(&mut lse, &[HQ, total_q]).unwrap()),
            &CU_Q,
            5,
            &cache_options(),
            &opts,
        )
        .unwrap();
        for b in 0..4 {
            let (q0, q1) = (CU_Q[b] as usize, CU_Q[b + 1] as usize);
            if q0 == q1 {
                continue;
            }
            let (sq, sk) = (q1 - q0, LENS_K[b] as usize);
            let (keys, values) = (gather(&c.k_cache, b), gather(&c.v_cache, b));
            let mut want = vec![0f32; sq * HQ * D];
            let mut want_lse = vec![0f32; HQ * sq];
            fwd(
                &View::contiguous(&c.q[q0 * HQ * D..q1 * HQ * D], &[1, sq, HQ, D]).unwrap(),
                &View::contiguous(&keys, &[1, sk, HK, D]).unwrap(),
                &View::contiguous(&values, &[1, sk, HK, D]).unwrap(),
                &mut ViewMut::contiguous(&mut want, &[1, sq, HQ, D]).unwrap(),
                Some(&mut ViewMut::contiguous(&mut want_lse, &[1, HQ, sq]).unwrap()),
                &opts,
            )
            .unwrap();
            for (i, (g, w)) in out[q0 * HQ * D..q1 * HQ * D].iter().zip(&want).enumerate() {
                assert!((g - w).abs() <= 1e-6, "sequence {b}, out[{i}]: {g} vs {w}");
            }
            for h in 0..HQ {
                for i in 0..sq {
                    let (g, w) = (lse[h * total_q + q0 + i], want_lse[h * sq + i]);
                    assert!(
                        (g - w).abs() <= 1e-6,
                        "sequence {b}, lse[{h}][{i}]: {g} vs {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn appending_and_bad_offsets_are_rejected_without_writing() {
    let c = case();
    let total_q = CU_Q[4] as usize;
    let mut out = vec![7f32; total_q * HQ * D];
    let k_new = vec![0f32; 4 * HK * D];
    let q = View::contiguous(&c.q, &[total_q, HQ, D]).unwrap();
    let k_cache = View::contiguous(&c.k_cache, &[BLOCKS, PAGE, HK, D]).unwrap();
    let v_cache = View::contiguous(&c.v_cache, &[BLOCKS, PAGE, HK, D]).unwrap();
    let appending = KvCacheOptions {
        k_new: Some(View::contiguous(&k_new, &[4, 1, HK, D]).unwrap()),
        v_new: Some(View::contiguous(&k_new, &[4, 1, HK, D]).unwrap()),
        ..cache_options()
    };
    let mut out_view = ViewMut::contiguous(&mut out, &[total_q, HQ, D]).unwrap();
    let opts = FwdOptions::default();
    let err = fwd_kvcache_varlen(
        &q,
        &k_cache,
        &v_cache,
        &mut out_view,
        None,
        &CU_Q,
        5,
        &appending,
        &opts,
    )
    .unwrap_err();
    assert_eq!(err.status(), Status::Unsupported, "{err}");
    assert!(err.message().contains("k_new"), "{err}");
    let decreasing = [0i32, 4, 2, 6, 9];
    let err = fwd_kvcache_varlen(
        &q,
        &k_cache,
        &v_cache,
        &mut out_view,
        None,
        &decreasing,
        5,
        &cache_options(),
        &opts,
    )
    .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument, "{err}");
    assert!(err.message().contains("cu_seqlens_q"), "{err}");
    let err = fwd_kvcache_varlen(
        &q,
        &k_cache,
        &v_cache,
        &mut out_view,
        None,
        &CU_Q,
        4,
        &cache_options(),
        &opts,
    )
    .unwrap_err();
    assert!(err.message().contains("max_seqlen_q"), "{err}");
    assert_eq!(bits(&out), bits(&vec![7f32; total_q * HQ * D]));
}
