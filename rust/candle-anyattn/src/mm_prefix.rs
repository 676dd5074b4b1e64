//! `mm_prefix_ranges` of the paged varlen op: key ranges that bypass the causal/window mask for
//! the queries inside them (bidirectional attention over an image's tokens, say).
//!
//! candle-flash-attn's kernel lets query `i` of sequence `b` (absolute position
//! `p = i + len_k - len_q`) see key `j` when the window allows it, or when some range
//! `[start, end)` of `b` holds both `p` and `j`. The ranges only matter when a mask is active
//! (some window side bounded). anyattn's masks are windows only, so the op first runs the plain
//! masked attention for every row, then recomputes the rows whose visible keys a range extends:
//! such a row sees a fixed set of key positions, and consecutive rows of a sequence that see the
//! same set form one sequence of a second paged call whose block table lists those positions one
//! by one (pages of one row over the same caches) and whose mask is off.

use anyattn::{BlockTable, CacheSeqlens, Element, FwdOptions, KvCacheOptions, View, ViewMut};
use candle_core::{bail, Result, Tensor, WithDType};

use crate::cpu::{anyattn_err, follow_candle_threads};
use crate::indices::read_i32;

/// Half-open ranges `[start, end)` of key positions, per sequence.
pub(crate) type Ranges = Vec<Vec<(i64, i64)>>;

/// Reads `mm_prefix_ranges`, `(batch, max_ranges, 2)` integers (i32 as candle-flash-attn takes
/// them; u32 and i64 too), into per-sequence lists without the empty ranges.
pub(crate) fn read_ranges(t: &Tensor, batch: usize) -> Result<Ranges> {
    let dims = t.dims();
    if dims.len() != 3 || dims[0] != batch || dims[2] != 2 {
        bail!(
            "flash-attn (anyattn): mm_prefix_ranges must have shape ({batch}, max_ranges, 2) \
             (batch, ranges, [start, end)), got shape {dims:?}"
        )
    }
    let flat = read_i32("mm_prefix_ranges", t)?;
    let per_seq = dims[1] * 2;
    Ok((0..batch)
        .map(|b| {
            flat[b * per_seq..(b + 1) * per_seq]
                .chunks(2)
                .map(|r| (i64::from(r[0]), i64::from(r[1])))
                .filter(|(start, end)| start < end)
                .collect()
        })
        .collect())
}

/// Consecutive query rows of one sequence that see the same key positions.
#[derive(Debug, PartialEq)]
pub(crate) struct RowGroup {
    /// First row in the packed query tensor.
    pub(crate) row: usize,
    /// Number of rows.
    pub(crate) rows: usize,
    /// The sequence.
    pub(crate) seq: usize,
    /// The visible key positions of the sequence: sorted, disjoint, non-adjacent closed intervals.
    pub(crate) keys: Vec<(i64, i64)>,
}

