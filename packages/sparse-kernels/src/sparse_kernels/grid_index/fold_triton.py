"""The Grid heads' line folds in one pass over the keys, and the merge of its partials.

Keys are cut into segments of ``seg`` positions (a multiple of the period), each segment into
sub-tiles of ``BLOCK_N``; a program owns one sub-tile position ``t`` of a run of segments, so every
key it reads has residue ``(t * BLOCK_N + n) mod period``, whatever the segment: the per-row sums
fold into one ``[BLOCK_L, BLOCK_N]`` accumulator without a gather. Each program keeps an online
softmax per row and two accumulators whose columns are fixed residues (column mass and diagonal
mass); segments whose every tile is inside the window take one accumulator
(``_fold_interior_body``). ``_line_folds_merge_kernel`` combines the programs' partials with the
rows' log-sum-exp. The launcher is :mod:`.fold_launch`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..estimate.triton import _group_major_at, _key_scores, _rows_and_keys


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
