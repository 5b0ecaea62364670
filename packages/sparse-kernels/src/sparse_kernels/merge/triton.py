"""Merge of N partial attentions by LSE (Triton): two passes over the parts per row tile."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton.config import block_d
from .._triton.launch import launch


@triton.jit
def _merge_fwd_kernel(
    outs_ptr,
    lses_ptr,
    out_ptr,
    lse_ptr,
    N,
    R,
    D,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    r_ok = offs_r < R
    rd_ok = r_ok[:, None] & (offs_d[None, :] < D)
    rows = offs_r.to(tl.int64)

    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    for i in range(N):
        m = tl.maximum(m, tl.load(lses_ptr + i * R + rows, mask=r_ok, other=float("-inf")))
    # An all-empty row keeps m = -inf; use 0 so that exp gives 0, not NaN.
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    denom = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for i in range(N):
        lse_i = tl.load(lses_ptr + i * R + rows, mask=r_ok, other=float("-inf"))
        w = tl.exp(lse_i - m_safe)
        o = tl.load(outs_ptr + (i * R + rows)[:, None] * D + offs_d[None, :], mask=rd_ok, other=0.0)
        # An empty part (w = 0) adds nothing, even where its out is not finite (0 * NaN).
        acc += tl.where(w[:, None] > 0, w[:, None] * o.to(tl.float32), 0.0)
        denom += w
    empty = denom == 0.0
    d_safe = tl.where(empty, 1.0, denom)
    out = acc / d_safe[:, None]
    lse = tl.where(empty, float("-inf"), m_safe + tl.log(d_safe))
    tl.store(
        out_ptr + rows[:, None] * D + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=rd_ok
    )
    tl.store(lse_ptr + rows, lse, mask=r_ok)


def _launch_merge_fwd(
    outs: list[torch.Tensor], lses: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    shape = outs[0].shape
    D = shape[-1]
    R = outs[0].numel() // D
    stacked_o = torch.stack([o.contiguous() for o in outs])
    stacked_l = torch.stack([x.contiguous() for x in lses])
    out = torch.empty(shape, dtype=outs[0].dtype, device=outs[0].device)
    lse = torch.empty(shape[:-1], dtype=torch.float32, device=outs[0].device)
    BLOCK_R = 64
    grid = (triton.cdiv(R, BLOCK_R),)
    launch(
        _merge_fwd_kernel, grid, (stacked_o, stacked_l, out, lse), (len(outs), R, D),
        BLOCK_R=BLOCK_R, BLOCK_D=block_d(D),
    )  # fmt: skip
    return out, lse
