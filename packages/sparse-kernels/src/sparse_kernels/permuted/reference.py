"""Plain PyTorch oracle for permuted block-sparse attention.

It never runs attention in permuted order: it builds the exact bool mask in ORIGINAL
coordinates (block lists in permuted space gathered through the inverse permutations, causal
on original positions) and calls ``masked_attention_reference`` on the original q, k, v.
"""

from __future__ import annotations

import torch

from .._types import AttentionOutput
from ..attention.reference import causal_mask, masked_attention_reference
from .perms import inverse_permutation


def expand_perm(perm: torch.Tensor | None, B: int, H: int, S: int, device) -> torch.Tensor:
    """A ``[S]``, ``[H|1, S]`` or ``[B|1, H|1, S]`` permutation (None = identity) as int64
    ``[B, H, S]``."""
    if perm is None:
        return torch.arange(S, device=device).expand(B, H, S)
    if perm.ndim < 3:
        perm = perm.reshape(1, -1, S)
    return perm.to(device=device, dtype=torch.int64).expand(B, H, S)


def block_list_mask(indices: torch.Tensor, counts: torch.Tensor, n_kv_blocks: int) -> torch.Tensor:
    """``[..., NQB, NKB]`` bool: query block ``m`` lists key block ``n`` among its first
    ``counts[..., m]`` entries of ``indices[..., m, :]``."""
    maxb = indices.shape[-1]
    valid = torch.arange(maxb, device=indices.device) < counts[..., None].long()
    idx = torch.where(valid, indices.long(), n_kv_blocks)
    out = torch.zeros(*idx.shape[:-1], n_kv_blocks + 1, dtype=torch.bool, device=indices.device)
    out.scatter_(-1, idx, True)
    return out[..., :n_kv_blocks]


def permuted_mask(
    *,
    B: int,
    H: int,
    H_KV: int,
    S_Q: int,
    S_KV: int,
    q_perm: torch.Tensor | None,
    kv_perm: torch.Tensor | None,
    kv_block_indices: torch.Tensor,
    kv_block_counts: torch.Tensor,
    full_kv_block_indices: torch.Tensor | None = None,
    full_kv_block_counts: torch.Tensor | None = None,
    block_m: int,
    block_n: int,
    causal: bool,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """``[B, H, S_Q, S_KV]`` bool in ORIGINAL coordinates: what query ``i`` attends.

    Original query ``i`` sits at permuted row ``r = q_inv[i]``, original key ``j`` at permuted
    column ``c = kv_inv[j]``. The pair is attended iff block ``(r // block_m, c // block_n)`` is in
    the full list, or it is in the partial list and (not causal or ``j <= i + S_KV - S_Q``).
    """
    nqb, nkb = -(-S_Q // block_m), -(-S_KV // block_n)

    def elem(indices, counts):
        bm = block_list_mask(indices.to(device), counts.to(device), nkb)
        bm = bm.expand(B, H, nqb, nkb)
        bm = bm.repeat_interleave(block_m, dim=2)[:, :, :S_Q]
        return bm.repeat_interleave(block_n, dim=3)[:, :, :, :S_KV]

    qp = expand_perm(q_perm, B, H, S_Q, device)
    if kv_perm is not None and kv_perm.ndim >= 2 and kv_perm.shape[-2] == H_KV and H_KV != H:
        kv_perm = kv_perm.repeat_interleave(H // H_KV, dim=-2)
    kp = expand_perm(kv_perm, B, H, S_KV, device)
    q_inv = inverse_permutation(qp)
    kv_inv = inverse_permutation(kp)

    def to_original(m):
        # rows: original i reads permuted row q_inv[i]; then columns likewise.
        m = torch.gather(m, 2, q_inv[..., None].expand(B, H, S_Q, S_KV))
        return torch.gather(m, 3, kv_inv[:, :, None, :].expand(B, H, S_Q, S_KV))

    mask = to_original(elem(kv_block_indices, kv_block_counts))
    if causal:
        mask = mask & causal_mask(S_Q, S_KV, device)
    if full_kv_block_indices is not None:
        mask = mask | to_original(elem(full_kv_block_indices, full_kv_block_counts))
    return mask


def permuted_block_sparse_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    q_perm: torch.Tensor | None,
    kv_perm: torch.Tensor | None,
    kv_block_indices: torch.Tensor,
    kv_block_counts: torch.Tensor,
    full_kv_block_indices: torch.Tensor | None = None,
    full_kv_block_counts: torch.Tensor | None = None,
    block_m: int = 64,
    block_n: int = 64,
    causal: bool = True,
    scale: float | None = None,
    compute_dtype: torch.dtype | None = None,
    row_chunk: int = 2048,
) -> AttentionOutput:
    """Permuted block-sparse attention by an explicit original-coordinate mask (no validation;
    the public op validates). See :func:`permuted_mask` for the attended set. The bool mask is
    built whole; scores are computed ``row_chunk`` original rows at a time."""
    B, H, S_Q, D = q.shape
    H_KV, S_KV = k.shape[1], k.shape[2]
    scale = D**-0.5 if scale is None else scale
    mask = permuted_mask(
        B=B,
        H=H,
        H_KV=H_KV,
        S_Q=S_Q,
        S_KV=S_KV,
        q_perm=q_perm,
        kv_perm=kv_perm,
        kv_block_indices=kv_block_indices,
        kv_block_counts=kv_block_counts,
        full_kv_block_indices=full_kv_block_indices,
        full_kv_block_counts=full_kv_block_counts,
        block_m=block_m,
        block_n=block_n,
        causal=causal,
        device=q.device,
    )
    outs, lses = [], []
    for r0 in range(0, S_Q, row_chunk):
        r1 = min(S_Q, r0 + row_chunk)
        part = masked_attention_reference(
            q[:, :, r0:r1], k, v, mask[:, :, r0:r1], scale=scale, compute_dtype=compute_dtype
        )
        outs.append(part.out)
        lses.append(part.lse)
    return AttentionOutput(torch.cat(outs, dim=2), torch.cat(lses, dim=2))
