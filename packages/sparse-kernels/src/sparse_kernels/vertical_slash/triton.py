"""Vertical-slash flash-attention forward (Triton), one launch for every (batch, head).

One program per (query block, batch * head), heaviest (last) query blocks first. It walks the
block's merged key-block ranges as dense tiles (no element mask strictly below the diagonal,
causal mask on the diagonal tiles), then the leftover vertical columns, gathered TILE_N at a
time through their indices (loaded once per chunk) with the causal mask. On Hopper and later the
ranges' tiles come through the copy engine (``_triton/tma.py``).

With ``MERGE`` the ranges have been attended by another engine (FA4's block-sparse kernel over
the same tiles): the program starts its online softmax from that result (``lse`` as the running
maximum, ``out`` as the accumulator, a sum of 1), walks the columns only, and writes the combined
``out`` and ``lse`` over it; a block without leftover columns is left as it is. No partial output
is materialised and no merge pass runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton.config import FP32_CONFIG, block_d, on_interpreter
from .._triton.inner import _attn_tile_inner, _finish_rows, _resume_rows
from .._triton.launch import launch
from .._triton.tma import kv_descriptors
from ..tuning import KernelSpec, LaunchConfig, choose_config

# Launch configs: looked up per GPU, shape and length in the tuned tables (sparse_kernels.tuning);
# a tuning run times these candidates. The tiles are the index's blocks (BLOCK_M x BLOCK_N), so
# only warps and stages are chosen, per block shape (the table variant "<BLOCK_M>x<BLOCK_N>"). A
# config may also name TILE_N, the keys per step (a divisor of BLOCK_N): the merge's does.
SPEC = KernelSpec(
    name="vertical_slash",
    candidates=(
        LaunchConfig.of(num_warps=4, num_stages=2),
        LaunchConfig.of(num_warps=4, num_stages=3),
        LaunchConfig.of(num_warps=8, num_stages=2),
        LaunchConfig.of(num_warps=8, num_stages=3),
    ),
    interpreter=LaunchConfig.of(num_warps=4, num_stages=1),
    # fp32: exact dots, slow to compile; the fewest stages and warps (and TILE_N, see _tile_n).
    fp32=LaunchConfig.of(num_warps=4, num_stages=2),
)
# The merge (MERGE) of 16-bit inputs: it walks gathered columns only, no ranges, so it does not
# take the whole kernel's table entries. On an H100 (128K tokens, the Qwen2.5-VL-7B shape, 128x128
# blocks, local and clustered slashes) 64-key steps with 4 warps and 2 stages made the merge
# 1.16x-1.19x faster than the table's entry (128-key steps, 8 warps, 3 stages); other GPUs take it
# unmeasured (docs/results.md, "The merge's own launch config").
MERGE_CONFIG = LaunchConfig.of(TILE_N=64, num_warps=4, num_stages=2)


@triton.jit
def _vertical_slash_fwd_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr,
    rcount_ptr, rstart_ptr, rend_ptr, ccount_ptr, cols_ptr, k_desc, v_desc,
    stride_q_b, stride_q_h, stride_q_s, stride_q_d,
    stride_k_b, stride_k_h, stride_k_s, stride_k_d,
    stride_v_b, stride_v_h, stride_v_s, stride_v_d,
    stride_o_b, stride_o_h, stride_o_s, stride_o_d,
    stride_l_b, stride_l_h, stride_l_s,
    R, C, H, GROUP, S, sm_scale,
    D: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TILE_N: tl.constexpr, MERGE: tl.constexpr,
    TMA: tl.constexpr,
):  # fmt: skip
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    h_kv = h // GROUP
    row = bh.to(tl.int64) * tl.num_programs(0) + start_m  # (b, h, m) row of the index tensors

    n_cols = tl.load(ccount_ptr + row)
    # Nested, not one `and`: MERGE is a constexpr, so the kernel without it compiles no check.
    if MERGE:  # noqa: SIM102
        if n_cols == 0:
            return  # the other engine's result is already this block's: nothing to read or write

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, TILE_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < S
    d_ok = offs_d < D

    q_ptrs = (
        q_ptr + b * stride_q_b + h * stride_q_h
        + offs_m[:, None].to(tl.int64) * stride_q_s + offs_d[None, :] * stride_q_d
    )  # fmt: skip
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    k_base = k_ptr + b * stride_k_b + h_kv * stride_k_h
    v_base = v_ptr + b * stride_v_b + h_kv * stride_v_h

    qk_scale = sm_scale * 1.4426950408889634
    o_ptrs = (
        out_ptr + b * stride_o_b + h * stride_o_h
        + offs_m[:, None].to(tl.int64) * stride_o_s + offs_d[None, :] * stride_o_d
    )  # fmt: skip
    l_ptrs = lse_ptr + b * stride_l_b + h * stride_l_h + offs_m.to(tl.int64) * stride_l_s
    rd_ok = row_ok[:, None] & d_ok[None, :]
    if MERGE:
        acc, l_i, m_i = _resume_rows(o_ptrs, l_ptrs, row_ok, rd_ok)  # the ranges' result
        n_ranges = 0
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        n_ranges = tl.load(rcount_ptr + row)
    q_pos = offs_m
    # Keys [0, full_hi) are visible to every row of the tile (and in bounds).
    full_hi = tl.minimum(start_m * BLOCK_M + 1, S) // BLOCK_N * BLOCK_N

    for r in range(0, n_ranges):
        lo = tl.load(rstart_ptr + row * R + r).to(tl.int64) * BLOCK_N
        hi = tl.minimum(tl.load(rend_ptr + row * R + r).to(tl.int64) * BLOCK_N, S)
        mid = tl.maximum(tl.minimum(hi, full_hi), lo)
        acc, l_i, m_i = _attn_tile_inner(
            acc, l_i, m_i, q, k_base, v_base,
            stride_k_s, stride_k_d, stride_v_s, stride_v_d,
            q_pos, offs_n, offs_d, lo, mid, S, qk_scale, 0, 0,
            D, BLOCK_D, TILE_N, False, True, False, IEEE, k_desc, v_desc, b, h_kv, TMA,
        )  # fmt: skip
        acc, l_i, m_i = _attn_tile_inner(
            acc, l_i, m_i, q, k_base, v_base,
            stride_k_s, stride_k_d, stride_v_s, stride_v_d,
            q_pos, offs_n, offs_d, mid, hi, S, qk_scale, 0, 0,
            D, BLOCK_D, TILE_N, True, True, False, IEEE, k_desc, v_desc, b, h_kv, TMA,
        )  # fmt: skip

    for c0 in range(0, n_cols, TILE_N):
        c_ok = c0 + offs_n < n_cols
        cols = tl.load(cols_ptr + row * C + c0 + offs_n, mask=c_ok, other=0).to(tl.int64)
        k = tl.load(
            k_base + cols[None, :] * stride_k_s + offs_d[:, None] * stride_k_d,
            mask=c_ok[None, :] & d_ok[:, None], other=0.0,
        )  # fmt: skip
        v = tl.load(
            v_base + cols[:, None] * stride_v_s + offs_d[None, :] * stride_v_d,
            mask=c_ok[:, None] & d_ok[None, :], other=0.0,
        )  # fmt: skip
        if IEEE:
            qk = tl.dot(q, k, input_precision="ieee")
        else:
            qk = tl.dot(q, k)
        keep = c_ok[None, :] & (cols[None, :] <= q_pos[:, None])
        qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
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

    out, lse = _finish_rows(acc, l_i, m_i)
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=rd_ok)
    tl.store(l_ptrs, lse, mask=row_ok)


def _tile_n(dtype: torch.dtype, block_n: int) -> int:
    # Key ranges are whole BLOCK_N blocks, so any tile dividing BLOCK_N walks them exactly. fp32
    # dots are exact ("ieee", FMA-emulated): a 64x128x128 one takes ptxas minutes, so fp32 on the
    # GPU walks 32-key tiles, like the fp32 config of the other kernels (FP32_CONFIG).
    if dtype == torch.float32 and not on_interpreter():
        return min(block_n, FP32_CONFIG["BLOCK_N"])
    return block_n


def _launch_vertical_slash_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    index,
    *,
    scale: float,
    config: LaunchConfig | None = None,
    merge_into: tuple[torch.Tensor, torch.Tensor] | None = None,
    tma: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate, launch. ``config``: this launch config instead of the looked-up one (tests and
    the tuner run each candidate); the merge of 16-bit inputs on a GPU defaults to
    :data:`MERGE_CONFIG`. ``merge_into``: ``(out [B, H, S, D], lse [B, H, S])``, any strides,
    holding the index's ranges already attended; only the columns are walked, and the result is
    written over them (the kernel's ``MERGE``; query blocks without columns are not touched).
    ``tma``: load the ranges' K/V tiles with the copy engine (True), with index loads (False),
    or as :func:`~sparse_kernels._triton.tma.tma_default` picks (None); columns are gathered by
    index either way, and ``MERGE`` walks no range."""
    B, H, S, D = q.shape
    H_KV = k.shape[1]
    gpu_16bit = q.dtype != torch.float32 and not on_interpreter()
    if config is None and merge_into is not None and gpu_16bit:
        config = MERGE_CONFIG
    if config is None:
        blocks = (index.block_m, index.block_n)
        config = choose_config(
            SPEC, device=q.device, head_dim=D, dtype=q.dtype, group=H // H_KV, seq_len=S,
            variant=f"{index.block_m}x{index.block_n}", blocks=blocks,
        )  # fmt: skip
    if merge_into is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = torch.empty((B, H, S), dtype=torch.float32, device=q.device)
    else:
        out, lse = merge_into
    nqb = -(-S // index.block_m)
    tiles = dict(config.tiles)
    tile_n = tiles.pop("TILE_N", _tile_n(q.dtype, index.block_n))
    if tiles or index.block_n % tile_n or tile_n < 16:
        raise ValueError(
            f"vertical_slash config: TILE_N (>= 16, dividing the index's key block "
            f"{index.block_n}) is its only tile, got {config}"
        )
    k_desc, v_desc = kv_descriptors(
        k, v, block_n=tile_n, block_d=block_d(D), tma=False if merge_into else tma,
        op="vertical_slash_attention",
    )  # fmt: skip
    rs, re = index.range_start.contiguous(), index.range_end.contiguous()
    cols = index.columns.contiguous()
    launch(
        _vertical_slash_fwd_kernel, (nqb, B * H),
        (q, k, v, out, lse, index.range_count.contiguous(), rs, re,
         index.column_count.contiguous(), cols, k_desc, v_desc),
        (*q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride(),
         rs.shape[-1], cols.shape[-1], H, H // H_KV, S, scale),
        D=D, BLOCK_D=block_d(D), IEEE=q.dtype == torch.float32,
        BLOCK_M=index.block_m, BLOCK_N=index.block_n, TILE_N=tile_n,
        MERGE=merge_into is not None, TMA=k_desc is not None, num_warps=config.num_warps,
        num_stages=config.num_stages,
    )  # fmt: skip
    return out, lse
