//! Forward attention against a KV cache: with in-place append (`anyattn_fwd_kvcache`), flash-attn's
//! `flash_attn_with_kvcache`, and for packed variable-length queries (`anyattn_fwd_kvcache_varlen`),
//! flash-attn's paged varlen.

use anyattn_sys as sys;

use crate::error::{check, Error, Result};
use crate::fwd::{c_params, i32_tensor, FwdOptions};
use crate::view::{Element, Quantized, View, ViewMut};

/// How many keys each sequence already has in the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CacheSeqlens<'a> {
    /// The whole cache (`S_cache` keys per sequence); contiguous caches only.
    #[default]
    Full,
    /// The same number of keys for every sequence.
    Uniform(usize),
    /// `(B)`: sequence `b` has `lens[b]` keys.
    PerSequence(&'a [i32]),
}

/// The block table of a paged cache: a C-contiguous i32 `(B, blocks_per_seq)` array. Cache
/// position `p` of sequence `b` lives in page `data[b * blocks_per_seq + p / page_size]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockTable<'a> {
    /// The entries, row by row; `data.len()` must be `B * blocks_per_seq`.
    pub data: &'a [i32],
    /// Entries per sequence (the table's second dimension), at least 1.
    pub blocks_per_seq: usize,
}

/// A rotary embedding applied to the new keys at their cache positions and to q: at
/// `cache_seqlens[b] + i` for query `i` when the call is causal or windowed, else at
/// `cache_seqlens[b]`. Requires [`KvCacheOptions::k_new`].
#[derive(Debug, Clone, Copy)]
pub struct Rotary<'a> {
    /// f32 `(S_ro, rotary_dim / 2)` cosines; `rotary_dim` is even and at most D.
    pub cos: View<'a, f32>,
    /// f32 `(S_ro, rotary_dim / 2)` sines, the shape of `cos`.
    pub sin: View<'a, f32>,
    /// `true`: rotate pairs `(2t, 2t + 1)` (GPT-J); `false`: pairs `(t, t + rotary_dim / 2)`
    /// (GPT-NeoX).
    pub interleaved: bool,
}

/// The cache-specific arguments of [`fwd_kvcache`]. `KvCacheOptions::default()` attends to the
/// whole contiguous cache and appends nothing.
#[derive(Debug, Clone, Copy)]
pub struct KvCacheOptions<'a, T: Element> {
    /// New keys `(B, S_new, Hk, D)`, written into the cache at positions
    /// `cache_seqlens[b] .. cache_seqlens[b] + S_new` before attention. Both or neither of
    /// `k_new` and `v_new`.
    pub k_new: Option<View<'a, T>>,
    /// New values `(B, S_new, Hk, Dv)`.
    pub v_new: Option<View<'a, T>>,
    /// Keys already in the cache per sequence.
    pub cache_seqlens: CacheSeqlens<'a>,
    /// `(B)`: sequence `b` uses cache batch `cache_batch_idx[b]` (contiguous caches only).
    pub cache_batch_idx: Option<&'a [i32]>,
    /// `(B)`: sequence `b`'s keys start at cache position `cache_leftpad[b]`.
    pub cache_leftpad: Option<&'a [i32]>,
    /// Paged cache: the caches are then `(num_blocks, page_size, Hk, D)` / `(.., Dv)`.
    pub block_table: Option<BlockTable<'a>>,
    /// Rotary embedding of q and the new keys; `None` = off.
    pub rotary: Option<Rotary<'a>>,
}

impl<T: Element> Default for KvCacheOptions<'_, T> {
    fn default() -> Self {
        KvCacheOptions {
            k_new: None,
            v_new: None,
            cache_seqlens: CacheSeqlens::Full,
            cache_batch_idx: None,
            cache_leftpad: None,
            block_table: None,
            rotary: None,
        }
    }
}

/// A C-contiguous rank-2 int32 descriptor of a block table.
fn block_table_tensor(table: &BlockTable<'_>) -> Result<sys::anyattn_tensor> {
    let bps = table.blocks_per_seq;
    if bps == 0 || table.data.len() % bps != 0 {
        return Err(Error::invalid(format!(
            "block_table: {} entries with blocks_per_seq = {bps} given, supported \
             blocks_per_seq >= 1 dividing the entry count (B * blocks_per_seq)",
            table.data.len()
        )));
    }
    let mut t = i32_tensor(table.data);
    t.ndim = 2;
    t.shape[0] = (table.data.len() / bps) as i64;
    t.shape[1] = bps as i64;
    t.strides[0] = bps as i64;
    t.strides[1] = 1;
    Ok(t)
}

