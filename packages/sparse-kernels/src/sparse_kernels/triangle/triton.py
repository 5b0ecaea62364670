"""Triangle attention (A-shape + dense last rows) in one launch, plus an LSE merge of the last rows.

The launch is a 1-D grid of two kinds of programs:
- split programs (the first ``B * H * cdiv(L, BLOCK_M) * n_chunks`` ids): one tile of the last
  ``L`` query rows of one head against one chunk of keys; partial (out, lse) go to an fp32
  workspace;
- A-shape programs (the rest): one tile of the other rows against its sink blocks and its window
  blocks only.
In both kinds the query heads of one KV group have adjacent ids on the same tile, so the K/V
blocks they share are read from L2 (64x32 tiles at 128K on an H100: 3.87 ms, against 4.47-4.52
ms with the heads on a second grid axis, in earlier runs; `triangle.md`). A second tiny kernel
merges the chunks of the last rows by LSE into the output.
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
from .window import window_class

# Key chunks of the dense last rows are a multiple of every candidate's BLOCK_N.
_CHUNK_ALIGN = 128


def _key_tile_divides_chunks(config: LaunchConfig, blocks: tuple[int, ...] = ()) -> bool:
    """A split program walks its key chunk (a multiple of _CHUNK_ALIGN keys) in BLOCK_N tiles."""
    return _CHUNK_ALIGN % config["BLOCK_N"] == 0


# Launch configs: looked up per GPU, shape, window class and length in the tuned tables
# (sparse_kernels.tuning); a tuning run times these candidates. ``TMA=1`` loads the window's and
# the last rows' K/V tiles with the copy engine where the GPU and the layouts allow
# (``_triton/tma.py``), else index loads. On an H100, against index loads with the same tiles,
# the copy engine gave 0.92x-1.16x with 64-row, 4-warp tiles (mostly faster) and 0.82x-0.99x
# with 128-row ones (docs/results.md), so each config names its loads.
SPEC = KernelSpec(
    name="triangle",
    candidates=(
        LaunchConfig.of(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3),
        LaunchConfig.of(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
        LaunchConfig.of(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3),
        LaunchConfig.of(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
        LaunchConfig.of(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=2),
        # Narrow key tiles: 3.87 ms against 4.67 for 128x64 at 128K on an H100.
        LaunchConfig.of(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=3),
        LaunchConfig.of(BLOCK_M=64, BLOCK_N=64, TMA=1, num_warps=4, num_stages=3),
        LaunchConfig.of(BLOCK_M=64, BLOCK_N=32, TMA=1, num_warps=4, num_stages=3),
        LaunchConfig.of(BLOCK_M=64, BLOCK_N=32, TMA=1, num_warps=4, num_stages=2),
    ),
    interpreter=LaunchConfig.of(BLOCK_M=64, BLOCK_N=32),
    fp32=LaunchConfig.of(**FP32_CONFIG, num_warps=4, num_stages=1),
    fits=_key_tile_divides_chunks,
)


@triton.jit
def _tile_ptrs(base, b, h, rows, offs_d, stride_b, stride_h, stride_s, stride_d):
    """Pointers to ``rows`` x ``offs_d`` of batch ``b``, head ``h``."""
    return (
        base
        + b.to(tl.int64) * stride_b
        + h.to(tl.int64) * stride_h
        + rows[:, None].to(tl.int64) * stride_s
        + offs_d[None, :] * stride_d
    )


# Triton compiles one binary per divisibility-by-16 of each int argument; the chunk count only
# counts loop steps and workspace rows, so it is not specialized on (no second binary when a
# new length changes it).
@triton.jit(do_not_specialize=["n_chunks"])
def _triangle_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    lse_ptr,
    ws_out_ptr,
    ws_lse_ptr,
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
    B,
    H,
    GROUP,
    S_Q,
    S_KV,
    sm_scale,
    sink,
    window,
    L,
    n_chunks,
    chunk,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IEEE: tl.constexpr,
    SINK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TMA: tl.constexpr,
):
    pid = tl.program_id(0)
    H_KV = H // GROUP
    n_lq = tl.cdiv(L, BLOCK_M)
    n_split = B * H * n_lq * n_chunks
    tile_r = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    qk_scale = sm_scale * 1.4426950408889634
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # Each kind of program computes its rows and head in its own branch (a row vector selected
    # between the two kinds would stay live through the key loops).
    if pid < n_split:
        # pid = ((bk * n_lq + lq) * n_chunks + c) * GROUP + g with bk = b * H_KV + h_kv: the heads
        # of one KV group read the same key chunk side by side, so it can come from L2.
        c = pid // GROUP % n_chunks
        lq = pid // GROUP // n_chunks % n_lq
        bk = pid // GROUP // n_chunks // n_lq
        b = bk // H_KV
        h_kv = bk % H_KV
        h = h_kv * GROUP + pid % GROUP
        k_base = k_ptr + b.to(tl.int64) * stride_k_b + h_kv.to(tl.int64) * stride_k_h
        v_base = v_ptr + b.to(tl.int64) * stride_v_b + h_kv.to(tl.int64) * stride_v_h
        offs_m = S_Q - L + lq * BLOCK_M + tile_r
        q_ptrs = _tile_ptrs(
            q_ptr, b, h, offs_m, offs_d, stride_q_b, stride_q_h, stride_q_s, stride_q_d
        )
        q = tl.load(q_ptrs, mask=(offs_m < S_Q)[:, None] & d_ok[None, :], other=0.0)
        q_pos = offs_m + (S_KV - S_Q)
        p_lo = S_Q - L + lq * BLOCK_M + (S_KV - S_Q)
        hi = tl.maximum(tl.minimum(p_lo + BLOCK_M, S_KV), 0)
        # Key blocks [0, full_hi) are causally visible to every row of the tile.
        full_hi = tl.maximum(tl.minimum(p_lo + 1, S_KV), 0) // BLOCK_N * BLOCK_N
        # Dense causal rows over keys [c * chunk, (c + 1) * chunk).
        lo = c * chunk
        c_hi = tl.minimum(lo + chunk, hi)
        u_hi = tl.maximum(tl.minimum(full_hi, c_hi), lo)
        acc, l_i, m_i = _attn_tile_inner(
            acc, l_i, m_i, q, k_base, v_base, stride_k_s, stride_k_d, stride_v_s, stride_v_d,
            q_pos, offs_n, offs_d, lo, u_hi, S_KV, qk_scale, sink, window,
            D, BLOCK_D, BLOCK_N, False, True, False, IEEE, k_desc, v_desc, b, h_kv, TMA,
        )  # fmt: skip
        acc, l_i, m_i = _attn_tile_inner(
            acc, l_i, m_i, q, k_base, v_base, stride_k_s, stride_k_d, stride_v_s, stride_v_d,
            q_pos, offs_n, offs_d, u_hi, c_hi, S_KV, qk_scale, sink, window,
            D, BLOCK_D, BLOCK_N, True, True, False, IEEE, k_desc, v_desc, b, h_kv, TMA,
        )  # fmt: skip
        out, lse = _finish_rows(acc, l_i, m_i)
        r = lq * BLOCK_M + tile_r
        r_ok = r < L
        ws_row = ((b * H + h).to(tl.int64) * n_chunks + c) * L + r
        tl.store(
            ws_out_ptr + ws_row[:, None] * D + offs_d[None, :],
            out,
            mask=r_ok[:, None] & d_ok[None, :],
        )
        tl.store(ws_lse_ptr + ws_row, lse, mask=r_ok)
    else:
        # pid - n_split = (bk * n_tiles + t) * GROUP + g: the heads of one KV group on one row
        # tile run side by side.
        n_tiles = tl.cdiv(S_Q - L, BLOCK_M)
        a = pid - n_split
        t = a // GROUP % n_tiles
        bk = a // GROUP // n_tiles
        b = bk // H_KV
        h_kv = bk % H_KV
        h = h_kv * GROUP + a % GROUP
        k_base = k_ptr + b.to(tl.int64) * stride_k_b + h_kv.to(tl.int64) * stride_k_h
        v_base = v_ptr + b.to(tl.int64) * stride_v_b + h_kv.to(tl.int64) * stride_v_h
        row0 = t * BLOCK_M
        offs_m = row0 + tile_r
        q_ptrs = _tile_ptrs(
            q_ptr, b, h, offs_m, offs_d, stride_q_b, stride_q_h, stride_q_s, stride_q_d
        )
        q = tl.load(q_ptrs, mask=(offs_m < S_Q)[:, None] & d_ok[None, :], other=0.0)
        q_pos = offs_m + (S_KV - S_Q)
        p_lo = row0 + (S_KV - S_Q)
        p_hi = p_lo + BLOCK_M - 1
        hi = tl.maximum(tl.minimum(p_hi + 1, S_KV), 0)
        full_hi = tl.maximum(tl.minimum(p_lo + 1, S_KV), 0) // BLOCK_N * BLOCK_N
        # Sink tiles [0, sink_end) are SINK_N keys wide (16 for the usual sink of 8, not a whole
        # BLOCK_N, so they take index loads, not the BLOCK_N-key descriptors), with the full
        # sink/window/causal element mask. When the window's first block reaches below sink_end,
        # the window loops start at key 0 instead and their element mask (j < sink or inside the
        # window) takes in the sink: no key is visited twice.
        sink_end = tl.cdiv(sink, SINK_N) * SINK_N
        s0 = tl.maximum(p_lo - window + 1, 0) // BLOCK_N * BLOCK_N
        own_sink = s0 >= sink_end
        offs_s = tl.arange(0, SINK_N)
        acc, l_i, m_i = _attn_tile_inner(
            acc, l_i, m_i, q, k_base, v_base, stride_k_s, stride_k_d, stride_v_s, stride_v_d,
            q_pos, offs_s, offs_d, 0, tl.where(own_sink, tl.minimum(sink_end, hi), 0), S_KV,
            qk_scale, sink, window, D, BLOCK_D, SINK_N, True, True, True, IEEE,
        )  # fmt: skip
        # Window blocks from s0; [f_lo, f_hi) is inside every row's window and causally visible.
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
        o_ok = offs_m < S_Q - L
        o_ptrs = _tile_ptrs(
            out_ptr, b, h, offs_m, offs_d, stride_o_b, stride_o_h, stride_o_s, stride_o_d
        )
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=o_ok[:, None] & d_ok[None, :])
        tl.store(lse_ptr + (b * H + h).to(tl.int64) * S_Q + offs_m, lse, mask=o_ok)


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


def sink_tile(sink: int) -> int:
    """Width of the sink tiles: the next power of two of ``sink``, between 16 (the narrowest
    ``tl.dot``) and 32. Larger sinks take several tiles: the sink loop's pipelined K/V buffers
    add to the window loop's in shared memory, and 128-key sink tiles with D=128 fit no tile
    config on an H100."""
    return min(32, max(16, triton.next_power_of_2(max(sink, 1))))


def default_chunk(S_KV: int) -> int:
    """Keys per split program of the dense last rows: about 32 chunks, at least 1024 keys."""
    want = max(1024, triton.cdiv(S_KV, 32))
    return triton.cdiv(want, _CHUNK_ALIGN) * _CHUNK_ALIGN


def fwd_grid(B: int, H: int, S_Q: int, L: int, n_chunks: int, block_m: int) -> tuple[int]:
    """Grid of ``_triangle_fwd_kernel`` for BLOCK_M = ``block_m``: the split programs of every
    head, then the A-shape programs of every (batch, head, row tile)."""
    n_split = B * H * triton.cdiv(L, block_m) * n_chunks
    return (n_split + B * H * triton.cdiv(S_Q - L, block_m),)


def _launch_triangle_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sink: int,
    window: int,
    last: int,
    scale: float,
    chunk: int | None = None,
    config: LaunchConfig | None = None,
    tma: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate, launch. ``config``: this launch config instead of the looked-up one (tests and
    the tuner run each candidate). ``tma``: load the window's and the last rows' K/V tiles with
    the copy engine (True) or with index loads (False); None follows the config: the copy engine
    where it names ``TMA=1`` and :func:`~sparse_kernels._triton.tma.tma_default` allows it."""
    check_int32_key_offsets(k, v, "triangle_attention")
    B, H, S_Q, D = q.shape
    H_KV, S_KV = k.shape[1], k.shape[2]
    if config is None:
        config = choose_config(
            SPEC, device=q.device, head_dim=D, dtype=q.dtype, group=H // H_KV, seq_len=S_KV,
            variant=window_class(window),
        )  # fmt: skip
    elif not _key_tile_divides_chunks(config):
        raise ValueError(
            f"triangle_attention: launch config BLOCK_N must divide {_CHUNK_ALIGN}, got {config}"
        )
    L = min(last, S_Q)
    chunk = default_chunk(S_KV) if chunk is None else chunk
    if chunk <= 0 or chunk % _CHUNK_ALIGN:
        raise ValueError(f"chunk: expected a positive multiple of {_CHUNK_ALIGN}, got {chunk}")
    n_chunks = triton.cdiv(S_KV, chunk) if L > 0 else 0
    options = config.launch_kwargs()
    named = options.pop("TMA", None)
    if named not in (None, 1):
        raise ValueError(
            f"triangle_attention: launch config TMA: expected 1 or no TMA key, got {named} in {config}"
        )
    if named is None and tma is None:
        tma = False
    k_desc, v_desc = kv_descriptors(
        k, v, block_n=config["BLOCK_N"], block_d=block_d(D), tma=tma, op="triangle_attention"
    )
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((B, H, S_Q), dtype=torch.float32, device=q.device)
    if L > 0:  # the split programs' partial results
        ws_out = torch.empty((B * H, n_chunks, L, D), dtype=torch.float32, device=q.device)
        ws_lse = torch.empty((B * H, n_chunks, L), dtype=torch.float32, device=q.device)
    else:  # no split program: never read, so lse (float32, like them) stands in
        ws_out = ws_lse = lse

    launch(
        _triangle_fwd_kernel, fwd_grid(B, H, S_Q, L, n_chunks, config["BLOCK_M"]),
        (q, k, v, out, lse, ws_out, ws_lse, k_desc, v_desc),
        (*q.stride(), *k.stride(), *v.stride(), *out.stride(),
         B, H, H // H_KV, S_Q, S_KV, scale, sink, window, L, n_chunks, chunk),
        D=D, BLOCK_D=block_d(D), IEEE=q.dtype == torch.float32, SINK_N=sink_tile(sink),
        TMA=k_desc is not None, **options,
    )  # fmt: skip
    if L > 0:
        BLOCK_R = 32
        # Axis 1 is B * H (at most 65535 programs on CUDA's second grid axis).
        launch(
            _triangle_merge_kernel, (triton.cdiv(L, BLOCK_R), B * H), (ws_out, ws_lse, out, lse),
            (*out.stride(), H, S_Q, L, n_chunks), D=D, BLOCK_D=block_d(D), BLOCK_R=BLOCK_R,
        )  # fmt: skip
    return out, lse
