"""PyTorch reference of the line scores: the approximate attention of the last query rows,
materialised, summed along columns and along diagonals."""

from __future__ import annotations

import torch


def line_scores_reference(
    q_rows: torch.Tensor,
    k: torch.Tensor,
    row_start: int,
    *,
    scale: float,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """See :func:`sparse_kernels.estimate.line_scores`; materialises ``[B, H, L, S]``."""
    B, H, L, D = q_rows.shape
    H_KV, S = k.shape[1], k.shape[2]
    G = H // H_KV
    kk = k.to(compute_dtype).repeat_interleave(G, dim=1)
    s = torch.matmul(q_rows.to(compute_dtype), kk.transpose(-1, -2)) * scale  # [B, H, L, S]
    r = torch.arange(row_start, row_start + L, device=q_rows.device)
    j = torch.arange(S, device=q_rows.device)
    s = s.masked_fill(j[None, :] > r[:, None], float("-inf"))
    p = torch.softmax(s, dim=-1)
    vertical = p.sum(dim=-2)
    # Diagonal offset o = r_l - j: row l, reversed, lands at offsets 0 .. r_l.
    slash = torch.zeros(B, H, S, dtype=compute_dtype, device=q_rows.device)
    for n in range(L):
        rr = min(row_start + n, S - 1)
        slash[..., : rr + 1] += p[..., n, : rr + 1].flip(-1)
    return vertical.float(), slash.float()


def column_mass_reference(
    q_rows: torch.Tensor,
    k: torch.Tensor,
    *,
    scale: float,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """See :func:`sparse_kernels.estimate.column_mass`; materialises ``[B, H, L, S]``."""
    B, H, L, D = q_rows.shape
    H_KV, S = k.shape[1], k.shape[2]
    qg = q_rows.to(compute_dtype).reshape(B, H_KV, (H // H_KV) * L, D)  # a KV group's rows
    s = torch.matmul(qg, k.to(compute_dtype).transpose(-1, -2)) * scale
    p = torch.softmax(s, dim=-1).reshape(B, H, L, S)
    return p.sum(dim=2).float()


def line_folds_reference(
    q_rows: torch.Tensor,
    k: torch.Tensor,
    row_start: int,
    *,
    period: int,
    lo: int,
    hi: int,
    scale: float,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """See :func:`sparse_kernels.estimate.line_folds`: the line scores of
    :func:`line_scores_reference`, restricted to positions ``lo .. hi - 1`` and summed per residue
    modulo ``period``."""
    vert, slash = line_scores_reference(
        q_rows, k, row_start, scale=scale, compute_dtype=compute_dtype
    )
    return fold_positions(vert, period, lo, hi), fold_positions(slash, period, lo, hi)


def fold_positions(x: torch.Tensor, period: int, lo: int, hi: int) -> torch.Tensor:
    """``out[..., c] = sum of x[..., p] over lo <= p < hi with p % period == c``, float32."""
    pos = torch.arange(lo, hi, device=x.device)
    out = torch.zeros(*x.shape[:-1], period, dtype=torch.float32, device=x.device)
    if hi > lo:
        out.index_add_(x.ndim - 1, pos % period, x[..., lo:hi].float())
    return out
