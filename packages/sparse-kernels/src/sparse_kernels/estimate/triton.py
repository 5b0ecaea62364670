"""Line scores of the last query rows in two Triton passes, without the ``[L, S]`` score matrix.

Pass 1 (``_lse_kernel``): one program per (key chunk, head) streams its keys once and writes the
partial row max / row sum (base 2) of the ``L`` query rows; torch merges the chunks into the
log-sum-exp of each row.

Pass 2 (``_lines_kernel``): one program per (run of ``OB_PER`` blocks of ``BO`` diagonal offsets,
head). Offsets ``o0 .. o0 + BO`` of rows ``r_0 .. r_0 + L - 1`` (``BO = BLOCK_L``) touch two
consecutive key blocks; walking the offsets upwards (the keys downwards), the program computes the
probabilities of each key block once, writes its column sums (vertical sums) and gathers it
once along the key axis: one triangle of the gathered tile sums to the key block's share of the
current offset block, the other to its share of the next (slash sums). Every key and every offset
is written by exactly one program.

``column_mass``'s kernel (``columns_triton.py``) reuses pass 1 with every key visible.

The Grid heads' line folds (one pass, folded per residue) are ``sparse_kernels.grid_index``'s
kernels; they share this module's row and key helpers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton.config import LOG2E, block_d, on_interpreter
from ..tuning import KernelSpec, LaunchConfig, choose_config

# Launch configs of pass 2 (``_lines_kernel``, offset blocks per program OB_PER): looked up per
# GPU, shape and length in the tuned tables (sparse_kernels.tuning), per row block (the table
# variant "rows<BLOCK_L>"); a tuning run times these candidates.
SPEC = KernelSpec(
    name="line_scores",
    candidates=(
        LaunchConfig.of(OB_PER=4, num_warps=4, num_stages=1),
        LaunchConfig.of(OB_PER=16, num_warps=4, num_stages=1),
        LaunchConfig.of(OB_PER=16, num_warps=4, num_stages=3),
        LaunchConfig.of(OB_PER=16, num_warps=8, num_stages=3),
        LaunchConfig.of(OB_PER=64, num_warps=4, num_stages=3),
        LaunchConfig.of(OB_PER=16, num_warps=2, num_stages=3),
        LaunchConfig.of(OB_PER=64, num_warps=2, num_stages=3),
    ),
    interpreter=LaunchConfig.of(OB_PER=2),
    # fp32 (exact dots, slow to compile): the shortest run of offset blocks.
    fp32=LaunchConfig.of(OB_PER=4, num_warps=4, num_stages=1),
)


@triton.jit
def _group_major(H, GROUP):
    """``(position, b, h, b * H + h)`` of this program. Axis 0 is (position, head of the KV
    group) with the group's heads fastest, axis 1 is (batch row, KV head): the ``GROUP`` query
    heads that read the same keys run next to each other and share them through L2 (with the
    heads on an axis of their own, each query head re-read its keys from memory)."""
    return _group_major_at(tl.program_id(0), tl.program_id(1), H, GROUP)


@triton.jit
def _group_major_at(pid, bkv, H, GROUP):
    """:func:`_group_major` of program ``(pid, bkv)``."""
    H_KV = H // GROUP
    b = bkv // H_KV
    h = (bkv % H_KV) * GROUP + pid % GROUP
    return pid // GROUP, b, h, b * H + h


@triton.jit
def _rows_and_keys(
    q_ptr,
    k_ptr,
    b,
    h,
    GROUP,
    L,
    stride_q_b,
    stride_q_h,
    stride_q_s,
    stride_k_b,
    stride_k_h,
    offs_l,
    offs_d,
    D: tl.constexpr,
):
    """The ``[BLOCK_L, BLOCK_D]`` query rows of head ``h`` and the base pointer of its KV head
    (64-bit offsets: a 1M-token layer's head offsets pass 2**31 elements)."""
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
    return q, kb


@triton.jit
def _key_scores(q, kb, j, ok_j, offs_d, stride_k_s, qk_scale, D: tl.constexpr, IEEE: tl.constexpr):
    """Scaled scores (base 2) ``[BLOCK_L, BLOCK_N]`` of the rows against keys ``j`` (the keys
    where ``ok_j`` is false are loaded as zeros)."""
    kt = tl.load(
        kb + j[None, :].to(tl.int64) * stride_k_s + offs_d[:, None],
        mask=ok_j[None, :] & (offs_d[:, None] < D),
        other=0.0,
    )
    if IEEE:
        return tl.dot(q, kt, input_precision="ieee") * qk_scale
    return tl.dot(q, kt) * qk_scale


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
    c, b, h, bh = _group_major(H, GROUP)
    offs_l = tl.arange(0, BLOCK_L)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    q, kb = _rows_and_keys(
        q_ptr, k_ptr, b, h, GROUP, L, stride_q_b, stride_q_h, stride_q_s, stride_k_b, stride_k_h,
        offs_l, offs_d, D,
    )  # fmt: skip
    r = row_start + offs_l
    m_i = tl.full([BLOCK_L], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_L], dtype=tl.float32)
    lo = c * chunk
    hi = tl.minimum(lo + chunk, tl.minimum(S, row_start + L))
    for j0 in range(lo, hi, BLOCK_N):
        j = j0 + offs_n
        # A tile inside the chunk whose keys all precede the first row needs no causal mask.
        inside = (j0 + BLOCK_N <= hi) & (j0 + BLOCK_N - 1 <= row_start)
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
        if not inside:
            s = tl.where((j[None, :] <= r[:, None]) & (j[None, :] < hi), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.exp2(m_i - m_safe) + tl.sum(tl.exp2(s - m_safe[:, None]), 1)
        m_i = m_new
    out = bh * n_chunks * BLOCK_L + c * BLOCK_L + offs_l
    tl.store(m_ptr + out, m_i)
    tl.store(l_ptr + out, l_i)


@triton.jit
def _lse_merge_kernel(
    m_ptr, l_ptr, lse_ptr, n_chunks, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr
):
    """One program per (batch row, head): the partial maxima and sums of pass 1's key chunks
    merged into each row's log-sum-exp (base 2). A row with no key at all (every partial max
    -inf) gets -inf."""
    bh = tl.program_id(0)
    offs_c = tl.arange(0, BLOCK_C)
    offs_l = tl.arange(0, BLOCK_L)
    at = bh * n_chunks * BLOCK_L + offs_c[:, None] * BLOCK_L + offs_l[None, :]
    ok = offs_c[:, None] < n_chunks
    m = tl.load(m_ptr + at, mask=ok, other=float("-inf"))
    lsum = tl.load(l_ptr + at, mask=ok, other=0.0)
    mx = tl.max(m, 0)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    tl.store(
        lse_ptr + bh * BLOCK_L + offs_l, mx + tl.log2(tl.sum(lsum * tl.exp2(m - mx[None, :]), 0))
    )


@triton.jit
def _prob_tile(
    q,
    kb,
    lse,
    r,
    offs_l,
    offs_u,
    offs_d,
    b,
    L,
    S,
    row_start,
    stride_k_s,
    qk_scale,
    D: tl.constexpr,
    BO: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_L: tl.constexpr,
):
    """Probabilities ``[BLOCK_L, BO]`` of the rows against key block ``b`` (keys
    ``row_start + 1 - (b + 1) * BO + u``; block -1 holds the keys right after ``row_start``)."""
    j = row_start + 1 - (b + 1) * BO + offs_u
    # A block at or below the first row whose keys are all >= 0, with every row present, needs no
    # mask: its keys exist and precede every row.
    if (b >= 0) & (row_start + 1 - (b + 1) * BO >= 0) & (L == BLOCK_L):
        kt = tl.load(
            kb + j[None, :].to(tl.int64) * stride_k_s + offs_d[:, None],
            mask=offs_d[:, None] < D,
            other=0.0,
        )
        if IEEE:
            s = tl.dot(q, kt, input_precision="ieee")
        else:
            s = tl.dot(q, kt)
        p = tl.exp2(s * qk_scale - lse[:, None])
    else:
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
    return p, j


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
    # Offset block ob (offsets ob * BO + u) reads key blocks ob (lower half of its window) and
    # ob - 1 (upper half): row l at offset ob * BO + u reads window key t = BO - 1 + l - u, that
    # is key (BO - 1 + l - u) mod BO of block ob if l <= u, of block ob - 1 if l > u. So one
    # gather per key block, at that index, gives both halves: its entries with l <= u sum to
    # block ob's share of offset block ob, those with l > u to its share of offset block ob + 1.
    # Walking ob upwards, each key block's probabilities are computed and gathered once; the
    # program keeps the l > u sums for the next offset block and owns the vertical sums of its
    # key blocks.
    pid, b, h, bh = _group_major(H, GROUP)
    offs_l = tl.arange(0, BLOCK_L)
    offs_d = tl.arange(0, BLOCK_D)
    offs_u = tl.arange(0, BO)
    q, kb = _rows_and_keys(
        q_ptr, k_ptr, b, h, GROUP, L, stride_q_b, stride_q_h, stride_q_s, stride_k_b, stride_k_h,
        offs_l, offs_d, D,
    )  # fmt: skip
    lse = tl.load(lse_ptr + bh * BLOCK_L + offs_l)
    r = row_start + offs_l
    out_v = vert_ptr + bh.to(tl.int64) * S
    out_s = slash_ptr + bh.to(tl.int64) * S
    lower = offs_l[:, None] <= offs_u[None, :]
    t_mod = tl.where(
        lower, BO - 1 + offs_l[:, None] - offs_u[None, :], offs_l[:, None] - offs_u[None, :] - 1
    )
    ob0 = pid * OB_PER
    p, j = _prob_tile(
        q, kb, lse, r, offs_l, offs_u, offs_d, ob0 - 1, L, S, row_start, stride_k_s, qk_scale,
        D, BO, IEEE, BLOCK_L,
    )  # fmt: skip
    tl.store(out_v + j, tl.sum(p, 0), mask=(j >= 0) & (j < S) & ((offs_u * 0 + ob0) == 0))
    upper_prev = tl.sum(tl.where(lower, 0.0, tl.gather(p, t_mod, 1)), 0)
    for i in range(OB_PER):
        ob = ob0 + i
        p, j = _prob_tile(
            q, kb, lse, r, offs_l, offs_u, offs_d, ob, L, S, row_start, stride_k_s, qk_scale,
            D, BO, IEEE, BLOCK_L,
        )  # fmt: skip
        tl.store(out_v + j, tl.sum(p, 0), mask=(j >= 0) & (j < S) & ((offs_u * 0 + ob) < n_ob))
        g = tl.gather(p, t_mod, 1)
        o = ob * BO + offs_u
        lower_sum = tl.sum(tl.where(lower, g, 0.0), 0)
        tl.store(out_s + o, lower_sum + upper_prev, mask=(o < S) & ((offs_u * 0 + ob) < n_ob))
        upper_prev = tl.sum(tl.where(lower, 0.0, g), 0)


_BLOCK_N = 64


def _row_lse(q_rows, k, row_start, qk_scale, BLOCK_L, BD, ieee) -> torch.Tensor:
    """Pass 1 and its merge: float32 ``[B * H, BLOCK_L]``, each row's log-sum-exp (base 2) over
    its causally visible keys (all of them for ``row_start >= S``)."""
    B, H, L, D = q_rows.shape
    H_KV, S = k.shape[1], k.shape[2]
    dev = q_rows.device
    n_keys = min(S, row_start + L)
    # Key chunks: enough programs to fill the GPU without a long serial walk per program.
    chunk = triton.cdiv(n_keys, 64 * _BLOCK_N) * _BLOCK_N
    n_chunks = triton.cdiv(n_keys, chunk)
    m = torch.empty(B * H, n_chunks, BLOCK_L, dtype=torch.float32, device=dev)
    lsum = torch.empty_like(m)
    G = H // H_KV
    _lse_kernel[(n_chunks * G, B * H_KV)](
        q_rows, k, m, lsum,
        q_rows.stride(0), q_rows.stride(1), q_rows.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        H, H // H_KV, L, S, row_start, chunk, n_chunks, qk_scale,
        D=D, BLOCK_D=BD, BLOCK_L=BLOCK_L, BLOCK_N=_BLOCK_N, IEEE=ieee,
        num_warps=4, num_stages=1 if on_interpreter() else 3,
    )  # fmt: skip
    lse = torch.empty(B * H, BLOCK_L, dtype=torch.float32, device=dev)
    _lse_merge_kernel[(B * H,)](
        m, lsum, lse, n_chunks, BLOCK_L=BLOCK_L, BLOCK_C=triton.next_power_of_2(n_chunks)
    )
    return lse


def line_scores_triton(
    q_rows: torch.Tensor,
    k: torch.Tensor,
    row_start: int,
    *,
    scale: float,
    config: LaunchConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``config``: pass 2's launch config instead of the looked-up one (tests and the tuner run
    each candidate)."""
    B, H, L, D = q_rows.shape
    H_KV, S = k.shape[1], k.shape[2]
    q_rows = q_rows if q_rows.stride(-1) == 1 else q_rows.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    BLOCK_L = max(16, triton.next_power_of_2(L))
    BD = block_d(D)
    ieee = q_rows.dtype == torch.float32
    qk_scale = scale * LOG2E
    dev = q_rows.device
    G = H // H_KV
    lse = _row_lse(q_rows, k, row_start, qk_scale, BLOCK_L, BD, ieee)
    vert = torch.zeros(B * H, S, dtype=torch.float32, device=dev)
    slash = torch.zeros(B * H, S, dtype=torch.float32, device=dev)
    # Offset blocks as wide as the row block: the window of one offset block is two key blocks.
    BO = BLOCK_L
    n_ob = triton.cdiv(row_start + L, BO)
    args = (
        q_rows, k, lse, vert, slash,
        q_rows.stride(0), q_rows.stride(1), q_rows.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        H, H // H_KV, L, S, row_start, n_ob, qk_scale,
    )  # fmt: skip
    if config is None:
        config = choose_config(
            SPEC, device=dev, head_dim=D, dtype=q_rows.dtype, group=G, seq_len=S,
            variant=f"rows{BLOCK_L}",
        )  # fmt: skip
    _lines_kernel[(triton.cdiv(n_ob, config["OB_PER"]) * G, B * H_KV)](
        *args, D=D, BLOCK_D=BD, BLOCK_L=BLOCK_L, BO=BO, IEEE=ieee, **config.launch_kwargs()
    )
    return vert.reshape(B, H, S), slash.reshape(B, H, S)
