//! The KV-cache forward, merging of attention states, the varlen backward and the kernel
//! registry, each against the dense entry points.

use anyattn::{
    bwd, bwd_varlen, fwd, fwd_kvcache, fwd_varlen, kernels, merge_attention_states,
    merge_attention_states_in_place, BlockTable, CacheSeqlens, FwdOptions, Isa, KvCacheOptions,
    Status, VarlenSeqs, View, ViewMut,
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

/// Bit patterns, so that equal NaNs and signed zeros compare as the library guarantees.
fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Dense forward of q `(1, sq, hq, d)` over keys `(1, sk, hk, d)`; returns (out, lse).
fn dense(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (sq, sk, hq, hk, d): (usize, usize, usize, usize, usize),
    opts: &FwdOptions,
) -> (Vec<f32>, Vec<f32>) {
    let mut out = vec![0f32; sq * hq * d];
    let mut lse = vec![0f32; hq * sq];
    fwd(
        &View::contiguous(q, &[1, sq, hq, d]).unwrap(),
        &View::contiguous(k, &[1, sk, hk, d]).unwrap(),
        &View::contiguous(v, &[1, sk, hk, d]).unwrap(),
        &mut ViewMut::contiguous(&mut out, &[1, sq, hq, d]).unwrap(),
        Some(&mut ViewMut::contiguous(&mut lse, &[1, hq, sq]).unwrap()),
        opts,
    )
    .unwrap();
    (out, lse)
}

/// Dense backward of `dense`'s call (same shapes), from its out and lse; returns (dq, dk, dv).
#[allow(clippy::too_many_arguments)]
fn dense_bwd(
    dout: &[f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &[f32],
    lse: &[f32],
    (sq, sk, hq, hk, d): (usize, usize, usize, usize, usize),
    opts: &FwdOptions,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut dq = vec![0f32; sq * hq * d];
    let mut dk = vec![0f32; sk * hk * d];
    let mut dv = vec![0f32; sk * hk * d];
    bwd(
        &View::contiguous(dout, &[1, sq, hq, d]).unwrap(),
        &View::contiguous(q, &[1, sq, hq, d]).unwrap(),
        &View::contiguous(k, &[1, sk, hk, d]).unwrap(),
        &View::contiguous(v, &[1, sk, hk, d]).unwrap(),
        &View::contiguous(out, &[1, sq, hq, d]).unwrap(),
        &View::contiguous(lse, &[1, hq, sq]).unwrap(),
        &mut ViewMut::contiguous(&mut dq, &[1, sq, hq, d]).unwrap(),
        &mut ViewMut::contiguous(&mut dk, &[1, sk, hk, d]).unwrap(),
        &mut ViewMut::contiguous(&mut dv, &[1, sk, hk, d]).unwrap(),
        None,
        opts,
    )
    .unwrap();
    (dq, dk, dv)
}

const B: usize = 2;
const SQ: usize = 2;
const HQ: usize = 4;
const HK: usize = 2;
const D: usize = 8;
const S_NEW: usize = 2;

/// Runs an append + attention on a cache of `rows` rows of `row_len` positions, where `locate(b, p)`
/// gives the (row, position) of cache position `p` of sequence `b`, then checks the appended
/// entries and compares every sequence with dense attention over its gathered keys, bitwise.
fn check_append_and_attend(
    rows: usize,
    row_len: usize,
    lens: &[i32],
    block_table: Option<BlockTable>,
    locate: impl Fn(usize, usize) -> (usize, usize),
) {
    let mut rng = Rng(7);
    let q = rng.vec(B * SQ * HQ * D);
    let k_new = rng.vec(B * S_NEW * HK * D);
    let v_new = rng.vec(B * S_NEW * HK * D);
    let mut k_cache = rng.vec(rows * row_len * HK * D);
    let mut v_cache = rng.vec(rows * row_len * HK * D);
    let mut out = vec![0f32; B * SQ * HQ * D];
    let mut lse = vec![0f32; B * HQ * SQ];
    let opts = FwdOptions {
        causal: true,
        ..Default::default()
    };
    let cache = KvCacheOptions {
        k_new: Some(View::contiguous(&k_new, &[B, S_NEW, HK, D]).unwrap()),
        v_new: Some(View::contiguous(&v_new, &[B, S_NEW, HK, D]).unwrap()),
        cache_seqlens: CacheSeqlens::PerSequence(lens),
        block_table,
        ..Default::default()
    };
    fwd_kvcache(
        &View::contiguous(&q, &[B, SQ, HQ, D]).unwrap(),
        &mut ViewMut::contiguous(&mut k_cache, &[rows, row_len, HK, D]).unwrap(),
        &mut ViewMut::contiguous(&mut v_cache, &[rows, row_len, HK, D]).unwrap(),
        &mut ViewMut::contiguous(&mut out, &[B, SQ, HQ, D]).unwrap(),
        Some(&mut ViewMut::contiguous(&mut lse, &[B, HQ, SQ]).unwrap()),
        &cache,
        &opts,
    )
    .unwrap();

    let at = |data: &[f32], b: usize, p: usize| {
        let (row, pos) = locate(b, p);
        let start = (row * row_len + pos) * HK * D;
        data[start..start + HK * D].to_vec()
    };
    for b in 0..B {
        let len = lens[b] as usize;
        for i in 0..S_NEW {
            let new = (b * S_NEW + i) * HK * D;
            assert_eq!(
                at(&k_cache, b, len + i),
                k_new[new..new + HK * D],
                "k_new b={b} i={i}"
            );
            assert_eq!(
                at(&v_cache, b, len + i),
                v_new[new..new + HK * D],
                "v_new b={b} i={i}"
            );
        }
        let sk = len + S_NEW;
        let k: Vec<f32> = (0..sk).flat_map(|p| at(&k_cache, b, p)).collect();
        let v: Vec<f32> = (0..sk).flat_map(|p| at(&v_cache, b, p)).collect();
        let qb = &q[b * SQ * HQ * D..(b + 1) * SQ * HQ * D];
        let (o, l) = dense(qb, &k, &v, (SQ, sk, HQ, HK, D), &opts);
        assert_eq!(
            bits(&out[b * SQ * HQ * D..(b + 1) * SQ * HQ * D]),
            bits(&o),
            "out of sequence {b}"
        );
        assert_eq!(
            bits(&lse[b * HQ * SQ..(b + 1) * HQ * SQ]),
            bits(&l),
            "lse of sequence {b}"
        );
    }
}

#[test]
fn kvcache_contiguous_append_equals_dense_attention() {
    check_append_and_attend(B, 16, &[3, 9], None, |b, p| (b, p));
}

#[test]
fn kvcache_paged_append_equals_dense_attention() {
    const PAGE: usize = 4;
    // Sequence b's logical page j lives in physical block table[b][j]; blocks are shuffled.
    let table = [5i32, 2, 7, 0, 1, 6, 3, 4];
    check_append_and_attend(
        8,
        PAGE,
        &[5, 10],
        Some(BlockTable {
            data: &table,
            blocks_per_seq: 4,
        }),
        |b, p| (table[b * 4 + p / PAGE] as usize, p % PAGE),
    );
}

#[test]
fn kvcache_capacity_overflow_is_rejected_and_leaves_the_cache_untouched() {
    const S_CACHE: usize = 8;
    let mut rng = Rng(11);
    let q = rng.vec(B * SQ * HQ * D);
    let k_new = rng.vec(B * S_NEW * HK * D);
    let v_new = rng.vec(B * S_NEW * HK * D);
    let k_before = rng.vec(B * S_CACHE * HK * D);
    let v_before = rng.vec(B * S_CACHE * HK * D);
    let (mut k_cache, mut v_cache) = (k_before.clone(), v_before.clone());
    let mut out = vec![0f32; B * SQ * HQ * D];
    // Sequence 0 fits; sequence 1 would need 7 + 2 = 9 positions of 8.
    let lens = [2i32, 7];
    let cache = KvCacheOptions {
        k_new: Some(View::contiguous(&k_new, &[B, S_NEW, HK, D]).unwrap()),
        v_new: Some(View::contiguous(&v_new, &[B, S_NEW, HK, D]).unwrap()),
        cache_seqlens: CacheSeqlens::PerSequence(&lens),
        ..Default::default()
    };
    let err = fwd_kvcache(
        &View::contiguous(&q, &[B, SQ, HQ, D]).unwrap(),
        &mut ViewMut::contiguous(&mut k_cache, &[B, S_CACHE, HK, D]).unwrap(),
        &mut ViewMut::contiguous(&mut v_cache, &[B, S_CACHE, HK, D]).unwrap(),
        &mut ViewMut::contiguous(&mut out, &[B, SQ, HQ, D]).unwrap(),
        None,
        &cache,
        &FwdOptions::default(),
    )
    .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument, "{err}");
    assert!(err.message().contains("cache_seqlens"), "{err}");
    assert_eq!(bits(&k_cache), bits(&k_before));
    assert_eq!(bits(&v_cache), bits(&v_before));
    assert!(out.iter().all(|&x| x == 0.0));
}

#[test]
fn kvcache_uniform_seqlen_without_append_reads_the_cache() {
    const S_CACHE: usize = 8;
    let mut rng = Rng(5);
    let q = rng.vec(SQ * HQ * D);
    let mut k_cache = rng.vec(S_CACHE * HK * D);
    let mut v_cache = rng.vec(S_CACHE * HK * D);
    let (k_before, v_before) = (k_cache.clone(), v_cache.clone());
    let mut out = vec![0f32; SQ * HQ * D];
    let cache = KvCacheOptions::<f32> {
        cache_seqlens: CacheSeqlens::Uniform(5),
        ..Default::default()
    };
    fwd_kvcache(
        &View::contiguous(&q, &[1, SQ, HQ, D]).unwrap(),
        &mut ViewMut::contiguous(&mut k_cache, &[1, S_CACHE, HK, D]).unwrap(),
        &mut ViewMut::contiguous(&mut v_cache, &[1, S_CACHE, HK, D]).unwrap(),
        &mut ViewMut::contiguous(&mut out, &[1, SQ, HQ, D]).unwrap(),
        None,
        &cache,
        &FwdOptions::default(),
    )
    .unwrap();
    assert_eq!(bits(&k_cache), bits(&k_before));
    assert_eq!(bits(&v_cache), bits(&v_before));
    let (o, _) = dense(
        &q,
        &k_before[..5 * HK * D],
        &v_before[..5 * HK * D],
        (SQ, 5, HQ, HK, D),
        &FwdOptions::default(),
    );
    assert_eq!(bits(&out), bits(&o));
}

#[test]
fn merging_two_halves_equals_attention_over_all_keys() {
    let (sq, sk, h, d) = (5, 12, 3, 8);
    let half = sk / 2;
    let mut rng = Rng(3);
    let q = rng.vec(sq * h * d);
    let k = rng.vec(sk * h * d);
    let v = rng.vec(sk * h * d);
    let opts = FwdOptions::default();
    let dims = |n| (sq, n, h, h, d);
    let (full, full_lse) = dense(&q, &k, &v, dims(sk), &opts);
    let split = half * h * d;
    let (a, lse_a) = dense(&q, &k[..split], &v[..split], dims(half), &opts);
    let (b, lse_b) = dense(&q, &k[split..], &v[split..], dims(sk - half), &opts);
    let close = |what: &str, got: &[f32], want: &[f32]| {
        for (i, (x, y)) in got.iter().zip(want).enumerate() {
            assert!((x - y).abs() <= 1e-5, "{what}[{i}]: {x} vs {y}");
        }
    };

    // 4-D: (B, S, H, Dv) with lse (B, H, S).
    let mut out4 = vec![0f32; sq * h * d];
    let mut lse4 = vec![0f32; h * sq];
    merge_attention_states(
        &View::contiguous(&a, &[1, sq, h, d]).unwrap(),
        &View::contiguous(&lse_a, &[1, h, sq]).unwrap(),
        &View::contiguous(&b, &[1, sq, h, d]).unwrap(),
        &View::contiguous(&lse_b, &[1, h, sq]).unwrap(),
        &mut ViewMut::contiguous(&mut out4, &[1, sq, h, d]).unwrap(),
        Some(&mut ViewMut::contiguous(&mut lse4, &[1, h, sq]).unwrap()),
    )
    .unwrap();
    close("out (4-D)", &out4, &full);
    close("lse (4-D)", &lse4, &full_lse);

    // 3-D: (T, H, Dv) with lse (H, T), no lse_out.
    let mut out3 = vec![0f32; sq * h * d];
    merge_attention_states(
        &View::contiguous(&a, &[sq, h, d]).unwrap(),
        &View::contiguous(&lse_a, &[h, sq]).unwrap(),
        &View::contiguous(&b, &[sq, h, d]).unwrap(),
        &View::contiguous(&lse_b, &[h, sq]).unwrap(),
        &mut ViewMut::contiguous(&mut out3, &[sq, h, d]).unwrap(),
        None,
    )
    .unwrap();
    assert_eq!(bits(&out3), bits(&out4));

    // In place into (out_a, lse_a).
    let (mut a_in, mut lse_a_in) = (a.clone(), lse_a.clone());
    merge_attention_states_in_place(
        &mut ViewMut::contiguous(&mut a_in, &[1, sq, h, d]).unwrap(),
        &mut ViewMut::contiguous(&mut lse_a_in, &[1, h, sq]).unwrap(),
        &View::contiguous(&b, &[1, sq, h, d]).unwrap(),
        &View::contiguous(&lse_b, &[1, h, sq]).unwrap(),
    )
    .unwrap();
    assert_eq!(bits(&a_in), bits(&out4));
    assert_eq!(bits(&lse_a_in), bits(&lse4));

    // A shape mismatch is the library's error, naming the parameter.
    let err = merge_attention_states(
        &View::contiguous(&a, &[1, sq, h, d]).unwrap(),
        &View::contiguous(&lse_a, &[1, h, sq]).unwrap(),
        &View::contiguous(&b, &[sq, h, d]).unwrap(),
        &View::contiguous(&lse_b, &[h, sq]).unwrap(),
        &mut ViewMut::contiguous(&mut out4, &[1, sq, h, d]).unwrap(),
        None,
    )
    .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument, "{err}");
    assert!(err.message().contains("out_b"), "{err}");
}

