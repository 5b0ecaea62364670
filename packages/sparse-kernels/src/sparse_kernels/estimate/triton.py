"""Line scores of the last query rows in two Triton passes, without the ``[L, S]`` score matrix.

Pass 1 (``_lse_kernel``): one program per (key chunk, head) streams its keys once and writes the
partial row max / row sum (base 2) of the ``L`` query rows; torch merges the chunks into the
log-sum-exp of each row.

Pass 2 (``_lines_kernel``): one program per (block of ``BO`` diagonal offsets, head). Offsets
``o0 .. o0 + BO`` of rows ``r_0 .. r_0 + L - 1`` touch the keys of one window of ``BO + BLOCK_L``
keys; the program computes the probabilities of that window once, reads the diagonals out of the
tile with a gather along the key axis (slash sums, column sums of the skewed tile) and writes the
column sums of the ``BO`` keys it owns (vertical sums). Windows of consecutive offset blocks own
consecutive key ranges, so every key and every offset is written by exactly one program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton.config import LOG2E, autotune_off, block_d, configs, on_interpreter


def _prune_lines(configs_, named_args, **kwargs):
    """fp32 (exact dots) and autotune-off runs: the smallest config."""
    if on_interpreter():
        return configs_
    if named_args["q_ptr"].dtype == torch.float32 or autotune_off():
        return [min(configs_, key=lambda c: (c.kwargs["OB_PER"], c.num_warps))]
    return configs_


@triton.jit
def _lse_kernel(
    q_ptr,
    k_ptr,
    m_ptr,
    l_ptr,
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
    row_start,
    chunk,
    n_chunks,
    qk_scale,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
):
    c = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_l = tl.arange(0, BLOCK_L)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    q = tl.load(
        q_ptr
        + b.to(tl.int64) * stride_q_b
        + h.to(tl.int64) * stride_q_h
        + offs_l[:, None] * stride_q_s
        + offs_d[None, :],
        mask=(offs_l[:, None] < L) & (offs_d[None, :] < D),
        other=0.0,
    )
    kb = k_ptr + b.to(tl.int64) * stride_k_b + (h // GROUP).to(tl.int64) * stride_k_h
    r = row_start + offs_l
    m_i = tl.full([BLOCK_L], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_L], dtype=tl.float32)
    lo = c * chunk
    hi = tl.minimum(lo + chunk, tl.minimum(S, row_start + L))
    for j0 in range(lo, hi, BLOCK_N):
        j = j0 + offs_n
        kt = tl.load(
            kb + j[None, :].to(tl.int64) * stride_k_s + offs_d[:, None],
            mask=(j[None, :] < hi) & (offs_d[:, None] < D),
            other=0.0,
        )
        if IEEE:
            s = tl.dot(q, kt, input_precision="ieee")
        else:
            s = tl.dot(q, kt)
        s = s * qk_scale
        s = tl.where((j[None, :] <= r[:, None]) & (j[None, :] < hi), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.exp2(m_i - m_safe) + tl.sum(tl.exp2(s - m_safe[:, None]), 1)
        m_i = m_new
    out = bh * n_chunks * BLOCK_L + c * BLOCK_L + offs_l
    tl.store(m_ptr + out, m_i)
    tl.store(l_ptr + out, l_i)


@triton.autotune(
    configs=configs(
        [
            dict(OB_PER=1, num_warps=4, num_stages=1),
            dict(OB_PER=4, num_warps=4, num_stages=2),
            dict(OB_PER=16, num_warps=4, num_stages=2),
            dict(OB_PER=16, num_warps=8, num_stages=2),
        ],
        dict(OB_PER=2),
    ),
    key=["D", "BLOCK_L", "IEEE"],
    prune_configs_by={"early_config_prune": _prune_lines},
)
@triton.jit
def _lines_kernel(
    q_ptr,
    k_ptr,
    lse_ptr,
    vert_ptr,
    slash_ptr,
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
    row_start,
    n_ob,
    qk_scale,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BO: tl.constexpr,
    IEEE: tl.constexpr,
    OB_PER: tl.constexpr,
):
    W: tl.constexpr = BO + BLOCK_L
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_l = tl.arange(0, BLOCK_L)
    offs_d = tl.arange(0, BLOCK_D)
    offs_t = tl.arange(0, W)
    offs_u = tl.arange(0, BO)
    q = tl.load(
        q_ptr
        + b.to(tl.int64) * stride_q_b
        + h.to(tl.int64) * stride_q_h
        + offs_l[:, None] * stride_q_s
        + offs_d[None, :],
        mask=(offs_l[:, None] < L) & (offs_d[None, :] < D),
        other=0.0,
    )
    lse = tl.load(lse_ptr + bh * BLOCK_L + offs_l)
    r = row_start + offs_l
    kb = k_ptr + b.to(tl.int64) * stride_k_b + (h // GROUP).to(tl.int64) * stride_k_h
    out_v = vert_ptr + bh.to(tl.int64) * S
    out_s = slash_ptr + bh.to(tl.int64) * S
    # Row l at offset o0 + u reads the diagonal element t = BO - 1 + l - u of the window.
    idx = BO - 1 + offs_l[:, None] - offs_u[None, :]
    for i in range(OB_PER):
        ob = pid * OB_PER + i
        if ob < n_ob:
            o0 = ob * BO
            # Window key t is j = jw0 + t.
            jw0 = row_start - o0 - BO + 1
            j = jw0 + offs_t
            kt = tl.load(
                kb + j[None, :].to(tl.int64) * stride_k_s + offs_d[:, None],
                mask=(j[None, :] >= 0) & (j[None, :] < S) & (offs_d[:, None] < D),
                other=0.0,
            )
            if IEEE:
                s = tl.dot(q, kt, input_precision="ieee")
            else:
                s = tl.dot(q, kt)
            ok = (j[None, :] >= 0) & (j[None, :] <= r[:, None]) & (offs_l[:, None] < L)
            p = tl.where(ok, tl.exp2(s * qk_scale - lse[:, None]), 0.0)
            # Vertical: this block owns keys t in [L - 1, L - 1 + BO) of its window.
            own = (offs_t >= L - 1) & (offs_t < L - 1 + BO) & (j >= 0) & (j < S)
            tl.store(out_v + j, tl.sum(p, 0), mask=own)
            # Slash: the diagonals of the tile, one column per offset.
            o = o0 + offs_u
            tl.store(out_s + o, tl.sum(tl.gather(p, idx, 1), 0), mask=o < S)


_BLOCK_N = 64


def line_scores_triton(
    q_rows: torch.Tensor, k: torch.Tensor, row_start: int, *, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    B, H, L, D = q_rows.shape
    H_KV, S = k.shape[1], k.shape[2]
    q_rows = q_rows if q_rows.stride(-1) == 1 else q_rows.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    BLOCK_L = max(16, triton.next_power_of_2(L))
    BD = block_d(D)
    ieee = q_rows.dtype == torch.float32
    qk_scale = scale * LOG2E
    dev = q_rows.device
    n_keys = min(S, row_start + L)
    # Key chunks: enough programs to fill the GPU without a long serial walk per program.
    chunk = triton.cdiv(n_keys, 64 * _BLOCK_N) * _BLOCK_N
    n_chunks = triton.cdiv(n_keys, chunk)
    m = torch.empty(B * H, n_chunks, BLOCK_L, dtype=torch.float32, device=dev)
    lsum = torch.empty_like(m)
    _lse_kernel[(n_chunks, B * H)](
        q_rows, k, m, lsum,
        q_rows.stride(0), q_rows.stride(1), q_rows.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        H, H // H_KV, L, S, row_start, chunk, n_chunks, qk_scale,
        D=D, BLOCK_D=BD, BLOCK_L=BLOCK_L, BLOCK_N=_BLOCK_N, IEEE=ieee,
        num_warps=4, num_stages=1 if on_interpreter() else 3,
    )  # fmt: skip
    mx = m.amax(dim=1)
    mx = torch.where(torch.isinf(mx), torch.zeros_like(mx), mx)
    lse = (mx + torch.log2((lsum * torch.exp2(m - mx[:, None])).sum(dim=1))).contiguous()
    vert = torch.zeros(B * H, S, dtype=torch.float32, device=dev)
    slash = torch.zeros(B * H, S, dtype=torch.float32, device=dev)
    # BO = BLOCK_L keeps the window (BO + BLOCK_L keys) a power of two.
    BO = BLOCK_L
    n_ob = triton.cdiv(row_start + L, BO)
    grid = lambda meta: (triton.cdiv(n_ob, meta["OB_PER"]), B * H)  # noqa: E731
    _lines_kernel[grid](
        q_rows, k, lse, vert, slash,
        q_rows.stride(0), q_rows.stride(1), q_rows.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        H, H // H_KV, L, S, row_start, n_ob, qk_scale,
        D=D, BLOCK_D=BD, BLOCK_L=BLOCK_L, BO=BO, IEEE=ieee,
    )  # fmt: skip
    return vert.reshape(B, H, S), slash.reshape(B, H, S)
