"""Online estimation steps (each small, named and testable on its own).

Pipeline of a dynamic head: :func:`approx_scores` (softmax of the last ``last_q`` queries against
all keys, causal) -> :func:`vertical_scores` / :func:`slash_scores` / :func:`pooled_block_scores`
-> :func:`topk_indices` or :func:`search_grid` (stride and phase) -> forced entries (sink
columns, local diagonals, diagonal blocks) -> block lists (:mod:`sparse_patterns.plan`).

All functions work on every head at once (leading dims ``[B, H]``); no per-head Python loop.
"""

from __future__ import annotations

import functools

import torch
from sparse_kernels.grid_index import (  # pipeline steps, defined beside their kernels
    fold_grid_lines,
    grid_window,
    search_grid_folds,
    search_grid_lines,
)

__all__ = [
    "approx_scores",
    "fold_grid_lines",
    "grid_window",
    "last_line_folds",
    "last_line_scores",
    "pool_blocks",
    "pooled_block_scores",
    "search_grid",
    "search_grid_folds",
    "search_grid_lines",
    "slash_scores",
    "stride_space",
    "topk_indices",
    "vertical_scores",
]


def approx_scores(
    q: torch.Tensor, k: torch.Tensor, rows: torch.Tensor, *, scale: float
) -> torch.Tensor:
    """Approximate attention ``softmax(q[rows] k^T * scale)`` with the causal mask, float32.

    Args:
        q: ``[B, H, S, D]``; k: ``[B, H_KV, S, D]`` (GQA handled by grouping, K is not repeated).
        rows: int64 ``[L]`` or ``[M, L]`` query positions (e.g. the last ``last_q`` tokens, or
            the last ``last_q`` tokens of each of ``M`` modalities).
    Returns:
        ``[B, H, L, S]`` or ``[B, H, M, L, S]``; row ``l`` is the distribution of query
        ``rows[l]`` over keys ``j <= rows[l]``.
    """
    B, H, _, D = q.shape
    H_KV, S = k.shape[1], k.shape[2]
    G = H // H_KV
    flat = rows.reshape(-1)
    qs = q[:, :, flat].float().reshape(B, H_KV, G, flat.numel(), D)
    s = torch.matmul(qs, k.float()[:, :, None].transpose(-1, -2)) * scale
    s = s.reshape(B, H, flat.numel(), S)
    j = torch.arange(S, device=q.device)
    s.masked_fill_(j[None, :] > flat[:, None], float("-inf"))
    p = torch.softmax(s, dim=-1)
    del s
    return p.reshape(B, H, *rows.shape, S)


def vertical_scores(p: torch.Tensor) -> torch.Tensor:
    """Mass per key column: sum over the approximate query rows. ``[..., L, S] -> [..., S]``."""
    return p.sum(dim=-2)