#[test]
fn bwd_varlen_equals_dense_bwd_per_sequence() {
    let (hq, hk, d) = (4, 2, 8);
    let cu_q = [0i32, 3, 8, 8, 10];
    let cu_k = [0i32, 4, 10, 12, 12];
    let (tq, tk) = (10, 12);
    let mut rng = Rng(17);
    let q = rng.vec(tq * hq * d);
    let k = rng.vec(tk * hk * d);
    let v = rng.vec(tk * hk * d);
    let dout = rng.vec(tq * hq * d);
    let opts = FwdOptions {
        causal: true,
        softcap: Some(5.0),
        ..Default::default()
    };
    let seqs = VarlenSeqs {
        cu_seqlens_q: &cu_q,
        cu_seqlens_k: &cu_k,
        max_seqlen_q: 5,
        max_seqlen_k: 6,
        seqused_k: None,
    };
    let mut out = vec![0f32; tq * hq * d];
    let mut lse = vec![0f32; hq * tq];
    fwd_varlen(
        &View::contiguous(&q, &[tq, hq, d]).unwrap(),
        &View::contiguous(&k, &[tk, hk, d]).unwrap(),
        &View::contiguous(&v, &[tk, hk, d]).unwrap(),
        &mut ViewMut::contiguous(&mut out, &[tq, hq, d]).unwrap(),
        Some(&mut ViewMut::contiguous(&mut lse, &[hq, tq]).unwrap()),
        &seqs,
        &opts,
    )
    .unwrap();
    let mut dq = vec![0f32; tq * hq * d];
    let mut dk = vec![0f32; tk * hk * d];
    let mut dv = vec![0f32; tk * hk * d];
    bwd_varlen(
        &View::contiguous(&dout, &[tq, hq, d]).unwrap(),
        &View::contiguous(&q, &[tq, hq, d]).unwrap(),
        &View::contiguous(&k, &[tk, hk, d]).unwrap(),
        &View::contiguous(&v, &[tk, hk, d]).unwrap(),
        &View::contiguous(&out, &[tq, hq, d]).unwrap(),
        &View::contiguous(&lse, &[hq, tq]).unwrap(),
        &mut ViewMut::contiguous(&mut dq, &[tq, hq, d]).unwrap(),
        &mut ViewMut::contiguous(&mut dk, &[tk, hk, d]).unwrap(),
        &mut ViewMut::contiguous(&mut dv, &[tk, hk, d]).unwrap(),
        None,
        &seqs,
        &opts,
    )
    .unwrap();

    for s in 0..cu_q.len() - 1 {
        let (q0, q1) = (cu_q[s] as usize, cu_q[s + 1] as usize);
        let (k0, k1) = (cu_k[s] as usize, cu_k[s + 1] as usize);
        let (sq, sk) = (q1 - q0, k1 - k0);
        let rq = |x: &[f32]| x[q0 * hq * d..q1 * hq * d].to_vec();
        let rk = |x: &[f32]| x[k0 * hk * d..k1 * hk * d].to_vec();
        let (qs, ks, vs, dos) = (rq(&q), rk(&k), rk(&v), rq(&dout));
        let dims = (sq, sk, hq, hk, d);
        let (o, l) = dense(&qs, &ks, &vs, dims, &opts);
        let (dqs, dks, dvs) = dense_bwd(&dos, &qs, &ks, &vs, &o, &l, dims, &opts);
        assert_eq!(bits(&rq(&dq)), bits(&dqs), "dq of sequence {s}");
        assert_eq!(bits(&rk(&dk)), bits(&dks), "dk of sequence {s}");
        assert_eq!(bits(&rk(&dv)), bits(&dvs), "dv of sequence {s}");
    }
}

