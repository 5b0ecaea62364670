"""Block-sparse flash-attention forward over FlexAttention block lists (Triton).

One program computes a TILE_M-row slice of one query block of one (batch, head). It reads the
block's kv index lists once (full list, then partial list) and walks the listed key blocks in
TILE_N sub-tiles with the online softmax in fp32, in one flat loop per list (so the compiler can
pipeline the K/V loads). Since ``mask_mod`` is not evaluated, full and partial blocks differ only
in which list they come from: a sub-tile gets the element mask only where it is needed (it
crosses the causal diagonal or the key bound). On Hopper and later the K/V sub-tiles come
through the copy engine (``_triton/tma.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton.config import block_d
from .._triton.inner import _finish_rows, _load_kv_tile
from .._triton.launch import launch
from .._triton.tma import kv_descriptors
from ..tuning import KernelSpec, LaunchConfig, choose_config


def _tiles_divide_blocks(config: LaunchConfig, blocks: tuple[int, ...]) -> bool:
    """A program covers TILE_M rows of one mask block and walks its listed key blocks in TILE_N
    sub-tiles: both tiles must divide the mask's blocks (64 or 128)."""
    bm, bn = blocks
    return bm % config["TILE_M"] == 0 and bn % config["TILE_N"] == 0


# Launch configs: looked up per GPU, shape and length in the tuned tables (sparse_kernels.tuning);
# a tuning run times the candidates that fit the mask's blocks.
SPEC = KernelSpec(
    name="block_sparse",
    candidates=(
        LaunchConfig.of(TILE_M=128, TILE_N=128, num_warps=8, num_stages=3),
        LaunchConfig.of(TILE_M=128, TILE_N=64, num_warps=8, num_stages=3),
        LaunchConfig.of(TILE_M=128, TILE_N=64, num_warps=4, num_stages=3),
        LaunchConfig.of(TILE_M=128, TILE_N=128, num_warps=8, num_stages=2),
        LaunchConfig.of(TILE_M=64, TILE_N=64, num_warps=4, num_stages=3),
        LaunchConfig.of(TILE_M=64, TILE_N=128, num_warps=4, num_stages=2),
    ),
    interpreter=LaunchConfig.of(TILE_M=64, TILE_N=64),
    # fp32 operands take exact (ieee) dots: one small tile; 64 divides every mask block.
    fp32=LaunchConfig.of(TILE_M=64, TILE_N=64, num_warps=4, num_stages=1),
    fits=_tiles_divide_blocks,
    fallback=lambda blocks: LaunchConfig.of(TILE_M=64, TILE_N=64, num_warps=4, num_stages=2),
)


