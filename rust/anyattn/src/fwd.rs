//! Forward attention, dense (`anyattn_fwd`) and variable-length (`anyattn_fwd_varlen`), and the
//! backward, dense (`anyattn_bwd`) and variable-length (`anyattn_bwd_varlen`).

use anyattn_sys as sys;

use crate::error::{check, Error, Result};
use crate::view::{Element, View, ViewMut};
use crate::{Isa, Precision};

/// Dropout parameters of a forward call (flash-attn's `dropout_p` with a counter-based RNG).
///
/// Kept probabilities are scaled by `1/(1-p)`; the keep mask is a pure function of
/// `(seed, offset, b, h, i, j)`, so the forward and [`bwd`] agree for any thread count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    /// Probability of dropping an attention weight, in [0, 1).
    pub p: f32,
    /// Seed of the RNG.
    pub seed: u64,
    /// Offset of the RNG stream.
    pub offset: u64,
}

/// Options of a forward call. `FwdOptions::default()` is plain softmax attention with scale
/// `1/sqrt(D)`, no mask and no extras.
///
/// The semantics are flash-attn 2.x's (see `docs/semantics.md` of the repository): the score is
/// `s = softmax_scale * <q_i, k_j>`, then the softcap, then ALiBi, then the mask, which is aligned
/// to the bottom-right corner: key `j` is visible to query `i` iff
/// `i + Sk - Sq - window_left <= j <= i + Sk - Sq + window_right`.
#[derive(Debug, Clone, Copy, Default)]
pub struct FwdOptions<'a> {
    /// Multiplies `<q_i, k_j>`; `None` selects `1/sqrt(D)`. Must be finite and non-zero (the C ABI
    /// reserves 0 for the default, so `Some(0.0)` is rejected rather than silently changed).
    pub softmax_scale: Option<f32>,
    /// `Some(c)` with `c > 0`: scores become `c * tanh(s / c)` before ALiBi and masking.
    pub softcap: Option<f32>,
    /// Causal mask: the same as `window_right = Some(0)`.
    pub causal: bool,
    /// Keys visible to the left of the diagonal; `None` = unbounded.
    pub window_left: Option<usize>,
    /// Keys visible to the right of the diagonal; `None` = unbounded (ignored when `causal`).
    pub window_right: Option<usize>,
    /// f32 ALiBi slopes of shape (Hq) or (B, Hq): `s += -slope_h * |i + Sk - Sq - j|`.
    pub alibi_slopes: Option<View<'a, f32>>,
    /// f32 sink logits of shape (Hq), in score units: they join the softmax denominator and
    /// contribute no value.
    pub sinks: Option<View<'a, f32>>,
    /// Dropout; `None` = off.
    pub dropout: Option<Dropout>,
    /// Splits of the key dimension; 0 = chosen from the problem shape (never from the thread
    /// count, so results do not depend on it).
    pub num_splits: usize,
    /// Instruction-set path; [`Isa::Auto`] picks the fastest the CPU runs.
    pub isa: Isa,
    /// Backward only: `true` promises that the `out` and `lse` handed to [`bwd`] or
    /// [`bwd_varlen`] are this library's forward results for these inputs and options, so that
    /// rows whose keys lie in one block of 64 are normalised from their own scores and bf16/f16
    /// `dsinks` is summed without `out`'s rounding (more accurate;
    /// `anyattn_fwd_params::bwd_own_forward`). `false` uses them as handed over.
    pub bwd_own_forward: bool,
    /// Forward only: whether bf16 calls may round the probabilities to bf16 before P V
    /// (`anyattn_fwd_params::precision`); the backward computes the accurate forward's gradients.
    pub precision: Precision,
}

fn window_to_c(name: &str, window: Option<usize>) -> Result<i32> {
    match window {
        None => Ok(-1),
        Some(w) => i32::try_from(w).map_err(|_| {
            Error::invalid(format!(
                "{name}: {w} given, supported 0 to {} or None (unbounded)",
                i32::MAX
            ))
        }),
    }
}

