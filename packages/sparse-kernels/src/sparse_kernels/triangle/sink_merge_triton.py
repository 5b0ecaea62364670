"""Add the sink keys to a windowed attention, in place (Triton).

The triangle pattern's A-shape rows attend a local window and the first ``sink`` keys. An engine
that runs the window as one sliding-window launch (FA4's local attention) leaves the sink keys
outside that window to this kernel: per tile of rows it starts the online softmax from the
window's result (``lse`` as the running maximum, ``out`` as the accumulator, a sum of 1), walks
the sink keys that lie before the window (``j < sink`` and ``j <= p - window``), and writes the
combined ``out`` and ``lse`` back over the window's. One read of q and of the window result, one
write: no partial output is materialised and no separate merge pass runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton.config import FP32_CONFIG, block_d, on_interpreter
from .._triton.inner import _attn_tile_inner, _finish_rows, _resume_rows
from .._triton.launch import launch


@triton.jit
def _sink_merge_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    lse_ptr,
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
    stride_l_b,
    stride_l_h,
    stride_l_s,
    H,
    GROUP,
    S_Q,
    S_KV,
    row_lo,
    row_hi,
    sink,
    window,
    sm_scale,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    h_kv = h // GROUP
    offs_m = row_lo + tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < row_hi
    d_ok = offs_d < D
    rd_ok = row_ok[:, None] & d_ok[None, :]
    rows = offs_m[:, None].to(tl.int64)

    q = tl.load(
        q_ptr + b.to(tl.int64) * stride_q_b + h.to(tl.int64) * stride_q_h
        + rows * stride_q_s + offs_d[None, :] * stride_q_d,
        mask=rd_ok, other=0.0,
    )  # fmt: skip
    o_ptrs = (
        out_ptr + b.to(tl.int64) * stride_o_b + h.to(tl.int64) * stride_o_h
        + rows * stride_o_s + offs_d[None, :] * stride_o_d
    )  # fmt: skip
    l_ptrs = (
        lse_ptr + b.to(tl.int64) * stride_l_b + h.to(tl.int64) * stride_l_h
        + offs_m.to(tl.int64) * stride_l_s
    )  # fmt: skip
    acc, l_i, m_i = _resume_rows(o_ptrs, l_ptrs, row_ok, rd_ok)  # the window's result

    k_base = k_ptr + b.to(tl.int64) * stride_k_b + h_kv.to(tl.int64) * stride_k_h
    v_base = v_ptr + b.to(tl.int64) * stride_v_b + h_kv.to(tl.int64) * stride_v_h
    # Sink keys before the window: j < sink (the key bound) and j <= p - window (the causal rule
    # on a position moved back by the window).
    before = offs_m + (S_KV - S_Q) - window
    hi = tl.minimum(sink, S_KV)
    acc, l_i, m_i = _attn_tile_inner(
        acc, l_i, m_i, q, k_base, v_base, stride_k_s, stride_k_d, stride_v_s, stride_v_d,
        before, offs_n, offs_d, 0, hi, hi, sm_scale * 1.4426950408889634, 0, 1,
        D, BLOCK_D, BLOCK_N, True, True, False, IEEE,
    )  # fmt: skip
    out, lse = _finish_rows(acc, l_i, m_i)
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=rd_ok)
    tl.store(l_ptrs, lse, mask=row_ok)


def _launch_sink_merge_fwd(
    out: torch.Tensor,
    lse: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sink: int,
    window: int,
    row_lo: int,
    row_hi: int,
    scale: float,
) -> None:
    """Merge, in place, rows ``[row_lo, row_hi)`` of ``(out, lse)`` (a windowed attention's
    result: ``[B, H, S_Q, D]`` and ``[B, H, S_Q]``, any strides) with those rows' attention over
    the sink keys before the window. Callers check shapes; ``sink >= 1``, ``window >= 1``."""
    if row_hi <= row_lo or sink == 0:
        return
    B, H, S_Q, D = q.shape
    H_KV, S_KV = k.shape[1], k.shape[2]
    fp32 = q.dtype == torch.float32
    stages = 3  # Triton's default
    if fp32:
        block_m, block_n, warps = FP32_CONFIG["BLOCK_M"], FP32_CONFIG["BLOCK_N"], 4
    elif on_interpreter():
        block_m, block_n, warps = 32, 16, 4
    else:
        # The pass is bound by reading q and the window's out and writing out. On an H100 (128K
        # rows, H=28, H_KV=4, D=128, bf16, sinks 8 and 128) 64-row tiles with 4 warps were the
        # fastest candidates, about 1.5x faster than 128-row tiles with 8 warps (docs/results.md,
        # packages/sparse-kernels/benchmarks/sweep_sink_merge.py).
        block_m, block_n, warps, stages = 64, 16 if sink <= 16 else 32, 4, 2
    grid = (triton.cdiv(row_hi - row_lo, block_m), B * H)
    launch(
        _sink_merge_fwd_kernel, grid, (q, k, v, out, lse),
        (*q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride(),
         H, H // H_KV, S_Q, S_KV, row_lo, row_hi, sink, window, scale),
        D=D, BLOCK_D=block_d(D), IEEE=fp32, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps,
        num_stages=stages,
    )  # fmt: skip
