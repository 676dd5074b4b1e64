"""Pack padded batches into varlen token streams and back, with flash_attn.bert_padding semantics.

A padded batch ``(batch, seqlen, ...)`` plus a ``(batch, seqlen)`` mask becomes a packed stream
``(total_nnz, ...)`` of the selected tokens in row-major order, the flat indices they came from,
and ``cu_seqlens`` (int32, leading 0) for the varlen attention functions. ``pad_input`` puts a
packed stream back, with zeros at the unselected positions. The index helpers are autograd
Functions: gathering rows scatters (accumulates) the gradient back, and scattering rows gathers it.

Plain torch ops, so any device works. Checks that need tensor values (index ranges, mask values)
run eagerly and are skipped while torch.compile traces, where they would break the graph.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "IndexFirstAxis",
    "IndexFirstAxisResidual",
    "IndexPutFirstAxis",
    "index_first_axis",
    "index_first_axis_residual",
    "index_put_first_axis",
    "pad_input",
    "unpad_input",
    "unpad_input_for_concatenated_sequences",
]

_INDEX_DTYPES = (torch.int32, torch.int64)


def _checking_values() -> bool:
    """Whether value-dependent checks may run: always, except while torch.compile traces."""
    return not torch.compiler.is_compiling()


def _is_size(value) -> bool:
    """Whether ``value`` is an int >= 0 (a SymInt counts while torch.compile traces)."""
    return (isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool)
            and value >= 0)


def _require_tensor(where: str, name: str, value, min_ndim: int, layout: str) -> None:
    if not isinstance(value, Tensor):
        raise TypeError(f"{where}: {name} must be a torch.Tensor of shape {layout}, "
                        f"got {type(value).__name__}")
    if value.ndim < min_ndim:
        raise ValueError(f"{where}: {name} must have shape {layout} (at least {min_ndim} "
                         f"dimensions), got shape {tuple(value.shape)}")


def _check_indices(where: str, indices, source: Tensor, first_axis_dim: int) -> None:
    """Raise unless ``indices`` is a 1-D int32/int64 tensor on source's device, within range."""
    if not isinstance(indices, Tensor):
        raise TypeError(f"{where}: indices must be a 1-D int32 or int64 torch.Tensor, "
                        f"got {type(indices).__name__}")
    if indices.ndim != 1:
        raise ValueError(f"{where}: indices must be 1-D, got shape {tuple(indices.shape)}")
    if indices.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{where}: indices must have dtype int32 or int64, got {indices.dtype}")
    if indices.device != source.device:
        raise ValueError(f"{where}: indices are on {indices.device} but the data is on "
                         f"{source.device}; they must be on the same device")
    if _checking_values() and indices.numel() > 0:
        lowest, highest = int(indices.min()), int(indices.max())
        if lowest < 0 or highest >= first_axis_dim:
            bad = lowest if lowest < 0 else highest
            raise ValueError(f"{where}: indices holds {bad}, outside the first axis "
                             f"[0, {first_axis_dim})")


class IndexFirstAxis(torch.autograd.Function):
    """``input[indices]`` along the first axis; the backward scatters into zeros.

    forward(input, indices): input ``(first_axis_dim, ...)`` with at least 2 dimensions, indices
    ``(n,)`` int32/int64 in ``[0, first_axis_dim)``. Returns ``(n, ...)``. Gradients of repeated
    indices accumulate. Raises TypeError/ValueError on a bad input or index.
    """

    @staticmethod
    def forward(ctx, input: Tensor, indices: Tensor) -> Tensor:
        _require_tensor("index_first_axis", "input", input, 2, "(first_axis_dim, ...)")
        _check_indices("index_first_axis", indices, input, input.shape[0])
        ctx.save_for_backward(indices)
        ctx.first_axis_dim = input.shape[0]
        return input.index_select(0, indices)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        (indices,) = ctx.saved_tensors
        grad_input = grad_output.new_zeros((ctx.first_axis_dim, *grad_output.shape[1:]))
        grad_input.index_add_(0, indices, grad_output)
        return grad_input, None


class IndexPutFirstAxis(torch.autograd.Function):
    """Rows of ``values`` written at ``indices`` of a zero tensor; the backward gathers.

    forward(values, indices, first_axis_dim): values ``(n, ...)`` with at least 2 dimensions,
    indices ``(n,)`` int32/int64 in ``[0, first_axis_dim)``, first_axis_dim an int >= 0.
    Returns ``(first_axis_dim, ...)`` in values' dtype and device, zero where no index points.
    Raises TypeError/ValueError on bad arguments.
    """

    @staticmethod
    def forward(ctx, values: Tensor, indices: Tensor, first_axis_dim: int) -> Tensor:
        where = "index_put_first_axis"
        _require_tensor(where, "values", values, 2, "(n, ...)")
        if not _is_size(first_axis_dim):
            raise ValueError(f"{where}: first_axis_dim must be an int >= 0, "
                             f"got {first_axis_dim!r}")
        _check_indices(where, indices, values, first_axis_dim)
        if indices.shape[0] != values.shape[0]:
            raise ValueError(f"{where}: indices has {indices.shape[0]} entries but values has "
                             f"{values.shape[0]} rows; they must match")
        ctx.save_for_backward(indices)
        output = values.new_zeros((first_axis_dim, *values.shape[1:]))
        output.index_copy_(0, indices.long(), values)
        return output

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        (indices,) = ctx.saved_tensors
        return grad_output.index_select(0, indices), None, None


