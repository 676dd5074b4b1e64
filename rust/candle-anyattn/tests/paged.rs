//! `flash_attn_varlen_paged_windowed`: packed queries against shuffled paged caches equal the plain
//! candle attention of each sequence over its keys (flash-attn's 2x rule), with and without
//! `mm_prefix_ranges`, and bad paging arguments give errors that name them.

mod common;

use candle_anyattn as fa;
use candle_core::{DType, Device, Tensor};
use common::{check, naive_varlen, randn, Spec};

/// A decode step, a sequence with no queries, a prefill chunk and a full prefill.
const CU_Q: [usize; 5] = [0, 1, 1, 8, 20];
const CU_K: [usize; 5] = [0, 13, 17, 40, 52];
const HQ: usize = 4;
const HK: usize = 2;
const D: usize = 32;
const PAGE: usize = 5;
const MAX_BLOCKS: usize = 5;

struct Case {
    q: Tensor,
    /// Packed keys and values `(total_k, HK, D)`: what the reference reads.
    k: Tensor,
    v: Tensor,
    /// The same keys and values scattered into `(num_blocks, PAGE, HK, D)` caches.
    k_cache: Tensor,
    v_cache: Tensor,
    table: Tensor,
}

fn case(dtype: DType) -> Case {
    let total_k = CU_K[4];
    let k = randn(1, &[total_k, HK, D], dtype);
    let v = randn(2, &[total_k, HK, D], dtype);
    // Block of logical page j of sequence b: a fixed shuffle of 4 * MAX_BLOCKS blocks, plus two
    // blocks nobody uses.
    let num_blocks = 4 * MAX_BLOCKS + 2;
    let block_of = |b: usize, j: usize| (7 * (b * MAX_BLOCKS + j) + 3) % num_blocks;
    let mut source = vec![total_k; num_blocks * PAGE]; // total_k: a zero row
    for b in 0..4 {
        for p in 0..CU_K[b + 1] - CU_K[b] {
            source[block_of(b, p / PAGE) * PAGE + p % PAGE] = CU_K[b] + p;
        }
    }
    let index: Vec<u32> = source.iter().map(|&r| r as u32).collect();
    let index = Tensor::new(index.as_slice(), &Device::Cpu).unwrap();
    let scatter = |t: &Tensor| {
        let padded =
            Tensor::cat(&[t, &t.narrow(0, 0, 1).unwrap().zeros_like().unwrap()], 0).unwrap();
        padded
            .index_select(&index, 0)
            .unwrap()
            .reshape((num_blocks, PAGE, HK, D))
            .unwrap()
    };
    let table: Vec<u32> = (0..4 * MAX_BLOCKS)
        .map(|i| block_of(i / MAX_BLOCKS, i % MAX_BLOCKS) as u32)
        .collect();
    Case {
        q: randn(3, &[CU_Q[4], HQ, D], dtype),
        k_cache: scatter(&k),
        v_cache: scatter(&v),
        k,
        v,
        table: Tensor::from_vec(table, (4, MAX_BLOCKS), &Device::Cpu).unwrap(),
    }
}

fn offsets(cu: &[usize]) -> Tensor {
    let v: Vec<u32> = cu.iter().map(|&x| x as u32).collect();
    Tensor::new(v.as_slice(), &Device::Cpu).unwrap()
}

#[test]
fn paged_varlen_meets_the_2x_rule_per_sequence() {
    for dtype in [DType::F32, DType::BF16] {
        let c = case(dtype);
        for (wl, wr, softcap) in [
            (None, None, None),
            (None, Some(0), None),
            (Some(6), Some(0), Some(4.0)),
        ] {
            let got = fa::flash_attn_varlen_paged_windowed(
                &c.q,
                &c.k_cache,
                &c.v_cache,
                &offsets(&CU_Q),
                &offsets(&CU_K),
                &c.table,
                None,
                12,
                23,
                0.2,
                wl,
                wr,
                PAGE,
                softcap,
            )
            .unwrap();
            let spec = Spec {
                scale: 0.2,
                window_left: wl,
                window_right: wr,
                softcap,
                ..Default::default()
            };
            let ref64 = naive_varlen(&c.q, &c.k, &c.v, &CU_Q, &CU_K, &spec, DType::F64).unwrap();
            let same = naive_varlen(&c.q, &c.k, &c.v, &CU_Q, &CU_K, &spec, dtype).unwrap();
            check(
                &format!("paged varlen window ({wl:?}, {wr:?}) softcap {softcap:?}"),
                &got,
                &ref64,
                &same,
            );
        }
    }
}

