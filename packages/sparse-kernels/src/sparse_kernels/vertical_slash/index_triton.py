"""The vertical-slash index's slash tiles as Triton kernels: which tiles the slashes cross, and
each query block's merged key-block ranges.

Tile ``(m, n)`` (query block ``m``, key block ``n``) is crossed by the diagonal of offset ``o``
iff ``o`` lies in ``[max(0, t - BN + 1), t + BM - 1]`` with ``t = m*BM - n*BN`` (the last query
block, which may be short, uses its last row ``S - 1`` for the upper end). With
``g = gcd(BM, BN)``, ``a = BM / g`` and ``p = BN / g``, ``t = tmin + g*u`` for the class
``u = m*a + (NKB - 1 - n)*p``, so one lookup per class covers every tile. Classes are split by
residue ``r = u mod p`` into ``p`` sequences; row ``m < NQB - 1`` reads sequence ``(m*a) mod p``
at ``k = (m*a) div p + (NKB - 1 - n)``, a window of ``NKB`` consecutive entries. The last row
gets a sequence of its own (index ``p``, ``k = NKB - 1 - n``). A row's ranges are the runs of
covered entries inside its window, so nothing here is ``NQB x NKB``:

1. ``_vertical_slash_cover_kernel``: every sequence entry, by a binary search of the head's
   sorted slashes.
2. ``_vertical_slash_runs_kernel``: one program per sequence numbers its runs (a running count of
   run starts) and records where each run starts and ends.
3. ``_vertical_slash_ranges_kernel``: one program per query block reads its window's runs: first
   the count, then (with the width read back) the ranges.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .._triton.config import on_interpreter
from .._triton.launch import launch

# Sequence entries per step of the cover and runs kernels, and ranges per step of the ranges
# kernel. Not tuned: the whole build is a few hundred microseconds at 128K. The interpreter's
# are small so that the CPU tests walk several steps.
SEQ_BLOCK, SEQ_BLOCK_INTERPRETER = 1024, 8
RANGE_BLOCK, RANGE_BLOCK_INTERPRETER = 128, 2


@triton.jit
def _position(k, s, T, nkb, P: tl.constexpr):
    """Where entry ``k`` of sequence ``s`` sits in a row of the cover table."""
    return tl.where(s == P, T + nkb - 1 - k, k * P + s)


@triton.jit
def _vertical_slash_cover_kernel(
    sl_ptr, cover_ptr, NS, n_iter, S, T, tmin, g, nqb, nkb,
    BM: tl.constexpr, BN: tl.constexpr, P: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    k = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    s = tl.program_id(1)
    n = tl.program_id(2).to(tl.int64)
    if s < P:
        u = k.to(tl.int64) * P + s
        t = tmin + g * u
        lo = tl.maximum(t - BN + 1, 0)
        hi = t + BM - 1
        length = (T - s + P - 1) // P
    else:
        c0 = (nkb - 1 - k.to(tl.int64)) * BN
        lo = tl.maximum((nqb - 1) * BM - c0 - BN + 1, 0)
        hi = S - 1 - c0
        length = nkb
    inside = k < length
    # lower bound of lo among the head's ascending slash offsets
    row = sl_ptr + n * NS
    left = tl.zeros([BLOCK], dtype=tl.int32)
    right = tl.full([BLOCK], 0, tl.int32) + NS
    for _ in range(n_iter):
        mid = left + (right - left) // 2
        val = tl.load(row + mid, mask=left < right, other=0)
        go = (left < right) & (val < lo)
        right = tl.where((left < right) & ~go, mid, right)
        left = tl.where(go, mid + 1, left)
    found = tl.load(row + left, mask=left < NS, other=0)
    cov = (left < NS) & (found <= hi)  # found >= lo >= 0, so hi < 0 fails here
    tl.store(cover_ptr + n * (T + nkb) + _position(k, s, T, nkb, P), cov.to(tl.int8), mask=inside)


@triton.jit
def _vertical_slash_runs_kernel(
    cover_ptr, runs_ptr, run_lo_ptr, run_hi_ptr, L, T, nkb, P: tl.constexpr, BLOCK: tl.constexpr
):
    n = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    length = tl.where(s == P, nkb, (T - s + P - 1) // P)
    row = cover_ptr + n * (T + nkb)
    base = (n * (P + 1) + s) * L
    offs = tl.arange(0, BLOCK)
    carry = tl.full([], 0, tl.int32)
    for k0 in range(0, length, BLOCK):
        k = k0 + offs
        cov = tl.load(row + _position(k, s, T, nkb, P), mask=k < length, other=0) != 0
        prev = tl.load(row + _position(k - 1, s, T, nkb, P), mask=(k >= 1) & (k <= length), other=0)
        nxt = tl.load(row + _position(k + 1, s, T, nkb, P), mask=k + 1 < length, other=0)
        first = cov & (prev == 0)
        last = cov & (nxt == 0)
        runs = carry + tl.cumsum(first.to(tl.int32), axis=0)
        tl.store(runs_ptr + base + k, runs, mask=k < length)
        # the run holding k started at or before k: it is run number runs - 1
        tl.store(run_lo_ptr + base + runs - 1, k, mask=first)
        tl.store(run_hi_ptr + base + runs - 1, k, mask=last)
        carry += tl.sum(first.to(tl.int32), axis=0)


@triton.jit
def _vertical_slash_ranges_kernel(
    runs_ptr, run_lo_ptr, run_hi_ptr, count_ptr, start_ptr, end_ptr,
    L, R, nqb, nkb, A: tl.constexpr, P: tl.constexpr, WRITE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    n = row // nqb
    m = row % nqb
    is_last = m == nqb - 1
    s = tl.where(is_last, P, (m * A) % P)
    lo = tl.where(is_last, 0, (m * A) // P)
    hi = lo + nkb - 1
    base = (n * (P + 1) + s) * L
    runs_hi = tl.load(runs_ptr + base + hi)
    # No run enters the window from below: the entry before it (key block NKB of row m) would
    # need a slash offset up to (m + 1)*BM - 1 - NKB*BN < 0. So the window holds the runs
    # numbered runs_before .. runs_hi - 1.
    runs_before = tl.load(runs_ptr + base + lo - 1, mask=lo > 0, other=0)
    count = runs_hi - runs_before
    if WRITE:
        # ranges ascend in key block n, so descend in k: range i is run runs_hi - 1 - i
        offs = tl.arange(0, BLOCK)
        for i0 in range(0, R, BLOCK):
            i = i0 + offs
            ok = i < count
            j = tl.maximum(runs_hi - 1 - i, 0)
            k_lo = tl.load(run_lo_ptr + base + j, mask=ok, other=0)
            # the last run may go on past the window (into key blocks n < 0)
            k_hi = tl.minimum(tl.load(run_hi_ptr + base + j, mask=ok, other=0), hi)
            start = tl.where(ok, nkb - 1 - (k_hi - lo), nkb)
            end = tl.where(ok, nkb - (k_lo - lo), nkb + 1)
            tl.store(start_ptr + row * R + i, start, mask=i < R)
            tl.store(end_ptr + row * R + i, end, mask=i < R)
    else:
        tl.store(count_ptr + row, count)


class SlashTiles:
    """The tiles that the slashes of ``N`` heads cross (one cover and one runs launch);
    :meth:`range_count` and :meth:`ranges` read them per query block.

    ``cover`` (int8 ``[N, T + NKB]``) is 1 where a slash crosses: class ``u < T`` (tile
    ``(m, n)`` of a row ``m < NQB - 1`` is class ``m*a + (NKB - 1 - n)*p``), then the last query
    block's key blocks ``n`` at ``T + n``."""

    def __init__(self, slash: torch.Tensor, seq_len: int, block_m: int, block_n: int) -> None:
        """``slash``: ``[N, NS]`` int32/int64, contiguous, each row strictly ascending in
        ``[0, seq_len)``."""
        N, NS = slash.shape
        S, BM, BN = seq_len, block_m, block_n
        self.seq_len, self.block_m, self.block_n = S, BM, BN
        self.N, self.nqb, self.nkb = N, -(-S // BM), -(-S // BN)
        g = math.gcd(BM, BN)
        self.a, self.p = BM // g, BN // g
        self.T = T = (self.nqb - 1) * self.a + (self.nkb - 1) * self.p + 1
        L = max(-(-T // self.p), self.nkb)  # the longest sequence
        dev = slash.device
        self.cover = torch.empty(N, T + self.nkb, dtype=torch.int8, device=dev)
        runs = (N, self.p + 1, L)
        self.runs = torch.empty(runs, dtype=torch.int32, device=dev)
        self.run_lo = torch.empty(runs, dtype=torch.int32, device=dev)
        self.run_hi = torch.empty(runs, dtype=torch.int32, device=dev)
        block = SEQ_BLOCK_INTERPRETER if on_interpreter() else SEQ_BLOCK
        # binary-search steps: enough to narrow NS + 1 candidate positions to one
        steps = max(NS, 1).bit_length()
        launch(
            _vertical_slash_cover_kernel, (triton.cdiv(L, block), self.p + 1, N),
            (slash, self.cover),
            (NS, steps, S, T, -(self.nkb - 1) * BN, g, self.nqb, self.nkb),
            BM=BM, BN=BN, P=self.p, BLOCK=block,
        )  # fmt: skip
        launch(
            _vertical_slash_runs_kernel, (N, self.p + 1),
            (self.cover, self.runs, self.run_lo, self.run_hi),
            (L, T, self.nkb), P=self.p, BLOCK=block,
        )  # fmt: skip

    def _launch_ranges(self, count, start, end, R: int, write: bool) -> None:
        launch(
            _vertical_slash_ranges_kernel, (self.N * self.nqb,),
            (self.runs, self.run_lo, self.run_hi, count, start, end),
            (self.runs.shape[-1], R, self.nqb, self.nkb),
            A=self.a, P=self.p, WRITE=write,
            BLOCK=RANGE_BLOCK_INTERPRETER if on_interpreter() else RANGE_BLOCK,
        )  # fmt: skip

    def range_count(self) -> torch.Tensor:
        """``[N, NQB]`` int32: the number of merged ranges of each query block."""
        count = torch.empty(self.N, self.nqb, dtype=torch.int32, device=self.cover.device)
        self._launch_ranges(count, count, count, 1, write=False)
        return count

    def ranges(self, R: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(start, end)``, each ``[N, NQB, R]`` int32: each query block's ranges ``[start,
        end)`` of key blocks, ascending; past the count, ``NKB`` and ``NKB + 1``."""
        start = torch.empty(self.N, self.nqb, R, dtype=torch.int32, device=self.cover.device)
        end = torch.empty_like(start)
        self._launch_ranges(start, start, end, R, write=True)
        return start, end
