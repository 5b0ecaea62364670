"""Algorithm 1 of MMInference on the fold pass's merged partials, one program per head.

``_fold_search_kernel`` folds the partials per residue (what ``fold_tail`` does in torch), then
scores every candidate stride (best class / mean class of the column and diagonal folds) and
keeps the smallest stride within ``rel_tol`` of the best, as ``search_folds_reference`` does.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .._triton.launch import launch
from .fold_launch import fold_partials


@triton.jit
def _fold_search_kernel(
    col_ptr,
    sl_ptr,
    scratch_ptr,
    strides_ptr,
    st_ptr,
    ph_ptr,
    sc_ptr,
    zero_ptr,
    n_zero,
    n_g,
    seg_w,
    n_mult,
    L,
    start_mod,
    P,
    n_strides,
    keep,
    BLOCK_P: tl.constexpr,
    BLOCK_LR: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # Program bh: (1) the folds of the merged partials (``fold_tail`` in torch): colf[c] sums
    # col over row groups and segment multiples at residue c; slf[c] sums row l's diagonal sums
    # at key residue (r_l - c) mod P (BLOCK_LR rows per gather). (2) Algorithm 1 on them
    # (``search_folds_reference``): per stride s, class c' sums the residues c' + m * s
    # ([BLOCK_M, BLOCK_C] tiles of (m, c')); the score is the larger best / mean ratio of the two
    # kinds of line, the phase the best column class; the answer is the smallest stride scoring
    # at least keep * best. Program 0 also zeroes n_zero int32 at zero_ptr (the next kernel's
    # atomic maxima), which saves a fill launch.
    bh = tl.program_id(0)
    c = tl.arange(0, BLOCK_P)
    okp = c < P
    if bh == 0:
        tl.store(zero_ptr + c, tl.zeros([BLOCK_P], dtype=tl.int32), mask=c < n_zero)
    colf = tl.zeros([BLOCK_P], dtype=tl.float32)
    base_c = col_ptr + bh.to(tl.int64) * n_g * seg_w
    for g in range(n_g):
        for m in range(n_mult):
            x = m * P + c
            colf += tl.load(base_c + g * seg_w + x, mask=okp & (x < seg_w), other=0.0)
    slf = tl.zeros([BLOCK_P], dtype=tl.float32)
    base_s = sl_ptr + bh.to(tl.int64) * L * seg_w
    for l0 in range(0, L, BLOCK_LR):
        ls = l0 + tl.arange(0, BLOCK_LR)[:, None]
        e = (start_mod + ls % P - c[None, :] + 2 * P) % P
        for m in range(n_mult):
            x = m * P + e
            ok = (ls < L) & okp[None, :] & (x < seg_w)
            slf += tl.sum(tl.load(base_s + ls * seg_w + x, mask=ok, other=0.0), 0)
    scr = scratch_ptr + bh.to(tl.int64) * 2 * BLOCK_P
    tl.store(scr + c, colf)
    tl.store(scr + BLOCK_P + c, slf)
    tl.debug_barrier()  # the class sums below read other threads' residues
    kk = tl.arange(0, BLOCK_K)
    scores = tl.full([BLOCK_K], float("-inf"), dtype=tl.float32)
    phases = tl.zeros([BLOCK_K], dtype=tl.int32)
    for i in range(n_strides):
        s = tl.load(strides_ptr + i)
        n_m = P // s
        best_c = float("-inf")
        best_s = float("-inf")
        arg_c = 0
        sum_c = 0.0
        sum_s = 0.0
        for c0 in range(0, s, BLOCK_C):
            cc = c0 + tl.arange(0, BLOCK_C)
            vc = tl.zeros([BLOCK_C], dtype=tl.float32)
            vs = tl.zeros([BLOCK_C], dtype=tl.float32)
            for m0 in range(0, n_m, BLOCK_M):
                ms = m0 + tl.arange(0, BLOCK_M)[:, None]
                x = ms * s + cc[None, :]
                mk = (ms < n_m) & (cc[None, :] < s)
                vc += tl.sum(tl.load(scr + x, mask=mk, other=0.0), 0)
                vs += tl.sum(tl.load(scr + BLOCK_P + x, mask=mk, other=0.0), 0)
            live = cc < s
            bc = tl.max(tl.where(live, vc, float("-inf")), 0)
            ac = tl.argmax(tl.where(live, vc, float("-inf")), 0) + c0
            arg_c = tl.where(bc > best_c, ac, arg_c)  # ties keep the first class
            best_c = tl.maximum(best_c, bc)
            best_s = tl.maximum(best_s, tl.max(tl.where(live, vs, float("-inf")), 0))
            sum_c += tl.sum(vc, 0)
            sum_s += tl.sum(vs, 0)
        r_c = best_c / tl.maximum(sum_c / s, 1e-30)
        r_s = best_s / tl.maximum(sum_s / s, 1e-30)
        scores = tl.where(kk == i, tl.maximum(r_c, r_s), scores)
        phases = tl.where(kk == i, arg_c, phases)
    best = tl.max(scores, 0)
    near = (scores >= best * keep) & (kk < n_strides)
    first = tl.min(tl.where(near, kk, BLOCK_K), 0)
    first = tl.where(first == BLOCK_K, 0, first)  # no score compares (NaN): the first stride
    tl.store(st_ptr + bh, tl.load(strides_ptr + first).to(tl.int64))
    tl.store(ph_ptr + bh, tl.sum(tl.where(kk == first, phases, 0), 0).to(tl.int64))
    tl.store(sc_ptr + bh, tl.sum(tl.where(kk == first, scores, 0.0), 0))


def line_fold_search_triton(
    q_rows: torch.Tensor,
    k: torch.Tensor,
    row_start: int,
    *,
    period: int,
    lo: int,
    hi: int,
    strides: torch.Tensor,
    rel_tol: float,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fold kernel, its merge and ``_fold_search_kernel``: ``(stride int64, phase int64,
    score float32)``, each ``[B, H]``. ``strides``: int32 ``[k]`` on the device, ascending, each
    dividing ``period`` (not checked here)."""
    B, H, L, _ = q_rows.shape
    col, sl, seg = fold_partials(q_rows, k, row_start, period=period, lo=lo, hi=hi, scale=scale)
    st, ph, score = search_partials(col, sl, seg, period, row_start, strides, rel_tol)
    return st.reshape(B, H), ph.reshape(B, H), score.reshape(B, H)


