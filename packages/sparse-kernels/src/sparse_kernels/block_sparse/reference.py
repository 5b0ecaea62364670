"""Plain PyTorch oracle for block-sparse attention over a FlexAttention ``BlockMask``."""

from __future__ import annotations

import torch

from .._types import AttentionOutput
from ..attention.reference import causal_mask, masked_attention_reference


def _listed_blocks(num: torch.Tensor, idx: torch.Tensor, n_kv_blocks: int) -> torch.Tensor:
    """``[B', H', NQB, n_kv_blocks]`` bool: the first ``num`` entries of each ``idx`` row."""
    B_, H_, NQB, W = idx.shape
    take = torch.arange(W, device=idx.device) < num[..., None].to(torch.int64)
    dst = torch.where(take, idx.to(torch.int64), n_kv_blocks)
    out = torch.zeros(B_, H_, NQB, n_kv_blocks + 1, dtype=torch.bool, device=idx.device)
    out.scatter_(-1, dst, True)
    return out[..., :n_kv_blocks]


def block_mask_to_dense(block_mask, S_Q: int, S_KV: int, *, causal: bool = True) -> torch.Tensor:
    """The exact attended set of ``block_sparse_attention``: bool ``[B', H', S_Q, S_KV]``.

    ``B'``/``H'`` are the batch/head sizes of the mask's ``kv_num_blocks`` (1 when broadcast).
    Query ``i`` attends key ``j`` iff block ``(i // BLOCK_M, j // BLOCK_N)`` is listed as partial or
    full and, with ``causal``, ``j <= i + S_KV - S_Q``. ``mask_mod`` is not evaluated.
    """
    BM, BN = block_mask.BLOCK_SIZE
    nqb, nkb = -(-S_Q // BM), -(-S_KV // BN)
    blocks = _listed_blocks(block_mask.kv_num_blocks, block_mask.kv_indices, nkb)
    if block_mask.full_kv_num_blocks is not None:
        blocks = blocks | _listed_blocks(
            block_mask.full_kv_num_blocks, block_mask.full_kv_indices, nkb
        )
    blocks = blocks[:, :, :nqb]
    dense = blocks.repeat_interleave(BM, dim=2).repeat_interleave(BN, dim=3)[..., :S_Q, :S_KV]
    if causal:
        dense = dense & causal_mask(S_Q, S_KV, dense.device)
    return dense


def block_sparse_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_mask,
    *,
    causal: bool = True,
    scale: float | None = None,
    compute_dtype: torch.dtype | None = None,
) -> AttentionOutput:
    """Dense attention restricted to :func:`block_mask_to_dense`, in float32 (float64 for
    float64 inputs) unless ``compute_dtype`` says otherwise (see
    :func:`~sparse_kernels.attention.masked_attention_reference`)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    mask = block_mask_to_dense(block_mask, q.shape[2], k.shape[2], causal=causal).to(q.device)
    return masked_attention_reference(q, k, v, mask, scale=scale, compute_dtype=compute_dtype)