/// The C parameter struct for `opts`, pointing at `alibi` and `sinks` (which must outlive its use).
pub(crate) fn c_params(
    opts: &FwdOptions<'_>,
    alibi: Option<&sys::anyattn_tensor>,
    sinks: Option<&sys::anyattn_tensor>,
) -> Result<sys::anyattn_fwd_params> {
    let mut p = std::mem::MaybeUninit::<sys::anyattn_fwd_params>::zeroed();
    // SAFETY: anyattn_fwd_params_init writes every field of a valid struct.
    let mut p = unsafe {
        sys::anyattn_fwd_params_init(p.as_mut_ptr());
        p.assume_init()
    };
    if let Some(scale) = opts.softmax_scale {
        if scale == 0.0 {
            return Err(Error::invalid(
                "softmax_scale: 0 given, supported any finite non-zero value or None (1/sqrt(D)); \
                 the C ABI reserves 0 for the default",
            ));
        }
        p.softmax_scale = scale;
    }
    if let Some(cap) = opts.softcap {
        p.softcap = cap;
    }
    p.causal = i32::from(opts.causal);
    p.window_left = window_to_c("window_left", opts.window_left)?;
    p.window_right = window_to_c("window_right", opts.window_right)?;
    if opts.causal {
        p.window_right = 0;
    }
    p.alibi_slopes = alibi.map_or(std::ptr::null(), |t| t as *const _);
    p.sinks = sinks.map_or(std::ptr::null(), |t| t as *const _);
    if let Some(d) = opts.dropout {
        p.dropout_p = d.p;
        p.dropout_seed = d.seed;
        p.dropout_offset = d.offset;
    }
    p.num_splits = i32::try_from(opts.num_splits).map_err(|_| {
        Error::invalid(format!(
            "num_splits: {} given, supported 0 (auto) to {}",
            opts.num_splits,
            i32::MAX
        ))
    })?;
    p.isa = opts.isa.raw();
    p.bwd_own_forward = i32::from(opts.bwd_own_forward);
    p.precision = opts.precision.raw();
    Ok(p)
}

/// Dense forward attention (`anyattn_fwd`).
///
/// Shapes: `q (B, Sq, Hq, D)`, `k (B, Sk, Hk, D)`, `v (B, Sk, Hk, Dv)`, `out (B, Sq, Hq, Dv)`,
/// `lse (B, Hq, Sq)` (f32, natural log, optional). `Hq % Hk == 0`; query head `h` reads kv head
/// `h / (Hq / Hk)`. `0 <= D <= 576`, `0 <= Dv <= 512` (0: docs/semantics.md, section 6). Every view's last dimension must have stride 1; other
/// strides are arbitrary. Accumulation is in f32 whatever `T` is.
///
/// Fully masked rows (and `Sk == 0`) give `out = 0` and `lse = -inf` (or the sink's logit).
/// On error nothing is written; the error carries the library's message.
pub fn fwd<T: Element>(
    q: &View<'_, T>,
    k: &View<'_, T>,
    v: &View<'_, T>,
    out: &mut ViewMut<'_, T>,
    lse: Option<&mut ViewMut<'_, f32>>,
    opts: &FwdOptions<'_>,
) -> Result<()> {
    let alibi = opts.alibi_slopes.as_ref().map(View::raw);
    let sinks = opts.sinks.as_ref().map(View::raw);
    let params = c_params(opts, alibi.as_ref(), sinks.as_ref())?;
    let (tq, tk, tv) = (q.raw(), k.raw(), v.raw());
    let to = out.raw();
    let tl = lse.map(|l| l.raw());
    // SAFETY: every view was checked to lie inside its slice, `out` and `lse` are exclusive
    // borrows that cannot overlap the shared inputs, and `out`/`lse` address no element twice.
    // The descriptors and the params outlive the call.
    let status = unsafe {
        sys::anyattn_fwd(
            &tq,
            &tk,
            &tv,
            &to,
            tl.as_ref().map_or(std::ptr::null(), |t| t as *const _),
            &params,
        )
    };
    check(status)
}

