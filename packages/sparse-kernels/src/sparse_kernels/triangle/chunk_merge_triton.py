"""The LSE merge of the triangle's last rows (Triton): ``triangle.triton``'s split programs write
each (last row, key chunk) pair's partial ``(out, lse)`` to an fp32 workspace; one program per
tile of rows and head combines the chunks and writes the rows' output."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n_chunks"])
def _triangle_merge_kernel(
    ws_out_ptr,
    ws_lse_ptr,
    out_ptr,
    lse_ptr,
    stride_o_b,
    stride_o_h,
    stride_o_s,
    stride_o_d,
    H,
    S_Q,
    L,
    n_chunks,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    r_ok = r < L
    rd_ok = r_ok[:, None] & (offs_d[None, :] < D)
    base = bh.to(tl.int64) * n_chunks * L
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    for c in range(n_chunks):
        m = tl.maximum(m, tl.load(ws_lse_ptr + base + c * L + r, mask=r_ok, other=float("-inf")))
    # A row that saw no key keeps m = -inf; use 0 so that exp gives 0, not NaN.
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    den = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for c in range(n_chunks):
        rows = base + c * L + r
        w = tl.exp(tl.load(ws_lse_ptr + rows, mask=r_ok, other=float("-inf")) - m_safe)
        o = tl.load(ws_out_ptr + rows[:, None] * D + offs_d[None, :], mask=rd_ok, other=0.0)
        acc += w[:, None] * o
        den += w
    empty = den == 0.0
    d_safe = tl.where(empty, 1.0, den)
    out = acc / d_safe[:, None]
    lse = tl.where(empty, float("-inf"), m_safe + tl.log(d_safe))
    rows_q = (S_Q - L + r).to(tl.int64)
    o_ptrs = (
        out_ptr
        + b.to(tl.int64) * stride_o_b
        + h.to(tl.int64) * stride_o_h
        + rows_q[:, None] * stride_o_s
        + offs_d[None, :] * stride_o_d
    )
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=rd_ok)
    tl.store(lse_ptr + bh.to(tl.int64) * S_Q + rows_q, lse, mask=r_ok)
