"""Public merge of partial attentions."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._types import AttentionOutput
from .._validate import SUPPORTED_DTYPES, check_tensor, resolve_impl
from .reference import merge_attention_reference


def _check_merge(outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]) -> None:
    for name, seq in (("outs", outs), ("lses", lses)):
        if isinstance(seq, torch.Tensor) or not isinstance(seq, Sequence):
            raise TypeError(
                f"outs and lses: expected sequences (list/tuple) of tensors, got {name} of type "
                f"{type(seq).__name__}"
            )
    if len(outs) != len(lses):
        raise ValueError(
            f"expected as many lses as outs, got {len(outs)} outs and {len(lses)} lses"
        )
    if len(outs) == 0:
        raise ValueError("expected at least one partial attention, got none")
    ref = check_tensor(outs[0], "outs[0]")
    if ref.ndim != 4 or ref.shape[-1] == 0:
        raise ValueError(
            f"outs[0]: expected a 4-D tensor [B, H, S, D] with D >= 1, got shape {tuple(ref.shape)}"
        )
    if ref.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"outs[0]: expected dtype torch.float16, torch.bfloat16 or torch.float32, got "
            f"{ref.dtype}"
        )
    for i, (o, x) in enumerate(zip(outs, lses)):
        check_tensor(o, f"outs[{i}]")
        check_tensor(x, f"lses[{i}]")
        if o.shape != ref.shape:
            raise ValueError(f"outs[{i}]: expected shape {tuple(ref.shape)}, got {tuple(o.shape)}")
        if o.dtype != ref.dtype:
            raise TypeError(f"outs[{i}]: expected dtype {ref.dtype} (outs[0]'s), got {o.dtype}")
        if x.shape != ref.shape[:-1]:
            raise ValueError(
                f"lses[{i}]: expected shape {tuple(ref.shape[:-1])}, got {tuple(x.shape)}"
            )
        if x.dtype != torch.float32:
            raise TypeError(f"lses[{i}]: expected dtype torch.float32, got {x.dtype}")
        if o.device != ref.device or x.device != ref.device:
            raise ValueError(
                f"outs[{i}]/lses[{i}]: expected device {ref.device}, got {o.device} and {x.device}"
            )


def merge_attention(
    outs: Sequence[torch.Tensor],
    lses: Sequence[torch.Tensor],
    *,
    impl: str = "auto",
) -> AttentionOutput:
    """Exactly combine attentions of the same queries over disjoint key sets.

    Args:
        outs: N tensors ``[B, H, S, D]`` (one dtype); lses: N float32 ``[B, H, S]`` (natural log).
        impl: ``"triton"``, ``"reference"`` or ``"auto"`` (triton on CUDA, reference elsewhere).

    Returns:
        ``AttentionOutput(out, lse)`` of the attention over the union of the key sets. A row that
        saw no key in any part has ``out = 0`` and ``lse = -inf``, never NaN. A part whose lse
        is ``-inf`` for a row (it saw no key there) contributes nothing to that row, whatever
        its ``out`` holds there (a NaN too); layouts are free (the Triton path copies
        non-contiguous parts).
    """
    _check_merge(outs, lses)
    which = resolve_impl(impl, outs[0].device, "merge_attention")
    if which == "reference":
        return merge_attention_reference(outs, lses)
    from .triton import _launch_merge_fwd

    return AttentionOutput(*_launch_merge_fwd(list(outs), list(lses)))
