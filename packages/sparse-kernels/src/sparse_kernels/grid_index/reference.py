"""PyTorch oracles of the Grid index: the stride and phase search on line scores, the block
index of a Grid permutation and its candidate block lists. Plain torch, any device; the Triton
kernels beside them are compared with these exactly (strides, phases, permutations, lists)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from ..estimate.reference import fold_positions
from ..estimate.search import (
    host_to_device,
    ratios_of_class_sums,
    residue_fold,
    search_folds_reference,
    smallest_near_best,
)
from ..permuted.perms import compact_by_mask

# ---------------------------------------------------------------------------------------------
# Stride and phase search (MMInference Algorithm 1)


def grid_window(period: int, S: int) -> tuple[int, int]:
    """``(lo, hi)``: the positions a folded Grid search reads, ``[period, S // period * period)``:
    whole periods only, so every class of every stride dividing ``period`` has the same count,
    and the first period left out (sink and local-window mass sit there for every stride)."""
    return period, S // period * period


def fold_grid_lines(
    col: torch.Tensor, sl: torch.Tensor, period: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Full line scores ``[..., S]`` (column and diagonal mass) summed per residue modulo
    ``period`` over :func:`grid_window`: what the fold kernel computes in one pass."""
    lo, hi = grid_window(period, col.shape[-1])
    return fold_positions(col, period, lo, hi), fold_positions(sl, period, lo, hi)


def search_grid_folds(
    col_fold: torch.Tensor,
    sl_fold: torch.Tensor,
    strides: list[int],
    *,
    rel_tol: float = 0.15,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Algorithm 1 on folded line scores: the same stride choice as :func:`search_grid_lines`,
    with every stride viewing the window of :func:`grid_window`.

    ``col_fold``, ``sl_fold``: ``[..., P]`` sums per residue modulo ``P``, every residue
    summed over the same number of positions; every stride must divide ``P``. Stride ``s``'s
    class ``c`` then sums the residues ``c, c + s, ...`` (all with the same count, so the ratio
    best / mean needs no counts). Returns ``(stride, phase, score)`` like
    :func:`search_grid_lines`."""
    P = col_fold.shape[-1]
    if sl_fold.shape != col_fold.shape:
        raise ValueError(
            f"sl_fold: expected the shape of col_fold {tuple(col_fold.shape)}, got "
            f"{tuple(sl_fold.shape)}"
        )
    strides = sorted(strides)
    bad = [s for s in strides if s < 1 or P % s]
    if not strides or bad:
        raise ValueError(
            f"search_grid_folds: expected strides dividing the period {P}, got {strides}"
        )
    return search_folds_reference(col_fold, sl_fold, strides, rel_tol=rel_tol)


def search_grid_lines(
    col: torch.Tensor,
    sl: torch.Tensor,
    strides: list[int],
    *,
    rel_tol: float = 0.15,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Algorithm 1: the grid stride and phase of every head from full line scores.

    For each candidate stride ``s`` the column mass (vertical lines) and the diagonal mass
    (slash lines) are viewed as ``[n, s]``; the score of ``s`` is the larger concentration ratio
    (best class mean / mean over classes). A multiple of the true stride scores about as high
    as the stride itself (and a little higher by chance: fewer samples per class), a divisor
    about ``1 / (s / d)`` as high; so the answer is the SMALLEST stride scoring within
    ``rel_tol`` of the best score. Phase = argmax class of the column view at that stride.

    Args:
        col: ``[..., S]`` column mass; sl: ``[..., S]`` diagonal mass of the same rows.
    Returns:
        ``(stride, phase, score)``, each ``col.shape[:-1]`` (int64, int64, float32).
    """
    strides = sorted(s for s in strides if (col.shape[-1] - s) // s >= 1)
    if not strides:
        raise ValueError(
            f"search_grid: expected a stride space with at least one stride <= S/2, got none "
            f"for S={col.shape[-1]}"
        )
    S = col.shape[-1]
    P = math.lcm(*strides)
    scores, phases = [], []
    svec = None
    if min(S // 2, 4096) >= P:
        # Every stride divides P. A few launches for all strides at once: the class sums mod P
        # (one pass over each vector), folded per stride by one matmul, minus the first period,
        # plus the tail past the last whole P-period (another matmul); then the per-stride
        # ratios on a padded [strides, P] view.
        fold, tail, first_idx, n, valid, svec = _fold_mats(tuple(strides), S, col.device)
        x = torch.stack([col, sl]).float()  # [2, N, S]
        SP = S // P * P
        acc = x[..., :SP].reshape(*x.shape[:-1], -1, P).sum(-2)  # [2, N, P]
        x_tail = torch.nn.functional.pad(x[..., SP:], (0, P - (S - SP)))
        v = (acc @ fold + x_tail @ tail - x[..., first_idx]) / n  # [2, N, sum(s)]
        sc, ph = ratios_of_class_sums(v, valid, svec)  # [N, k]
    else:
        both = torch.stack([col, sl])  # one view per stride for the two kinds of line
        for s in strides:
            r, arg = _line_ratio(both, s)
            scores.append(r.amax(0))
            phases.append(arg[0])
        sc = torch.stack(scores, -1)
        ph = torch.stack(phases, -1)
    if svec is None:
        svec = host_to_device(torch.tensor(strides), col.device)
    return smallest_near_best(sc, ph, svec, rel_tol)


def _line_ratio(x: torch.Tensor, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """View ``x [N, S]`` as ``[N, n, s]`` (skipping the first period: sink / self-attention mass
    sits there for every stride) and return (best class mean / mean, argmax class)."""
    n = (x.shape[-1] - s) // s
    return _class_ratio(x[..., s : s + n * s].reshape(*x.shape[:-1], n, s).mean(dim=-2))


@functools.lru_cache(maxsize=64)
def _fold_mats(strides: tuple[int, ...], S: int, device: torch.device):
    """Constant matrices of the folded stride search (see :func:`search_grid_lines`), for
    strides dividing ``P = lcm(strides)``; columns are the (stride, class) pairs, stride-major.
    ``fold [P, C]``: residue mod P -> class; ``tail [P, C]``: the same, for the positions
    ``S // P * P + p`` inside stride ``s``'s view ``[s, S // s * s)``; ``first_idx [C]``: the
    position of class ``c`` in the first period (removed); ``n [C]``: periods per view;
    ``valid [k, P]``: column of (stride i, class c), -1 past the stride; ``svec [k]``: the
    strides (int64)."""
    P = math.lcm(*strides)
    SP = S // P * P
    C = sum(strides)
    tail = torch.zeros(P, C)
    first_idx = torch.zeros(C, dtype=torch.long)
    n = torch.zeros(C)
    o = 0
    r = torch.arange(P)
    for s in strides:
        inside = (SP + r) < S // s * s
        tail[r[inside], o + r[inside] % s] = 1.0
        first_idx[o : o + s] = torch.arange(s)
        n[o : o + s] = S // s - 1
        o += s
    fold, valid, svec = residue_fold(strides, P, device)
    tail, first_idx, n = (host_to_device(t, device) for t in (tail, first_idx, n))
    return fold, tail, first_idx, n, valid, svec


def _class_ratio(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Class means ``v [..., s]`` -> (best class mean / mean, argmax class)."""
    mean = v.mean(dim=-1).clamp_min(1e-30)
    best, arg = v.max(dim=-1)
    return best / mean, arg


# ---------------------------------------------------------------------------------------------
# Block index and block lists of a Grid permutation


def block_min_max(perm: torch.Tensor, blk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 ``[N, NB]``: smallest and largest original index in each block of ``blk`` permuted
    positions (the last block may be short). Reduced in ``perm``'s dtype, without a padded
    int64 copy of the whole ``[N, S]`` array."""
    N, S = perm.shape
    whole = S // blk * blk
    body = perm[:, :whole].reshape(N, S // blk, blk)
    lo, hi = body.amin(-1), body.amax(-1)
    if whole < S:
        lo = torch.cat([lo, perm[:, whole:].amin(-1, keepdim=True)], 1)
        hi = torch.cat([hi, perm[:, whole:].amax(-1, keepdim=True)], 1)
    return lo.long(), hi.long()


def grid_block_lines(
    offs: torch.Tensor, N: int, S: int, blk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 ``[N, NB]``: the grid line of the first and of the last permuted position of each
    block (``offs``: the line table of ``grid_line_offsets``, on the blocks' device)."""
    first = torch.arange(-(-S // blk), device=offs.device) * blk
    last = torch.clamp(first + blk, max=S) - 1
    c_lo = torch.searchsorted(offs, first.expand(N, -1).contiguous(), right=True) - 1
    c_hi = torch.searchsorted(offs, last.expand(N, -1).contiguous(), right=True) - 1
    return c_lo, c_hi


def grid_block_runs(
    perm: torch.Tensor, offsets: torch.Tensor, S: int, blk: int, *, lines=None
) -> torch.Tensor:
    """``sparse_kernels.permuted.kv_block_runs(perm, blk, stride)`` of grid orders, from their
    line tables instead of a pass over ``perm``: a block is a run iff its first and last
    positions lie on one line. A line is one residue class in ascending order, so its blocks step
    by the stride; two lines are different classes, so no block that spans both is a progression
    of that step, and the last block always ends its class. ``perm`` int ``[N, S]`` (grid orders),
    ``offsets`` their ``grid_line_offsets`` (``lines``: ``grid_block_lines`` of them, if the caller
    has it); returns int32 ``[N, ceil(S / blk)]``."""
    if lines is None:
        lines = grid_block_lines(offsets.to(perm.device), perm.shape[0], S, blk)
    c_lo, c_hi = lines
    first = perm[:, ::blk].long()
    return torch.where(c_lo == c_hi, first, -1).to(torch.int32)


def grid_block_mask(
    perm: torch.Tensor,
    offsets: torch.Tensor,
    use_hline: torch.Tensor,
    use_vline: torch.Tensor,
    use_slash: torch.Tensor,
    S: int,
    blk: int,
) -> Callable[[int, int], torch.Tensor]:
    """Chunk function ``fn(m0, m1) -> bool [N, m1 - m0, NKB]`` of the block mask of Grid heads in
    their permuted space (same permutation for rows and columns).

    ``perm`` ``[N, S]`` from ``sparse_kernels.grid_permutation``; ``offsets`` ``[N, L + 1]``
    from ``grid_line_offsets``; flags ``[N]`` bool. Listed: the diagonal block; slash = the key
    blocks of the query block's own lines; vline = key blocks of line 0; hline = every key
    block for query blocks touching line 0; all pruned to blocks holding at least one key whose
    original position is <= the block's largest original query position.
    """
    nkb = -(-S // blk)
    dev = perm.device
    kmin, qmax = block_min_max(perm, blk)  # [N, NKB], [N, NQB]
    offs = offsets.to(dev)
    c_lo, c_hi = grid_block_lines(offs, offs.shape[0], S, blk)
    s_lo = offs.gather(1, c_lo) // blk
    s_hi = (offs.gather(1, c_hi + 1) - 1) // blk
    v_hi = (offs[:, 1] - 1) // blk
    col = lambda x: x.reshape(-1, 1, 1)  # noqa: E731

    def fn(m0: int, m1: int) -> torch.Tensor:
        n = torch.arange(nkb, device=dev)[None, None, :]
        m = torch.arange(m0, m1, device=dev)[None, :, None]
        sl = (n >= s_lo[:, m0:m1, None]) & (n <= s_hi[:, m0:m1, None]) & col(use_slash)
        vl = (n <= v_hi[:, None, None]) & col(use_vline)
        hl = (c_lo[:, m0:m1, None] == 0) & col(use_hline)
        causal = kmin[:, None, :] <= qmax[:, m0:m1, None]
        return (sl | vl | hl | (n == m)) & causal

    return fn


def candidate_lists_reference(
    v_hi: torch.Tensor,
    s_lo: torch.Tensor,
    s_hi: torch.Tensor,
    kmin: torch.Tensor,
    qmax: torch.Tensor,
    wv: int,
    ws: int,
    nkb: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Grid block lists from their candidate ranges in torch (see
    :func:`~sparse_kernels.grid_index.grid_candidate_lists`): int32 ``(idx [N, NQB, W],
    cnt [N, NQB])``, ``W = wv + ws + 1``, zeros past each count."""
    N = s_lo.shape[0]
    dev = s_lo.device
    v_hi, s_lo, s_hi, kmin, qmax = (t.long() for t in (v_hi, s_lo, s_hi, kmin, qmax))
    m = torch.arange(nkb, device=dev)[None, :, None]
    cand_v = torch.arange(wv, device=dev)[None, None, :].expand(N, nkb, wv)
    ok_v = cand_v <= v_hi[:, None, None]
    cand_s = s_lo[..., None] + torch.arange(ws, device=dev)[None, None, :]
    ok_s = (cand_s <= s_hi[..., None]) & (cand_s > v_hi[:, None, None])
    cand_d = m.expand(N, nkb, 1)
    ok_d = ~(
        (cand_d <= v_hi[:, None, None])
        | ((cand_d >= s_lo[..., None]) & (cand_d <= s_hi[..., None]))
    )
    cand = torch.cat([cand_v, cand_s, cand_d], -1).clamp(max=nkb - 1)
    ok = torch.cat([ok_v, ok_s, ok_d], -1)
    ok &= kmin.gather(1, cand.reshape(N, -1)).reshape(cand.shape) <= qmax[..., None]
    idx, cnt = compact_by_mask(ok, cand, width=wv + ws + 1)  # kept ones, in candidate order
    return idx.contiguous(), cnt