/// Dense backward attention (`anyattn_bwd`): the gradients of a loss with respect to q, k, v
/// (and the sinks), given `dout` and the forward call's inputs, output, LSE and options.
///
/// Shapes as in [`fwd`]: `dout`/`out (B, Sq, Hq, Dv)`, `lse (B, Hq, Sq)` f32 (required), `dq` like
/// `q`, `dk`/`dv` like `k`/`v` (summed over each GQA group), `dsinks (Hq)` f32, required exactly
/// when `opts.sinks` is set. `opts` must be the forward's options (ALiBi slopes get no gradient).
/// Accumulation is f32; results are bitwise identical for any thread count. On a validation error
/// nothing is written.
#[allow(clippy::too_many_arguments)]
pub fn bwd<T: Element>(
    dout: &View<'_, T>,
    q: &View<'_, T>,
    k: &View<'_, T>,
    v: &View<'_, T>,
    out: &View<'_, T>,
    lse: &View<'_, f32>,
    dq: &mut ViewMut<'_, T>,
    dk: &mut ViewMut<'_, T>,
    dv: &mut ViewMut<'_, T>,
    dsinks: Option<&mut ViewMut<'_, f32>>,
    opts: &FwdOptions<'_>,
) -> Result<()> {
    let alibi = opts.alibi_slopes.as_ref().map(View::raw);
    let sinks = opts.sinks.as_ref().map(View::raw);
    let params = c_params(opts, alibi.as_ref(), sinks.as_ref())?;
    let (tdo, tq, tk, tv, to, tl) = (dout.raw(), q.raw(), k.raw(), v.raw(), out.raw(), lse.raw());
    let (tdq, tdk, tdv) = (dq.raw(), dk.raw(), dv.raw());
    let tds = dsinks.map(|d| d.raw());
    // SAFETY: every view lies inside its slice; the gradients are distinct exclusive borrows, so
    // they overlap neither each other nor the shared inputs, and address no element twice. The
    // descriptors and the params outlive the call.
    let status = unsafe {
        sys::anyattn_bwd(
            &tdo,
            &tq,
            &tk,
            &tv,
            &to,
            &tl,
            &tdq,
            &tdk,
            &tdv,
            tds.as_ref().map_or(std::ptr::null(), |t| t as *const _),
            &params,
        )
    };
    check(status)
}

/// Sequence boundaries of a variable-length batch, like flash-attn's `cu_seqlens`.
#[derive(Debug, Clone, Copy)]
pub struct VarlenSeqs<'a> {
    /// `B + 1` non-decreasing offsets into the packed query rows.
    pub cu_seqlens_q: &'a [i32],
    /// `B + 1` non-decreasing offsets into the packed key/value rows.
    pub cu_seqlens_k: &'a [i32],
    /// An upper bound of every query length (checked).
    pub max_seqlen_q: usize,
    /// An upper bound of every key length (checked).
    pub max_seqlen_k: usize,
    /// Optional `(B)`: sequence `b` uses only its first `seqused_k[b]` keys.
    pub seqused_k: Option<&'a [i32]>,
}

fn read_cu(name: &str, cu: &[i32], total: usize) -> Result<Vec<usize>> {
    if cu.len() < 2 {
        return Err(Error::invalid(format!(
            "{name}: {} entries given, supported B + 1 >= 2",
            cu.len()
        )));
    }
    let mut out = Vec::with_capacity(cu.len());
    for (i, &c) in cu.iter().enumerate() {
        let c = usize::try_from(c)
            .map_err(|_| Error::invalid(format!("{name}[{i}]: {c} given, offsets must be >= 0")))?;
        if let Some(&prev) = out.last() {
            if c < prev {
                return Err(Error::invalid(format!(
                    "{name}[{i}]: {c} is less than {name}[{}] = {prev}; offsets must be \
                     non-decreasing",
                    i - 1
                )));
            }
        }
        out.push(c);
    }
    let last = *out.last().unwrap();
    if last > total {
        return Err(Error::invalid(format!(
            "{name}[{}]: {last} exceeds the {total} packed rows",
            cu.len() - 1
        )));
    }
    Ok(out)
}