@triton.jit
def _walk_list(
    acc, l_i, m_i, q, k_base, v_base, idx_base, n_blocks,
    stride_k_s, stride_k_d, stride_v_s, stride_v_d,
    q_pos, first_pos, offs_n, offs_d, S_KV, qk_scale, k_desc, v_desc, kv_b, kv_h,
    D: tl.constexpr, BLOCK_D: tl.constexpr, MASK_BN: tl.constexpr, TILE_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, IEEE: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """Online softmax over the listed kv blocks, one flat (software-pipelined) loop over their
    TILE_N sub-tiles. The element mask is applied only to sub-tiles that cross the causal
    diagonal or the key end."""
    SPLIT = MASK_BN // TILE_N
    for t in range(0, n_blocks * SPLIT):
        kb = tl.load(idx_base + t // SPLIT).to(tl.int64)
        start_n = kb * MASK_BN + (t % SPLIT) * TILE_N
        cols = start_n + offs_n
        col_ok = cols < S_KV
        k, v = _load_kv_tile(
            k_base, v_base, stride_k_s, stride_k_d, stride_v_s, stride_v_d, cols, offs_d, S_KV,
            k_desc, v_desc, kv_b, kv_h, start_n, D, BLOCK_D, TILE_N, True, TMA,
        )  # fmt: skip
        if IEEE:
            qk = tl.dot(q, k, input_precision="ieee")
        else:
            qk = tl.dot(q, k)
        needs = start_n + TILE_N > S_KV
        if IS_CAUSAL:
            needs = needs | (start_n + TILE_N - 1 > first_pos)
        if needs:
            keep = col_ok[None, :]
            if IS_CAUSAL:
                keep = keep & (cols[None, :] <= q_pos[:, None])
            qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        # A row that has seen no key yet keeps m = -inf; use 0 so exp2 gives 0, not NaN.
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if IEEE:
            acc = tl.dot(p, v, acc, input_precision="ieee")
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _block_sparse_fwd_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr,
    num_ptr, idx_ptr, fnum_ptr, fidx_ptr, k_desc, v_desc,
    stride_q_b, stride_q_h, stride_q_s, stride_q_d,
    stride_k_b, stride_k_h, stride_k_s, stride_k_d,
    stride_v_b, stride_v_h, stride_v_s, stride_v_d,
    stride_o_b, stride_o_h, stride_o_s, stride_o_d,
    stride_n_b, stride_n_h, stride_n_m,
    stride_i_b, stride_i_h, stride_i_m,
    stride_fn_b, stride_fn_h, stride_fn_m,
    stride_fi_b, stride_fi_h, stride_fi_m,
    H, GROUP, S_Q, S_KV, sm_scale,
    D: tl.constexpr, BLOCK_D: tl.constexpr, IS_CAUSAL: tl.constexpr, IEEE: tl.constexpr,
    HAS_FULL: tl.constexpr, MASK_BM: tl.constexpr, MASK_BN: tl.constexpr,
    TILE_M: tl.constexpr, TILE_N: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    # Last query blocks first: under a causal mask their lists are the longest, so the grid ends
    # on short work (`block_sparse.md`).
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    h_kv = h // GROUP
    mblk = (pid_m // (MASK_BM // TILE_M)).to(tl.int64)
    row0 = pid_m * TILE_M

    offs_m = row0 + tl.arange(0, TILE_M)
    offs_n = tl.arange(0, TILE_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < S_Q
    d_ok = offs_d < D

    q_ptrs = (
        q_ptr + b * stride_q_b + h * stride_q_h
        + offs_m[:, None].to(tl.int64) * stride_q_s + offs_d[None, :] * stride_q_d
    )  # fmt: skip
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    k_base = k_ptr + b * stride_k_b + h_kv * stride_k_h
    v_base = v_ptr + b * stride_v_b + h_kv * stride_v_h

    qk_scale = sm_scale * 1.4426950408889634
    m_i = tl.full([TILE_M], float("-inf"), tl.float32)
    l_i = tl.zeros([TILE_M], tl.float32)
    acc = tl.zeros([TILE_M, BLOCK_D], tl.float32)

    # DESIGN.md alignment: row i sits at position i + S_KV - S_Q.
    q_pos = offs_m + (S_KV - S_Q)
    first_pos = row0 + (S_KV - S_Q)

    if HAS_FULL:
        n_full = tl.load(fnum_ptr + b * stride_fn_b + h * stride_fn_h + mblk * stride_fn_m)
        fidx_base = fidx_ptr + b * stride_fi_b + h * stride_fi_h + mblk * stride_fi_m
        acc, l_i, m_i = _walk_list(
            acc, l_i, m_i, q, k_base, v_base, fidx_base, n_full,
            stride_k_s, stride_k_d, stride_v_s, stride_v_d,
            q_pos, first_pos, offs_n, offs_d, S_KV, qk_scale, k_desc, v_desc, b, h_kv,
            D, BLOCK_D, MASK_BN, TILE_N, IS_CAUSAL, IEEE, TMA,
        )  # fmt: skip
    n_part = tl.load(num_ptr + b * stride_n_b + h * stride_n_h + mblk * stride_n_m)
    idx_base = idx_ptr + b * stride_i_b + h * stride_i_h + mblk * stride_i_m
    acc, l_i, m_i = _walk_list(
        acc, l_i, m_i, q, k_base, v_base, idx_base, n_part,
        stride_k_s, stride_k_d, stride_v_s, stride_v_d,
        q_pos, first_pos, offs_n, offs_d, S_KV, qk_scale, k_desc, v_desc, b, h_kv,
        D, BLOCK_D, MASK_BN, TILE_N, IS_CAUSAL, IEEE, TMA,
    )  # fmt: skip

    out, lse = _finish_rows(acc, l_i, m_i)
    o_ptrs = (
        out_ptr + b * stride_o_b + h * stride_o_h
        + offs_m[:, None].to(tl.int64) * stride_o_s + offs_d[None, :] * stride_o_d
    )  # fmt: skip
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    tl.store(lse_ptr + bh.to(tl.int64) * S_Q + offs_m, lse, mask=row_ok)


def _bcast_strides(t: torch.Tensor, n: int) -> list[int]:
    """Strides of the first ``n`` dims, 0 where a batch/head dim of size 1 is broadcast."""
    return [0 if (i < 2 and t.shape[i] == 1) else t.stride(i) for i in range(n)]


def _unit_last_stride(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its last dim contiguous: the kernel steps through a list by one element. A copy
    only for lists that are not (a strided view, a column-major tensor); they are small."""
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _launch_block_sparse_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_num_blocks: torch.Tensor,
    kv_indices: torch.Tensor,
    full_kv_num_blocks: torch.Tensor | None,
    full_kv_indices: torch.Tensor | None,
    *,
    block_m: int,
    block_n: int,
    causal: bool,
    scale: float,
    config: LaunchConfig | None = None,
    tma: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate, launch. ``config``: this launch config instead of the looked-up one (tests and
    the tuner run each candidate); its tiles must divide ``(block_m, block_n)``. ``tma``: load
    K/V tiles with the copy engine (True), with index loads (False), or as
    :func:`~sparse_kernels._triton.tma.tma_default` picks (None)."""
    B, H, S_Q, D = q.shape
    H_KV, S_KV = k.shape[1], k.shape[2]
    blocks = (block_m, block_n)
    if config is None:
        config = choose_config(
            SPEC, device=q.device, head_dim=D, dtype=q.dtype, group=H // H_KV, seq_len=S_KV,
            variant="causal" if causal else "full", blocks=blocks,
        )  # fmt: skip
    elif not _tiles_divide_blocks(config, blocks):
        raise ValueError(
            f"block_sparse_attention: launch config tiles must divide the mask blocks {blocks}, "
            f"got {config}"
        )
    k_desc, v_desc = kv_descriptors(
        k, v, block_n=config["TILE_N"], block_d=block_d(D), tma=tma, op="block_sparse_attention"
    )
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((B, H, S_Q), dtype=torch.float32, device=q.device)
    has_full = full_kv_num_blocks is not None
    kv_indices = _unit_last_stride(kv_indices)
    if has_full:
        full_kv_indices = _unit_last_stride(full_kv_indices)
    else:
        full_kv_num_blocks, full_kv_indices = kv_num_blocks, kv_indices
    nqb = -(-S_Q // block_m)
    launch(
        _block_sparse_fwd_kernel, (nqb * (block_m // config["TILE_M"]), B * H),
        (q, k, v, out, lse,
         kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, k_desc, v_desc),
        (*q.stride(), *k.stride(), *v.stride(), *out.stride(),
         *_bcast_strides(kv_num_blocks, 3), *_bcast_strides(kv_indices, 3),
         *_bcast_strides(full_kv_num_blocks, 3), *_bcast_strides(full_kv_indices, 3),
         H, H // H_KV, S_Q, S_KV, scale),
        D=D, BLOCK_D=block_d(D), IS_CAUSAL=bool(causal), IEEE=q.dtype == torch.float32,
        HAS_FULL=has_full, MASK_BM=block_m, MASK_BN=block_n, TMA=k_desc is not None,
        **config.launch_kwargs(),
    )  # fmt: skip
    return out, lse
