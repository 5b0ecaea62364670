"""Plain PyTorch oracle for merging partial attentions by their LSE."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._types import AttentionOutput


def merge_attention_reference(
    outs: Sequence[torch.Tensor],
    lses: Sequence[torch.Tensor],
    *,
    compute_dtype: torch.dtype = torch.float32,
) -> AttentionOutput:
    """Exact combination of attentions over disjoint key sets.

    ``lse = log(sum_i exp(lse_i))`` and ``out = sum_i exp(lse_i - lse) * out_i``; a row whose
    every part is empty (all ``lse_i = -inf``) gives ``out = 0``, ``lse = -inf``.
    """
    lse_all = torch.stack([x.to(compute_dtype) for x in lses])  # [N, B, H, S]
    lse = torch.logsumexp(lse_all, dim=0)
    empty = torch.isneginf(lse)
    safe = torch.where(empty, torch.zeros_like(lse), lse)
    w = torch.exp(lse_all - safe[None])  # exp(-inf) = 0 for empty parts
    # An empty part adds nothing, even where its out is not finite (0 * NaN would be NaN).
    out = sum(
        torch.where(w[i][..., None] > 0, w[i][..., None] * outs[i].to(compute_dtype), 0.0)
        for i in range(len(outs))
    )
    out = out.masked_fill(empty[..., None], 0.0)
    return AttentionOutput(out.to(outs[0].dtype), lse.to(torch.float32))
