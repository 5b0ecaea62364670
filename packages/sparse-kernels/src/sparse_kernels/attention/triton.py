"""Dense flash-attention forward with LSE (Triton).

One program computes BLOCK_M query rows of one (batch, head) against all keys it may see,
with the online softmax in fp32. Keys are walked in two phases: blocks that every row of the
tile sees in full (no element mask, no bounds check) and the remaining blocks (causal diagonal
and the ragged tail), where the element mask is applied. On Hopper and later the K/V tiles come
through the copy engine (``_triton/tma.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton.config import FP32_CONFIG, block_d
from .._triton.inner import _attn_tile_inner, _finish_rows
from .._triton.launch import launch
from .._triton.tma import kv_descriptors
from .._validate import check_int32_key_offsets
from ..tuning import KernelSpec, LaunchConfig, choose_config

# Launch configs: looked up per GPU, shape and length in the tuned tables (sparse_kernels.tuning);
# a tuning run times these candidates.
SPEC = KernelSpec(
    name="attention",
    candidates=(
        LaunchConfig.of(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3),
        LaunchConfig.of(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
        LaunchConfig.of(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3),
        LaunchConfig.of(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2),
        LaunchConfig.of(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
    ),
    interpreter=LaunchConfig.of(BLOCK_M=64, BLOCK_N=32),
    fp32=LaunchConfig.of(**FP32_CONFIG, num_warps=4, num_stages=1),
)


@triton.jit
def _attn_fwd_kernel(
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
    sm_scale,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TMA: tl.constexpr,
):
    # Heaviest causal tiles (last rows) first, so the tail of the grid is short work.
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    h_kv = h // GROUP

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < S_Q
    d_ok = offs_d < D

    q_ptrs = (
        q_ptr
        + b.to(tl.int64) * stride_q_b
        + h.to(tl.int64) * stride_q_h
        + offs_m[:, None].to(tl.int64) * stride_q_s
        + offs_d[None, :] * stride_q_d
    )
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    k_base = k_ptr + b.to(tl.int64) * stride_k_b + h_kv.to(tl.int64) * stride_k_h
    v_base = v_ptr + b.to(tl.int64) * stride_v_b + h_kv.to(tl.int64) * stride_v_h

    qk_scale = sm_scale * 1.4426950408889634
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # Absolute position of each query row (DESIGN.md: row i sits at i + S_KV - S_Q).
    q_pos = offs_m + (S_KV - S_Q)
    if IS_CAUSAL:
        first_pos = start_m * BLOCK_M + (S_KV - S_Q)
        hi = tl.minimum(first_pos + BLOCK_M, S_KV)
        full_hi = tl.minimum(first_pos + 1, S_KV)
    else:
        hi = S_KV
        full_hi = S_KV
    hi = tl.maximum(hi, 0)
    # Key blocks [0, full_hi) are entirely visible to every row of this tile.
    full_hi = tl.maximum(full_hi, 0) // BLOCK_N * BLOCK_N

    acc, l_i, m_i = _attn_tile_inner(
        acc, l_i, m_i, q, k_base, v_base,
        stride_k_s, stride_k_d, stride_v_s, stride_v_d,
        q_pos, offs_n, offs_d, 0, full_hi, S_KV, qk_scale, 0, 0,
        D, BLOCK_D, BLOCK_N, False, IS_CAUSAL, False, IEEE, k_desc, v_desc, b, h_kv, TMA,
    )  # fmt: skip
    acc, l_i, m_i = _attn_tile_inner(
        acc, l_i, m_i, q, k_base, v_base,
        stride_k_s, stride_k_d, stride_v_s, stride_v_d,
        q_pos, offs_n, offs_d, full_hi, hi, S_KV, qk_scale, 0, 0,
        D, BLOCK_D, BLOCK_N, True, IS_CAUSAL, False, IEEE, k_desc, v_desc, b, h_kv, TMA,
    )  # fmt: skip

    out, lse = _finish_rows(acc, l_i, m_i)

    o_ptrs = (
        out_ptr
        + b.to(tl.int64) * stride_o_b
        + h.to(tl.int64) * stride_o_h
        + offs_m[:, None].to(tl.int64) * stride_o_s
        + offs_d[None, :] * stride_o_d
    )
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    lse_ptrs = lse_ptr + bh.to(tl.int64) * S_Q + offs_m
    tl.store(lse_ptrs, lse, mask=row_ok)


def _launch_attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float,
    config: LaunchConfig | None = None,
    tma: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate, launch. ``config``: this launch config instead of the looked-up one (tests and
    the tuner run each candidate). ``tma``: load K/V tiles with the copy engine (True), with
    index loads (False), or as :func:`~sparse_kernels._triton.tma.tma_default` picks (None)."""
    check_int32_key_offsets(k, v, "attention")
    B, H, S_Q, D = q.shape
    H_KV, S_KV = k.shape[1], k.shape[2]
    if config is None:
        config = choose_config(
            SPEC, device=q.device, head_dim=D, dtype=q.dtype, group=H // H_KV, seq_len=S_KV,
            variant="causal" if causal else "full",
        )  # fmt: skip
    k_desc, v_desc = kv_descriptors(
        k, v, block_n=config["BLOCK_N"], block_d=block_d(D), tma=tma, op="attention"
    )
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((B, H, S_Q), dtype=torch.float32, device=q.device)
    launch(
        _attn_fwd_kernel, (triton.cdiv(S_Q, config["BLOCK_M"]), B * H),
        (q, k, v, out, lse, k_desc, v_desc),
        (*q.stride(), *k.stride(), *v.stride(), *out.stride(), H, H // H_KV, S_Q, S_KV, scale),
        D=D, BLOCK_D=block_d(D), IS_CAUSAL=bool(causal), IEEE=q.dtype == torch.float32,
        TMA=k_desc is not None, **config.launch_kwargs(),
    )  # fmt: skip
    return out, lse