/// The C descriptors of a [`KvCacheOptions`]; [`CacheDescriptors::params`] points into them, so
/// they must stay in place until the call returns.
pub(crate) struct CacheDescriptors {
    pub(crate) k_new: Option<sys::anyattn_tensor>,
    pub(crate) v_new: Option<sys::anyattn_tensor>,
    seqlens: Option<sys::anyattn_tensor>,
    seqlen: i64,
    batch_idx: Option<sys::anyattn_tensor>,
    leftpad: Option<sys::anyattn_tensor>,
    table: Option<sys::anyattn_tensor>,
    cos: Option<sys::anyattn_tensor>,
    sin: Option<sys::anyattn_tensor>,
    interleaved: bool,
    pub(crate) scales: ScaleDescriptors,
}

/// The C descriptors of an 8-bit cache's scales (all `None` for a float cache).
#[derive(Default)]
pub(crate) struct ScaleDescriptors {
    pub(crate) k_descale: Option<sys::anyattn_tensor>,
    pub(crate) v_descale: Option<sys::anyattn_tensor>,
    pub(crate) k_token_scale: Option<sys::anyattn_tensor>,
    pub(crate) v_token_scale: Option<sys::anyattn_tensor>,
}

impl CacheDescriptors {
    pub(crate) fn new<T: Element>(cache: &KvCacheOptions<'_, T>) -> Result<Self> {
        let (seqlens, seqlen) = match cache.cache_seqlens {
            CacheSeqlens::Full => (None, -1),
            CacheSeqlens::Uniform(n) => {
                let n = i64::try_from(n).map_err(|_| {
                    Error::invalid(format!(
                        "cache_seqlens: {n} given, supported 0 to {}",
                        i64::MAX
                    ))
                })?;
                (None, n)
            }
            CacheSeqlens::PerSequence(lens) => (Some(i32_tensor(lens)), -1),
        };
        Ok(CacheDescriptors {
            k_new: cache.k_new.as_ref().map(View::raw),
            v_new: cache.v_new.as_ref().map(View::raw),
            seqlens,
            seqlen,
            batch_idx: cache.cache_batch_idx.map(i32_tensor),
            leftpad: cache.cache_leftpad.map(i32_tensor),
            table: cache
                .block_table
                .as_ref()
                .map(block_table_tensor)
                .transpose()?,
            cos: cache.rotary.as_ref().map(|r| r.cos.raw()),
            sin: cache.rotary.as_ref().map(|r| r.sin.raw()),
            interleaved: cache.rotary.is_some_and(|r| r.interleaved),
            scales: ScaleDescriptors::default(),
        })
    }

    /// The C struct, pointing at the descriptors in `self`.
    fn params(&self) -> sys::anyattn_kvcache_params {
        let ptr = |t: &Option<sys::anyattn_tensor>| {
            t.as_ref().map_or(std::ptr::null(), |t| t as *const _)
        };
        let mut c = std::mem::MaybeUninit::<sys::anyattn_kvcache_params>::zeroed();
        // SAFETY: anyattn_kvcache_params_init writes every field of a valid struct.
        let mut c = unsafe {
            sys::anyattn_kvcache_params_init(c.as_mut_ptr());
            c.assume_init()
        };
        c.k_new = ptr(&self.k_new);
        c.v_new = ptr(&self.v_new);
        c.cache_seqlens = ptr(&self.seqlens);
        c.cache_seqlen = self.seqlen;
        c.cache_batch_idx = ptr(&self.batch_idx);
        c.cache_leftpad = ptr(&self.leftpad);
        c.block_table = ptr(&self.table);
        c.rotary_cos = ptr(&self.cos);
        c.rotary_sin = ptr(&self.sin);
        c.rotary_interleaved = i32::from(self.interleaved);
        c.k_descale = ptr(&self.scales.k_descale);
        c.v_descale = ptr(&self.scales.v_descale);
        c.k_token_scale = ptr(&self.scales.k_token_scale);
        c.v_token_scale = ptr(&self.scales.v_token_scale);
        c
    }
}