class IndexFirstAxisResidual(torch.autograd.Function):
    """``(input[indices], input)``: the gathered rows plus the whole input as a residual.

    forward(input, indices): as IndexFirstAxis, and also returns ``input`` (detached storage) so a
    fused block can use it as its residual branch. The backward adds the scattered gradient of
    the rows to the residual's gradient.
    """

    @staticmethod
    def forward(ctx, input: Tensor, indices: Tensor) -> Tuple[Tensor, Tensor]:
        _require_tensor("index_first_axis_residual", "input", input, 2, "(first_axis_dim, ...)")
        _check_indices("index_first_axis_residual", indices, input, input.shape[0])
        ctx.save_for_backward(indices)
        return input.index_select(0, indices), input.detach()

    @staticmethod
    def backward(ctx, grad_output: Tensor, grad_residual: Tensor):
        (indices,) = ctx.saved_tensors
        return grad_residual.index_add(0, indices, grad_output), None


index_first_axis = IndexFirstAxis.apply
index_put_first_axis = IndexPutFirstAxis.apply
index_first_axis_residual = IndexFirstAxisResidual.apply


def _check_mask(where: str, name: str, mask, hidden_states: Tensor) -> Tensor:
    """Return ``mask`` as bool after checking its shape, device and that it holds only 0/1."""
    batch_seqlen = (hidden_states.shape[0], hidden_states.shape[1])
    if not isinstance(mask, Tensor):
        raise TypeError(f"{where}: {name} must be a torch.Tensor of shape (batch, seqlen), "
                        f"got {type(mask).__name__}")
    if tuple(mask.shape) != batch_seqlen:
        raise ValueError(f"{where}: {name} must have shape (batch, seqlen) = {batch_seqlen} "
                         f"to match hidden_states, got {tuple(mask.shape)}")
    if mask.device != hidden_states.device:
        raise ValueError(f"{where}: {name} is on {mask.device} but hidden_states is on "
                         f"{hidden_states.device}; they must be on the same device")
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex():
        raise TypeError(f"{where}: {name} must be bool, integer or floating, got {mask.dtype}")
    if _checking_values():
        not_binary = (mask != 0) & (mask != 1)
        if bool(not_binary.any()):
            bad = mask[not_binary][0].item()
            raise ValueError(f"{where}: {name} holds {bad}; only 0 (padding) and 1 (token) are "
                             f"supported")
    return mask != 0


def _pack(hidden_states: Tensor, selected: Tensor) -> Tuple[Tensor, Tensor]:
    """The selected rows of ``(batch, seqlen, ...)`` in row-major order, and their flat indices."""
    indices = torch.nonzero(selected.flatten(), as_tuple=False).flatten()
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices


def _cumulative(seqlens: Tensor) -> Tensor:
    """``[0, l0, l0 + l1, ...]`` as int32."""
    return F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))


def _max_or_zero(seqlens: Tensor) -> int:
    return int(seqlens.max().item()) if seqlens.numel() > 0 else 0


def unpad_input(
    hidden_states: Tensor, attention_mask: Tensor, unused_mask: Optional[Tensor] = None
) -> Tuple[Tensor, Tensor, Tensor, int, Tensor]:
    """Pack the tokens a mask selects from a padded batch.

    Args:
        hidden_states: ``(batch, seqlen, ...)``, at least 3 dimensions.
        attention_mask: ``(batch, seqlen)``, bool or numbers; 1/True marks a real token,
            0/False padding.
        unused_mask: optional ``(batch, seqlen)`` of the same kind, marking positions that are
            allocated (packed and counted in ``cu_seqlens``) but not used.

    Returns:
        ``(hidden_states_unpadded, indices, cu_seqlens, max_seqlen_in_batch, seqused)``:
        ``(total_nnz, ...)`` rows selected by ``attention_mask | unused_mask`` in row-major order;
        their int64 flat indices into ``batch * seqlen``; int32 ``(batch + 1,)`` cumulative
        selected lengths starting at 0; the longest selected length as a Python int (0 for an
        empty batch); and int32 ``(batch,)`` counts of ``attention_mask`` alone.

    Raises:
        TypeError, ValueError: hidden_states has fewer than 3 dimensions, a mask has the wrong
            shape or dtype, or (outside torch.compile) a mask holds a value other than 0 or 1.
    """
    where = "unpad_input"
    _require_tensor(where, "hidden_states", hidden_states, 3, "(batch, seqlen, ...)")
    used = _check_mask(where, "attention_mask", attention_mask, hidden_states)
    selected = used
    if unused_mask is not None:
        selected = used | _check_mask(where, "unused_mask", unused_mask, hidden_states)
    seqlens = selected.sum(dim=-1, dtype=torch.int32)
    packed, indices = _pack(hidden_states, selected)
    return (packed, indices, _cumulative(seqlens), _max_or_zero(seqlens),
            used.sum(dim=-1, dtype=torch.int32))


