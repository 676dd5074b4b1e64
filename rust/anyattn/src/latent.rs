//! Shared latent caches: absorbed multi-head latent attention (DeepSeek's MLA decode). One cache
//! holds rows of `D` values (DeepSeek: 512 latent + 64 rotary) and the values are each row's
//! first `dv` columns. The C library takes the cache as `k_cache` and a column view of it as
//! `v_cache`; two exclusive borrows cannot say that in Rust, so these entry points take the one
//! cache and make the column views themselves.

use anyattn_sys as sys;

use crate::error::{Error, Result};
use crate::fwd::FwdOptions;
use crate::kvcache::{call_kvcache, call_kvcache_varlen, CacheDescriptors, KvCacheOptions};
use crate::view::{Element, Storage, View, ViewMut};

/// A shared latent cache and, for an 8-bit cache, its scales. Keys are whole rows, values their
/// first `dv` columns, so the values take the keys' scales: a value is
/// `stored * descale * token_scale` of its key column.
#[derive(Debug)]
pub struct LatentCache<'a, S: Storage> {
    /// The latent rows `(B_cache, S_cache, Hk, D)`, or paged `(num_blocks, page_size, Hk, D)`:
    /// `f32`/`f16`/`bf16` of q's dtype, or an 8-bit [`crate::Quantized`] type.
    pub latent: ViewMut<'a, S>,
    /// The values are each row's first `dv` columns, `0 <= dv <= D`; `out` is `(.., Hq, dv)`.
    pub dv: usize,
    /// 8-bit caches only: f32 `(1)` per tensor, `(Hk)` per kv head or `(B, Hk)` per sequence
    /// and kv head, as [`crate::QuantizedKvCache::k_descale`].
    pub descale: Option<View<'a, f32>>,
    /// 8-bit caches only: f32 per-(cache position, kv head) scales, `(B_cache, S_cache, Hk)` or
    /// paged `(num_blocks, page_size, Hk)`. The append writes the new positions' scales.
    pub token_scale: Option<ViewMut<'a, f32>>,
}

/// The descriptor of `t`'s first `dv` columns (last dimension), the values of a latent row.
fn leading_columns(
    mut t: sys::anyattn_tensor,
    dv: usize,
    name: &str,
) -> Result<sys::anyattn_tensor> {
    if t.ndim < 1 {
        return Err(Error::invalid(format!(
            "{name}: a rank-0 view given, supported rank 3 or 4 with the latent columns last"
        )));
    }
    let d = t.shape[t.ndim as usize - 1];
    if i64::try_from(dv).map_or(true, |dv| dv > d) {
        return Err(Error::invalid(format!(
            "dv: {dv} given, supported 0 to {d} (the last dimension of {name}: the values are \
             each latent row's first dv columns)"
        )));
    }
    t.shape[t.ndim as usize - 1] = dv as i64;
    Ok(t)
}

/// The descriptors of a latent call over the latent rows `keys` (one cache's descriptor, for
/// writing or for reading): the cache descriptors, with the cache's `descale` and `token_scale`
/// as K's (V takes K's), and the values' descriptor, the rows' first `dv` columns.
/// `cache.k_new` holds the new latent rows and the new values are their first `dv` columns, so
/// `cache.v_new` must be `None`.
fn latent_descriptors<T: Element>(
    cache: &KvCacheOptions<'_, T>,
    dv: usize,
    keys: sys::anyattn_tensor,
    descale: Option<&View<'_, f32>>,
    token_scale: Option<sys::anyattn_tensor>,
) -> Result<(CacheDescriptors, sys::anyattn_tensor)> {
    if cache.v_new.is_some() {
        return Err(Error::invalid(
            "cache.v_new: given with a shared latent cache, supported None (the new values are \
             the first dv columns of cache.k_new, which the call writes once)"
                .to_string(),
        ));
    }
    let mut descriptors = CacheDescriptors::new(cache)?;
    if let Some(k_new) = descriptors.k_new {
        descriptors.v_new = Some(leading_columns(k_new, dv, "cache.k_new")?);
    }
    descriptors.scales.k_descale = descale.map(View::raw);
    descriptors.scales.k_token_scale = token_scale;
    Ok((descriptors, leading_columns(keys, dv, "latent")?))
}

/// [`crate::fwd_kvcache`] against a shared latent cache: q `(B, Sq, Hq, D)` attends to the
/// latent rows as keys and to their first `dv` columns as values, `out (B, Sq, Hq, dv)`,
/// `lse (B, Hq, Sq)`. `cache.k_new` `(B, S_new, Hk, D)` are new latent rows, appended in place
/// (quantized once per row for an 8-bit cache, the token scale from all `D` columns);
/// `cache.v_new` must be `None` and `cache.rotary` is rejected (rotate the rotary columns of
/// `k_new` before the call). Everything is validated before anything is written.
pub fn fwd_kvcache_latent<T: Element, S: Storage>(
    q: &View<'_, T>,
    latent: &mut LatentCache<'_, S>,
    out: &mut ViewMut<'_, T>,
    lse: Option<&mut ViewMut<'_, f32>>,
    cache: &KvCacheOptions<'_, T>,
    opts: &FwdOptions<'_>,
) -> Result<()> {
    let keys = latent.latent.raw();
    let token_scale = latent.token_scale.as_mut().map(ViewMut::raw);
    let (descriptors, values) =
        latent_descriptors(cache, latent.dv, keys, latent.descale.as_ref(), token_scale)?;
    call_kvcache(q, keys, values, out, lse, descriptors, opts)
}

/// [`crate::fwd_kvcache_varlen`] against a shared latent cache, which the call only reads:
/// packed queries `q (total_q, Hq, D)`, `out (total_q, Hq, dv)`, `lse (Hq, total_q)`; `cache`
/// gives the lengths, batch indices, left padding and block table (no `k_new`, `v_new` or
/// `rotary`).
#[allow(clippy::too_many_arguments)]
pub fn fwd_kvcache_varlen_latent<T: Element, S: Storage>(
    q: &View<'_, T>,
    latent: &LatentCache<'_, S>,
    out: &mut ViewMut<'_, T>,
    lse: Option<&mut ViewMut<'_, f32>>,
    cu_seqlens_q: &[i32],
    max_seqlen_q: usize,
    cache: &KvCacheOptions<'_, T>,
    opts: &FwdOptions<'_>,
) -> Result<()> {
    let keys = latent.latent.raw_read();
    let token_scale = latent.token_scale.as_ref().map(ViewMut::raw_read);
    let (descriptors, values) =
        latent_descriptors(cache, latent.dv, keys, latent.descale.as_ref(), token_scale)?;
    call_kvcache_varlen(q, keys, values, out, lse, cu_seqlens_q, max_seqlen_q, descriptors, opts)
}
