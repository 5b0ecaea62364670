"""The Grid permutation and its inverse in one Triton pass (no gather, no scatter).

Line ``c`` of a head with stride ``st`` and phase ``ph`` (``0 <= ph < st``) holds the tokens
``i = (ph + c) mod st + k*st``; with ``q, r = divmod(S, st)`` it starts at permuted position
``start(c) = c*q + #{c' < c : (ph + c') mod st < r}``, which is arithmetic. Each program writes,
for a block of ``i``: ``inverse[i] = start((i - ph) mod st) + i // st``, and ``perm[i]`` from the
line found by a binary search of ``start`` (``STEPS`` halvings of ``[0, st)``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 1024


@triton.jit
def _line_start(c, ph, st, q, r):
    """First permuted position of line ``c`` (``0 <= c <= st``; ``start(st) == S``)."""
    x = ph + c  # < 2 * st: the count of t in [0, x) with t mod st < r needs no division
    fx = tl.where(x < st, tl.minimum(x, r), r + tl.minimum(x - st, r))
    return c * q + fx - tl.minimum(ph, r)


@triton.jit
def _grid_permutation_fwd_kernel(
    st_ptr, ph_ptr, perm_ptr, inv_ptr, S, BLOCK: tl.constexpr, STEPS: tl.constexpr
):
    pid = tl.program_id(0)
    n = tl.program_id(1)
    st = tl.load(st_ptr + n)
    ph = tl.load(ph_ptr + n)
    q = S // st
    r = S - q * st
    i = pid * BLOCK + tl.arange(0, BLOCK)
    ok = i < S
    row = n.to(tl.int64) * S
    c = (i - ph + st) % st
    tl.store(inv_ptr + row + i, _line_start(c, ph, st, q, r) + i // st, mask=ok)
    lo = tl.zeros([BLOCK], dtype=tl.int32)
    hi = lo + st
    for _ in range(STEPS):  # invariant: start(lo) <= i < start(hi)
        mid = (lo + hi) // 2
        take = _line_start(mid, ph, st, q, r) <= i
        lo = tl.where(take, mid, lo)
        hi = tl.where(take, hi, mid)
    first = tl.where(ph + lo < st, ph + lo, ph + lo - st)
    tl.store(perm_ptr + row + i, first + st * (i - _line_start(lo, ph, st, q, r)), mask=ok)


def _launch_grid_permutation_fwd(
    S: int, stride: torch.Tensor, phase: torch.Tensor, max_stride: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(perm, inverse)`` int32 ``[H, S]``. ``stride``/``phase``: int ``[H]`` on one device,
    strides in ``1 .. max_stride`` (not checked here), phases any integer."""
    H = stride.shape[0]
    st = stride.to(torch.int32).contiguous()
    ph = torch.remainder(phase.to(torch.int64), stride.to(torch.int64)).to(torch.int32).contiguous()
    perm = torch.empty(H, S, dtype=torch.int32, device=stride.device)
    inv = torch.empty_like(perm)
    steps = max(1, int(max_stride).bit_length())
    _grid_permutation_fwd_kernel[(triton.cdiv(S, _BLOCK), H)](
        st, ph, perm, inv, S, BLOCK=_BLOCK, STEPS=steps
    )
    return perm, inv