/// A rank-1 int32 descriptor over `data`.
pub(crate) fn i32_tensor(data: &[i32]) -> sys::anyattn_tensor {
    let mut t = sys::anyattn_tensor {
        data: data.as_ptr() as *mut std::os::raw::c_void,
        dtype: sys::ANYATTN_DTYPE_I32,
        ndim: 1,
        shape: [0; sys::ANYATTN_MAX_NDIM],
        strides: [0; sys::ANYATTN_MAX_NDIM],
    };
    t.shape[0] = data.len() as i64;
    t.strides[0] = 1;
    t
}

/// Checks the shapes and sequence boundaries of a varlen call on the Rust side, so errors name the
/// offending entry; returns `(max_seqlen_q, max_seqlen_k)` as the C ABI takes them.
fn check_varlen(
    q_shape: &[usize],
    k_shape: &[usize],
    v_shape: &[usize],
    out_shape: &[usize],
    lse_shape: Option<&[usize]>,
    seqs: &VarlenSeqs<'_>,
    opts: &FwdOptions<'_>,
) -> Result<(i64, i64)> {
    for (name, view_shape) in [("q", q_shape), ("k", k_shape), ("v", v_shape)] {
        if view_shape.len() != 3 {
            return Err(Error::invalid(format!(
                "{name}: rank {} given, supported 3 (total, heads, head_dim) for varlen",
                view_shape.len()
            )));
        }
    }
    if out_shape.len() != 3 {
        return Err(Error::invalid(format!(
            "out: rank {} given, supported 3 (total_q, Hq, Dv) for varlen",
            out_shape.len()
        )));
    }
    let total_q = q_shape[0];
    let total_k = k_shape[0];
    if v_shape[0] != total_k {
        return Err(Error::invalid(format!(
            "v: {} packed rows given, k has {total_k}",
            v_shape[0]
        )));
    }
    if out_shape[0] != total_q {
        return Err(Error::invalid(format!(
            "out: {} packed rows given, q has {total_q}",
            out_shape[0]
        )));
    }
    if let Some(l) = lse_shape {
        if l.len() != 2 || l[1] != total_q || l[0] != q_shape[1] {
            return Err(Error::invalid(format!(
                "lse: shape {:?} given, supported (Hq, total_q) = ({}, {total_q})",
                l, q_shape[1]
            )));
        }
    }
    let cu_q = read_cu("cu_seqlens_q", seqs.cu_seqlens_q, total_q)?;
    let cu_k = read_cu("cu_seqlens_k", seqs.cu_seqlens_k, total_k)?;
    if cu_q.len() != cu_k.len() {
        return Err(Error::invalid(format!(
            "cu_seqlens_k: {} entries given, cu_seqlens_q has {}; both must be B + 1",
            cu_k.len(),
            cu_q.len()
        )));
    }
    let batch = cu_q.len() - 1;
    if let Some(used) = seqs.seqused_k {
        if used.len() != batch {
            return Err(Error::invalid(format!(
                "seqused_k: {} entries given, supported B = {batch}",
                used.len()
            )));
        }
    }
    let hq = q_shape[1];
    if let Some(alibi) = &opts.alibi_slopes {
        let ok = match alibi.shape() {
            [h] => *h == hq,
            [b, h] => *b == batch && *h == hq,
            _ => false,
        };
        if !ok {
            return Err(Error::invalid(format!(
                "alibi_slopes: shape {:?} given, supported ({hq}) or ({batch}, {hq})",
                alibi.shape()
            )));
        }
    }

    for b in 0..batch {
        let len_q = cu_q[b + 1] - cu_q[b];
        let mut len_k = cu_k[b + 1] - cu_k[b];
        if let Some(used) = seqs.seqused_k {
            let u = usize::try_from(used[b])
                .ok()
                .filter(|&u| u <= len_k)
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "seqused_k[{b}]: {} given, supported 0 to the sequence's {len_k} keys",
                        used[b]
                    ))
                })?;
            len_k = u;
        }
        if len_q > seqs.max_seqlen_q {
            return Err(Error::invalid(format!(
                "max_seqlen_q: {} given, but sequence {b} has {len_q} queries",
                seqs.max_seqlen_q
            )));
        }
        if len_k > seqs.max_seqlen_k {
            return Err(Error::invalid(format!(
                "max_seqlen_k: {} given, but sequence {b} has {len_k} keys",
                seqs.max_seqlen_k
            )));
        }
    }
    let max_q = i64::try_from(seqs.max_seqlen_q)
        .map_err(|_| Error::invalid("max_seqlen_q: does not fit in int64"))?;
    let max_k = i64::try_from(seqs.max_seqlen_k)
        .map_err(|_| Error::invalid("max_seqlen_k: does not fit in int64"))?;
    Ok((max_q, max_k))
}