/// Forward attention of q against a KV cache, with an optional in-place append of new keys and
/// values and an optional rotary embedding (`anyattn_fwd_kvcache`).
///
/// Shapes: `q (B, Sq, Hq, D)`, `k_cache (B_cache, S_cache, Hk, D)` and
/// `v_cache (B_cache, S_cache, Hk, Dv)`, or paged `(num_blocks, page_size, Hk, D/Dv)` with
/// [`KvCacheOptions::block_table`], `out (B, Sq, Hq, Dv)`, `lse (B, Hq, Sq)` (f32, optional).
/// Sequence `b` attends to cache positions `[leftpad_b, cache_seqlens[b] + S_new)`; the mask is
/// bottom-right aligned to that key count. The caches are written only when `cache.k_new` is
/// given. `opts` are the dense options, except dropout, which this entry point rejects.
///
/// Everything (capacity, cache batch indices, block table entries, rotary table length) is
/// validated before the first write: on error neither the caches nor the outputs are touched,
/// and the error names the offending parameter.
pub fn fwd_kvcache<T: Element>(
    q: &View<'_, T>,
    k_cache: &mut ViewMut<'_, T>,
    v_cache: &mut ViewMut<'_, T>,
    out: &mut ViewMut<'_, T>,
    lse: Option<&mut ViewMut<'_, f32>>,
    cache: &KvCacheOptions<'_, T>,
    opts: &FwdOptions<'_>,
) -> Result<()> {
    let descriptors = CacheDescriptors::new(cache)?;
    call_kvcache(q, k_cache.raw(), v_cache.raw(), out, lse, descriptors, opts)
}

/// anyattn_fwd_kvcache over cache descriptors made from exclusive borrows (or, without an
/// append, from any borrows: the library then only reads them). The two caches are distinct
/// borrows, or one borrow of a shared latent cache seen whole as K and by its first columns as V.
pub(crate) fn call_kvcache<T: Element>(
    q: &View<'_, T>,
    tkc: sys::anyattn_tensor,
    tvc: sys::anyattn_tensor,
    out: &mut ViewMut<'_, T>,
    lse: Option<&mut ViewMut<'_, f32>>,
    descriptors: CacheDescriptors,
    opts: &FwdOptions<'_>,
) -> Result<()> {
    let alibi = opts.alibi_slopes.as_ref().map(View::raw);
    let sinks = opts.sinks.as_ref().map(View::raw);
    let params = c_params(opts, alibi.as_ref(), sinks.as_ref())?;
    let c = descriptors.params();

    let tq = q.raw();
    let to = out.raw();
    let tl = lse.map(|l| l.raw());
    // SAFETY: every view lies inside its slice; the caches (and token scales), out and lse are
    // exclusive borrows, so they overlap neither each other nor the shared inputs (q, k_new,
    // v_new, the tables, the descales), and address no element twice. The one exception is a
    // shared latent cache: V is then a column prefix of K's own borrow, and v_new the same
    // prefix of k_new, which the library recognises and writes once, from k_new. The library
    // validates every index it reads from the i32 tables (cache lengths, batch indices, left
    // padding, block table entries) against the cache shapes before touching memory. The
    // descriptors and both parameter structs outlive the call.
    let status = unsafe {
        sys::anyattn_fwd_kvcache(
            &tq,
            &tkc,
            &tvc,
            &to,
            tl.as_ref().map_or(std::ptr::null(), |t| t as *const _),
            &c,
            &params,
        )
    };
    check(status)
}