/// Sorted union of closed intervals, touching ones merged.
fn union(mut parts: Vec<(i64, i64)>) -> Vec<(i64, i64)> {
    parts.retain(|(lo, hi)| lo <= hi);
    parts.sort_unstable();
    let mut merged: Vec<(i64, i64)> = Vec::with_capacity(parts.len());
    for (lo, hi) in parts {
        match merged.last_mut() {
            Some(last) if lo <= last.1 + 1 => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    merged
}

/// The rows whose visible keys the ranges change, grouped. `cu_q` are the cumulative query
/// offsets, `lens_k` the key count of each sequence, the windows as the op's.
pub(crate) fn row_groups(
    cu_q: &[i32],
    lens_k: &[i32],
    ranges: &Ranges,
    window_left: Option<usize>,
    window_right: Option<usize>,
) -> Vec<RowGroup> {
    let mut groups: Vec<RowGroup> = Vec::new();
    if window_left.is_none() && window_right.is_none() {
        return groups; // no mask: every key is visible already
    }
    let wide = |w: Option<usize>| w.map(|w| i64::try_from(w).unwrap_or(i64::MAX / 4));
    let (wl, wr) = (wide(window_left), wide(window_right));
    for (b, seq_ranges) in ranges.iter().enumerate() {
        if seq_ranges.is_empty() {
            continue;
        }
        let row0 = i64::from(cu_q[b]);
        let len_q = i64::from(cu_q[b + 1]) - row0;
        let len_k = i64::from(lens_k[b]);
        for i in 0..len_q {
            let p = i + len_k - len_q;
            let window = (
                wl.map_or(0, |w| (p - w).max(0)),
                wr.map_or(len_k - 1, |w| (p + w).min(len_k - 1)),
            );
            let mut parts = vec![window];
            parts.extend(
                seq_ranges
                    .iter()
                    .filter(|(start, end)| *start <= p && p < *end)
                    .map(|&(start, end)| (start.max(0), end.min(len_k) - 1)),
            );
            if parts.len() == 1 {
                continue;
            }
            let keys = union(parts);
            if keys == union(vec![window]) {
                continue;
            }
            let row = (row0 + i) as usize;
            match groups.last_mut() {
                Some(g) if g.seq == b && g.row + g.rows == row && g.keys == keys => g.rows += 1,
                _ => groups.push(RowGroup {
                    row,
                    rows: 1,
                    seq: b,
                    keys,
                }),
            }
        }
    }
    groups
}

/// The op's block table.
pub(crate) struct Paging<'a> {
    /// `(batch, blocks_per_seq)` row-major block indices.
    pub(crate) table: &'a [i32],
    pub(crate) blocks_per_seq: usize,
    pub(crate) page_block_size: usize,
}

/// Recomputes the rows of `groups` into `out` (`(total_q, Hq, Dv)`, contiguous): one paged call
/// over the caches seen as one-row pages (`rows_as_pages`, `(num_blocks * page, 1, Hk, D)`),
/// each group a sequence whose block table lists its key positions and whose mask is off (`opts`
/// must have no window). Rows outside the groups form sequences without keys and are left as
/// they are in `out`.
pub(crate) fn recompute_rows<T: Element + WithDType>(
    groups: &[RowGroup],
    paging: &Paging<'_>,
    q: &View<'_, T>,
    k_rows: &View<'_, T>,
    v_rows: &View<'_, T>,
    opts: &FwdOptions<'_>,
    out: &mut [T],
) -> Result<()> {
    if groups.is_empty() {
        return Ok(());
    }
    let total_q = q.shape()[0];
    let row_len = out.len() / total_q.max(1);
    let key_count =
        |g: &RowGroup| -> usize { g.keys.iter().map(|(lo, hi)| (hi - lo + 1) as usize).sum() };
    let max_keys = groups.iter().map(key_count).max().unwrap_or(1).max(1);
    // Sequences: the groups, and between them sequences of the other rows with no keys.
    let mut cu_q: Vec<i32> = vec![0];
    let mut lens: Vec<i32> = Vec::new();
    let mut table: Vec<i32> = Vec::new();
    let mut max_q = 1usize;
    let push = |cu_q: &mut Vec<i32>,
                lens: &mut Vec<i32>,
                table: &mut Vec<i32>,
                end: usize,
                keys: &[i32]| {
        cu_q.push(end as i32);
        lens.push(keys.len() as i32);
        table.extend_from_slice(keys);
        table.resize(lens.len() * max_keys, 0);
    };
    let page = paging.page_block_size;
    let mut cursor = 0usize;
    for g in groups {
        if g.row > cursor {
            push(&mut cu_q, &mut lens, &mut table, g.row, &[]);
            max_q = max_q.max(g.row - cursor);
        }
        let mut rows = Vec::with_capacity(key_count(g));
        for &(lo, hi) in &g.keys {
            for pos in lo as usize..=hi as usize {
                let block = paging.table[g.seq * paging.blocks_per_seq + pos / page];
                rows.push(block * page as i32 + (pos % page) as i32);
            }
        }
        cursor = g.row + g.rows;
        push(&mut cu_q, &mut lens, &mut table, cursor, &rows);
        max_q = max_q.max(g.rows);
    }
    if cursor < total_q {
        push(&mut cu_q, &mut lens, &mut table, total_q, &[]);
        max_q = max_q.max(total_q - cursor);
    }
    let cache = KvCacheOptions {
        cache_seqlens: CacheSeqlens::PerSequence(&lens),
        block_table: Some(BlockTable {
            data: &table,
            blocks_per_seq: max_keys,
        }),
        ..Default::default()
    };
    let mut rows_out = vec![T::from_f64(0.0); out.len()];
    let mut shape = q.shape().to_vec();
    shape[2] = row_len / shape[1].max(1);
    let mut out_view = ViewMut::contiguous(&mut rows_out, &shape).map_err(anyattn_err)?;
    follow_candle_threads();
    anyattn::fwd_kvcache_varlen(
        q,
        k_rows,
        v_rows,
        &mut out_view,
        None,
        &cu_q,
        max_q,
        &cache,
        opts,
    )
    .map_err(anyattn_err)?;
    for g in groups {
        let span = g.row * row_len..(g.row + g.rows) * row_len;
        out[span.clone()].copy_from_slice(&rows_out[span]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_inside_a_range_see_the_range() {
        // One sequence of 6 queries over 8 keys (positions 2..8), causal with a left window of 1,
        // range [3, 6): rows at positions 3, 4 and 5 see keys 3..=5 plus their window.
        let groups = row_groups(&[0, 6], &[8], &vec![vec![(3, 6)]], Some(1), Some(0));
        assert_eq!(
            groups,
            vec![
                RowGroup {
                    row: 1,
                    rows: 1,
                    seq: 0,
                    keys: vec![(2, 5)]
                },
                RowGroup {
                    row: 2,
                    rows: 2,
                    seq: 0,
                    keys: vec![(3, 5)]
                },
            ]
        );
        // Without a mask the ranges change nothing.
        assert!(row_groups(&[0, 6], &[8], &vec![vec![(3, 6)]], None, None).is_empty());
    }
}