#[test]
fn bwd_varlen_checks_gradient_shapes() {
    let cu = [0i32, 2];
    let x = vec![0.5f32; 2 * 8];
    let mut dq = vec![0f32; 2 * 8];
    let mut dk = vec![0f32; 2 * 8];
    let mut dv = vec![0f32; 2 * 8];
    let lse = vec![0f32; 2];
    let view = || View::contiguous(&x, &[2, 1, 8]).unwrap();
    let err = bwd_varlen(
        &view(),
        &view(),
        &view(),
        &view(),
        &view(),
        &View::contiguous(&lse, &[1, 2]).unwrap(),
        &mut ViewMut::contiguous(&mut dq, &[1, 1, 8]).unwrap(),
        &mut ViewMut::contiguous(&mut dk, &[2, 1, 8]).unwrap(),
        &mut ViewMut::contiguous(&mut dv, &[2, 1, 8]).unwrap(),
        None,
        &VarlenSeqs {
            cu_seqlens_q: &cu,
            cu_seqlens_k: &cu,
            max_seqlen_q: 2,
            max_seqlen_k: 2,
            seqused_k: None,
        },
        &FwdOptions::default(),
    )
    .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().starts_with("dq: shape [1, 1, 8]"), "{err}");
}

#[test]
fn kernels_list_a_supported_portable_entry() {
    let list = kernels();
    assert!(!list.is_empty());
    let portable = list
        .iter()
        .find(|k| k.isa == Some(Isa::Portable))
        .expect("a portable kernel");
    assert!(portable.supported, "{portable:?}");
    assert!(portable.name.contains("portable"), "{portable:?}");
    assert!(portable.vector_lanes > 0 && portable.tile_rows > 0 && portable.tile_keys > 0);
    for k in &list {
        if let Some(isa) = k.isa {
            assert_eq!(k.supported, isa.is_supported(), "{k:?}");
        }
    }
}

