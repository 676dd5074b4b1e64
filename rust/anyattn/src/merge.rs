//! Merging two partial attentions of the same queries over disjoint key sets
//! (`anyattn_merge_attention_states`).

use anyattn_sys as sys;

use crate::error::{check, Result};
use crate::view::{Element, View, ViewMut};

/// Merges two attentions of the same queries over disjoint key sets (split-KV, ring attention,
/// cascades): `out = (e^lse_a out_a + e^lse_b out_b) / (e^lse_a + e^lse_b)` and
/// `lse_out = log(e^lse_a + e^lse_b)`.
///
/// Shapes: `out_a`, `out_b`, `out` `(T, H, Dv)` with LSEs `(H, T)`, or `(B, S, H, Dv)` with LSEs
/// `(B, H, S)`, as [`fwd_varlen`](crate::fwd_varlen) and [`fwd`](crate::fwd) write them. The
/// LSEs are f32; `-inf` marks an empty partial result (weight 0); both empty gives `out = 0`,
/// `lse_out = -inf`. `lse_out` is optional. On error nothing is written.
pub fn merge_attention_states<T: Element>(
    out_a: &View<'_, T>,
    lse_a: &View<'_, f32>,
    out_b: &View<'_, T>,
    lse_b: &View<'_, f32>,
    out: &mut ViewMut<'_, T>,
    lse_out: Option<&mut ViewMut<'_, f32>>,
) -> Result<()> {
    let (ta, tla, tb, tlb) = (out_a.raw(), lse_a.raw(), out_b.raw(), lse_b.raw());
    let to = out.raw();
    let tlo = lse_out.map(|l| l.raw());
    // SAFETY: every view lies inside its slice; `out` and `lse_out` are exclusive borrows, so
    // they overlap neither each other nor the shared inputs, and address no element twice. The
    // descriptors outlive the call.
    let status = unsafe {
        sys::anyattn_merge_attention_states(
            &ta,
            &tla,
            &tb,
            &tlb,
            &to,
            tlo.as_ref().map_or(std::ptr::null(), |t| t as *const _),
        )
    };
    check(status)
}

/// The in-place form of [`merge_attention_states`]: merges `(out_b, lse_b)` into
/// `(out_a, lse_a)`, which receive the merged output and LSE. Same shapes and semantics.
pub fn merge_attention_states_in_place<T: Element>(
    out_a: &mut ViewMut<'_, T>,
    lse_a: &mut ViewMut<'_, f32>,
    out_b: &View<'_, T>,
    lse_b: &View<'_, f32>,
) -> Result<()> {
    let (ta, tla) = (out_a.raw(), lse_a.raw());
    let (tb, tlb) = (out_b.raw(), lse_b.raw());
    // SAFETY: every view lies inside its slice; `out_a` and `lse_a` are distinct exclusive
    // borrows that overlap no input, address no element twice, and are passed as both input and
    // output with identical descriptors, the in-place form the C ABI documents and accepts. The
    // descriptors outlive the call.
    let status = unsafe { sys::anyattn_merge_attention_states(&ta, &tla, &tb, &tlb, &ta, &tla) };
    check(status)
}
