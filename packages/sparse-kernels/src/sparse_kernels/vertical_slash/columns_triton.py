"""A vertical-slash index's leftover columns (Triton): per (batch, head, query block ``m``), the
verticals ``v <= last row of m`` whose tile ``(m, v // block_n)`` no slash covers, ascending.

Two launches of one kernel: a count pass writes ``column_count``, the caller reads the largest
count back to the host (with the ranges' width, one read), and a write pass puts each kept
vertical at its rank (a cumulative sum along the row) and pads the row. Nothing of size
``rows x NV`` is materialised: memory traffic is the verticals read per row plus the output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton.config import on_interpreter
from .._triton.launch import launch

# Query blocks per program (they share each step's verticals) and verticals per step. Not tuned:
# the write pass is bound by writing the padded [N, NQB, C] columns.
BLOCK_R = 4
BLOCK_V = 256


@triton.jit
def _vertical_slash_columns_kernel(
    v_ptr,
    cover_ptr,
    count_ptr,
    cols_ptr,
    NV,
    NQB,
    NKB,
    T,
    S,
    BM,
    BN,
    A,
    P,
    C,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    WRITE: tl.constexpr,
):
    # A program takes BLOCK_R query blocks of one (batch, head) row n: they share its verticals,
    # read BLOCK_V at a time.
    n = tl.program_id(1).to(tl.int64)
    m = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = m < NQB
    last_row = tl.where(row_ok, tl.minimum((m + 1) * BM, S) - 1, -1)
    # The cover table's row n (index_triton.SlashTiles): rows m < NQB - 1 read the slash
    # classes, tile (m, kb) is class m*A + (NKB-1-kb)*P; the last (possibly short) query block
    # reads its own entries after the T classes, one per key block.
    # A limit of -1 reads nothing (every vertical is >= 0).
    is_last = m == NQB - 1
    mid_lim = tl.where(is_last, -1, last_row)
    last_lim = tl.max(tl.where(is_last, last_row, -1), 0)
    top = tl.max(last_row, 0)
    cover_row = cover_ptr + n * (T + NKB)
    cls0 = m * A + (NKB - 1) * P
    row_off = (n * NQB + m) * C
    offs = tl.arange(0, BLOCK_V)
    total = tl.zeros([BLOCK_R], tl.int32)
    t0 = tl.full([], 0, tl.int64)
    go = t0 < NV
    while go:
        t = t0 + offs
        # Lanes past NV read S, which no row keeps (S > every last row).
        vv = tl.load(v_ptr + n * NV + t, mask=t < NV, other=S)
        kb = vv // BN
        live = vv[None, :] <= last_row[:, None]
        mid = tl.load(
            cover_row + cls0[:, None] - (kb * P)[None, :],
            mask=vv[None, :] <= mid_lim[:, None],
            other=0,
        )
        lst = tl.load(cover_row + T + kb, mask=vv <= last_lim, other=0)
        covered = tl.where(is_last[:, None], lst[None, :], mid)
        keep = live & (covered == 0)
        k32 = keep.to(tl.int32)
        if WRITE:
            rank = total[:, None] + tl.cumsum(k32, 1) - 1
            val = tl.broadcast_to(vv.to(tl.int32)[None, :], (BLOCK_R, BLOCK_V))
            tl.store(cols_ptr + row_off[:, None] + rank, val, mask=keep)
        total += tl.sum(k32, 1)
        t0 += BLOCK_V
        # Verticals ascend: once one passes the last row of this program's query blocks, no
        # later one is kept.
        go = (t0 < NV) & (tl.max(vv, 0) <= top)
    if WRITE:
        pad = tl.zeros([BLOCK_R, BLOCK_V], tl.int32) + S
        pad_ok = row_ok[:, None]
        for c0 in range(tl.min(tl.where(row_ok, total, C), 0), C, BLOCK_V):
            c = c0 + offs[None, :]
            mask = pad_ok & (c >= total[:, None]) & (c < C)
            tl.store(cols_ptr + row_off[:, None] + c, pad, mask=mask)
    else:
        tl.store(count_ptr + n * NQB + m, total, mask=row_ok)


def _launch(v: torch.Tensor, tiles, count: torch.Tensor, cols: torch.Tensor, write: bool) -> None:
    N, NV = v.shape
    # The interpreter's cost is per operation, so fewer, wider steps; a small BLOCK_V there
    # still walks several steps per row in the tests.
    block_v = 32 if on_interpreter() else BLOCK_V
    launch(
        _vertical_slash_columns_kernel, (triton.cdiv(tiles.nqb, BLOCK_R), N),
        (v, tiles.cover, count, cols),
        (NV, tiles.nqb, tiles.nkb, tiles.T, tiles.seq_len, tiles.block_m, tiles.block_n,
         tiles.a, tiles.p, cols.shape[-1]),
        BLOCK_R=BLOCK_R, BLOCK_V=block_v, WRITE=write, num_warps=4,
    )  # fmt: skip


def _launch_column_count(v: torch.Tensor, tiles) -> torch.Tensor:
    """``column_count [N, NQB]`` int32. ``v``: ``[N, NV]`` int32/int64 verticals, rows strictly
    ascending in ``[0, S)``, ``NV >= 1``, contiguous; ``tiles``: the heads'
    :class:`~.index_triton.SlashTiles`, on ``v``'s device."""
    count = torch.empty(v.shape[0], tiles.nqb, dtype=torch.int32, device=v.device)
    _launch(v, tiles, count, count, write=False)
    return count


def _launch_columns(v: torch.Tensor, tiles, width: int) -> torch.Tensor:
    """``columns [N, NQB, width]`` int32: each row's kept verticals (see
    :func:`_launch_column_count`, same inputs) ascending, then ``seq_len`` as padding.
    ``width`` must be at least every row's count."""
    cols = torch.empty(v.shape[0], tiles.nqb, width, dtype=torch.int32, device=v.device)
    _launch(v, tiles, cols, cols, write=True)
    return cols
