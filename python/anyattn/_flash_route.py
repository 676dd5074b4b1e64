"""The CUDA route through the ``flash_attn`` package, used when _dispatch selects it."""

from __future__ import annotations

from ._options import AttnOptions


def flash_attn_call(q, k, v, options: AttnOptions, alibi_slopes, return_attn_probs):
    """Call ``flash_attn.flash_attn_func`` with the same options; returns what it returns.

    ``softcap`` is passed only when set, so flash_attn versions older than 2.6 (which lack the
    argument) still serve calls without it. _dispatch has already checked that the installed
    version supports every option the call uses, and that the call has no sinks.
    """
    from flash_attn import flash_attn_func  # noqa: PLC0415 - optional dependency

    from ._flash_attn_compat import original_function  # noqa: PLC0415

    flash_attn_func = original_function(flash_attn_func)  # past install_as_flash_attn's CPU route

    kwargs = dict(
        dropout_p=options.dropout_p,
        softmax_scale=options.softmax_scale,
        causal=options.causal,
        alibi_slopes=alibi_slopes,
        deterministic=options.deterministic,
        return_attn_probs=return_attn_probs,
    )
    if options.window_size != (-1, -1):
        kwargs["window_size"] = options.window_size
    if options.softcap > 0.0:
        kwargs["softcap"] = options.softcap
    return flash_attn_func(q, k, v, **kwargs)
