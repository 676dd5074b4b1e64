"""An attention call's options in the C library's terms, carried as one object from the front
ends to the binding, and the one conversion into what the binding reads.

``AttnOptions`` (_options.py) holds what the caller asked for, with flash-attn's meanings;
``KernelOptions`` holds what the kernels run: the scale in the C ABI's convention (0 selects
1/sqrt(D)), the window's two sides, the per-head ALiBi slopes and sink logits as float32
tensors/arrays, and the dropout with its (seed, offset) state. Its fields follow the score
arguments of the ``anyattn::`` torch ops (softmax_scale, softcap, causal, window_left,
window_right, alibi_slopes, sinks, dropout_p, rng_state), whose schemas must spell them as
scalars: ``op(q, k, v, *kernel_options)`` passes them, and ``KernelOptions(*scalars)`` rebuilds
the object on the other side.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Tuple

import numpy as np

from ._options import AttnOptions

_U64 = (1 << 64) - 1


class KernelOptions(NamedTuple):
    """The options an anyattn kernel call runs with (see the module docstring)."""

    softmax_scale: float = 0.0  # 0 selects 1/sqrt(D)
    softcap: float = 0.0
    causal: bool = False
    window_left: int = -1
    window_right: int = -1
    alibi_slopes: Optional[Any] = None  # float32 (Hq,) or (B, Hq)
    sinks: Optional[Any] = None  # float32 (Hq,)
    dropout_p: float = 0.0
    rng_state: Optional[Any] = None  # int64 tensor (2,) = (seed, offset), with dropout

    def score_args(self) -> Tuple:
        """The seven score arguments of the ops, before dropout_p and rng_state."""
        return tuple(self[:7])


def backward_options(scalars: Tuple) -> Tuple[KernelOptions, bool]:
    """(KernelOptions, own_forward) from the trailing arguments of a backward op: the 7 score
    arguments, dropout_p, rng_state, then own_forward, which the dispatcher drops when it is the
    schema's default (False)."""
    return KernelOptions(*scalars[:9]), len(scalars) > 9 and bool(scalars[9])


def kernel_options(options: AttnOptions, alibi_slopes=None, sinks=None,
                   rng_state=None) -> KernelOptions:
    """The KernelOptions of a call with ``options``. An explicit softmax_scale of 0 also maps to
    0: the front end then runs q * 0 with the default scale (every score exactly 0)."""
    left, right = options.window_size
    return KernelOptions(options.softmax_scale or 0.0, options.softcap, options.causal, left, right,
                         alibi_slopes, sinks, options.dropout_p, rng_state)


def kernel_query(q: Any, options: AttnOptions) -> Any:
    """q as the kernels take it. The C ABI reads a scale of 0 as "the default 1/sqrt(D)", so an
    explicit ``softmax_scale=0.0`` runs q * 0 with the default scale: every dot product is then
    exactly 0, or NaN where q or k holds an Inf/NaN, which is what 0 * <q, k> gives."""
    if options.softmax_scale != 0.0:  # None (the default scale) or a nonzero scale
        return q
    if isinstance(q, np.ndarray):
        with np.errstate(invalid="ignore"):  # Inf * 0 = NaN is the intended result
            return q * 0
    return q * 0


def seed_offset(rng_state: Optional[Any]) -> Tuple[int, int]:
    """(seed, offset) as unsigned 64-bit ints from an int64 tensor (2,), or (0, 0) for None.

    The int64 values are reinterpreted as uint64 (two's complement), as the C ABI expects.
    """
    if rng_state is None:
        return 0, 0
    seed, offset = (int(x) & _U64 for x in rng_state.tolist())
    return seed, offset


def binding_options(options: KernelOptions, f32_spec: Callable[[Any], Any],
                    num_splits: int = 0, own_forward: bool = False) -> Tuple:
    """The tuple every ``_core`` attention function takes as ``options``, which the binding turns
    into anyattn_fwd_params (python/src/core_module.cc, ScoreParams): the per-head tensors become
    specs through ``f32_spec`` (which keeps them alive), rng_state becomes (seed, offset).
    ``own_forward`` (backward only): out and lse are this library's forward results for the same
    inputs (anyattn_fwd_params::bwd_own_forward)."""
    seed, offset = seed_offset(options.rng_state)
    return (float(options.softmax_scale), float(options.softcap), bool(options.causal),
            int(options.window_left), int(options.window_right), f32_spec(options.alibi_slopes),
            f32_spec(options.sinks), int(num_splits), float(options.dropout_p), seed, offset,
            bool(own_forward))