/// Forward attention of packed variable-length queries against a KV cache that the call only
/// reads (`anyattn_fwd_kvcache_varlen`): flash-attn's paged varlen, for batches that mix prefill
/// chunks and decode steps.
///
/// Shapes: `q (total_q, Hq, D)`, sequence `b` being rows `cu_seqlens_q[b] .. cu_seqlens_q[b + 1]`
/// (`B + 1` non-decreasing offsets, every length at most `max_seqlen_q`); the caches as in
/// [`fwd_kvcache`], contiguous or paged; `out (total_q, Hq, Dv)`, `lse (Hq, total_q)` (f32,
/// optional). Sequence `b` attends to cache positions `[leftpad_b, cache_seqlens[b])`, its
/// queries being the last of those keys (the mask is bottom-right aligned per sequence). `cache`
/// takes the lengths, batch indices, left padding and block table; its `k_new`, `v_new` and
/// `rotary` must be `None` (an `Unsupported` error otherwise). Dropout is rejected. Rows of `out`
/// and `lse` outside every sequence are left untouched.
///
/// Everything is validated before anything is written; the error names the parameter.
#[allow(clippy::too_many_arguments)]
pub fn fwd_kvcache_varlen<T: Element>(
    q: &View<'_, T>,
    k_cache: &View<'_, T>,
    v_cache: &View<'_, T>,
    out: &mut ViewMut<'_, T>,
    lse: Option<&mut ViewMut<'_, f32>>,
    cu_seqlens_q: &[i32],
    max_seqlen_q: usize,
    cache: &KvCacheOptions<'_, T>,
    opts: &FwdOptions<'_>,
) -> Result<()> {
    let descriptors = CacheDescriptors::new(cache)?;
    let (tkc, tvc) = (k_cache.raw(), v_cache.raw());
    call_kvcache_varlen(q, tkc, tvc, out, lse, cu_seqlens_q, max_seqlen_q, descriptors, opts)
}

/// anyattn_fwd_kvcache_varlen over cache descriptors, which the library only reads.
#[allow(clippy::too_many_arguments)]
pub(crate) fn call_kvcache_varlen<T: Element>(
    q: &View<'_, T>,
    tkc: sys::anyattn_tensor,
    tvc: sys::anyattn_tensor,
    out: &mut ViewMut<'_, T>,
    lse: Option<&mut ViewMut<'_, f32>>,
    cu_seqlens_q: &[i32],
    max_seqlen_q: usize,
    descriptors: CacheDescriptors,
    opts: &FwdOptions<'_>,
) -> Result<()> {
    let max_seqlen_q = i64::try_from(max_seqlen_q).map_err(|_| {
        Error::invalid(format!(
            "max_seqlen_q: {max_seqlen_q} given, supported 0 to {}",
            i64::MAX
        ))
    })?;
    let alibi = opts.alibi_slopes.as_ref().map(View::raw);
    let sinks = opts.sinks.as_ref().map(View::raw);
    let params = c_params(opts, alibi.as_ref(), sinks.as_ref())?;
    let c = descriptors.params();

    let tq = q.raw();
    let to = out.raw();
    let tl = lse.map(|l| l.raw());
    let tcq = i32_tensor(cu_seqlens_q);
    // SAFETY: every view lies inside its slice; out and lse are exclusive borrows, so they overlap
    // neither each other nor the shared inputs (q, the caches, the tables). The library reads
    // the caches only, and validates every offset and index it reads from the i32 tables
    // (cu_seqlens_q, cache lengths, batch indices, left padding, block table entries) against
    // the shapes before touching memory. The descriptors and both parameter structs outlive
    // the call.
    let status = unsafe {
        sys::anyattn_fwd_kvcache_varlen(
            &tq,
            &tkc,
            &tvc,
            &to,
            tl.as_ref().map_or(std::ptr::null(), |t| t as *const _),
            &tcq,
            max_seqlen_q,
            &c,
            &params,
        )
    };
    check(status)
}

/// An 8-bit KV cache with the scales that read it: a cached element's value is
/// `stored * descale * token_scale`, a missing factor being 1. Keys and values share one
/// [`Quantized`] type; q, the new keys/values and out stay `f32`/`f16`/`bf16`.
#[derive(Debug)]
pub struct QuantizedKvCache<'a, C: Quantized> {
    /// Keys `(B_cache, S_cache, Hk, D)`, or paged `(num_blocks, page_size, Hk, D)`.
    pub k: ViewMut<'a, C>,
    /// Values `(B_cache, S_cache, Hk, Dv)`, or paged `(num_blocks, page_size, Hk, Dv)`.
    pub v: ViewMut<'a, C>,
    /// f32 `(1)` per tensor, `(Hk)` per kv head, or `(B, Hk)` per sequence (the query's batch
    /// index, FlashAttention 3's layout) and kv head. Finite and >= 0; when appending, normal
    /// and positive.
    pub k_descale: Option<View<'a, f32>>,
    /// f32 descale of the values, shaped like `k_descale`.
    pub v_descale: Option<View<'a, f32>>,
    /// f32 per-(cache position, kv head) scales of keys and values: `(B_cache, S_cache, Hk)`
    /// or paged `(num_blocks, page_size, Hk)`. The append writes the new positions' scales.
    pub token_scales: Option<TokenScales<'a>>,
}