/// Variable-length forward attention over packed sequences, flash-attn's `flash_attn_varlen_func`.
///
/// Shapes: `q (total_q, Hq, D)`, `k (total_k, Hk, D)`, `v (total_k, Hk, Dv)`,
/// `out (total_q, Hq, Dv)`, `lse (Hq, total_q)` (f32, optional). Sequence `b` owns query rows
/// `cu_seqlens_q[b]..cu_seqlens_q[b+1]` and key rows `cu_seqlens_k[b]..cu_seqlens_k[b+1]`
/// (the first `seqused_k[b]` of them if given). Masks and ALiBi positions are per sequence.
/// `opts.alibi_slopes` may be `(Hq)` or `(B, Hq)`.
///
/// Runs `anyattn_fwd_varlen` once for the whole batch. The sequence boundaries are also checked
/// here first, so their errors name the offending entry. Output rows that belong to no sequence
/// are left untouched. On error nothing is written.
pub fn fwd_varlen<T: Element>(
    q: &View<'_, T>,
    k: &View<'_, T>,
    v: &View<'_, T>,
    out: &mut ViewMut<'_, T>,
    lse: Option<&mut ViewMut<'_, f32>>,
    seqs: &VarlenSeqs<'_>,
    opts: &FwdOptions<'_>,
) -> Result<()> {
    let lse_shape = lse.as_deref().map(|l| l.shape().to_vec());
    let (max_q, max_k) = check_varlen(
        q.shape(),
        k.shape(),
        v.shape(),
        out.shape(),
        lse_shape.as_deref(),
        seqs,
        opts,
    )?;

    let alibi = opts.alibi_slopes.as_ref().map(View::raw);
    let sinks = opts.sinks.as_ref().map(View::raw);
    let params = c_params(opts, alibi.as_ref(), sinks.as_ref())?;
    let (tq, tk, tv) = (q.raw(), k.raw(), v.raw());
    let to = out.raw();
    let tl = lse.map(|l| l.raw());
    let (tcq, tck) = (i32_tensor(seqs.cu_seqlens_q), i32_tensor(seqs.cu_seqlens_k));
    let tused = seqs.seqused_k.map(i32_tensor);
    // SAFETY: as in `fwd`; the sequence descriptors point at the borrowed i32 slices, and every
    // row they select was checked above to lie inside q, k, v and out.
    let status = unsafe {
        sys::anyattn_fwd_varlen(
            &tq,
            &tk,
            &tv,
            &to,
            tl.as_ref().map_or(std::ptr::null(), |t| t as *const _),
            &tcq,
            &tck,
            tused.as_ref().map_or(std::ptr::null(), |t| t as *const _),
            max_q,
            max_k,
            &params,
        )
    };
    check(status)
}

