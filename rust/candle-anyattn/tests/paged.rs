//! `flash_attn_varlen_paged_windowed`: packed queries against shuffled paged caches equal the plain
//! candle attention of each sequence over its keys (flash-attn's 2x rule), and bad paging
//! arguments give errors that name them.

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
    let ranges = Tensor::zeros((4, 1, 2), DType::U32, &Device::Cpu).unwrap();
    let msg = call(&c.table, Some(&ranges), PAGE, &CU_K);
    assert!(msg.contains("mm_prefix_ranges"), "{msg}");
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
