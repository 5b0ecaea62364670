"""The launcher of the fold pass (:mod:`.fold_triton`): per-shape launch settings, one
workspace allocation, the fold launch and its merge; and the torch fold of the merged partials
(what :func:`~sparse_kernels.estimate.line_folds` returns)."""

from __future__ import annotations

import functools
import itertools
from typing import NamedTuple

import torch
import triton

from .._triton.config import FP32_CONFIG, LOG2E, block_d, on_interpreter
from .._triton.launch import launch
from .fold_triton import _line_folds_fwd_kernel, _line_folds_kernel, _line_folds_merge_kernel
from .settings import DEFAULT_SETTINGS, GridIndexSettings

# Widest key tile of the fold kernel (fp16/bf16, at most 64 rows).
FOLD_BLOCK_N = 128


def fold_plan(
    period: int, n_keys: int, heads: int, block_n: int, programs: int, short: int
) -> tuple[int, int, int, int, int]:
    """``(seg, n_sub, n_seg, seg_per_chunk, n_chunks)`` of a launch (see the kernel;
    ``programs``, ``short``: :class:`GridIndexSettings` ``fold_programs``, ``fold_short_keys``)."""
    seg = period if period >= block_n else period * (block_n // period)
    n_seg = triton.cdiv(n_keys, seg)
    # Sub-tiles past the last key hold nothing: a period longer than the keys costs no more
    # programs or scratch than the keys themselves.
    n_sub = triton.cdiv(min(seg, n_keys), block_n)
    per, n_chunks = _chunks(n_seg, n_sub * heads, n_keys, programs, short)
    return seg, n_sub, n_seg, per, n_chunks


def _chunks(n_seg: int, lanes: int, n_keys: int, programs: int, short: int) -> tuple[int, int]:
    """``(segments per chunk, chunks)``: ``n_seg`` segments for each of ``lanes`` (sub-tile,
    head) pairs cut so that the launch has about ``programs`` programs (at most 256 up to
    ``short`` keys)."""
    programs = programs if n_keys > short else min(programs, 256)
    per = max(1, triton.cdiv(n_seg * lanes, programs))
    return per, triton.cdiv(n_seg, per)


def interior_segments(
    seg: int, n_sub: int, block_n: int, L: int, block_l: int, row_start: int, lo: int, hi: int
) -> tuple[int, int]:
    """``(g_a, g_b)``: the segments ``[g_a, g_b)`` whose every tile passes the fold kernel's
    ``inside`` test for every row and sub-tile (keys in ``[lo, hi)``, at least ``lo`` before
    the first row, after every row's ``r - hi``; full sub-tiles and rows), or ``(0, 0)``."""
    if n_sub * block_n != seg or block_l != L:
        return 0, 0
    last_row = row_start + L - 1
    g_a = max(triton.cdiv(lo, seg), triton.cdiv(max(0, last_row - hi + 1), seg))
    g_b = min(hi // seg, max(0, row_start - lo + 1) // seg)
    return (g_a, g_b) if g_b > g_a else (0, 0)


def line_folds_triton(
    q_rows: torch.Tensor,
    k: torch.Tensor,
    row_start: int,
    *,
    period: int,
    lo: int,
    hi: int,
    scale: float,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    settings: GridIndexSettings = DEFAULT_SETTINGS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass over the keys, the partials merged by ``_line_folds_merge_kernel``, then the
    residue fold and the slash gather in torch (``block_n``, ``num_warps``, ``num_stages``: the
    kernel's tile and launch settings, for tests and tuning; by default 128-wide tiles and 4
    warps, and for more than 64 rows 64-wide tiles and 8 warps, which keeps the two
    ``[rows, block_n]`` float32 accumulators in registers; ``settings``: how the pass is cut
    into programs)."""
    B, H, L, _ = q_rows.shape
    col, sl, seg = fold_partials(
        q_rows, k, row_start, period=period, lo=lo, hi=hi, scale=scale, block_n=block_n,
        num_warps=num_warps, num_stages=num_stages, settings=settings,
    )  # fmt: skip
    col, sl = fold_tail(col, sl, seg, period, row_start)
    return col.reshape(B, H, period), sl.reshape(B, H, period)


def fold_tail(
    col: torch.Tensor, sl: torch.Tensor, seg: int, P: int, row_start: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The merged partials of :func:`fold_partials` as folds ``[B * H, P]`` (torch): ``col``
    summed over row groups and segment multiples, ``sl`` per row by offset class."""
    BH, L, seg_w = sl.shape
    col = col.sum(1)
    if seg_w < seg:  # sub-tiles past the last key: zero sums
        col = torch.nn.functional.pad(col, (0, seg - seg_w))
        sl = torch.nn.functional.pad(sl, (0, seg - seg_w))
    if col.shape[-1] != P:
        col = col[:, :seg].reshape(BH, seg // P, P).sum(1)
        sl = sl[..., :seg].reshape(BH, L, seg // P, P).sum(2)  # [BH, L, P], by key residue
    # Row l's key residue e is offset residue (r_l - e) mod P: gather each row by offset class.
    sl = sl.gather(2, _slash_residues(row_start % P, L, P, sl.device).expand(BH, L, P)).sum(1)
    return col, sl


def fold_partials(
    q_rows: torch.Tensor,
    k: torch.Tensor,
    row_start: int,
    *,
    period: int,
    lo: int,
    hi: int,
    scale: float,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    qk_offsets: torch.Tensor | None = None,
    settings: GridIndexSettings = DEFAULT_SETTINGS,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The fold kernel and its merge: ``(col [B * H, row groups, seg_w], sl [B * H, L, seg_w],
    seg)``, float32. ``col`` summed over its row groups and ``sl`` over its rows (after each
    row's offset-class gather) are the folds of a segment of ``seg`` positions (a multiple of
    the period); positions ``seg_w ..`` of the segment hold nothing.

    ``qk_offsets``: int64 ``[2]`` on the device; the fold kernel then reads the rows and keys at
    those element offsets from ``q_rows`` and ``k`` (tensors of their shape, strides and dtype
    there; multiples of 16 bytes), so that a CUDA graph of these launches serves other inputs
    (:class:`~sparse_kernels.grid_index.OffsetGraph` writes them before each replay). ``q_rows`` and ``k`` must
    then have unit last strides (no copy is made)."""
    B, H, L, D = q_rows.shape
    H_KV, S = k.shape[1], k.shape[2]
    if qk_offsets is not None:
        if q_rows.stride(-1) != 1 or k.stride(-1) != 1:
            raise ValueError(
                f"qk_offsets: expected q_rows and k with unit last strides, got strides "
                f"{q_rows.stride()} and {k.stride()}"
            )
        if qk_offsets.dtype != torch.int64 or tuple(qk_offsets.shape) != (2,):
            raise ValueError(
                f"qk_offsets: expected int64 [2], got {qk_offsets.dtype} {list(qk_offsets.shape)}"
            )
    q_rows = q_rows if q_rows.stride(-1) == 1 else q_rows.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    f = fold_setup(
        B, H, H_KV, L, D, S, row_start, period, lo, hi, q_rows.dtype == torch.float32, block_n,
        num_warps, num_stages, on_interpreter(), settings.fold_interior, settings.fold_programs,
        settings.fold_short_keys, settings.fold_heads,
    )  # fmt: skip
    # One allocation for the partials and the merged sums (each allocation costs host time).
    ws = torch.empty(f.total, dtype=torch.float32, device=q_rows.device)
    o = f.offsets  # of m, lsum, acol, asl, m_i, l_i, a_i, col, sl in ws
    strides = (q_rows.stride(0), q_rows.stride(1), q_rows.stride(2))
    strides += (k.stride(0), k.stride(1), k.stride(2))
    sc = scale * LOG2E
    moved = qk_offsets is not None
    ptrs = (q_rows, k, ws, qk_offsets if moved else ws)
    align = dict(QK_OFF=moved, QK_ALIGN=16 // q_rows.element_size() if moved else 1)
    if f.edges:
        launch(
            _line_folds_kernel, f.grid_i, ptrs, (*o[:7], *strides, *f.args_i, sc, f.n_int_progs),
            **f.meta_i, **align,
        )  # fmt: skip
    else:
        launch(
            _line_folds_fwd_kernel, f.grid, ptrs, (*o[:4], *strides, *f.args, sc), **f.meta,
            **align,
        )  # fmt: skip
    launch(
        _line_folds_merge_kernel, f.grid_m, (ws,), (*o, *f.args_m), **f.meta_m,
    )  # fmt: skip
    BH, n_g, seg_w = B * H, f.n_g, f.seg_w
    col = ws.as_strided((BH, n_g, seg_w), (n_g * seg_w, seg_w, 1), o[7])
    sl = ws.as_strided((BH, L, seg_w), (L * seg_w, seg_w, 1), o[8])
    return col, sl, f.seg


class FoldSetup(NamedTuple):
    """What :func:`fold_partials` launches with, per shape (:func:`fold_setup`)."""

    total: int
    offsets: tuple[int, ...]
    edges: bool
    grid_i: tuple[int, int]
    args_i: tuple[int, ...]
    meta_i: dict
    n_int_progs: int
    grid: tuple[int, int]
    args: tuple[int, ...]
    meta: dict
    grid_m: tuple[int, int, int]
    args_m: tuple[int, ...]
    meta_m: dict
    n_g: int
    seg_w: int
    seg: int


@functools.lru_cache(maxsize=64)
def fold_setup(
    B, H, H_KV, L, D, S, row_start, period, lo, hi, fp32, block_n, num_warps, num_stages,
    interp, interior, programs, short, heads,
) -> FoldSetup:  # fmt: skip
    """The launch settings of :func:`fold_partials` per shape; ``interior``, ``programs``,
    ``short`` and ``heads`` are the ``fold_*`` fields of :class:`GridIndexSettings`."""
    BLOCK_L = max(16, triton.next_power_of_2(L))
    n_keys = min(S, row_start + L)
    is_short = n_keys <= short
    block_n_given, warps_given = block_n, num_warps
    if block_n is None:
        # fp32 goes through exact (FMA-emulated) dots: a narrow tile, as in the other kernels.
        block_n = FP32_CONFIG["BLOCK_N"] if fp32 else FOLD_BLOCK_N
        if BLOCK_L > 64:
            block_n = min(block_n, 64)
    G = H // H_KV
    # Query heads of a KV group per interior program (they share each key tile): by default two
    # up to ``short`` keys (then 64-wide tiles and 8 warps), else one. On H100s at the
    # Qwen2.5-VL-7B shape two
    # heads with 3 stages were the fastest fold pass at 128K; at 512K and 1M one head with
    # 128-wide tiles was the fastest on one machine and 64-wide tiles on another, so the
    # earlier 128 is kept; 4 and 8 heads were slower: the pass is bound by its dots and
    # exponentials more than by reading the keys.
    hp = heads if heads else (min(2, G) if is_short and not fp32 else 1)
    rows = hp * BLOCK_L
    if block_n_given is None and rows > 64:
        block_n = min(block_n, 64 if rows <= 256 else 32)
    if num_warps is None:
        num_warps = 8 if BLOCK_L > 64 else 4
    warps_i = num_warps if warps_given is not None else (8 if rows > 64 else 4)
    BH = B * H
    seg, n_sub, n_seg, per, n_chunks = fold_plan(period, n_keys, BH, block_n, programs, short)
    g_a, g_b = (
        interior_segments(seg, n_sub, block_n, L, BLOCK_L, row_start, lo, hi)
        if interior
        else (0, 0)
    )
    edges = g_b > g_a
    n_slots = triton.cdiv(G, hp)
    lanes_i = n_sub * B * H_KV * n_slots
    per_i, n_int = _chunks(g_b - g_a, lanes_i, n_keys, programs, short) if edges else (1, 0)
    if edges:  # the general kernel walks the segments outside [g_a, g_b): two runs
        per, n_chunks = 1, 2
    n_part, n_ipart = n_sub * n_chunks, n_sub * n_int
    seg_w = n_sub * block_n
    block_r = min(16, BLOCK_L)
    n_g = BLOCK_L // block_r
    tile = BLOCK_L * block_n
    sizes = (BH * n_part * BLOCK_L,) * 2 + (BH * n_part * tile,) * 2
    sizes += (BH * n_ipart * BLOCK_L,) * 2 + (BH * n_ipart * tile,)
    sizes += (BH * n_g * seg_w, BH * L * seg_w)
    if num_stages is None:
        num_stages = 1 if interp else (3 if is_short else 2)
    meta = dict(
        D=D, BLOCK_D=block_d(D), BLOCK_L=BLOCK_L, BLOCK_N=block_n, IEEE=fp32,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return FoldSetup(
        total=sum(sizes), offsets=tuple(itertools.accumulate(sizes[:-1], initial=0)), edges=edges,
        grid_i=(n_int * n_sub * n_slots + n_chunks * n_sub * G, B * H_KV),
        args_i=(H, G, n_slots, L, S, row_start, seg, n_sub, n_seg, per_i, n_int, lo, hi, g_a, g_b),
        n_int_progs=n_int * n_sub * n_slots,
        meta_i={**meta, "HP": hp, "num_warps": warps_i},
        grid=(n_chunks * n_sub * G, B * H_KV),
        args=(H, G, L, S, row_start, seg, n_sub, n_seg, per, n_chunks, lo, hi, g_a, g_b),
        meta=meta, grid_m=(BH, n_sub, n_g), args_m=(L, n_sub, n_chunks, n_int, seg_w),
        meta_m=dict(BLOCK_L=BLOCK_L, BLOCK_R=block_r, BLOCK_N=block_n, num_warps=4),
        n_g=n_g, seg_w=seg_w, seg=seg,
    )  # fmt: skip


@functools.lru_cache(maxsize=32)
def _slash_residues(start: int, L: int, P: int, device: torch.device) -> torch.Tensor:
    """int64 ``[L, P]``: the key residue that offset residue ``c`` is in row ``l`` whose position
    is ``start + l`` modulo ``P``: ``(start + l - c) mod P``."""
    r = torch.arange(start, start + L)
    return ((r[:, None] - torch.arange(P)[None, :]) % P).to(device)
