"""A-shape rows with the query heads of one KV group packed into each tile (Triton).

The A-shape rows of the triangle pattern (``triangle.triton``) attend a few sink keys and a local
window. With a narrow window a tile of ``BLOCK_M`` rows of one head walks only about
``window + BLOCK_M`` keys, so each key tile it loads serves few score rows, and the loads from L2
weigh as much as the matrix work. Here tile row ``r`` holds query head ``h_kv * GROUP + r %
GROUP`` at position ``t * P + r // GROUP`` (``P = BLOCK_M // GROUP`` positions per tile; the last
``BLOCK_M - P * GROUP`` rows are idle): the ``GROUP`` heads that share a KV head share every key
tile the program loads, and the tile's keys span ``window + P`` positions instead of
``window + BLOCK_M``. The sink, window and causal rules are the per-row ones of the unpacked
kernel, on each row's own position.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .._triton.inner import _attn_tile_inner, _finish_rows


@triton.jit
def _packed_a_shape_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    lse_ptr,
    k_desc,
    v_desc,
    stride_q_b,
    stride_q_h,
    stride_q_s,
    stride_q_d,
    stride_k_b,
    stride_k_h,
    stride_k_s,
    stride_k_d,
    stride_v_b,
    stride_v_h,
    stride_v_s,
    stride_v_d,
    stride_o_b,
    stride_o_h,
    stride_o_s,
    stride_o_d,
    H,
    GROUP,
    S_Q,
    S_KV,
    n_rows,
    sm_scale,
    sink,
    window,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IEEE: tl.constexpr,
    SINK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TMA: tl.constexpr,
):
    # pid = bk * n_tiles + t, bk = b * H_KV + h_kv: neighbouring programs take neighbouring
    # positions of one KV head, whose windows overlap.
    pid = tl.program_id(0)
    H_KV = H // GROUP
    P = BLOCK_M // GROUP
    n_tiles = tl.cdiv(n_rows, P)
    t = pid % n_tiles
    bk = pid // n_tiles
    b = bk // H_KV
    h_kv = bk % H_KV
    r = tl.arange(0, BLOCK_M)
    h = h_kv * GROUP + r % GROUP
    pos = t * P + r // GROUP
    row_ok = (r < P * GROUP) & (pos < n_rows)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    rd_ok = row_ok[:, None] & (offs_d < D)[None, :]
    k_base = k_ptr + b.to(tl.int64) * stride_k_b + h_kv.to(tl.int64) * stride_k_h
    v_base = v_ptr + b.to(tl.int64) * stride_v_b + h_kv.to(tl.int64) * stride_v_h
    q_rows = q_ptr + b.to(tl.int64) * stride_q_b + h.to(tl.int64) * stride_q_h
    q_rows += pos.to(tl.int64) * stride_q_s
    q = tl.load(q_rows[:, None] + offs_d[None, :] * stride_q_d, mask=rd_ok, other=0.0)
    q_pos = pos + (S_KV - S_Q)
    qk_scale = sm_scale * 1.4426950408889634
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # The key loops follow the unpacked kernel's A-shape branch over the positions
    # [p_lo, p_hi] of this tile (see there for the sink tiles and the block split).
    p_lo = t * P + (S_KV - S_Q)
    p_hi = tl.minimum(p_lo + P, n_rows + (S_KV - S_Q)) - 1
    hi = tl.maximum(tl.minimum(p_hi + 1, S_KV), 0)
    full_hi = tl.maximum(tl.minimum(p_lo + 1, S_KV), 0) // BLOCK_N * BLOCK_N
    sink_end = tl.cdiv(sink, SINK_N) * SINK_N
    s0 = tl.maximum(p_lo - window + 1, 0) // BLOCK_N * BLOCK_N
    own_sink = s0 >= sink_end
    offs_s = tl.arange(0, SINK_N)
    acc, l_i, m_i = _attn_tile_inner(
        acc, l_i, m_i, q, k_base, v_base, stride_k_s, stride_k_d, stride_v_s, stride_v_d,
        q_pos, offs_s, offs_d, 0, tl.where(own_sink, tl.minimum(sink_end, hi), 0), S_KV,
        qk_scale, sink, window, D, BLOCK_D, SINK_N, True, True, True, IEEE,
    )  # fmt: skip
    s0 = tl.where(own_sink, s0, 0)
    f_lo = tl.maximum(tl.cdiv(tl.maximum(p_hi - window + 1, 0), BLOCK_N) * BLOCK_N, s0)
    has_full = full_hi > f_lo
    b_end = tl.where(has_full, f_lo, hi)
    c_lo = tl.where(has_full, f_lo, hi)
    c_hi = tl.where(has_full, full_hi, hi)
    acc, l_i, m_i = _attn_tile_inner(
        acc, l_i, m_i, q, k_base, v_base, stride_k_s, stride_k_d, stride_v_s, stride_v_d,
        q_pos, offs_n, offs_d, s0, b_end, S_KV, qk_scale, sink, window,
        D, BLOCK_D, BLOCK_N, True, True, True, IEEE, k_desc, v_desc, b, h_kv, TMA,
    )  # fmt: skip
    acc, l_i, m_i = _attn_tile_inner(
        acc, l_i, m_i, q, k_base, v_base, stride_k_s, stride_k_d, stride_v_s, stride_v_d,
        q_pos, offs_n, offs_d, c_lo, c_hi, S_KV, qk_scale, sink, window,
        D, BLOCK_D, BLOCK_N, False, True, True, IEEE, k_desc, v_desc, b, h_kv, TMA,
    )  # fmt: skip
    acc, l_i, m_i = _attn_tile_inner(
        acc, l_i, m_i, q, k_base, v_base, stride_k_s, stride_k_d, stride_v_s, stride_v_d,
        q_pos, offs_n, offs_d, tl.maximum(c_hi, s0), hi, S_KV, qk_scale, sink, window,
        D, BLOCK_D, BLOCK_N, True, True, True, IEEE, k_desc, v_desc, b, h_kv, TMA,
    )  # fmt: skip
    out, lse = _finish_rows(acc, l_i, m_i)
    o_rows = out_ptr + b.to(tl.int64) * stride_o_b + h.to(tl.int64) * stride_o_h
    o_rows += pos.to(tl.int64) * stride_o_s
    o_ptrs = o_rows[:, None] + offs_d[None, :] * stride_o_d
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=rd_ok)
    tl.store(lse_ptr + (b * H + h).to(tl.int64) * S_Q + pos, lse, mask=row_ok)


def packed_grid(B: int, H_KV: int, n_rows: int, group: int, block_m: int) -> tuple[int]:
    """Grid of :func:`_packed_a_shape_kernel`: one program per (batch, KV head, tile of
    ``block_m // group`` positions) of the ``n_rows`` A-shape rows."""
    return (B * H_KV * triton.cdiv(n_rows, block_m // group),)
