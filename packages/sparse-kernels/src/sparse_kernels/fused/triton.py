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
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / N + eps)
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


@triton.jit
def _rotary_kernel(
    x_ptr, c_ptr, s_ptr, y_ptr, H, S, HALF,
    sx_b, sx_h, sx_s, sx_d, sy_b, sy_h, sy_s, sy_d, sc_b, sc_s, sc_d, ss_b, ss_s, ss_d,
    BLOCK_S: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    """One tile of BLOCK_S positions of one batch row, every head in turn: cos/sin are read once
    per tile, not once per head."""
    n_s = tl.cdiv(S, BLOCK_S)
    b = (tl.program_id(0) // n_s).to(tl.int64)
    rows = ((tl.program_id(0) % n_s) * BLOCK_S + tl.arange(0, BLOCK_S)).to(tl.int64)
    cols = tl.arange(0, BLOCK_HALF).to(tl.int64)
    ok = (rows < S)[:, None] & (cols < HALF)[None, :]
    c_at = c_ptr + b * sc_b + rows[:, None] * sc_s
    s_at = s_ptr + b * ss_b + rows[:, None] * ss_s
    c1 = tl.load(c_at + cols[None, :] * sc_d, mask=ok, other=0.0).to(tl.float32)
    c2 = tl.load(c_at + (cols + HALF)[None, :] * sc_d, mask=ok, other=0.0).to(tl.float32)
    s1 = tl.load(s_at + cols[None, :] * ss_d, mask=ok, other=0.0).to(tl.float32)
    s2 = tl.load(s_at + (cols + HALF)[None, :] * ss_d, mask=ok, other=0.0).to(tl.float32)
    dt = y_ptr.dtype.element_ty
    # The pointers step by one head stride per head: ``h * sx_h`` in int32 would pass 2**31 at
    # 1M tokens (a contiguous q: 2**27 elements per head).
    x_at = x_ptr + b * sx_b + rows[:, None] * sx_s
    y_at = y_ptr + b * sy_b + rows[:, None] * sy_s
    for _ in range(H):
        x1 = tl.load(x_at + cols[None, :] * sx_d, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(x_at + (cols + HALF)[None, :] * sx_d, mask=ok, other=0.0).to(tl.float32)
        # Each product and the sum rounded to the output dtype, as the eager ops round them (the
        # GPU compiler may fold the product roundings away: agreement is to one ulp).
        y1 = (x1 * c1).to(dt).to(tl.float32) + (-x2 * s1).to(dt).to(tl.float32)
        y2 = (x2 * c2).to(dt).to(tl.float32) + (x1 * s2).to(dt).to(tl.float32)
        tl.store(y_at + cols[None, :] * sy_d, y1.to(dt), mask=ok)
        tl.store(y_at + (cols + HALF)[None, :] * sy_d, y2.to(dt), mask=ok)
        x_at += sx_h
        y_at += sy_h


def _launch_rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    B, H, S, D = x.shape
    # The eager ops keep x's memory order (HF's q is a [B, S, H, D] buffer seen as [B, H, S, D]).
    y = torch.empty_like(x, dtype=out_dtype)
    BLOCK_S = 32
    _rotary_kernel[(B * triton.cdiv(S, BLOCK_S),)](
        x, cos, sin, y, H, S, D // 2, *x.stride(), *y.stride(), *cos.stride(), *sin.stride(),
        BLOCK_S=BLOCK_S, BLOCK_HALF=max(16, triton.next_power_of_2(D // 2)), num_warps=4,
    )  # fmt: skip
    return y


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