/// `mm_prefix_ranges` (per sequence key ranges a query inside sees whatever the mask) against
/// the plain attention with the same visibility rule, for causal and sliding-window masks,
/// ranges that overlap the query rows or lie before them, empty ranges and a sequence without.
#[test]
fn mm_prefix_ranges_extend_the_mask() {
    // Positions: sequence 0 has 13 keys and 1 query (position 12), sequence 1 has 4 keys and no
    // query, sequence 2 has 23 keys and 7 queries (positions 16..23), sequence 3 has 12 keys
    // and 12 queries (positions 0..12).
    let ranges: Vec<Vec<(i64, i64)>> = vec![
        vec![(10, 13), (0, 0)],
        vec![(0, 4), (0, 0)],
        vec![(2, 9), (15, 21)],
        vec![(3, 8), (8, 11)],
    ];
    let flat: Vec<i32> = ranges
        .iter()
        .flat_map(|r| r.iter().flat_map(|&(s, e)| [s as i32, e as i32]))
        .collect();
    let ranges_t = Tensor::from_vec(flat, (4, 2, 2), &Device::Cpu).unwrap();
    for dtype in [DType::F32, DType::BF16] {
        let c = case(dtype);
        for (wl, wr, softcap) in [
            (None, Some(0), None),
            (Some(2), Some(0), None),
            (Some(3), Some(1), Some(4.0)),
            (None, None, None),
        ] {
            let got = fa::flash_attn_varlen_paged_windowed(
                &c.q,
                &c.k_cache,
                &c.v_cache,
                &offsets(&CU_Q),
                &offsets(&CU_K),
                &c.table,
                Some(&ranges_t),
                12,
                23,
                0.2,
                wl,
                wr,
                PAGE,
                softcap,
            )
            .unwrap();
            let spec = Spec {
                scale: 0.2,
                window_left: wl,
                window_right: wr,
                softcap,
                // The ranges only apply where a mask is active, as in candle-flash-attn.
                prefix_ranges: if wl.is_some() || wr.is_some() {
                    ranges.clone()
                } else {
                    Vec::new()
                },
                ..Default::default()
            };
            let ref64 = naive_varlen(&c.q, &c.k, &c.v, &CU_Q, &CU_K, &spec, DType::F64).unwrap();
            let same = naive_varlen(&c.q, &c.k, &c.v, &CU_Q, &CU_K, &spec, dtype).unwrap();
            check(
                &format!("mm_prefix_ranges window ({wl:?}, {wr:?}) softcap {softcap:?}"),
                &got,
                &ref64,
                &same,
            );
        }
    }
}

#[test]
fn paging_errors_name_the_argument() {
    let c = case(DType::F32);
    let call = |table: &Tensor, ranges: Option<&Tensor>, page: usize, cu_k: &[usize]| {
        fa::flash_attn_varlen_paged_windowed(
            &c.q,
            &c.k_cache,
            &c.v_cache,
            &offsets(&CU_Q),
            &offsets(cu_k),
            table,
            ranges,
            12,
            23,
            0.2,
            None,
            Some(0),
            page,
            None,
        )
        .unwrap_err()
        .to_string()
    };
    let ranges = Tensor::zeros((3, 1, 2), DType::I32, &Device::Cpu).unwrap();
    let msg = call(&c.table, Some(&ranges), PAGE, &CU_K);
    assert!(
        msg.contains("mm_prefix_ranges must have shape (4, max_ranges, 2)"),
        "{msg}"
    );
    let ranges = Tensor::zeros((4, 1, 2), DType::F32, &Device::Cpu).unwrap();
    let msg = call(&c.table, Some(&ranges), PAGE, &CU_K);
    assert!(
        msg.contains("mm_prefix_ranges must be u32, i32 or i64"),
        "{msg}"
    );
    let msg = call(&c.table, None, PAGE + 1, &CU_K);
    assert!(msg.contains("page_block_size is 6"), "{msg}");
    let msg = call(&c.table, None, PAGE, &[0, 13, 12, 40, 52]);
    assert!(msg.contains("seqlens_k gives sequence 1 -1 keys"), "{msg}");
    let mut entries = c.table.flatten_all().unwrap().to_vec1::<u32>().unwrap();
    entries[2 * MAX_BLOCKS + 1] = 99;
    let bad = Tensor::from_vec(entries, (4, MAX_BLOCKS), &Device::Cpu).unwrap();
    let msg = call(&bad, None, PAGE, &CU_K);
    assert!(msg.contains("block_table"), "{msg}");
}