def search_partials(
    col: torch.Tensor,
    sl: torch.Tensor,
    seg: int,
    P: int,
    row_start: int,
    strides: torch.Tensor,
    rel_tol: float,
    zero: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_fold_search_kernel`` on merged partials (see :func:`~.fold_launch.fold_partials`): ``(stride,
    phase, score)``, each ``[B * H]``; the search of :func:`~.fold_launch.fold_tail`'s folds. ``zero``: an
    int32 tensor of at most ``next_power_of_2(P)`` entries the kernel sets to 0. ``out``:
    int64 ``[2, B * H]`` storage for the strides and phases (else one allocation here)."""
    BH, n_g, seg_w = col.shape
    L = sl.shape[1]
    dev = col.device
    block_p, meta = _search_setup(P, strides.shape[0])
    buf = torch.empty(BH * (2 * block_p + 1), dtype=torch.float32, device=dev)
    scratch, score = buf[: BH * 2 * block_p], buf[BH * 2 * block_p :]
    if out is None:
        out = torch.empty(2, BH, dtype=torch.int64, device=dev)
    elif out.dtype != torch.int64 or tuple(out.shape) != (2, BH):
        raise ValueError(f"out: expected int64 [2, {BH}], got {out.dtype} {list(out.shape)}")
    st, ph = out.unbind()
    n_zero = 0 if zero is None else zero.numel()
    if n_zero > block_p:
        raise ValueError(f"zero: expected at most {block_p} entries, got {n_zero}")
    launch(
        _fold_search_kernel, (BH,),
        (col, sl, scratch, strides, st, ph, score, score if zero is None else zero),
        (n_zero, n_g, seg_w, seg // P, L, row_start % P, P, strides.shape[0], _keep(rel_tol)),
        **meta,
    )  # fmt: skip
    return st, ph, score


@functools.lru_cache(maxsize=64)
def _search_setup(P: int, n_strides: int) -> tuple[int, dict]:
    """``(BLOCK_P, constexprs and launch options)`` of ``_fold_search_kernel``."""
    block_p = triton.next_power_of_2(P)
    return block_p, dict(
        BLOCK_P=block_p, BLOCK_LR=max(1, 4096 // block_p), BLOCK_M=32, BLOCK_C=64,
        BLOCK_K=triton.next_power_of_2(n_strides), num_warps=4 if block_p <= 1024 else 8,
    )  # fmt: skip


@functools.lru_cache(maxsize=16)
def _keep(rel_tol: float) -> float:
    """``1 - rel_tol`` rounded to float32, as torch computes ``best * (1.0 - rel_tol)``."""
    return float(torch.tensor(1.0 - rel_tol, dtype=torch.float32))