/// The per-position scales of a [`QuantizedKvCache`], keys and values.
#[derive(Debug)]
pub struct TokenScales<'a> {
    /// Key scales, `(B_cache, S_cache, Hk)` or `(num_blocks, page_size, Hk)`.
    pub k: ViewMut<'a, f32>,
    /// Value scales, shaped like `k`.
    pub v: ViewMut<'a, f32>,
}

impl<C: Quantized> QuantizedKvCache<'_, C> {
    /// The scale descriptors, for a call that writes the token scales.
    fn scales_for_write(&mut self) -> ScaleDescriptors {
        let (k_token_scale, v_token_scale) = match self.token_scales.as_mut() {
            Some(t) => (Some(t.k.raw()), Some(t.v.raw())),
            None => (None, None),
        };
        ScaleDescriptors {
            k_descale: self.k_descale.as_ref().map(View::raw),
            v_descale: self.v_descale.as_ref().map(View::raw),
            k_token_scale,
            v_token_scale,
        }
    }

    /// The scale descriptors, for a call that only reads them.
    fn scales_for_read(&self) -> ScaleDescriptors {
        ScaleDescriptors {
            k_descale: self.k_descale.as_ref().map(View::raw),
            v_descale: self.v_descale.as_ref().map(View::raw),
            k_token_scale: self.token_scales.as_ref().map(|t| t.k.raw_read()),
            v_token_scale: self.token_scales.as_ref().map(|t| t.v.raw_read()),
        }
    }
}

/// [`fwd_kvcache`] against an 8-bit cache: attention over the dequantized cache
/// (`stored * descale * token_scale`, f32 accumulation), with the optional in-place append of
/// `cache.k_new`/`cache.v_new` (after rotary) quantized by the library: per (position, kv head)
/// row, with token scales `token_scale = min(amax / (C::QMAX * descale), f32::MAX)` (0 and a
/// zero row for a row without a finite non-zero element) and `stored = round(x / (descale *
/// token_scale))`, without them `stored = round(x / descale)`, rounding to nearest (ties to
/// even) and saturating ([`Quantized::quantize`]). Everything is validated before anything is
/// written.
pub fn fwd_kvcache_quantized<T: Element, C: Quantized>(
    q: &View<'_, T>,
    kv: &mut QuantizedKvCache<'_, C>,
    out: &mut ViewMut<'_, T>,
    lse: Option<&mut ViewMut<'_, f32>>,
    cache: &KvCacheOptions<'_, T>,
    opts: &FwdOptions<'_>,
) -> Result<()> {
    let mut descriptors = CacheDescriptors::new(cache)?;
    descriptors.scales = kv.scales_for_write();
    call_kvcache(q, kv.k.raw(), kv.v.raw(), out, lse, descriptors, opts)
}

/// [`fwd_kvcache_varlen`] against an 8-bit cache, which the call only reads; `(B, Hk)`
/// descales are indexed by sequence.
#[allow(clippy::too_many_arguments)]
pub fn fwd_kvcache_varlen_quantized<T: Element, C: Quantized>(
    q: &View<'_, T>,
    kv: &QuantizedKvCache<'_, C>,
    out: &mut ViewMut<'_, T>,
    lse: Option<&mut ViewMut<'_, f32>>,
    cu_seqlens_q: &[i32],
    max_seqlen_q: usize,
    cache: &KvCacheOptions<'_, T>,
    opts: &FwdOptions<'_>,
) -> Result<()> {
    let mut descriptors = CacheDescriptors::new(cache)?;
    descriptors.scales = kv.scales_for_read();
    let (tkc, tvc) = (kv.k.raw_read(), kv.v.raw_read());
    call_kvcache_varlen(q, tkc, tvc, out, lse, cu_seqlens_q, max_seqlen_q, descriptors, opts)
}
