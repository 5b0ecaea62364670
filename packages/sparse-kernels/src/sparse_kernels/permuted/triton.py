"""Permuted block-sparse flash-attention forward with LSE (Triton).

Size: one kernel (its three list walks share one prologue and one online-softmax step) and its
launcher.

One program computes BLOCK_M permuted query rows of one (batch, head). It loads the query
permutation for its rows once, gathers those q rows, walks the key blocks listed for its query
block (partial list with the causal element mask on ORIGINAL positions, then the full list with
bounds only), gathering k/v rows through the key permutation, and scatters out/lse back to the
original rows; an optional third list holds runs of consecutive original keys, loaded without the
key permutation. No permuted copy of any tensor is made. Optional per-pair modality masks keep, in
a listed block, only the (query modality, key modality) pairs its entry allows. Row and column offsets are int64 so that
gathers into 1M-token tensors do not overflow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from .._triton.config import FP32_CONFIG, block_d
from .._triton.inner import _finish_rows
from .._triton.launch import launch
from ..tuning import KernelSpec, LaunchConfig, choose_config
from .reference import MAX_MODALITIES

if TYPE_CHECKING:
    from ..sparse_plan import SparsePlan

# Bit (a * PAIR_STRIDE + b) of a pair mask allows query modality a with key modality b.
PAIR_STRIDE = tl.constexpr(MAX_MODALITIES)
# The bits of one query modality's row of the pair mask.
PAIR_ROW_BITS = tl.constexpr((1 << MAX_MODALITIES) - 1)


def _tiles_divide_blocks(config: LaunchConfig, blocks: tuple[int, ...]) -> bool:
    """A program's BLOCK_M rows lie in one query block and its BLOCK_N keys in one key block."""
    q_block, kv_block = blocks
    return q_block % config["BLOCK_M"] == 0 and kv_block % config["BLOCK_N"] == 0


