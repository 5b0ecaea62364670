"""The column mass of query rows that follow every key, in Triton: per pass of up to 128 rows,
pass 1 of the line scores (``triton._row_lse``) with every key visible (``row_start = S``), then
``_columns_kernel``, one program per (key block, head), adds the rows' probabilities under those
log-sum-exps to the column sums (the passes run in order on one stream, so each program's
read-add-write of its own columns is the only one)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton.config import LOG2E, block_d, on_interpreter
from .triton import _BLOCK_N, _group_major, _key_scores, _row_lse, _rows_and_keys

# Rows per pass: BLOCK_L's register tile (line_scores takes at most as many).
_ROWS_PER_PASS = 128


@triton.jit
def _columns_kernel(
    q_ptr,
    k_ptr,
    lse_ptr,
    col_ptr,
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
    qk_scale,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
):
    """One program per (key block, head): the block's probabilities under pass 1's row
    log-sum-exps, summed over the rows and added to the column sums (row chunks accumulate)."""
    c, b, h, bh = _group_major(H, GROUP)
    offs_l = tl.arange(0, BLOCK_L)
    offs_d = tl.arange(0, BLOCK_D)
    q, kb = _rows_and_keys(
        q_ptr, k_ptr, b, h, GROUP, L, stride_q_b, stride_q_h, stride_q_s, stride_k_b, stride_k_h,
        offs_l, offs_d, D,
    )  # fmt: skip
    lse = tl.load(lse_ptr + bh * BLOCK_L + offs_l)
    j = c * BLOCK_N + tl.arange(0, BLOCK_N)
    ok_j = j < S
    s = _key_scores(q, kb, j, ok_j, offs_d, stride_k_s, qk_scale, D, IEEE)
    p = tl.where((offs_l[:, None] < L) & ok_j[None, :], tl.exp2(s - lse[:, None]), 0.0)
    out = col_ptr + bh.to(tl.int64) * S + j
    tl.store(out, tl.load(out, mask=ok_j, other=0.0) + tl.sum(p, 0), mask=ok_j)


def column_mass_triton(q_rows: torch.Tensor, k: torch.Tensor, *, scale: float) -> torch.Tensor:
    """:func:`~sparse_kernels.estimate.column_mass` in passes of up to 128 rows: pass 1 with
    every key visible, then the column sums, added up over the passes."""
    B, H, L, D = q_rows.shape
    H_KV, S = k.shape[1], k.shape[2]
    k = k if k.stride(-1) == 1 else k.contiguous()
    BD = block_d(D)
    ieee = q_rows.dtype == torch.float32
    qk_scale = scale * LOG2E
    G = H // H_KV
    col = torch.zeros(B * H, S, dtype=torch.float32, device=q_rows.device)
    for r0 in range(0, L, _ROWS_PER_PASS):
        rows = q_rows[:, :, r0 : r0 + _ROWS_PER_PASS]
        rows = rows if rows.stride(-1) == 1 else rows.contiguous()
        n = rows.shape[2]
        BLOCK_L = max(16, triton.next_power_of_2(n))
        lse = _row_lse(rows, k, S, qk_scale, BLOCK_L, BD, ieee)
        _columns_kernel[(triton.cdiv(S, _BLOCK_N) * G, B * H_KV)](
            rows, k, lse, col,
            rows.stride(0), rows.stride(1), rows.stride(2),
            k.stride(0), k.stride(1), k.stride(2),
            H, G, n, S, qk_scale,
            D=D, BLOCK_D=BD, BLOCK_L=BLOCK_L, BLOCK_N=_BLOCK_N, IEEE=ieee,
            num_warps=4, num_stages=1 if on_interpreter() else 3,
        )  # fmt: skip
    return col.reshape(B, H, S)
