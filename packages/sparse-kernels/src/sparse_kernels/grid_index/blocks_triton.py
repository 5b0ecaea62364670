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

from .._triton.launch import launch

_BLOCK = 1024


@triton.jit
def _line_start(c, ph, st, q, r):
    """First permuted position of line ``c`` (``0 <= c <= st``; ``start(st) == S``)."""
    x = ph + c  # < 2 * st: the count of t in [0, x) with t mod st < r needs no division
    fx = tl.where(x < st, tl.minimum(x, r), r + tl.minimum(x - st, r))
    return c * q + fx - tl.minimum(ph, r)


@triton.jit
def _line_and_token(p, ph, st, q, r, STEPS: tl.constexpr):
    """``(line, original token)`` at permuted positions ``p`` (any shape, ``0 <= p < S``): the
    line by a binary search of ``start`` (``STEPS`` halvings of ``[0, st)``), the token by its
    rank in the line."""
    lo = tl.zeros(p.shape, dtype=tl.int32)
    hi = lo + st
    for _ in range(STEPS):  # invariant: start(lo) <= p < start(hi)
        mid = (lo + hi) // 2
        take = _line_start(mid, ph, st, q, r) <= p
        lo = tl.where(take, mid, lo)
        hi = tl.where(take, hi, mid)
    first = tl.where(ph + lo < st, ph + lo, ph + lo - st)
    return lo, first + st * (p - _line_start(lo, ph, st, q, r))


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
    _, val = _line_and_token(i, ph, st, q, r, STEPS)
    tl.store(perm_ptr + row + i, val, mask=ok)


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
def _grid_blocks_kernel(
    st_ptr,
    ph_ptr,
    vline_ptr,
    slash_ptr,
    perm_ptr,
    blocks_ptr,
    v_hi_ptr,
    width_ptr,
    S,
    plane,
    nb,
    blk,
    BM: tl.constexpr,
    BLOCK_B: tl.constexpr,
    STEPS: tl.constexpr,
    TWO_LINES: tl.constexpr,
):
    # TWO_LINES: every line is at least blk long (S // stride >= blk), so a block touches at
    # most two: one binary search per block (its first position) instead of one per position.
    # Program (run of BM blocks of blk permuted positions, head n): the permutation of those
    # positions (as in ``_grid_permutation_fwd_kernel``) and, per block, what the Grid block
    # lists need: the smallest and largest original index, the first block of the first line it
    # touches and the last block of the last (its slash candidates), and its run start (the
    # first original index when the block lies on one line, else -1). The widest slash range
    # and vertical-line range go to width_ptr by atomic max.
    pid = tl.program_id(0)
    n = tl.program_id(1)
    st = tl.load(st_ptr + n).to(tl.int32)
    ph = tl.load(ph_ptr + n).to(tl.int32)
    ph = ((ph % st) + st) % st
    q = S // st
    r = S - q * st
    m = pid * BM + tl.arange(0, BM)
    u = tl.arange(0, BLOCK_B)
    p = m[:, None] * blk + u[None, :]
    ok = (u[None, :] < blk) & (p < S)
    if TWO_LINES:
        lo0, _ = _line_and_token(m * blk, ph, st, q, r, STEPS)  # m * blk < S or masked below
        lo = lo0[:, None] + (p >= _line_start(lo0 + 1, ph, st, q, r)[:, None]).to(tl.int32)
        first = tl.where(ph + lo < st, ph + lo, ph + lo - st)
        val = first + st * (p - _line_start(lo, ph, st, q, r))
    else:
        lo, val = _line_and_token(p, ph, st, q, r, STEPS)
    row = n.to(tl.int64) * S
    tl.store(perm_ptr + row + p, val, mask=ok)
    big = 2147483647
    kmin = tl.min(tl.where(ok, val, big), 1)
    qmax = tl.max(tl.where(ok, val, -1), 1)
    c_lo = tl.min(tl.where(ok, lo, big), 1)
    c_hi = tl.max(tl.where(ok, lo, -1), 1)
    s_lo = _line_start(c_lo, ph, st, q, r) // blk
    use_slash = tl.load(slash_ptr + n) != 0
    s_hi = tl.where(use_slash, (_line_start(c_hi + 1, ph, st, q, r) - 1) // blk, s_lo - 1)
    runs = tl.where(c_lo == c_hi, kmin, -1)  # a line ascends: its first entry is its smallest
    mok = m < nb
    out = blocks_ptr + n.to(tl.int64) * nb + m
    tl.store(out, kmin, mask=mok)
    tl.store(out + plane, qmax, mask=mok)
    tl.store(out + 2 * plane, s_lo, mask=mok)
    tl.store(out + 3 * plane, s_hi, mask=mok)
    tl.store(out + 4 * plane, runs, mask=mok)
    tl.atomic_max(width_ptr + 1, tl.max(tl.where(mok, s_hi - s_lo + 1, 0), 0))
    if pid == 0:
        v_hi = tl.where(tl.load(vline_ptr + n) != 0, (_line_start(1, ph, st, q, r) - 1) // blk, -1)
        tl.store(v_hi_ptr + n, v_hi)
        tl.atomic_max(width_ptr, v_hi + 1)


def grid_blocks_size(N: int, S: int, block: int) -> int:
    """int32 entries of :func:`grid_blocks_buffer`."""
    return N * S + 5 * N * triton.cdiv(S, block) + N + 2


def grid_blocks_buffer(N: int, S: int, block: int, device) -> torch.Tensor:
    """Uninitialised int32 storage for :func:`grid_blocks_triton`'s outputs; its last two
    entries (the widths) must be zeroed before the launch."""
    return torch.empty(grid_blocks_size(N, S, block), dtype=torch.int32, device=device)


def grid_blocks_triton(
    S: int,
    stride: torch.Tensor,
    phase: torch.Tensor,
    use_vline: torch.Tensor,
    use_slash: torch.Tensor,
    block: int,
    max_stride: int,
    *,
    buf: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Grid permutation and the per-block index of its block lists in one launch.

    ``stride``/``phase``: int ``[N]`` (strides in ``1 .. max_stride``, not checked here);
    ``use_vline``/``use_slash``: int or bool ``[N]``. Returns ``(perm int32 [N, S],
    blocks int32 [5, N, NB], v_hi int32 [N], widths int32 [2])``: ``blocks`` holds per block of
    ``block`` permuted positions its smallest original index, its largest, the first and last
    key block of its slash candidates (the lines it touches; last = first - 1 without slash
    lines) and its run start (-1: not one line); ``v_hi`` the last key block of vertical
    line 0 (-1 without vertical lines); ``widths`` the widest vertical range (``max(v_hi) + 1``)
    and slash range (at least 0). ``buf``: a :func:`grid_blocks_buffer` whose widths a kernel
    earlier on the stream zeroed (else one is made and zeroed here)."""
    N = stride.shape[0]
    nb = triton.cdiv(S, block)
    if buf is None:
        buf = grid_blocks_buffer(N, S, block, stride.device)
        buf[-2:].zero_()
    o = buf.storage_offset()  # (buf may be a slice of a larger allocation)
    at = o + N * S + 5 * N * nb
    perm = buf.as_strided((N, S), (S, 1), o)
    blocks = buf.as_strided((5, N, nb), (N * nb, nb, 1), o + N * S)
    v_hi = buf.as_strided((N,), (1,), at)
    widths = buf.as_strided((2,), (1,), at + N)
    block_b = triton.next_power_of_2(block)
    bm = max(1, 2048 // block_b)
    steps = max(1, int(max_stride).bit_length())
    launch(
        _grid_blocks_kernel, (triton.cdiv(nb, bm), N),
        (stride, phase, use_vline, use_slash, perm, blocks, v_hi, widths), (S, N * nb, nb, block),
        BM=bm, BLOCK_B=block_b, STEPS=steps, TWO_LINES=S // max_stride >= block,
    )  # fmt: skip
    return perm, blocks, v_hi, widths