def _tiles_within_blocks(config: LaunchConfig, blocks: tuple[int, ...]) -> LaunchConfig:
    """``config`` with each tile cut to its block size. The interpreter and fp32 configs are
    written for blocks of at least 64 keys; blocks are powers of two, so the cut tile divides
    them. Any other looked-up config already fits (unchanged)."""
    q_block, kv_block = blocks
    return LaunchConfig.of(
        BLOCK_M=min(config["BLOCK_M"], q_block), BLOCK_N=min(config["BLOCK_N"], kv_block),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip


def _fallback(blocks: tuple[int, ...]) -> LaunchConfig:
    q_block, kv_block = blocks
    return LaunchConfig.of(
        BLOCK_M=min(q_block, 64), BLOCK_N=min(kv_block, 64), num_warps=4, num_stages=2
    )


# Launch configs: looked up per GPU, shape and length in the tuned tables (sparse_kernels.tuning);
# a tuning run times the candidates whose tiles divide the block sizes.
SPEC = KernelSpec(
    name="permuted",
    candidates=(
        LaunchConfig.of(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3),
        LaunchConfig.of(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2),
        LaunchConfig.of(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
        LaunchConfig.of(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3),
        LaunchConfig.of(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3),
        LaunchConfig.of(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
        LaunchConfig.of(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2),
    ),
    # Under the interpreter tiles are as large as the blocks allow (fewer, bigger numpy ops).
    interpreter=LaunchConfig.of(BLOCK_M=64, BLOCK_N=64),
    fp32=LaunchConfig.of(**FP32_CONFIG, num_warps=4, num_stages=1),
    fits=_tiles_divide_blocks,
    fallback=_fallback,
)


@triton.jit
def _bit_or(a, b):
    return a | b


@triton.jit
def _permuted_blocks_inner(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    kvp_base,
    idx_base,
    stride_idx_n,
    count,
    pairs_base,
    stride_pairs_n,
    kvmod_base,
    stride_kvmod_s,
    q_pair,
    q_mods,
    kvmax_base,
    kvset_base,
    stride_sum_n,
    run_step,
    stride_k_s,
    stride_k_d,
    stride_v_s,
    stride_v_d,
    stride_kvp_s,
    kv_block,
    q_pos,
    offs_n,
    offs_d,
    S_KV,
    qk_scale,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    APPLY_CAUSAL: tl.constexpr,
    HAS_KV_PERM: tl.constexpr,
    HAS_PAIRS: tl.constexpr,
    IEEE: tl.constexpr,
    RUN_LIST: tl.constexpr,
):
    """Online-softmax update over the ``count`` listed key blocks, BLOCK_N key tiles at a time.

    RUN_LIST: the entries are not permuted key blocks but ORIGINAL positions ``s`` of runs of
    ``kv_block`` keys ``s, s + run_step, s + 2 * run_step, ...`` (those below ``S_KV``): the tile's
    key positions are arithmetic, so it is loaded without the key permutation (call it with
    HAS_KV_PERM and HAS_PAIRS off). ``run_step`` is 1 for identity and modality orders and the
    grid stride for a Grid head's lines.

    With HAS_PAIRS, element (row, col) of an entry is kept only if bit
    ``q_pair[row] + kv_modality[col]`` of the entry's int64 pair mask is set.

    One flat loop over (listed block, sub-tile) so that the compiler pipelines it like a dense
    key loop (a nested loop with one inner iteration would not be pipelined). Each list gets its
    own loop, with its own shared-memory buffers: one loop over all three lists, choosing the
    list per step, fits 128x128 tiles but ran 0.65x-0.74x as fast on 128x128 Grid plans at its
    best config (H100, same process, ``results/grid/permuted-single-loop-ab-H100-2026-11-26.json``,
    where ``new`` is that loop).
    """
    d_ok = offs_d < D
    n_sub = kv_block // BLOCK_N
    # The element mask is built only for tiles that need it: tiles past the key end, tiles with a
    # key after some row's position (causal), tiles holding a (query, key) modality pair that the
    # entry's pair mask drops. Most tiles of a permuted head need none of it. The test reads two
    # per-key-block summaries made at launch (the block's largest original position and its set
    # of key modalities; for a sub-tile they are supersets, so the test can only err towards
    # masking) instead of reducing over the tile's gathered columns.
    min_q_pos = tl.min(q_pos)
    # Block numbers, run starts and key permutation entries are not bounded here: clamping them
    # per tile cost 2-9% on an H100 (docs/kernels/permuted.md); the op's checks cover them.
    for t in range(0, count * n_sub):
        blk = tl.load(idx_base + (t // n_sub) * stride_idx_n).to(tl.int64)
        if RUN_LIST:
            start_p = blk + (t % n_sub) * BLOCK_N * run_step
            cols_p = start_p + offs_n * run_step
            last_p = start_p + (BLOCK_N - 1) * run_step
        else:
            start_p = blk * kv_block + (t % n_sub) * BLOCK_N
            cols_p = start_p + offs_n
            last_p = start_p + BLOCK_N - 1
        col_ok = cols_p < S_KV
        if HAS_KV_PERM:
            cols = tl.load(kvp_base + cols_p * stride_kvp_s, mask=col_ok, other=0).to(tl.int64)
        else:
            cols = cols_p
        k = tl.load(
            k_base + cols[None, :] * stride_k_s + offs_d[:, None] * stride_k_d,
            mask=col_ok[None, :] & d_ok[:, None],
            other=0.0,
        )
        v = tl.load(
            v_base + cols[:, None] * stride_v_s + offs_d[None, :] * stride_v_d,
            mask=col_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        need = last_p >= S_KV
        if APPLY_CAUSAL:
            # Causality on ORIGINAL positions: that is what keeps a permuted causal head exact.
            if HAS_KV_PERM:
                max_col = tl.load(kvmax_base + blk * stride_sum_n).to(tl.int64)
            else:
                max_col = last_p
            need = need | (max_col > min_q_pos)
        if HAS_PAIRS:
            bits = tl.load(pairs_base + (t // n_sub) * stride_pairs_n).to(tl.int64)
            k_set = tl.load(kvset_base + blk * stride_sum_n).to(tl.int64)
            # Every query modality a of the tile must allow every key modality of the block.
            for a in tl.static_range(PAIR_STRIDE):
                row_a = (bits >> (a * PAIR_STRIDE)) & PAIR_ROW_BITS
                drops = ((q_mods >> a) & 1) * ((row_a & k_set) != k_set).to(tl.int64)
                need = need | (drops != 0)
        if IEEE:
            qk = tl.dot(q, k, input_precision="ieee")
        else:
            qk = tl.dot(q, k)
        if need:
            keep = col_ok[None, :]
            if APPLY_CAUSAL:
                keep = keep & (cols[None, :] <= q_pos[:, None])
            if HAS_PAIRS:
                k_mod = tl.load(kvmod_base + cols * stride_kvmod_s, mask=col_ok, other=0)
                # Row r keeps key modality m iff bit m of its row of the pair mask is set.
                row_bits = ((bits >> q_pair) & PAIR_ROW_BITS).to(tl.int32)
                keep = keep & (((row_bits[:, None] >> k_mod.to(tl.int32)[None, :]) & 1) != 0)
            qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        # A row that has seen no key yet keeps m = -inf and subtracts 0, so that exp2 gives 0,
        # not NaN. Keeping 0 as its max instead would make a later tile whose scores all lie
        # below about -126 (log2 units) underflow to an empty row.
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk * qk_scale - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if IEEE:
            acc = tl.dot(p, v, acc, input_precision="ieee")
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


# The list widths only bound list walks: not specialized on, so a new length that changes them
# reuses the compiled binary (Triton compiles one per divisibility-by-16 of each int argument).
@triton.jit(do_not_specialize=["idx_width", "fidx_width", "run_width"])
def _permuted_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    lse_ptr,
    qp_ptr,
    kvp_ptr,
    idx_ptr,
    cnt_ptr,
    fidx_ptr,
    fcnt_ptr,
    qmod_ptr,
    kvmod_ptr,
    pairs_ptr,
    kvmax_ptr,
    kvset_ptr,
    run_ptr,
    rcnt_ptr,
    step_ptr,
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
    stride_qp_b,
    stride_qp_h,
    stride_qp_s,
    stride_kvp_b,
    stride_kvp_h,
    stride_kvp_s,
    stride_idx_b,
    stride_idx_h,
    stride_idx_m,
    stride_idx_n,
    stride_cnt_b,
    stride_cnt_h,
    stride_cnt_m,
    stride_fidx_b,
    stride_fidx_h,
    stride_fidx_m,
    stride_fidx_n,
    stride_fcnt_b,
    stride_fcnt_h,
    stride_fcnt_m,
    stride_qmod_b,
    stride_qmod_s,
    stride_kvmod_b,
    stride_kvmod_s,
    stride_pairs_b,
    stride_pairs_h,
    stride_pairs_m,
    stride_pairs_n,
    stride_sum_b,
    stride_sum_h,
    stride_sum_n,
    stride_run_b,
    stride_run_h,
    stride_run_m,
    stride_run_n,
    stride_rcnt_b,
    stride_rcnt_h,
    stride_rcnt_m,
    stride_step_b,
    stride_step_h,
    idx_width,
    fidx_width,
    run_width,
    H,
    GROUP,
    KVP_HEAD_DIV,
    S_Q,
    S_KV,
    q_block,
    kv_block,
    sm_scale,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    HAS_Q_PERM: tl.constexpr,
    HAS_KV_PERM: tl.constexpr,
    HAS_FULL: tl.constexpr,
    HAS_PAIRS: tl.constexpr,
    HAS_RUNS: tl.constexpr,
    UNIT_STEPS: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    h_kv = h // GROUP
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)

    offs_r = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # permuted rows
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_r < S_Q
    d_ok = offs_d < D
    if HAS_Q_PERM:
        # The permutation index of this tile, loaded once and reused for the q gather and the
        # out/lse scatter.
        qp_base = qp_ptr + b64 * stride_qp_b + h64 * stride_qp_h
        rows = tl.load(qp_base + offs_r.to(tl.int64) * stride_qp_s, mask=row_ok, other=0)
        rows = rows.to(tl.int64)
        # An entry outside [0, S_Q) (unchecked input) is neither gathered nor written.
        row_ok = row_ok & (rows >= 0) & (rows < S_Q)
    else:
        rows = offs_r.to(tl.int64)

    q = tl.load(
        q_ptr
        + b64 * stride_q_b
        + h64 * stride_q_h
        + rows[:, None] * stride_q_s
        + offs_d[None, :] * stride_q_d,
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    k_base = k_ptr + b64 * stride_k_b + h_kv.to(tl.int64) * stride_k_h
    v_base = v_ptr + b64 * stride_v_b + h_kv.to(tl.int64) * stride_v_h
    kvp_base = kvp_ptr + b64 * stride_kvp_b + (h // KVP_HEAD_DIV).to(tl.int64) * stride_kvp_h

    qk_scale = sm_scale * 1.4426950408889634
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # Original position of each row (DESIGN.md: row i sits at i + S_KV - S_Q).
    q_pos = rows + (S_KV - S_Q)

    if HAS_PAIRS:
        q_mod = tl.load(qmod_ptr + b64 * stride_qmod_b + rows * stride_qmod_s, mask=row_ok, other=0)
        q_pair = q_mod.to(tl.int64) * PAIR_STRIDE
        # The set of query modalities in this tile (bit a: some row has modality a).
        q_mods = tl.reduce(tl.where(row_ok, 1 << q_mod.to(tl.int64), 0), 0, _bit_or)
    else:
        q_pair = tl.zeros([BLOCK_M], tl.int64)
        q_mods = b64 * 0
    sum_off = b64 * stride_sum_b + (h // KVP_HEAD_DIV).to(tl.int64) * stride_sum_h
    kvmax_base = kvmax_ptr + sum_off
    kvset_base = kvset_ptr + sum_off
    kvmod_base = kvmod_ptr + b64 * stride_kvmod_b

    qb = (start_m * BLOCK_M) // q_block
    pairs_base = (
        pairs_ptr + b64 * stride_pairs_b + h64 * stride_pairs_h + qb.to(tl.int64) * stride_pairs_m
    )
    # Counts above the list width (unchecked input) would read past the list: clamp them.
    count = tl.load(cnt_ptr + b64 * stride_cnt_b + h64 * stride_cnt_h + qb * stride_cnt_m)
    count = tl.minimum(count, idx_width)
    idx_base = idx_ptr + b64 * stride_idx_b + h64 * stride_idx_h + qb.to(tl.int64) * stride_idx_m
    acc, l_i, m_i = _permuted_blocks_inner(
        acc, l_i, m_i, q, k_base, v_base, kvp_base, idx_base, stride_idx_n, count,
        pairs_base, stride_pairs_n, kvmod_base, stride_kvmod_s, q_pair,
        q_mods, kvmax_base, kvset_base, stride_sum_n, 1,
        stride_k_s, stride_k_d, stride_v_s, stride_v_d, stride_kvp_s, kv_block,
        q_pos, offs_n, offs_d, S_KV, qk_scale,
        D, BLOCK_N, IS_CAUSAL, HAS_KV_PERM, HAS_PAIRS, IEEE, False,
    )  # fmt: skip
    if HAS_RUNS:
        rcount = tl.load(rcnt_ptr + b64 * stride_rcnt_b + h64 * stride_rcnt_h + qb * stride_rcnt_m)
        rcount = tl.minimum(rcount, run_width)
        run_base = (
            run_ptr + b64 * stride_run_b + h64 * stride_run_h + qb.to(tl.int64) * stride_run_m
        )
        if UNIT_STEPS:
            run_step = 1
        else:
            run_step = tl.load(step_ptr + b64 * stride_step_b + h64 * stride_step_h).to(tl.int64)
            # A step < 1 or past the sequence (unchecked input) would address keys outside it.
            run_step = tl.minimum(tl.maximum(run_step, 1), S_KV)
        # Step 1 (identity and modality orders) gets a loop with the step a constant: the compiler
        # then sees consecutive key rows. UNIT_STEPS: every head's step is 1 (no branch at all);
        # otherwise the branch picks per program.
        if UNIT_STEPS or run_step == 1:
            acc, l_i, m_i = _permuted_blocks_inner(
                acc, l_i, m_i, q, k_base, v_base, kvp_base, run_base, stride_run_n, rcount,
                pairs_base, stride_pairs_n, kvmod_base, stride_kvmod_s, q_pair,
                q_mods, kvmax_base, kvset_base, stride_sum_n, 1,
                stride_k_s, stride_k_d, stride_v_s, stride_v_d, stride_kvp_s, kv_block,
                q_pos, offs_n, offs_d, S_KV, qk_scale,
                D, BLOCK_N, IS_CAUSAL, False, False, IEEE, True,
            )  # fmt: skip
        else:
            acc, l_i, m_i = _permuted_blocks_inner(
                acc, l_i, m_i, q, k_base, v_base, kvp_base, run_base, stride_run_n, rcount,
                pairs_base, stride_pairs_n, kvmod_base, stride_kvmod_s, q_pair,
                q_mods, kvmax_base, kvset_base, stride_sum_n, run_step,
                stride_k_s, stride_k_d, stride_v_s, stride_v_d, stride_kvp_s, kv_block,
                q_pos, offs_n, offs_d, S_KV, qk_scale,
                D, BLOCK_N, IS_CAUSAL, False, False, IEEE, True,
            )  # fmt: skip
    if HAS_FULL:
        fcount = tl.load(fcnt_ptr + b64 * stride_fcnt_b + h64 * stride_fcnt_h + qb * stride_fcnt_m)
        fcount = tl.minimum(fcount, fidx_width)
        fidx_base = (
            fidx_ptr + b64 * stride_fidx_b + h64 * stride_fidx_h + qb.to(tl.int64) * stride_fidx_m
        )
        acc, l_i, m_i = _permuted_blocks_inner(
            acc, l_i, m_i, q, k_base, v_base, kvp_base, fidx_base, stride_fidx_n, fcount,
            pairs_base, stride_pairs_n, kvmod_base, stride_kvmod_s, q_pair,
            q_mods, kvmax_base, kvset_base, stride_sum_n, 1,
            stride_k_s, stride_k_d, stride_v_s, stride_v_d, stride_kvp_s, kv_block,
            q_pos, offs_n, offs_d, S_KV, qk_scale,
            D, BLOCK_N, False, HAS_KV_PERM, False, IEEE, False,
        )  # fmt: skip

    out, lse = _finish_rows(acc, l_i, m_i)
    # Scatter back to the original rows (the inverse permutation, applied by the store).
    o_ptrs = (
        out_ptr
        + b64 * stride_o_b
        + h64 * stride_o_h
        + rows[:, None] * stride_o_s
        + offs_d[None, :] * stride_o_d
    )
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    tl.store(lse_ptr + bh.to(tl.int64) * S_Q + rows, lse, mask=row_ok)


def _strides3(t: torch.Tensor | None) -> tuple[int, int, int]:
    """Strides (b, h, s) of a ``[B|1, H|1, S]`` index; size-1 dims broadcast (stride 0)."""
    if t is None:
        return (0, 0, 0)
    return tuple(0 if t.shape[i] == 1 else t.stride(i) for i in range(3))


def _strides_mod(t: torch.Tensor | None) -> tuple[int, int]:
    """Strides (b, s) of a ``[B|1, S]`` modality index; size-1 batch broadcasts."""
    if t is None:
        return (0, 0)
    return (0 if t.shape[0] == 1 else t.stride(0), t.stride(1))


def _strides_blocks(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(0 if (i < 2 and t.shape[i] == 1) else t.stride(i) for i in range(t.ndim))


def _kv_block_summaries(
    kv_perm: torch.Tensor | None,
    kv_modality: torch.Tensor | None,
    kv_block: int,
    S_KV: int,
    *,
    causal: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Per key block of the permuted order, what the kernel's "does this tile need the element
    mask" test reads: the largest original position (int32, with ``kv_perm`` and ``causal``) and
    the set of key modalities as a bit set (int32, with ``kv_modality``, i.e. pair masks).

    ``kv_perm``: ``[B|1, Hp|1, S_KV]``; ``kv_modality``: ``[B|1, S_KV]`` in original order. Both
    results have the shape ``[B', Hp, NKB]`` (``B'`` the broadcast batch, ``Hp`` the permutation's
    heads or 1), so they share strides. A few small torch launches per call.
    """
    want_max = kv_perm is not None and causal
    if not want_max and kv_modality is None:
        return None, None
    nkb = -(-S_KV // kv_block)
    pad = nkb * kv_block - S_KV
    B_ = max(kv_perm.shape[0] if kv_perm is not None else 1,
             kv_modality.shape[0] if kv_modality is not None else 1)  # fmt: skip
    Hp = kv_perm.shape[1] if kv_perm is not None else 1
    kv_max = kv_set = None
    if want_max:
        p = torch.nn.functional.pad(kv_perm.to(torch.int32), (0, pad), value=-1)
        kv_max = p.reshape(*p.shape[:2], nkb, kv_block).amax(-1).expand(B_, Hp, nkb).contiguous()
    if kv_modality is not None:
        # Clamped: an unchecked out-of-range id or permutation entry must not index out of
        # bounds here either (its output is undefined, as in the kernel).
        mods = kv_modality.long().clamp(0, MAX_MODALITIES - 1)[:, None, :].expand(B_, Hp, S_KV)
        if kv_perm is not None:
            mods = mods.gather(-1, kv_perm.long().clamp(0, S_KV - 1).expand(B_, Hp, S_KV))
        # Set bit m of block n for each key of modality m: a scatter of ones into [.., nkb * M].
        slot = torch.arange(S_KV, device=mods.device) // kv_block * MAX_MODALITIES + mods
        hit = torch.zeros(B_, Hp, nkb * MAX_MODALITIES, dtype=torch.int32, device=mods.device)
        hit.scatter_(-1, slot, 1)
        weights = 1 << torch.arange(MAX_MODALITIES, dtype=torch.int32, device=mods.device)
        kv_set = (hit.view(B_, Hp, nkb, MAX_MODALITIES) * weights).sum(-1, dtype=torch.int32)
    return kv_max, kv_set


def _launch_permuted_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: SparsePlan,
    *,
    scale: float,
    config: LaunchConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate, launch. ``config``: this launch config instead of the looked-up one (tests and
    the tuner run each candidate); its tiles must divide ``plan.block_size``."""
    B, H, S_Q, D = q.shape
    H_KV, S_KV = k.shape[1], k.shape[2]
    blocks = block_m, block_n = plan.block_size
    causal = plan.causal
    if config is None:
        config = choose_config(
            SPEC, device=q.device, head_dim=D, dtype=q.dtype, group=H // H_KV, seq_len=S_KV,
            variant=f"{'causal' if causal else 'full'}-{block_m}x{block_n}", blocks=blocks,
        )  # fmt: skip
        config = _tiles_within_blocks(config, blocks)
    elif not _tiles_divide_blocks(config, blocks):
        raise ValueError(
            f"permuted_block_sparse_attention: launch config tiles must divide the block sizes "
            f"{blocks}, got {config}"
        )
    # The plan keeps permutations [B'|1, heads|1, S] and modality ids [B'|1, S].
    q_perm, kv_perm = plan.q_perm, plan.kv_perm
    kv_block_indices, kv_block_counts = plan.kv_indices, plan.kv_num_blocks
    full_kv_block_indices, full_kv_block_counts = plan.full_kv_indices, plan.full_kv_num_blocks
    q_modality, kv_modality, kv_block_pairs = plan.q_modality, plan.kv_modality, plan.kv_block_pairs
    kv_run_starts, kv_run_counts, kv_run_step = (
        plan.kv_run_starts, plan.kv_run_counts, plan.kv_run_step
    )  # fmt: skip
    out = torch.empty((B, H, S_Q, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, S_Q), dtype=torch.float32, device=q.device)
    has_full = full_kv_block_indices is not None
    fidx = full_kv_block_indices if has_full else kv_block_indices
    fcnt = full_kv_block_counts if has_full else kv_block_counts
    # kv_perm head h' for query head h: h // GROUP (per KV head), h (per query head), any (shared).
    if kv_perm is not None and kv_perm.shape[1] == H_KV and H_KV != H:
        kvp_div = H // H_KV
    else:
        kvp_div = 1
    has_pairs = kv_block_pairs is not None
    kv_max, kv_set = _kv_block_summaries(
        kv_perm, kv_modality if has_pairs else None, block_n, S_KV, causal=causal
    )
    summary = kv_max if kv_max is not None else kv_set  # the two share one shape
    has_runs = kv_run_starts is not None
    unit_steps = isinstance(kv_run_step, int) and kv_run_step == 1
    if has_runs:
        # [B|1, H|1] int64 step of each head's runs (1 = consecutive keys).
        run_step = torch.ones(1, 1, dtype=torch.int64, device=q.device)
        if not unit_steps:
            run_step = torch.as_tensor(kv_run_step, dtype=torch.int64, device=q.device)
            run_step = run_step.reshape(1, 1) if run_step.ndim == 0 else run_step
    dummy = kv_block_counts  # any int tensor: never read when the HAS_* flag is off
    tensors = (
        q, k, v, out, lse,
        q_perm if q_perm is not None else dummy,
        kv_perm if kv_perm is not None else dummy,
        kv_block_indices, kv_block_counts, fidx, fcnt,
        q_modality if has_pairs else dummy,
        kv_modality if has_pairs else dummy,
        kv_block_pairs if has_pairs else dummy,
        kv_max if kv_max is not None else dummy,
        kv_set if kv_set is not None else dummy,
        kv_run_starts if has_runs else dummy,
        kv_run_counts if has_runs else dummy,
        run_step if has_runs else dummy,
    )  # fmt: skip
    scalars = (
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        *_strides3(q_perm), *_strides3(kv_perm),
        *_strides_blocks(kv_block_indices), *_strides_blocks(kv_block_counts),
        *_strides_blocks(fidx), *_strides_blocks(fcnt),
        *_strides_mod(q_modality), *_strides_mod(kv_modality),
        *(_strides_blocks(kv_block_pairs) if has_pairs else (0, 0, 0, 0)),
        *(_strides_blocks(summary) if summary is not None else (0, 0, 0)),
        *(_strides_blocks(kv_run_starts) if has_runs else (0, 0, 0, 0)),
        *(_strides_blocks(kv_run_counts) if has_runs else (0, 0, 0)),
        *(_strides_blocks(run_step) if has_runs else (0, 0)),
        kv_block_indices.shape[-1], fidx.shape[-1],
        kv_run_starts.shape[-1] if has_runs else 0,
        H, H // H_KV, kvp_div, S_Q, S_KV, block_m, block_n, scale,
    )  # fmt: skip
    flags = dict(
        D=D,
        BLOCK_D=block_d(D),
        IS_CAUSAL=causal,
        HAS_Q_PERM=q_perm is not None,
        HAS_KV_PERM=kv_perm is not None,
        HAS_FULL=has_full,
        HAS_PAIRS=has_pairs,
        HAS_RUNS=has_runs,
        UNIT_STEPS=unit_steps,
        IEEE=q.dtype == torch.float32,
    )
    launch(
        _permuted_fwd_kernel, (triton.cdiv(S_Q, config["BLOCK_M"]), B * H), tensors, scalars,
        **flags, **config.launch_kwargs(),
    )  # fmt: skip
    return out, lse
