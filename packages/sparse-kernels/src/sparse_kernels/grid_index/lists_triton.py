"""The Grid heads' block lists in one Triton launch (no host read, no ``nonzero``): per query
block, its candidates (vertical line 0, its own lines, the diagonal block), pruned causally, with
their run split. Each program takes a tile of list rows, marks the entries it keeps and writes
them at their ranks (a cumulative sum along the row). The torch oracle is
:func:`~sparse_kernels.grid_index.reference.candidate_lists_reference`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton.launch import launch
from .settings import DEFAULT_SETTINGS


@triton.jit
def _grid_lists_kernel(
    v_hi_ptr,
    s_lo_ptr,
    s_hi_ptr,
    kmin_ptr,
    qmax_ptr,
    width_ptr,
    idx_ptr,
    cnt_ptr,
    runs_ptr,
    rest_ptr,
    rest_cnt_ptr,
    starts_ptr,
    run_cnt_ptr,
    nqb,
    nkb,
    CAP,
    BLOCK_R: tl.constexpr,
    BLOCK_W: tl.constexpr,
    SPLIT: tl.constexpr,
):
    # Candidates of query block m, in order: key blocks 0 .. WV - 1 (vertical line 0, kept up to
    # v_hi), s_lo[m] .. s_lo[m] + WS - 1 (the block's own lines, kept up to s_hi[m] and above
    # v_hi), then m itself (kept unless already listed); each kept only if its smallest original
    # key is <= the query block's largest original row. Kept ones are written at their ranks,
    # zeros past them up to the candidate width W = WV + WS + 1; rows are CAP entries apart.
    # WV and WS are read from width_ptr (no host read before the launch): when W > CAP nothing is
    # written, and the caller, who reads the widths afterwards, launches again. The candidates
    # are walked BLOCK_W at a time, ranks carried across chunks. SPLIT: the kept blocks are also
    # split as ``_split_runs_kernel`` does (runs: the run map of the key blocks).
    WV = tl.load(width_ptr)
    WS = tl.load(width_ptr + 1)
    W = WV + WS + 1
    if W <= CAP:
        n = tl.program_id(1)
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        live = rows < nqb
        vh = tl.load(v_hi_ptr + n)
        at = n.to(tl.int64) * nqb + rows
        slo = tl.load(s_lo_ptr + at, mask=live, other=0)[:, None]
        shi = tl.load(s_hi_ptr + at, mask=live, other=-1)[:, None]
        qm = tl.load(qmax_ptr + at, mask=live, other=-1)[:, None]
        m = rows[:, None]
        row_k = n.to(tl.int64) * nkb
        out = at[:, None] * CAP
        count = tl.zeros([BLOCK_R], dtype=tl.int32)
        n_run = tl.zeros([BLOCK_R], dtype=tl.int32)
        for c0 in range(0, W, BLOCK_W):
            c = c0 + tl.arange(0, BLOCK_W)[None, :]
            is_v = c < WV
            is_s = (c >= WV) & (c < WV + WS)
            cand = tl.where(is_v, c, tl.where(is_s, slo + (c - WV), m))
            ok_d = ~((cand <= vh) | ((cand >= slo) & (cand <= shi)))
            ok = tl.where(is_v, c <= vh, tl.where(is_s, (cand <= shi) & (cand > vh), ok_d))
            ok = ok & (c < W) & live[:, None]
            cand = tl.minimum(cand, nkb - 1)
            km = tl.load(kmin_ptr + row_k + cand, mask=ok, other=0)
            ok = ok & (km <= qm)
            pos = count[:, None] + tl.cumsum(ok.to(tl.int32), 1) - 1
            tl.store(idx_ptr + out + pos, cand.to(tl.int32), mask=ok)
            if SPLIT:
                start = tl.load(runs_ptr + row_k + cand, mask=ok, other=-1)
                is_run = ok & (start >= 0)
                rest = ok & (start < 0)
                p_run = n_run[:, None] + tl.cumsum(is_run.to(tl.int32), 1) - 1
                p_rest = (count - n_run)[:, None] + tl.cumsum(rest.to(tl.int32), 1) - 1
                tl.store(starts_ptr + out + p_run, start, mask=is_run)
                tl.store(rest_ptr + out + p_rest, cand.to(tl.int32), mask=rest)
                n_run += tl.sum(is_run.to(tl.int32), 1)
            count += tl.sum(ok.to(tl.int32), 1)
        n_rest = count - n_run
        for c0 in range(0, W, BLOCK_W):  # zeros past each count
            c = c0 + tl.arange(0, BLOCK_W)[None, :]
            slot = (c < W) & live[:, None]
            tl.store(idx_ptr + out + c, tl.zeros_like(c), mask=slot & (c >= count[:, None]))
            if SPLIT:
                tl.store(starts_ptr + out + c, tl.zeros_like(c), mask=slot & (c >= n_run[:, None]))
                tl.store(rest_ptr + out + c, tl.zeros_like(c), mask=slot & (c >= n_rest[:, None]))
        tl.store(cnt_ptr + at, count, mask=live)
        if SPLIT:
            tl.store(run_cnt_ptr + at, n_run, mask=live)
            tl.store(rest_cnt_ptr + at, n_rest, mask=live)


def grid_lists_size(N: int, nqb: int, cap: int, split: bool = True) -> int:
    """int32 entries of :func:`launch_grid_lists`'s outputs (``split``: with ``runs``)."""
    return (3 if split else 1) * N * nqb * (cap + 1)