#[test]
fn kvcache_malformed_block_table_is_rejected_before_the_call() {
    let q = vec![0f32; D];
    let mut k_cache = vec![0f32; 4 * HK * D];
    let mut v_cache = vec![0f32; 4 * HK * D];
    let mut out = vec![0f32; D];
    let table = [0i32, 1, 2];
    let err = fwd_kvcache(
        &View::contiguous(&q, &[1, 1, 1, D]).unwrap(),
        &mut ViewMut::contiguous(&mut k_cache, &[4, 1, HK, D]).unwrap(),
        &mut ViewMut::contiguous(&mut v_cache, &[4, 1, HK, D]).unwrap(),
        &mut ViewMut::contiguous(&mut out, &[1, 1, 1, D]).unwrap(),
        None,
        &KvCacheOptions {
            cache_seqlens: CacheSeqlens::Uniform(1),
            block_table: Some(BlockTable {
                data: &table,
                blocks_per_seq: 2,
            }),
            ..Default::default()
        },
        &FwdOptions::default(),
    )
    .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().starts_with("block_table: 3 entries"), "{err}");
}

/// `bwd_own_forward` reaches the kernels from Rust: causal with Sq > Sk, row Sq - Sk sees key 0
/// alone (P = 1), so dS = dP - delta is exactly 0 in exact arithmetic. With the flag its delta is
/// that key's dP (the row is normalised from its own scores), so its dq is exactly 0; rows before
/// it see no key. The rows after it get non-zero gradients, and the flag changes only f32 rows of
/// few keys, so dk and dv stay close to the plain backward's.
#[test]
fn bwd_own_forward_gives_a_row_of_one_key_zero_dq() {
    let (sq, sk, h, d) = (12, 5, 2, 16);
    let mut rng = Rng(11);
    let q = rng.vec(sq * h * d);
    let k = rng.vec(sk * h * d);
    let v = rng.vec(sk * h * d);
    let dout = rng.vec(sq * h * d);
    let plain = FwdOptions {
        causal: true,
        ..Default::default()
    };
    let dims = (sq, sk, h, h, d);
    let (out, lse) = dense(&q, &k, &v, dims, &plain);
    let gradients = |opts: &FwdOptions| dense_bwd(&dout, &q, &k, &v, &out, &lse, dims, opts);
    let own = FwdOptions {
        bwd_own_forward: true,
        ..plain
    };
    let (dq, dk, dv) = gradients(&own);
    let one_key_rows = (sq - sk + 1) * h * d;
    assert!(
        dq[..one_key_rows].iter().all(|&x| x == 0.0),
        "dq of rows that see at most one key"
    );
    assert!(
        dq[one_key_rows..].iter().any(|&x| x != 0.0),
        "dq of rows that see several keys"
    );
    let (_, dk_plain, dv_plain) = gradients(&plain);
    for (name, a, b) in [("dk", &dk, &dk_plain), ("dv", &dv, &dv_plain)] {
        let worst = a
            .iter()
            .zip(b.iter())
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(
            worst < 1e-5,
            "{name}: own_forward and plain differ by {worst}"
        );
    }
}