def slash_scores(p: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Mass per diagonal offset ``o = i - j`` (``o >= 0``). ``[..., L, S] -> [..., S]``.

    ``rows``: the query positions of ``p``'s rows (``[L]``, or ``[M, L]`` matching ``p``).
    Row ``l`` contributes ``p[l, rows[l] - o]`` to offset ``o``: a reversed slice per row (a
    loop over the ``L`` approximate rows, vectorised over heads; no ``L x S`` index tensor).
    """
    return _slash_scores(p, rows.shape, rows.reshape(-1).tolist())


def _slash_scores(p: torch.Tensor, shape: torch.Size, positions: list[int]) -> torch.Tensor:
    """:func:`slash_scores` with the row positions given on the host (``positions``, the rows
    ``[*shape]`` flattened): slicing by them needs them as Python ints."""
    S = p.shape[-1]
    lead = p.shape[: p.ndim - len(shape) - 1]
    pr = p.reshape(*lead, -1, S)
    out = torch.zeros(*lead, *shape[:-1], S, dtype=p.dtype, device=p.device)
    flat_out = out.reshape(*lead, -1, S)
    L = shape[-1]
    for n, r in enumerate(positions):
        r = min(int(r), S - 1)
        flat_out[..., n // L, : r + 1] += pr[..., n, : r + 1].flip(-1)
    return out


def last_line_scores(
    q: torch.Tensor, k: torch.Tensor, L: int, *, scale: float, impl: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Column and diagonal mass of the last ``L`` queries (``L' = min(L, S)`` rows), every head.

    Returns ``(vertical [B, H, S], slash [B, H, S])`` as
    :func:`vertical_scores` / :func:`slash_scores` of :func:`approx_scores` would. ``impl``:
    ``"triton"`` streams the keys through ``sparse_kernels.line_scores`` (no ``[L, S]``
    matrix; needs ``L' <= 128``), ``"reference"`` composes the torch steps above, ``"auto"``
    picks triton on CUDA when ``L' <= 128`` and the reference otherwise (same sums either way).
    """
    from sparse_kernels import line_scores
    from sparse_kernels.validation import resolve_impl

    S = q.shape[2]
    n = min(L, S)
    which = resolve_impl(impl, q.device, "last_line_scores")
    if impl == "auto" and n > 128:
        which = "reference"
    if which == "triton":
        return line_scores(q[:, :, S - n :], k, S - n, scale=scale, impl="triton")
    rows = torch.arange(S - n, S, device=q.device)
    p = approx_scores(q, k, rows, scale=scale)
    return vertical_scores(p), _slash_scores(p, rows.shape, list(range(S - n, S)))


def last_line_folds(
    q: torch.Tensor, k: torch.Tensor, L: int, *, period: int, scale: float, impl: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Column and diagonal mass of the last ``L`` queries over :func:`grid_window`, summed per
    residue modulo ``period``: ``(vertical_fold [B, H, period], slash_fold [B, H, period])``.
    ``impl``: ``"triton"`` (``sparse_kernels.line_folds``: one pass over the keys, no ``[B, H,
    S]`` vectors; needs ``L' = min(L, S) <= 128``), ``"reference"`` (:func:`last_line_scores`' torch steps, then
    folded), ``"auto"`` (triton on CUDA when ``L' <= 128``; the same sums either way)."""
    from sparse_kernels import line_folds
    from sparse_kernels.validation import resolve_impl

    S = q.shape[2]
    n = min(L, S)
    lo, hi = grid_window(period, S)
    which = resolve_impl(impl, q.device, "last_line_folds")
    if impl == "auto" and n > 128:
        which = "reference"
    if which == "triton":
        return line_folds(
            q[:, :, S - n :], k, S - n, period=period, lo=lo, hi=hi, scale=scale, impl="triton"
        )
    return fold_grid_lines(*last_line_scores(q, k, L, scale=scale, impl="reference"), period)


def topk_indices(scores: torch.Tensor, k: int, *, forced: int = 0) -> torch.Tensor:
    """Indices of the ``k`` largest entries along the last dim, the first ``forced`` always
    included (set to +inf first); sorted ascending, int64. ``k`` is clipped to the length."""
    n = scores.shape[-1]
    k = max(0, min(k, n))
    s = scores.clone()
    if forced > 0:
        s[..., : min(forced, n)] = float("inf")
    idx = torch.topk(s, k, dim=-1, sorted=False).indices
    return torch.sort(idx, dim=-1).values


def stride_space(tokens_per_frame: int | None, *, max_stride: int, S: int) -> list[int]:
    """Grid strides to try: tokens per frame and its divisors (>= 2), capped at ``max_stride``
    and at ``S // 4`` (a stride needs a few periods to be seen). Without a frame size: every
    stride 2..min(max_stride, 256, S // 4)."""
    return list(_stride_space(tokens_per_frame, max_stride, S))


@functools.lru_cache(maxsize=256)
def _stride_space(tokens_per_frame: int | None, max_stride: int, S: int) -> tuple[int, ...]:
    cap = min(max_stride, max(2, S // 4))
    if tokens_per_frame is None:
        return tuple(range(2, min(cap, 256) + 1))
    t = tokens_per_frame
    return tuple(d for d in range(2, t + 1) if t % d == 0 and d <= cap)


def search_grid(
    p: torch.Tensor,
    rows: torch.Tensor,
    strides: list[int],
    *,
    rel_tol: float = 0.15,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`search_grid_lines` on the column and diagonal mass of the approximate scores
    ``p [..., L, S]`` of the query rows ``rows [L]``."""
    return search_grid_lines(vertical_scores(p), slash_scores(p, rows), strides, rel_tol=rel_tol)


def pool_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """Mean of each block of ``block`` rows: ``[B, H, S, D] -> [B, H, ceil(S / block), D]``, float32."""
    B, H, S, D = x.shape
    nb = -(-S // block)
    pad = nb * block - S
    xf = torch.nn.functional.pad(x.float(), (0, 0, 0, pad))
    cnt = torch.full((nb,), float(block), device=x.device)
    cnt[-1] = block - pad
    return xf.reshape(B, H, nb, block, D).sum(-2) / cnt[:, None]


def pooled_block_scores(
    pq: torch.Tensor, pk: torch.Tensor, *, scale: float, m0: int = 0
) -> torch.Tensor:
    """Block-level approximate attention from pooled blocks (:func:`pool_blocks`), causal at
    block level (query block ``m0 + m`` sees key blocks ``<= m0 + m``), softmax over key blocks.

    ``pq``: ``[B, H, C, D]`` pooled query blocks ``m0 .. m0 + C``; ``pk``: ``[B, H_KV, NKB, D]``.
    Returns ``[B, H, C, NKB]`` float32.
    """
    B, H, C, D = pq.shape
    H_KV, nb = pk.shape[1], pk.shape[2]
    G = H // H_KV
    s = torch.matmul(pq.reshape(B, H_KV, G, C, D), pk[:, :, None].transpose(-1, -2))
    s = s.reshape(B, H, C, nb) * scale
    m = torch.arange(m0, m0 + C, device=pq.device)[:, None]
    n = torch.arange(nb, device=pq.device)[None, :]
    s = s.masked_fill(n > m, float("-inf"))
    return torch.softmax(s, dim=-1)