/// Variable-length backward attention (`anyattn_bwd_varlen`): the gradients of [`fwd_varlen`]
/// with the same q, k, v, sequences and options, given `dout`.
///
/// Shapes as in [`fwd_varlen`]: `dout`/`out (total_q, Hq, Dv)`, `q (total_q, Hq, D)`,
/// `k (total_k, Hk, D)`, `v (total_k, Hk, Dv)`, `lse (Hq, total_q)` f32 (required: the forward's
/// LSE), `dq` like `q`, `dk`/`dv` like `k`/`v` (summed over each GQA group; keys beyond
/// `seqused_k[b]` get exact zeros), `dsinks (Hq)` f32, required exactly when `opts.sinks` is set.
/// Rows of `dq`, `dk`, `dv` that belong to no sequence are left untouched. The sequence
/// boundaries are checked here first, as in [`fwd_varlen`]. Each sequence's gradients are
/// bitwise those of [`bwd`] on that sequence alone; results do not depend on the thread count.
/// On a validation error nothing is written.
#[allow(clippy::too_many_arguments)]
pub fn bwd_varlen<T: Element>(
    dout: &View<'_, T>,
    q: &View<'_, T>,
    k: &View<'_, T>,
    v: &View<'_, T>,
    out: &View<'_, T>,
    lse: &View<'_, f32>,
    dq: &mut ViewMut<'_, T>,
    dk: &mut ViewMut<'_, T>,
    dv: &mut ViewMut<'_, T>,
    dsinks: Option<&mut ViewMut<'_, f32>>,
    seqs: &VarlenSeqs<'_>,
    opts: &FwdOptions<'_>,
) -> Result<()> {
    let (max_q, max_k) = check_varlen(
        q.shape(),
        k.shape(),
        v.shape(),
        out.shape(),
        Some(lse.shape()),
        seqs,
        opts,
    )?;
    for (name, got, of, want) in [
        ("dout", dout.shape(), "out", out.shape()),
        ("dq", dq.shape(), "q", q.shape()),
        ("dk", dk.shape(), "k", k.shape()),
        ("dv", dv.shape(), "v", v.shape()),
    ] {
        if got != want {
            return Err(Error::invalid(format!(
                "{name}: shape {got:?} given, supported {want:?} (the shape of {of})"
            )));
        }
    }

    let alibi = opts.alibi_slopes.as_ref().map(View::raw);
    let sinks = opts.sinks.as_ref().map(View::raw);
    let params = c_params(opts, alibi.as_ref(), sinks.as_ref())?;
    let (tdo, tq, tk, tv, to, tl) = (dout.raw(), q.raw(), k.raw(), v.raw(), out.raw(), lse.raw());
    let (tdq, tdk, tdv) = (dq.raw(), dk.raw(), dv.raw());
    let tds = dsinks.map(|d| d.raw());
    let (tcq, tck) = (i32_tensor(seqs.cu_seqlens_q), i32_tensor(seqs.cu_seqlens_k));
    let tused = seqs.seqused_k.map(i32_tensor);
    // SAFETY: as in `bwd`; the sequence descriptors point at the borrowed i32 slices, and every
    // row they select was checked above to lie inside the packed views, whose shapes the
    // gradients share.
    let status = unsafe {
        sys::anyattn_bwd_varlen(
            &tdo,
            &tq,
            &tk,
            &tv,
            &to,
            &tl,
            &tdq,
            &tdk,
            &tdv,
            tds.as_ref().map_or(std::ptr::null(), |t| t as *const _),
            &tcq,
            &tck,
            tused.as_ref().map_or(std::ptr::null(), |t| t as *const _),
            max_q,
            max_k,
            &params,
        )
    };
    check(status)
}