def unpad_input_for_concatenated_sequences(
    hidden_states: Tensor, attention_mask_in_length: Tensor
) -> Tuple[Tensor, Tensor, Tensor, int]:
    """Pack rows that each hold several short sequences back to back.

    Row ``b`` of ``attention_mask_in_length`` lists the lengths of the sequences concatenated at
    the start of row ``b`` of ``hidden_states`` (its nonzero entries, in order; zeros are
    skipped), e.g. ``[2, 3, 0, 0, 0, 0]`` is a 2-token then a 3-token sequence followed by one
    padding position. Each listed sequence becomes its own entry of ``cu_seqlens``.

    Args:
        hidden_states: ``(batch, seqlen, ...)``, at least 3 dimensions.
        attention_mask_in_length: ``(batch, seqlen)`` integer tensor of lengths >= 0 whose row
            sums are at most ``seqlen``.

    Returns:
        ``(hidden_states_unpadded, indices, cu_seqlens, max_seqlen_in_batch)``: the first
        ``sum(row)`` positions of each row, packed in row-major order; their int64 flat indices;
        int32 cumulative lengths of every listed sequence, starting at 0 (length
        ``1 + number of nonzero entries``); the longest listed length as a Python int (0 if none).

    Raises:
        TypeError, ValueError: wrong shapes or dtype, or (outside torch.compile) a negative
            length or a row whose lengths add up to more than ``seqlen``.
    """
    where = "unpad_input_for_concatenated_sequences"
    _require_tensor(where, "hidden_states", hidden_states, 3, "(batch, seqlen, ...)")
    lengths = attention_mask_in_length
    batch, seqlen = hidden_states.shape[0], hidden_states.shape[1]
    if not isinstance(lengths, Tensor):
        raise TypeError(f"{where}: attention_mask_in_length must be an integer torch.Tensor of "
                        f"shape (batch, seqlen), got {type(lengths).__name__}")
    if tuple(lengths.shape) != (batch, seqlen):
        raise ValueError(f"{where}: attention_mask_in_length must have shape (batch, seqlen) = "
                         f"{(batch, seqlen)} to match hidden_states, got {tuple(lengths.shape)}")
    if lengths.device != hidden_states.device:
        raise ValueError(f"{where}: attention_mask_in_length is on {lengths.device} but "
                         f"hidden_states is on {hidden_states.device}; they must be on the same "
                         f"device")
    if lengths.dtype == torch.bool or lengths.is_floating_point() or lengths.is_complex():
        raise TypeError(f"{where}: attention_mask_in_length must hold integer lengths, "
                        f"got dtype {lengths.dtype}")
    row_tokens = lengths.sum(dim=-1)
    if _checking_values() and lengths.numel() > 0:
        if bool((lengths < 0).any()):
            raise ValueError(f"{where}: attention_mask_in_length holds {int(lengths.min())}; "
                             f"lengths must be >= 0")
        longest_row = int(row_tokens.max())
        if longest_row > seqlen:
            raise ValueError(f"{where}: a row of attention_mask_in_length adds up to "
                             f"{longest_row} tokens, more than seqlen = {seqlen}")
    positions = torch.arange(seqlen, device=lengths.device)
    selected = positions.unsqueeze(0) < row_tokens.unsqueeze(1)
    flat_lengths = lengths.flatten()
    seqlens = flat_lengths[flat_lengths != 0]
    packed, indices = _pack(hidden_states, selected)
    return packed, indices, _cumulative(seqlens), _max_or_zero(seqlens)


def pad_input(hidden_states: Tensor, indices: Tensor, batch: int, seqlen: int) -> Tensor:
    """Scatter packed rows back into a zero-padded ``(batch, seqlen, ...)`` tensor.

    Args:
        hidden_states: ``(total_nnz, ...)``, at least 2 dimensions.
        indices: ``(total_nnz,)`` int32/int64 flat positions in ``[0, batch * seqlen)``, as
            returned by ``unpad_input``.
        batch, seqlen: ints >= 0, the padded shape.

    Returns:
        ``(batch, seqlen, ...)`` in hidden_states' dtype and device; row ``indices[i]`` of the
        flattened result is ``hidden_states[i]`` and every other row is zero. Gradients flow
        back to ``hidden_states`` by gathering.

    Raises:
        TypeError, ValueError: bad shapes, dtypes, sizes, or (outside torch.compile) an index
            outside ``[0, batch * seqlen)``.
    """
    for name, size in (("batch", batch), ("seqlen", seqlen)):
        if not _is_size(size):
            raise ValueError(f"pad_input: {name} must be an int >= 0, got {size!r}")
    _require_tensor("pad_input", "hidden_states", hidden_states, 2, "(total_nnz, ...)")
    output = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return output.reshape(batch, seqlen, *output.shape[1:])
