"""Plain PyTorch oracle for triangle (A-shape + dense last rows) attention."""

from __future__ import annotations

import torch

from .._types import AttentionOutput
from ..attention.reference import masked_attention_reference


def triangle_mask(
    S_Q: int, S_KV: int, *, sink: int, window: int, last: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``[S_Q, S_KV]`` bool: row i (position ``p = i + S_KV - S_Q``) attends key j iff
    ``j <= p`` and (``j < sink`` or ``p - j < window`` or ``i >= S_Q - last``)."""
    i = torch.arange(S_Q, device=device)[:, None]
    p = i + (S_KV - S_Q)
    j = torch.arange(S_KV, device=device)[None, :]
    return (j <= p) & ((j < sink) | (p - j < window) | (i >= S_Q - last))


def triangle_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sink: int,
    window: int,
    last: int = 0,
    scale: float | None = None,
    compute_dtype: torch.dtype | None = None,
    row_chunk: int | None = None,
    score_budget: int = 1 << 27,
) -> AttentionOutput:
    """Triangle attention by an explicit mask, ``row_chunk`` query rows at a time so that a long
    sequence never holds more than ``row_chunk x S_KV`` scores per head. By default a chunk's
    score array (all batches and heads) is kept near ``score_budget`` elements (2^27: 1 GiB
    in float64), at most 2048 rows; the masked softmax holds a few arrays of that size at once,
    plus K/V expanded to all heads. A fixed 2048 rows held 8.6 GB per score array in float64 at 32 heads x 16K keys, and
    several test workers sharing a GPU ran it out of memory. Computed in float32 (float64 for
    float64 inputs) unless ``compute_dtype`` says otherwise (see
    :func:`~sparse_kernels.attention.masked_attention_reference`)."""
    B, H, S_Q, _ = q.shape
    S_KV = k.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if score_budget < 1:
        raise ValueError(f"score_budget: expected a positive element count, got {score_budget}")
    if row_chunk is None:
        row_chunk = max(1, min(2048, score_budget // max(1, B * H * S_KV)))
    elif row_chunk < 1:
        raise ValueError(f"row_chunk: expected a positive row count, got {row_chunk}")
    outs, lses = [], []
    for r0 in range(0, S_Q, row_chunk):
        r1 = min(S_Q, r0 + row_chunk)
        i = torch.arange(r0, r1, device=q.device)[:, None]
        p = i + (S_KV - S_Q)
        j = torch.arange(S_KV, device=q.device)[None, :]
        mask = (j <= p) & ((j < sink) | (p - j < window) | (i >= S_Q - last))
        part = masked_attention_reference(
            q[:, :, r0:r1], k, v, mask, scale=scale, compute_dtype=compute_dtype
        )
        outs.append(part.out)
        lses.append(part.lse)
    return AttentionOutput(torch.cat(outs, dim=2), torch.cat(lses, dim=2))
