"""Triton kernels of the fused per-token ops: one read and one write per element."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr, w_ptr, y_ptr, N, stride_x, stride_y, eps, BLOCK_N: tl.constexpr
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    ok = offs < N
    x = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    # Round the normalised row to the input dtype before the weight, as HF's RMSNorm does.
    h = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + offs, (h * w).to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, y_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    g = tl.load(g_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    # silu rounded to the dtype first, then the product: the two roundings of the eager form.
    s = (g / (1.0 + tl.exp(-g))).to(y_ptr.dtype.element_ty).to(tl.float32)
    tl.store(y_ptr + offs, (s * u).to(y_ptr.dtype.element_ty), mask=ok)


def _launch_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype
) -> torch.Tensor:
    N = x.shape[-1]
    x2 = x.reshape(-1, N)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape, dtype=out_dtype, device=x.device)
    if x2.shape[0] == 0:
        return y.view(x.shape)
    BLOCK_N = triton.next_power_of_2(N)
    warps = 4 if BLOCK_N <= 2048 else 8 if BLOCK_N <= 8192 else 16
    _rms_norm_kernel[(x2.shape[0],)](
        x2, weight, y, N, x2.stride(0), y.stride(0), eps, BLOCK_N=BLOCK_N, num_warps=warps
    )
    return y.view(x.shape)


def _launch_silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    g = gate.contiguous()
    u = up.contiguous()
    y = torch.empty_like(g)
    numel = g.numel()
    if numel == 0:
        return y
    BLOCK = 2048
    _silu_mul_kernel[(triton.cdiv(numel, BLOCK),)](g, u, y, numel, BLOCK=BLOCK, num_warps=8)
    return y
