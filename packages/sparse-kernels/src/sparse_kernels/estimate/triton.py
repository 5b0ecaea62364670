"""Line scores of the last query rows in two Triton passes, without the ``[L, S]`` score matrix.

Pass 1 (``_lse_kernel``): one program per (key chunk, head) streams its keys once and writes the
partial row max / row sum (base 2) of the ``L`` query rows; torch merges the chunks into the
log-sum-exp of each row.

Pass 2 (``_lines_kernel``): one program per (run of ``OB_PER`` blocks of ``BO`` diagonal offsets,
head). Offsets ``o0 .. o0 + BO`` of rows ``r_0 .. r_0 + L - 1`` (``BO = BLOCK_L``) touch two
consecutive key blocks; walking the offsets upwards (the keys downwards), the program computes the
probabilities of each key block once, writes its column sums (vertical sums) and gathers it
once along the key axis: one triangle of the gathered tile sums to the key block's share of the
current offset block, the other to its share of the next (slash sums). Every key and every offset
is written by exactly one program.

Line folds (``_line_folds_fwd_kernel``, one pass): the same sums restricted to a window of
positions and summed per residue modulo a period, which is all a Grid head's stride search reads.
Each program keeps an online softmax per row and two ``[BLOCK_L, BLOCK_N]`` accumulators whose
columns are fixed residues; ``_line_folds_merge_kernel`` combines the programs' partials with
the rows' log-sum-exp, and torch folds the rows' slash sums by offset class.
"""

from __future__ import annotations

import functools
import itertools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .._triton.config import FP32_CONFIG, LOG2E, block_d, on_interpreter
from .._triton.launch import launch
from ..tuning import KernelSpec, LaunchConfig, choose_config

# Line folds (one pass). Keys are cut into segments of ``seg`` positions (a multiple of the period),
# each segment into sub-tiles of BLOCK_N; a program owns one sub-tile position t of a run of
# segments, so every key it reads has residue (t * BLOCK_N + n) mod period, whatever the
# segment: the per-row sums fold into one [BLOCK_L, BLOCK_N] accumulator without a gather.
_FOLD_BLOCK_N = 128
# Programs per launch the key range is split into (the partial accumulators they write are
# BLOCK_L x BLOCK_N floats each, two per program, so this also bounds that scratch memory).
# Up to _FOLD_SHORT_KEYS keys, a quarter as many: fewer partials for the merge to read; on an
# H100 at 128K keys with two heads per program 256 programs were the fastest of 256-2048
# (grid_and_boundaries.md section 11); at 512K, 1024 were faster than 512 (1.107 against
# 1.141 ms).
_FOLD_PROGRAMS = 1024
_FOLD_SHORT_KEYS = 262144
# Segments whose tiles are all inside the window go to ``_fold_interior_body`` (one
# accumulator); False: every segment through the general body (tests and timings compare).
_FOLD_INTERIOR = True
# Query heads of one KV group per interior program (0: the default of ``_fold_setup``).
_FOLD_HEADS = 0


# Launch configs of pass 2 (``_lines_kernel``, offset blocks per program OB_PER): looked up per
# GPU, shape and length in the tuned tables (sparse_kernels.tuning), per row block (the table
# variant "rows<BLOCK_L>"); a tuning run times these candidates.
SPEC = KernelSpec(
    name="line_scores",
    candidates=(
        LaunchConfig.of(OB_PER=4, num_warps=4, num_stages=1),
        LaunchConfig.of(OB_PER=16, num_warps=4, num_stages=1),
        LaunchConfig.of(OB_PER=16, num_warps=4, num_stages=3),
        LaunchConfig.of(OB_PER=16, num_warps=8, num_stages=3),
        LaunchConfig.of(OB_PER=64, num_warps=4, num_stages=3),
        LaunchConfig.of(OB_PER=16, num_warps=2, num_stages=3),
        LaunchConfig.of(OB_PER=64, num_warps=2, num_stages=3),
    ),
    interpreter=LaunchConfig.of(OB_PER=2),
    # fp32 (exact dots, slow to compile): the shortest run of offset blocks.
    fp32=LaunchConfig.of(OB_PER=4, num_warps=4, num_stages=1),
)


@triton.jit
def _group_major(H, GROUP):
    """``(position, b, h, b * H + h)`` of this program. Axis 0 is (position, head of the KV
    group) with the group's heads fastest, axis 1 is (batch row, KV head): the ``GROUP`` query
    heads that read the same keys run next to each other and share them through L2 (with the
    heads on an axis of their own, each query head re-read its keys from memory)."""
    return _group_major_at(tl.program_id(0), tl.program_id(1), H, GROUP)


@triton.jit
def _group_major_at(pid, bkv, H, GROUP):
    """:func:`_group_major` of program ``(pid, bkv)``."""
    H_KV = H // GROUP
    b = bkv // H_KV
    h = (bkv % H_KV) * GROUP + pid % GROUP
    return pid // GROUP, b, h, b * H + h