@triton.jit
def _grid_lists_kernel(
    v_hi_ptr,
    s_lo_ptr,
    s_hi_ptr,
    kmin_ptr,
    qmax_ptr,
    idx_ptr,
    cnt_ptr,
    nqb,
    nkb,
    WV,
    WS,
    BLOCK_R: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    # Candidates of query block m, in order: key blocks 0 .. WV - 1 (vertical line 0, kept up to
    # v_hi), s_lo[m] .. s_lo[m] + WS - 1 (the block's own lines, kept up to s_hi[m] and above
    # v_hi), then m itself (kept unless already listed); each kept only if its smallest original
    # key is <= the query block's largest original row. Kept ones are written at their ranks.
    n = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    live = rows < nqb
    c = tl.arange(0, BLOCK_W)[None, :]
    vh = tl.load(v_hi_ptr + n)
    at = n.to(tl.int64) * nqb + rows
    slo = tl.load(s_lo_ptr + at, mask=live, other=0)[:, None]
    shi = tl.load(s_hi_ptr + at, mask=live, other=-1)[:, None]
    qm = tl.load(qmax_ptr + at, mask=live, other=-1)[:, None]
    m = rows[:, None]
    is_v = c < WV
    is_s = (c >= WV) & (c < WV + WS)
    cand = tl.where(is_v, c, tl.where(is_s, slo + (c - WV), m))
    ok_d = ~((cand <= vh) | ((cand >= slo) & (cand <= shi)))
    ok = tl.where(is_v, c <= vh, tl.where(is_s, (cand <= shi) & (cand > vh), ok_d))
    ok = ok & (c <= WV + WS) & live[:, None]
    cand = tl.minimum(cand, nkb - 1)
    km = tl.load(kmin_ptr + n.to(tl.int64) * nkb + cand, mask=ok, other=0)
    ok = ok & (km <= qm)
    keep = ok.to(tl.int32)
    pos = tl.cumsum(keep, 1) - 1
    W = WV + WS + 1
    tl.store(idx_ptr + at[:, None] * W + pos, cand.to(tl.int32), mask=ok)
    tl.store(cnt_ptr + at, tl.sum(keep, 1), mask=live)


# Widest candidate row the kernel takes in one tile; wider rows go through the torch path.
GRID_LISTS_MAX_WIDTH = 8192


def _launch_grid_lists(v_hi, s_lo, s_hi, kmin, qmax, wv: int, ws: int, nkb: int):
    """``(idx [N, NQB, wv + ws + 1], cnt [N, NQB])`` int32 (see ``_grid_lists_kernel``); inputs
    int64: ``v_hi [N]``, ``s_lo``/``s_hi``/``qmax [N, NQB]``, ``kmin [N, NKB]``."""
    N, nqb = s_lo.shape
    W = wv + ws + 1
    block_w = triton.next_power_of_2(W)
    block_r = max(1, 4096 // block_w)
    idx = torch.zeros(N, nqb, W, dtype=torch.int32, device=s_lo.device)
    cnt = torch.empty(N, nqb, dtype=torch.int32, device=s_lo.device)
    _grid_lists_kernel[(triton.cdiv(nqb, block_r), N)](
        v_hi.contiguous(), s_lo.contiguous(), s_hi.contiguous(), kmin.contiguous(),
        qmax.contiguous(), idx, cnt, nqb, nkb, wv, ws, BLOCK_R=block_r, BLOCK_W=block_w,
    )  # fmt: skip
    return idx, cnt


@triton.jit
def _split_runs_kernel(
    idx_ptr,
    cnt_ptr,
    runs_ptr,
    rest_ptr,
    rest_cnt_ptr,
    starts_ptr,
    run_cnt_ptr,
    n_rows,
    nqb,
    nkb,
    W,
    WIDTH,
    BLOCK_R: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    # Row r = (lead, query block): its listed key blocks whose run map entry (runs[lead, block])
    # is a start go to the run list as that start, the others stay; both keep list order.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    live = rows < n_rows
    c = tl.arange(0, BLOCK_W)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    cnt = tl.load(cnt_ptr + rows, mask=live, other=0)
    valid = (c < cnt[:, None]) & (c < W) & live[:, None]
    blk = tl.load(idx_ptr + r64 * W + c, mask=valid, other=0)
    lead = (rows // nqb).to(tl.int64)[:, None]
    start = tl.load(
        runs_ptr + lead * nkb + tl.minimum(tl.maximum(blk, 0), nkb - 1), mask=valid, other=-1
    )
    is_run = valid & (start >= 0)
    rest = valid & (start < 0)
    p_run = tl.cumsum(is_run.to(tl.int32), 1) - 1
    p_rest = tl.cumsum(rest.to(tl.int32), 1) - 1
    tl.store(starts_ptr + r64 * WIDTH + p_run, start, mask=is_run & (p_run < WIDTH))
    tl.store(rest_ptr + r64 * WIDTH + p_rest, blk, mask=rest & (p_rest < WIDTH))
    tl.store(run_cnt_ptr + rows, tl.sum(is_run.to(tl.int32), 1), mask=live)
    tl.store(rest_cnt_ptr + rows, tl.sum(rest.to(tl.int32), 1), mask=live)


# Widest list the split kernel takes in one tile; wider lists go through the torch path.
SPLIT_RUNS_MAX_WIDTH = 8192


def _launch_split_runs(idx, cnt, runs, width: int):
    """``split_run_blocks`` in one launch: ``idx [*lead, NQB, W]``, ``cnt [*lead, NQB]``,
    ``runs [*lead, NKB]`` (already broadcast to ``lead``), outputs ``width`` wide."""
    *lead, nqb, W = idx.shape
    nkb = runs.shape[-1]
    n_rows = cnt.numel()
    idx = idx.to(torch.int32).contiguous()
    cnt = cnt.to(torch.int32).contiguous()
    runs = runs.to(torch.int32).contiguous()
    dev = idx.device
    rest = torch.zeros(*lead, nqb, width, dtype=torch.int32, device=dev)
    starts = torch.zeros_like(rest)
    rest_cnt = torch.empty(*lead, nqb, dtype=torch.int32, device=dev)
    run_cnt = torch.empty_like(rest_cnt)
    block_w = triton.next_power_of_2(max(W, 1))
    block_r = max(1, 4096 // block_w)
    _split_runs_kernel[(triton.cdiv(n_rows, block_r),)](
        idx, cnt, runs, rest, rest_cnt, starts, run_cnt, n_rows, nqb, nkb, W, width,
        BLOCK_R=block_r, BLOCK_W=block_w,
    )  # fmt: skip
    return rest, rest_cnt, starts, run_cnt