def launch_grid_lists(
    v_hi,
    s_lo,
    s_hi,
    kmin,
    qmax,
    widths: torch.Tensor,
    cap: int,
    nkb: int,
    runs=None,
    buf=None,
    *,
    block_w: int = DEFAULT_SETTINGS.lists_block_w,
):
    """``(idx [N, NQB, cap], cnt [N, NQB])`` int32 (see ``_grid_lists_kernel``); inputs int32
    or int64: ``v_hi [N]``, ``s_lo``/``s_hi``/``qmax [N, NQB]``, ``kmin [N, NKB]``, ``widths``
    int32 ``[2]`` on the device: ``wv >= max(v_hi) + 1`` and ``ws >= max(s_hi - s_lo + 1)``.
    The lists' entries past ``W = wv + ws + 1`` are unset (``[..., :W]`` is the list of
    ``W`` entries); when ``W > cap`` nothing is written (read ``widths`` to know). With ``runs``
    (the run map ``[N, NKB]``), also the run split of those lists
    (:func:`~sparse_kernels.permuted.split_run_blocks` with ``width = W``):
    ``(idx, cnt, (rest_idx, rest_cnt, run_starts, run_cnt))``. Every input contiguous (not
    checked: the planners pass the block index's views). ``buf``: int32 storage of
    :func:`grid_lists_size` entries for the outputs (else one allocation here). ``block_w``: the
    widest candidate chunk a program walks at a time (a power of two)."""
    N, nqb = s_lo.shape
    block_w = min(triton.next_power_of_2(max(cap, 1)), block_w)
    block_r = max(1, 4096 // block_w)
    split = runs is not None
    n_lists = 3 if split else 1
    if buf is None:  # one allocation for every output list and count
        buf = torch.empty(
            grid_lists_size(N, nqb, cap, split), dtype=torch.int32, device=s_lo.device
        )
    at = n_lists * N * nqb * cap
    lists = buf[:at].view(n_lists, N, nqb, cap).unbind()
    counts = buf[at:].view(n_lists, N, nqb).unbind()
    args = (lists[1], counts[1], lists[2], counts[2]) if split else (lists[0], counts[0]) * 2
    launch(
        _grid_lists_kernel, (triton.cdiv(nqb, block_r), N),
        (v_hi, s_lo, s_hi, kmin, qmax, widths, lists[0], counts[0], runs if split else counts[0],
         *args),
        (nqb, nkb, cap), BLOCK_R=block_r, BLOCK_W=block_w, SPLIT=split,
    )  # fmt: skip
    if not split:
        return lists[0], counts[0]
    return lists[0], counts[0], (lists[1], counts[1], lists[2], counts[2])