@triton.jit
def _rows_and_keys(
    q_ptr,
    k_ptr,
    b,
    h,
    GROUP,
    L,
    stride_q_b,
    stride_q_h,
    stride_q_s,
    stride_k_b,
    stride_k_h,
    offs_l,
    offs_d,
    D: tl.constexpr,
):
    """The ``[BLOCK_L, BLOCK_D]`` query rows of head ``h`` and the base pointer of its KV head
    (64-bit offsets: a 1M-token layer's head offsets pass 2**31 elements)."""
    q = tl.load(
        q_ptr
        + b.to(tl.int64) * stride_q_b
        + h.to(tl.int64) * stride_q_h
        + offs_l[:, None] * stride_q_s
        + offs_d[None, :],
        mask=(offs_l[:, None] < L) & (offs_d[None, :] < D),
        other=0.0,
    )
    kb = k_ptr + b.to(tl.int64) * stride_k_b + (h // GROUP).to(tl.int64) * stride_k_h
    return q, kb


@triton.jit
def _key_scores(q, kb, j, ok_j, offs_d, stride_k_s, qk_scale, D: tl.constexpr, IEEE: tl.constexpr):
    """Scaled scores (base 2) ``[BLOCK_L, BLOCK_N]`` of the rows against keys ``j`` (the keys
    where ``ok_j`` is false are loaded as zeros)."""
    kt = tl.load(
        kb + j[None, :].to(tl.int64) * stride_k_s + offs_d[:, None],
        mask=ok_j[None, :] & (offs_d[:, None] < D),
        other=0.0,
    )
    if IEEE:
        return tl.dot(q, kt, input_precision="ieee") * qk_scale
    return tl.dot(q, kt) * qk_scale


@triton.jit
def _lse_kernel(
    q_ptr,
    k_ptr,
    m_ptr,
    l_ptr,
    stride_q_b,
    stride_q_h,
    stride_q_s,
    stride_k_b,
    stride_k_h,
    stride_k_s,
    H,
    GROUP,
    L,
    S,
    row_start,
    chunk,
    n_chunks,
    qk_scale,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
):
    c, b, h, bh = _group_major(H, GROUP)
    offs_l = tl.arange(0, BLOCK_L)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    q, kb = _rows_and_keys(
        q_ptr, k_ptr, b, h, GROUP, L, stride_q_b, stride_q_h, stride_q_s, stride_k_b, stride_k_h,
        offs_l, offs_d, D,
    )  # fmt: skip
    r = row_start + offs_l
    m_i = tl.full([BLOCK_L], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_L], dtype=tl.float32)
    lo = c * chunk
    hi = tl.minimum(lo + chunk, tl.minimum(S, row_start + L))
    for j0 in range(lo, hi, BLOCK_N):
        j = j0 + offs_n
        # A tile inside the chunk whose keys all precede the first row needs no causal mask.
        inside = (j0 + BLOCK_N <= hi) & (j0 + BLOCK_N - 1 <= row_start)
        kt = tl.load(
            kb + j[None, :].to(tl.int64) * stride_k_s + offs_d[:, None],
            mask=(j[None, :] < hi) & (offs_d[:, None] < D),
            other=0.0,
        )
        if IEEE:
            s = tl.dot(q, kt, input_precision="ieee")
        else:
            s = tl.dot(q, kt)
        s = s * qk_scale
        if not inside:
            s = tl.where((j[None, :] <= r[:, None]) & (j[None, :] < hi), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.exp2(m_i - m_safe) + tl.sum(tl.exp2(s - m_safe[:, None]), 1)
        m_i = m_new
    out = bh * n_chunks * BLOCK_L + c * BLOCK_L + offs_l
    tl.store(m_ptr + out, m_i)
    tl.store(l_ptr + out, l_i)


@triton.jit
def _lse_merge_kernel(
    m_ptr, l_ptr, lse_ptr, n_chunks, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr
):
    """One program per (batch row, head): the partial maxima and sums of pass 1's key chunks
    merged into each row's log-sum-exp (base 2). A row with no key at all (every partial max
    -inf) gets -inf."""
    bh = tl.program_id(0)
    offs_c = tl.arange(0, BLOCK_C)
    offs_l = tl.arange(0, BLOCK_L)
    at = bh * n_chunks * BLOCK_L + offs_c[:, None] * BLOCK_L + offs_l[None, :]
    ok = offs_c[:, None] < n_chunks
    m = tl.load(m_ptr + at, mask=ok, other=float("-inf"))
    lsum = tl.load(l_ptr + at, mask=ok, other=0.0)
    mx = tl.max(m, 0)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    tl.store(
        lse_ptr + bh * BLOCK_L + offs_l, mx + tl.log2(tl.sum(lsum * tl.exp2(m - mx[None, :]), 0))
    )


@triton.jit
def _prob_tile(
    q,
    kb,
    lse,
    r,
    offs_l,
    offs_u,
    offs_d,
    b,
    L,
    S,
    row_start,
    stride_k_s,
    qk_scale,
    D: tl.constexpr,
    BO: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_L: tl.constexpr,
):
    """Probabilities ``[BLOCK_L, BO]`` of the rows against key block ``b`` (keys
    ``row_start + 1 - (b + 1) * BO + u``; block -1 holds the keys right after ``row_start``)."""
    j = row_start + 1 - (b + 1) * BO + offs_u
    # A block at or below the first row whose keys are all >= 0, with every row present, needs no
    # mask: its keys exist and precede every row.
    if (b >= 0) & (row_start + 1 - (b + 1) * BO >= 0) & (L == BLOCK_L):
        kt = tl.load(
            kb + j[None, :].to(tl.int64) * stride_k_s + offs_d[:, None],
            mask=offs_d[:, None] < D,
            other=0.0,
        )
        if IEEE:
            s = tl.dot(q, kt, input_precision="ieee")
        else:
            s = tl.dot(q, kt)
        p = tl.exp2(s * qk_scale - lse[:, None])
    else:
        kt = tl.load(
            kb + j[None, :].to(tl.int64) * stride_k_s + offs_d[:, None],
            mask=(j[None, :] >= 0) & (j[None, :] < S) & (offs_d[:, None] < D),
            other=0.0,
        )
        if IEEE:
            s = tl.dot(q, kt, input_precision="ieee")
        else:
            s = tl.dot(q, kt)
        ok = (j[None, :] >= 0) & (j[None, :] <= r[:, None]) & (offs_l[:, None] < L)
        p = tl.where(ok, tl.exp2(s * qk_scale - lse[:, None]), 0.0)
    return p, j


@triton.jit
def _lines_kernel(
    q_ptr,
    k_ptr,
    lse_ptr,
    vert_ptr,
    slash_ptr,
    stride_q_b,
    stride_q_h,
    stride_q_s,
    stride_k_b,
    stride_k_h,
    stride_k_s,
    H,
    GROUP,
    L,
    S,
    row_start,
    n_ob,
    qk_scale,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BO: tl.constexpr,
    IEEE: tl.constexpr,
    OB_PER: tl.constexpr,
):
    # Offset block ob (offsets ob * BO + u) reads key blocks ob (lower half of its window) and
    # ob - 1 (upper half): row l at offset ob * BO + u reads window key t = BO - 1 + l - u, that
    # is key (BO - 1 + l - u) mod BO of block ob if l <= u, of block ob - 1 if l > u. So one
    # gather per key block, at that index, gives both halves: its entries with l <= u sum to
    # block ob's share of offset block ob, those with l > u to its share of offset block ob + 1.
    # Walking ob upwards, each key block's probabilities are computed and gathered once; the
    # program keeps the l > u sums for the next offset block and owns the vertical sums of its
    # key blocks.
    pid, b, h, bh = _group_major(H, GROUP)
    offs_l = tl.arange(0, BLOCK_L)
    offs_d = tl.arange(0, BLOCK_D)
    offs_u = tl.arange(0, BO)
    q, kb = _rows_and_keys(
        q_ptr, k_ptr, b, h, GROUP, L, stride_q_b, stride_q_h, stride_q_s, stride_k_b, stride_k_h,
        offs_l, offs_d, D,
    )  # fmt: skip
    lse = tl.load(lse_ptr + bh * BLOCK_L + offs_l)
    r = row_start + offs_l
    out_v = vert_ptr + bh.to(tl.int64) * S
    out_s = slash_ptr + bh.to(tl.int64) * S
    lower = offs_l[:, None] <= offs_u[None, :]
    t_mod = tl.where(
        lower, BO - 1 + offs_l[:, None] - offs_u[None, :], offs_l[:, None] - offs_u[None, :] - 1
    )
    ob0 = pid * OB_PER
    p, j = _prob_tile(
        q, kb, lse, r, offs_l, offs_u, offs_d, ob0 - 1, L, S, row_start, stride_k_s, qk_scale,
        D, BO, IEEE, BLOCK_L,
    )  # fmt: skip
    tl.store(out_v + j, tl.sum(p, 0), mask=(j >= 0) & (j < S) & ((offs_u * 0 + ob0) == 0))
    upper_prev = tl.sum(tl.where(lower, 0.0, tl.gather(p, t_mod, 1)), 0)
    for i in range(OB_PER):
        ob = ob0 + i
        p, j = _prob_tile(
            q, kb, lse, r, offs_l, offs_u, offs_d, ob, L, S, row_start, stride_k_s, qk_scale,
            D, BO, IEEE, BLOCK_L,
        )  # fmt: skip
        tl.store(out_v + j, tl.sum(p, 0), mask=(j >= 0) & (j < S) & ((offs_u * 0 + ob) < n_ob))
        g = tl.gather(p, t_mod, 1)
        o = ob * BO + offs_u
        lower_sum = tl.sum(tl.where(lower, g, 0.0), 0)
        tl.store(out_s + o, lower_sum + upper_prev, mask=(o < S) & ((offs_u * 0 + ob) < n_ob))
        upper_prev = tl.sum(tl.where(lower, 0.0, g), 0)


_BLOCK_N = 64


def line_scores_triton(
    q_rows: torch.Tensor,
    k: torch.Tensor,
    row_start: int,
    *,
    scale: float,
    config: LaunchConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``config``: pass 2's launch config instead of the looked-up one (tests and the tuner run
    each candidate)."""
    B, H, L, D = q_rows.shape
    H_KV, S = k.shape[1], k.shape[2]
    q_rows = q_rows if q_rows.stride(-1) == 1 else q_rows.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    BLOCK_L = max(16, triton.next_power_of_2(L))
    BD = block_d(D)
    ieee = q_rows.dtype == torch.float32
    qk_scale = scale * LOG2E
    dev = q_rows.device
    n_keys = min(S, row_start + L)
    # Key chunks: enough programs to fill the GPU without a long serial walk per program.
    chunk = triton.cdiv(n_keys, 64 * _BLOCK_N) * _BLOCK_N
    n_chunks = triton.cdiv(n_keys, chunk)
    m = torch.empty(B * H, n_chunks, BLOCK_L, dtype=torch.float32, device=dev)
    lsum = torch.empty_like(m)
    G = H // H_KV
    _lse_kernel[(n_chunks * G, B * H_KV)](
        q_rows, k, m, lsum,
        q_rows.stride(0), q_rows.stride(1), q_rows.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        H, H // H_KV, L, S, row_start, chunk, n_chunks, qk_scale,
        D=D, BLOCK_D=BD, BLOCK_L=BLOCK_L, BLOCK_N=_BLOCK_N, IEEE=ieee,
        num_warps=4, num_stages=1 if on_interpreter() else 3,
    )  # fmt: skip
    lse = torch.empty(B * H, BLOCK_L, dtype=torch.float32, device=dev)
    _lse_merge_kernel[(B * H,)](
        m, lsum, lse, n_chunks, BLOCK_L=BLOCK_L, BLOCK_C=triton.next_power_of_2(n_chunks)
    )
    vert = torch.zeros(B * H, S, dtype=torch.float32, device=dev)
    slash = torch.zeros(B * H, S, dtype=torch.float32, device=dev)
    # Offset blocks as wide as the row block: the window of one offset block is two key blocks.
    BO = BLOCK_L
    n_ob = triton.cdiv(row_start + L, BO)
    args = (
        q_rows, k, lse, vert, slash,
        q_rows.stride(0), q_rows.stride(1), q_rows.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        H, H // H_KV, L, S, row_start, n_ob, qk_scale,
    )  # fmt: skip
    if config is None:
        config = choose_config(
            SPEC, device=dev, head_dim=D, dtype=q_rows.dtype, group=G, seq_len=S,
            variant=f"rows{BLOCK_L}",
        )  # fmt: skip
    _lines_kernel[(triton.cdiv(n_ob, config["OB_PER"]) * G, B * H_KV)](
        *args, D=D, BLOCK_D=BD, BLOCK_L=BLOCK_L, BO=BO, IEEE=ieee, **config.launch_kwargs()
    )
    return vert.reshape(B, H, S), slash.reshape(B, H, S)


@triton.jit
def _fold_body(
    pid,
    bkv,
    q_ptr,
    k_ptr,
    ws_ptr,
    off_m,
    off_l,
    off_acol,
    off_asl,
    stride_q_b,
    stride_q_h,
    stride_q_s,
    stride_k_b,
    stride_k_h,
    stride_k_s,
    H,
    GROUP,
    L,
    S,
    row_start,
    seg,
    n_sub,
    n_seg,
    seg_per_chunk,
    n_chunks,
    lo,
    hi,
    g_a,
    g_b,
    qk_scale,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
    EDGES: tl.constexpr,
):
    # EDGES: chunk 0 walks the segments [0, g_a), chunk 1 [g_b, n_seg) (the interior ones are
    # ``_fold_interior_body``'s); else chunk c walks seg_per_chunk segments from c.
    # The partials are regions of one workspace (element offsets off_*: one allocation).
    m_ptr, l_ptr = ws_ptr + off_m, ws_ptr + off_l
    acol_ptr, asl_ptr = ws_ptr + off_acol, ws_ptr + off_asl
    pos, b, h, bh = _group_major_at(pid, bkv, H, GROUP)
    t = pos % n_sub
    c = pos // n_sub
    offs_l = tl.arange(0, BLOCK_L)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    q, kb = _rows_and_keys(
        q_ptr, k_ptr, b, h, GROUP, L, stride_q_b, stride_q_h, stride_q_s, stride_k_b, stride_k_h,
        offs_l, offs_d, D,
    )  # fmt: skip
    r = row_start + offs_l
    n_keys = tl.minimum(S, row_start + L)
    width = tl.minimum(BLOCK_N, seg - t * BLOCK_N)
    last_row = row_start + L - 1
    # Online softmax per row (base 2): the accumulators hold sum_j exp2(s_j - m_i) of the keys
    # inside the window (a_col: key j in [lo, hi); a_sl: offset r - j in [lo, hi)) and l_i that
    # of every visible key, all rescaled when the row max m_i grows.
    m_i = tl.full([BLOCK_L], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_L], dtype=tl.float32)
    a_col = tl.zeros([BLOCK_L, BLOCK_N], dtype=tl.float32)
    a_sl = tl.zeros([BLOCK_L, BLOCK_N], dtype=tl.float32)
    if EDGES:
        g_lo = tl.where(c == 0, 0, g_b)
        g_hi = tl.where(c == 0, g_a, n_seg)
    else:
        g_lo = c * seg_per_chunk
        g_hi = tl.minimum(g_lo + seg_per_chunk, n_seg)
    for g in range(g_lo, g_hi):
        j0 = g * seg + t * BLOCK_N
        j = j0 + offs_n
        # A full tile whose keys precede every row by at least lo, lie inside [lo, hi) and
        # after every row's r - hi counts for the row sums and both accumulators unmasked.
        inside = (
            (width == BLOCK_N)
            & (j0 + BLOCK_N - 1 <= row_start - lo)
            & (j0 >= lo)
            & (j0 + BLOCK_N <= hi)
            & (j0 > last_row - hi)
            & (L == BLOCK_L)
        )
        if inside:
            s = _key_scores(q, kb, j, offs_n >= 0, offs_d, stride_k_s, qk_scale, D, IEEE)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            a_col = a_col * alpha[:, None] + p
            a_sl = a_sl * alpha[:, None] + p
            m_i = m_new
        else:
            ok_j = (j < n_keys) & (offs_n < width)
            s = _key_scores(q, kb, j, ok_j, offs_d, stride_k_s, qk_scale, D, IEEE)
            valid = ok_j[None, :] & (j[None, :] <= r[:, None]) & (offs_l[:, None] < L)
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            o = r[:, None] - j[None, :]
            in_col = (j[None, :] >= lo) & (j[None, :] < hi)
            a_col = a_col * alpha[:, None] + tl.where(in_col, p, 0.0)
            a_sl = a_sl * alpha[:, None] + tl.where((o >= lo) & (o < hi), p, 0.0)
            m_i = m_new
    part = (bh * n_sub + t) * n_chunks + c
    tl.store(m_ptr + part * BLOCK_L + offs_l, m_i)
    tl.store(l_ptr + part * BLOCK_L + offs_l, l_i)
    at = part.to(tl.int64) * (BLOCK_L * BLOCK_N) + offs_l[:, None] * BLOCK_N + offs_n[None, :]
    tl.store(acol_ptr + at, a_col)
    tl.store(asl_ptr + at, a_sl)


@triton.jit
def _fold_interior_body(
    pid,
    bkv,
    q_ptr,
    k_ptr,
    ws_ptr,
    off_m,
    off_l,
    off_a,
    stride_q_b,
    stride_q_h,
    stride_q_s,
    stride_k_b,
    stride_k_h,
    stride_k_s,
    H,
    GROUP,
    n_slots,
    L,
    row_start,
    seg,
    n_sub,
    seg_per_chunk,
    n_chunks,
    g_a,
    g_b,
    qk_scale,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HP: tl.constexpr,
    IEEE: tl.constexpr,
):
    # The segments [g_a, g_b), whose every tile is inside the window for every row (see the
    # ``inside`` test of ``_line_folds_fwd_kernel``): a key's column and diagonal terms are then
    # the same probability, so one accumulator serves both sums (half the registers and half
    # the partials of the general kernel), with no masks.
    # A program takes HP query heads of one KV group (slot s of the group's n_slots: heads
    # s * HP .. of it, rows past the group's end masked) stacked as HP * BLOCK_L rows, so each
    # key tile is read once for all of them: with one head per program, the key reads from L2
    # bound the pass.
    m_ptr, l_ptr, a_ptr = ws_ptr + off_m, ws_ptr + off_l, ws_ptr + off_a
    H_KV = H // GROUP
    b = bkv // H_KV
    slot = pid % n_slots
    pos = pid // n_slots
    t = pos % n_sub
    c = pos // n_sub
    ROWS: tl.constexpr = HP * BLOCK_L
    offs_r = tl.arange(0, ROWS)
    offs_l = offs_r % BLOCK_L
    g_in = slot * HP + offs_r // BLOCK_L  # the row's head within its KV group
    live = g_in < GROUP
    h = (bkv % H_KV) * GROUP + g_in
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    q = tl.load(
        q_ptr
        + b.to(tl.int64) * stride_q_b
        + h.to(tl.int64)[:, None] * stride_q_h
        + offs_l[:, None] * stride_q_s
        + offs_d[None, :],
        mask=live[:, None] & (offs_d[None, :] < D),
        other=0.0,
    )
    kb = k_ptr + b.to(tl.int64) * stride_k_b + (bkv % H_KV).to(tl.int64) * stride_k_h
    m_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    g_lo = g_a + c * seg_per_chunk
    g_hi = tl.minimum(g_lo + seg_per_chunk, g_b)
    for g in range(g_lo, g_hi):
        j = g * seg + t * BLOCK_N + offs_n
        s = _key_scores(q, kb, j, offs_n >= 0, offs_d, stride_k_s, qk_scale, D, IEEE)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + p
        m_i = m_new
    part = ((b * H + h) * n_sub + t) * n_chunks + c
    tl.store(m_ptr + part * BLOCK_L + offs_l, m_i, mask=live)
    tl.store(l_ptr + part * BLOCK_L + offs_l, l_i, mask=live)
    at = (
        part.to(tl.int64)[:, None] * (BLOCK_L * BLOCK_N)
        + offs_l[:, None] * BLOCK_N
        + offs_n[None, :]
    )
    tl.store(a_ptr + at, acc, mask=live[:, None])


@triton.jit
def _offset_qk_ptrs(q_ptr, k_ptr, qk_off_ptr, QK_OFF: tl.constexpr, QK_ALIGN: tl.constexpr):
    """With ``QK_OFF``, ``q_ptr`` and ``k_ptr`` moved by the element offsets at ``qk_off_ptr``
    (int64 ``[2]``, multiples of ``QK_ALIGN``): a CUDA graph of the launch then reads other
    tensors of the same shape and strides from what its host writes there."""
    if QK_OFF:
        q_ptr += tl.multiple_of(tl.load(qk_off_ptr), QK_ALIGN)
        k_ptr += tl.multiple_of(tl.load(qk_off_ptr + 1), QK_ALIGN)
    return q_ptr, k_ptr


@triton.jit
def _line_folds_fwd_kernel(
    q_ptr, k_ptr, ws_ptr, qk_off_ptr, off_m, off_l, off_acol, off_asl,
    stride_q_b, stride_q_h, stride_q_s, stride_k_b, stride_k_h, stride_k_s,
    H, GROUP, L, S, row_start, seg, n_sub, n_seg, seg_per_chunk, n_chunks, lo, hi, g_a, g_b,
    qk_scale,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr, QK_OFF: tl.constexpr, QK_ALIGN: tl.constexpr,
):  # fmt: skip
    # Every segment through the general body (a layout with no interior segments).
    q_ptr, k_ptr = _offset_qk_ptrs(q_ptr, k_ptr, qk_off_ptr, QK_OFF, QK_ALIGN)
    _fold_body(
        tl.program_id(0), tl.program_id(1), q_ptr, k_ptr, ws_ptr, off_m, off_l, off_acol,
        off_asl, stride_q_b, stride_q_h, stride_q_s, stride_k_b, stride_k_h, stride_k_s, H,
        GROUP, L, S, row_start, seg, n_sub, n_seg, seg_per_chunk, n_chunks, lo, hi, g_a, g_b,
        qk_scale, D, BLOCK_D, BLOCK_L, BLOCK_N, IEEE, False,
    )  # fmt: skip


@triton.jit
def _line_folds_kernel(
    q_ptr, k_ptr, ws_ptr, qk_off_ptr, off_m, off_l, off_acol, off_asl, off_mi, off_li, off_ai,
    stride_q_b, stride_q_h, stride_q_s, stride_k_b, stride_k_h, stride_k_s,
    H, GROUP, n_slots, L, S, row_start, seg, n_sub, n_seg, per_i, n_int, lo, hi, g_a, g_b,
    qk_scale, n_int_progs,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_N: tl.constexpr,
    HP: tl.constexpr, IEEE: tl.constexpr, QK_OFF: tl.constexpr, QK_ALIGN: tl.constexpr,
):  # fmt: skip
    # One launch for a layout with interior segments: programs [0, n_int_progs) walk them
    # (``_fold_interior_body``), the others the edge segments before g_a and from g_b
    # (``_fold_body``, two runs per sub-tile and head). One launch less costs the host a launch.
    q_ptr, k_ptr = _offset_qk_ptrs(q_ptr, k_ptr, qk_off_ptr, QK_OFF, QK_ALIGN)
    pid = tl.program_id(0)
    bkv = tl.program_id(1)
    if pid < n_int_progs:
        _fold_interior_body(
            pid, bkv, q_ptr, k_ptr, ws_ptr, off_mi, off_li, off_ai, stride_q_b, stride_q_h,
            stride_q_s, stride_k_b, stride_k_h, stride_k_s, H, GROUP, n_slots, L, row_start, seg,
            n_sub, per_i, n_int, g_a, g_b, qk_scale, D, BLOCK_D, BLOCK_L, BLOCK_N, HP, IEEE,
        )  # fmt: skip
    else:
        _fold_body(
            pid - n_int_progs, bkv, q_ptr, k_ptr, ws_ptr, off_m, off_l, off_acol, off_asl,
            stride_q_b, stride_q_h, stride_q_s, stride_k_b, stride_k_h, stride_k_s, H, GROUP, L,
            S, row_start, seg, n_sub, n_seg, 1, 2, lo, hi, g_a, g_b, qk_scale, D, BLOCK_D,
            BLOCK_L, BLOCK_N, IEEE, True,
        )  # fmt: skip


@triton.jit
def _merge_lse(m_ptr, l_ptr, n, offs_r, mx, tot, BLOCK_L: tl.constexpr):
    """Row max and sum (base 2) ``(mx, tot)`` merged with ``n`` consecutive partials."""
    for i in range(n):
        m = tl.load(m_ptr + i * BLOCK_L + offs_r)
        lsum = tl.load(l_ptr + i * BLOCK_L + offs_r)
        m_new = tl.maximum(mx, m)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        tot = tot * tl.exp2(mx - m_safe) + lsum * tl.exp2(m - m_safe)
        mx = m_new
    return mx, tot


@triton.jit
def _line_folds_merge_kernel(
    ws_ptr,
    off_m,
    off_l,
    off_acol,
    off_asl,
    off_mi,
    off_li,
    off_ai,
    off_col,
    off_sl,
    L,
    n_sub,
    n_chunks,
    n_int,
    seg_w,
    BLOCK_L: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # n_int interior partials per sub-tile (``_fold_interior_body``: one accumulator
    # for both sums) besides the n_chunks general ones.
    # Program (bh, t, row group g): for rows g * BLOCK_R .., the log-sum-exp over every partial
    # of head bh, then sub-tile t's partial sums weighted by exp2(m_part - M) / sum and added:
    # the group's vertical sums (col[bh, g, t * BLOCK_N + n], summed over groups by the caller)
    # and the per-row slash sums (sl[bh, l, t * BLOCK_N + n]).
    m_ptr, l_ptr = ws_ptr + off_m, ws_ptr + off_l
    acol_ptr, asl_ptr = ws_ptr + off_acol, ws_ptr + off_asl
    mi_ptr, li_ptr, ai_ptr = ws_ptr + off_mi, ws_ptr + off_li, ws_ptr + off_ai
    col_ptr, sl_ptr = ws_ptr + off_col, ws_ptr + off_sl
    bh = tl.program_id(0)
    t = tl.program_id(1)
    g = tl.program_id(2)
    offs_r = g * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_n = tl.arange(0, BLOCK_N)
    n_part = n_sub * n_chunks
    base = bh * n_part
    mx = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    tot = tl.zeros([BLOCK_R], dtype=tl.float32)
    base_i = bh * n_sub * n_int
    mx, tot = _merge_lse(m_ptr + base * BLOCK_L, l_ptr + base * BLOCK_L, n_part, offs_r, mx, tot,
                         BLOCK_L)  # fmt: skip
    mx, tot = _merge_lse(mi_ptr + base_i * BLOCK_L, li_ptr + base_i * BLOCK_L, n_sub * n_int,
                         offs_r, mx, tot, BLOCK_L)  # fmt: skip
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    inv = 1.0 / tl.where(tot > 0, tot, 1.0)  # rows past L have no keys (and no sums)
    acc_col = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
    acc_sl = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
    for c in range(n_chunks):
        part = base + t * n_chunks + c
        w = tl.exp2(tl.load(m_ptr + part * BLOCK_L + offs_r) - mx) * inv
        at = part.to(tl.int64) * (BLOCK_L * BLOCK_N) + offs_r[:, None] * BLOCK_N + offs_n[None, :]
        acc_col += tl.load(acol_ptr + at) * w[:, None]
        acc_sl += tl.load(asl_ptr + at) * w[:, None]
    for c in range(n_int):
        part = base_i + t * n_int + c
        w = tl.exp2(tl.load(mi_ptr + part * BLOCK_L + offs_r) - mx) * inv
        at = part.to(tl.int64) * (BLOCK_L * BLOCK_N) + offs_r[:, None] * BLOCK_N + offs_n[None, :]
        a = tl.load(ai_ptr + at) * w[:, None]
        acc_col += a
        acc_sl += a
    row_ok = offs_r[:, None] < L
    n_g = BLOCK_L // BLOCK_R
    tl.store(
        col_ptr + (bh.to(tl.int64) * n_g + g) * seg_w + t * BLOCK_N + offs_n,
        tl.sum(tl.where(row_ok, acc_col, 0.0), 0),
    )
    out = (bh.to(tl.int64) * L + offs_r[:, None]) * seg_w + t * BLOCK_N + offs_n[None, :]
    tl.store(sl_ptr + out, acc_sl, mask=row_ok)


def _fold_plan(
    period: int, n_keys: int, heads: int, block_n: int
) -> tuple[int, int, int, int, int]:
    """``(seg, n_sub, n_seg, seg_per_chunk, n_chunks)`` of a launch (see the kernel)."""
    seg = period if period >= block_n else period * (block_n // period)
    n_seg = triton.cdiv(n_keys, seg)
    # Sub-tiles past the last key hold nothing: a period longer than the keys costs no more
    # programs or scratch than the keys themselves.
    n_sub = triton.cdiv(min(seg, n_keys), block_n)
    per, n_chunks = _chunks(n_seg, n_sub * heads, n_keys)
    return seg, n_sub, n_seg, per, n_chunks


def _chunks(n_seg: int, lanes: int, n_keys: int) -> tuple[int, int]:
    """``(segments per chunk, chunks)``: ``n_seg`` segments for each of ``lanes`` (sub-tile,
    head) pairs cut so that the launch has about ``_FOLD_PROGRAMS`` programs."""
    programs = _FOLD_PROGRAMS if n_keys > _FOLD_SHORT_KEYS else min(_FOLD_PROGRAMS, 256)
    per = max(1, triton.cdiv(n_seg * lanes, programs))
    return per, triton.cdiv(n_seg, per)


def _interior(
    seg: int, n_sub: int, block_n: int, L: int, block_l: int, row_start: int, lo: int, hi: int
) -> tuple[int, int]:
    """``(g_a, g_b)``: the segments ``[g_a, g_b)`` whose every tile passes the fold kernel's
    ``inside`` test for every row and sub-tile (keys in ``[lo, hi)``, at least ``lo`` before
    the first row, after every row's ``r - hi``; full sub-tiles and rows), or ``(0, 0)``."""
    if n_sub * block_n != seg or block_l != L or not _FOLD_INTERIOR:
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass over the keys, the partials merged by ``_line_folds_merge_kernel``, then the
    residue fold and the slash gather in torch (``block_n``, ``num_warps``, ``num_stages``: the
    kernel's tile and launch settings, for tests and tuning; by default 128-wide tiles and 4
    warps, and for more than 64 rows 64-wide tiles and 8 warps, which keeps the two
    ``[rows, block_n]`` float32 accumulators in registers)."""
    B, H, L, _ = q_rows.shape
    col, sl, seg = _fold_partials(
        q_rows, k, row_start, period=period, lo=lo, hi=hi, scale=scale, block_n=block_n,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    col, sl = _fold_tail(col, sl, seg, period, row_start)
    return col.reshape(B, H, period), sl.reshape(B, H, period)


def _fold_tail(
    col: torch.Tensor, sl: torch.Tensor, seg: int, P: int, row_start: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The merged partials of :func:`_fold_partials` as folds ``[B * H, P]`` (torch): ``col``
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


def _fold_partials(
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
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The fold kernel and its merge: ``(col [B * H, row groups, seg_w], sl [B * H, L, seg_w],
    seg)``, float32. ``col`` summed over its row groups and ``sl`` over its rows (after each
    row's offset-class gather) are the folds of a segment of ``seg`` positions (a multiple of
    the period); positions ``seg_w ..`` of the segment hold nothing.

    ``qk_offsets``: int64 ``[2]`` on the device; the fold kernel then reads the rows and keys at
    those element offsets from ``q_rows`` and ``k`` (tensors of their shape, strides and dtype
    there; multiples of 16 bytes), so that a CUDA graph of these launches serves other inputs
    (``sparse_patterns._graphs`` writes them before each replay). ``q_rows`` and ``k`` must
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
    f = _fold_setup(
        B, H, H_KV, L, D, S, row_start, period, lo, hi, q_rows.dtype == torch.float32, block_n,
        num_warps, num_stages, on_interpreter(), _FOLD_INTERIOR, _FOLD_PROGRAMS, _FOLD_SHORT_KEYS,
        _FOLD_HEADS,
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


class _FoldSetup(NamedTuple):
    """What :func:`_fold_partials` launches with, per shape (:func:`_fold_setup`)."""

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
def _fold_setup(
    B, H, H_KV, L, D, S, row_start, period, lo, hi, fp32, block_n, num_warps, num_stages,
    interp, interior, programs, short, heads,
) -> _FoldSetup:  # fmt: skip
    """The launch settings of :func:`_fold_partials` per shape. The module's switches
    ``_FOLD_INTERIOR``, ``_FOLD_PROGRAMS`` and ``_FOLD_SHORT_KEYS`` (read by ``_interior`` and
    ``_chunks``) are in the cache key as ``interior``, ``programs`` and ``short``, and
    ``_FOLD_HEADS`` is ``heads``: tests and timings change them."""
    del interior, programs
    BLOCK_L = max(16, triton.next_power_of_2(L))
    n_keys = min(S, row_start + L)
    is_short = n_keys <= short
    block_n_given, warps_given = block_n, num_warps
    if block_n is None:
        # fp32 goes through exact (FMA-emulated) dots: a narrow tile, as in the other kernels.
        block_n = FP32_CONFIG["BLOCK_N"] if fp32 else _FOLD_BLOCK_N
        if BLOCK_L > 64:
            block_n = min(block_n, 64)
    G = H // H_KV
    # Query heads of a KV group per interior program (they share each key tile): by default two
    # up to _FOLD_SHORT_KEYS keys (then 64-wide tiles and 8 warps), else one. On H100s at the
    # Qwen2.5-VL-7B shape (scripts/fold_heads_gpu.py, grid_and_boundaries.md section 11) two
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
    seg, n_sub, n_seg, per, n_chunks = _fold_plan(period, n_keys, BH, block_n)
    g_a, g_b = _interior(seg, n_sub, block_n, L, BLOCK_L, row_start, lo, hi)
    edges = g_b > g_a
    n_slots = triton.cdiv(G, hp)
    lanes_i = n_sub * B * H_KV * n_slots
    per_i, n_int = _chunks(g_b - g_a, lanes_i, n_keys) if edges else (1, 0)
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
    return _FoldSetup(
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
    # Program bh: (1) the folds of the merged partials (``_fold_tail`` in torch): colf[c] sums
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
    col, sl, seg = _fold_partials(q_rows, k, row_start, period=period, lo=lo, hi=hi, scale=scale)
    st, ph, score = _search_partials(col, sl, seg, period, row_start, strides, rel_tol)
    return st.reshape(B, H), ph.reshape(B, H), score.reshape(B, H)


def _search_partials(
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
    """``_fold_search_kernel`` on merged partials (see :func:`_fold_partials`): ``(stride,
    phase, score)``, each ``[B * H]``; the search of :func:`_fold_tail`'s folds. ``zero``: an
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


@functools.lru_cache(maxsize=32)
def _slash_residues(start: int, L: int, P: int, device: torch.device) -> torch.Tensor:
    """int64 ``[L, P]``: the key residue that offset residue ``c`` is in row ``l`` whose position
    is ``start + l`` modulo ``P``: ``(start + l - c) mod P``."""
    r = torch.arange(start, start + L)
    return ((r[:, None] - torch.arange(P)[None, :]) % P).to(device)
