"""Plain PyTorch oracle for vertical-slash attention: the exact attended mask, then dense."""

from __future__ import annotations

import torch

from .._types import AttentionOutput
from ..attention.reference import masked_attention_reference


def vertical_slash_mask(
    vertical_indices: torch.Tensor,
    slash_indices: torch.Tensor,
    seq_len: int,
    *,
    block_m: int = 64,
    block_n: int = 64,
) -> torch.Tensor:
    """``[B, H, S, S]`` bool, the attended set of ``vertical_slash_attention``.

    Built by walking every slash diagonal element by element and marking each
    ``block_m x block_n`` tile it passes through, then adding the vertical columns and the
    causal rule ``j <= i``. Memory ``O(B * H * NS * S)``: meant for tests and small sizes.
    """
    S, BM, BN = seq_len, block_m, block_n
    B, H = vertical_indices.shape[:2]
    dev = vertical_indices.device
    N = B * H
    nqb, nkb = -(-S // BM), -(-S // BN)
    o = slash_indices.reshape(N, -1, 1).to(torch.int64)
    i = torch.arange(S, device=dev)[None, None, :]
    j = i - o
    ok = j >= 0
    flat = torch.where(ok, (i // BM) * nkb + j.clamp_min(0) // BN, nqb * nkb)
    tiles = torch.zeros(N, nqb * nkb + 1, dtype=torch.bool, device=dev)
    tiles.scatter_(1, flat.reshape(N, -1), True)
    tiles = tiles[:, : nqb * nkb].reshape(N, nqb, nkb)
    dense = tiles.repeat_interleave(BM, dim=1).repeat_interleave(BN, dim=2)[:, :S, :S]
    cols = torch.zeros(N, S, dtype=torch.bool, device=dev)
    cols.scatter_(1, vertical_indices.reshape(N, -1).to(torch.int64), True)
    dense = dense | cols[:, None, :]
    dense = dense & torch.ones(S, S, dtype=torch.bool, device=dev).tril()
    return dense.reshape(B, H, S, S)


def vertical_slash_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    vertical_indices: torch.Tensor,
    slash_indices: torch.Tensor,
    *,
    scale: float | None = None,
    block_m: int = 64,
    block_n: int = 64,
    compute_dtype: torch.dtype | None = None,
) -> AttentionOutput:
    """Dense attention restricted to :func:`vertical_slash_mask`, in float32 (float64 for
    float64 inputs) unless ``compute_dtype`` says otherwise (see
    :func:`~sparse_kernels.attention.masked_attention_reference`)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    mask = vertical_slash_mask(
        vertical_indices, slash_indices, q.shape[2], block_m=block_m, block_n=block_n
    ).to(q.device)
    return masked_attention_reference(q, k, v, mask, scale=scale, compute_dtype=compute_dtype)
