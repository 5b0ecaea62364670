"""The online-softmax tile loop and the tile epilogue shared by the attention kernels."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _load_kv_tile(
    k_base,
    v_base,
    stride_k_s,
    stride_k_d,
    stride_v_s,
    stride_v_d,
    cols,
    offs_d,
    S_KV,
    k_desc,
    v_desc,
    kv_b,
    kv_h,
    start_n,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BOUNDS: tl.constexpr,
    TMA: tl.constexpr,
):
    """The key tile ``[BLOCK_D, BLOCK_N]`` (transposed, for ``q @ k``) and value tile
    ``[BLOCK_N, BLOCK_D]`` of keys ``cols = start_n + arange(BLOCK_N)``.

    TMA: the copy engine loads both through descriptors of the whole ``[B, H_KV, S_KV, D]``
    tensors (blocks ``[1, 1, BLOCK_N, BLOCK_D]``, ``_triton/tma.py``) at ``(kv_b, kv_h,
    start_n, 0)``, zero-filling keys past ``S_KV`` and dims past ``D``. Else index loads from
    ``k_base``/``v_base`` (the head's first key), masked on the key bound where BOUNDS and on
    the head dim where ``BLOCK_D != D``.
    """
    if TMA:
        # Descriptor coordinates are 32-bit.
        at = [tl.cast(kv_b, tl.int32), tl.cast(kv_h, tl.int32), tl.cast(start_n, tl.int32), 0]
        k = tl.reshape(k_desc.load(at), (BLOCK_N, BLOCK_D)).T
        v = tl.reshape(v_desc.load(at), (BLOCK_N, BLOCK_D))
    else:
        k_ptrs = k_base + cols[None, :] * stride_k_s + offs_d[:, None] * stride_k_d
        v_ptrs = v_base + cols[:, None] * stride_v_s + offs_d[None, :] * stride_v_d
        d_ok = offs_d < D
        if BOUNDS:
            col_ok = cols < S_KV
            k = tl.load(k_ptrs, mask=col_ok[None, :] & d_ok[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        elif BLOCK_D != D:
            k = tl.load(k_ptrs, mask=d_ok[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
    return k, v


@triton.jit
def _attn_tile_inner(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    stride_k_s,
    stride_k_d,
    stride_v_s,
    stride_v_d,
    q_pos,
    offs_n,
    offs_d,
    lo,
    hi,
    S_KV,
    qk_scale,
    sink,
    window,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    IEEE: tl.constexpr,
    k_desc=None,
    v_desc=None,
    kv_b=0,
    kv_h=0,
    TMA: tl.constexpr = False,
):
    """Online-softmax update of one query tile over key blocks [lo, hi) (steps of BLOCK_N).

    MASKED applies the element mask (key bounds, causal on ``q_pos``, and with HAS_WINDOW the
    sink/window rule ``j < sink or q_pos - j < window``); unmasked calls must only cover blocks
    that every row of the tile sees in full. TMA loads the tiles through ``k_desc``/``v_desc`` at
    batch ``kv_b`` and KV head ``kv_h`` (:func:`_load_kv_tile`).
    """
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k, v = _load_kv_tile(
            k_base, v_base, stride_k_s, stride_k_d, stride_v_s, stride_v_d, cols, offs_d, S_KV,
            k_desc, v_desc, kv_b, kv_h, start_n, D, BLOCK_D, BLOCK_N, MASKED, TMA,
        )  # fmt: skip
        if IEEE:
            qk = tl.dot(q, k, input_precision="ieee")
        else:
            qk = tl.dot(q, k)
        if MASKED:
            keep = (cols < S_KV)[None, :]
            if IS_CAUSAL:
                keep = keep & (cols[None, :] <= q_pos[:, None])
            if HAS_WINDOW:
                keep = keep & ((cols[None, :] < sink) | (q_pos[:, None] - cols[None, :] < window))
            qk = tl.where(keep, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            # A row that has seen no key yet keeps m = -inf (so a later tile of very negative
            # scores still sets its maximum); it subtracts 0 instead, so exp2 gives 0, not NaN.
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_sub = m_new
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


@triton.jit
def _finish_rows(acc, l_i, m_i):
    """Normalised output and natural-log LSE of a finished tile; a row that saw no key gets
    out = 0 and lse = -inf."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    return acc / l_safe[:, None], lse


@triton.jit
def _resume_rows(o_ptrs, l_ptrs, row_ok, rd_ok):
    """The inverse of :func:`_finish_rows`: a finished result (``out``, natural-log ``lse``) as an
    online-softmax state ``(acc, l_i, m_i)`` in the exp2 domain (maximum ``lse * log2(e)``, sum 1,
    accumulator ``out``), so that a kernel can add more keys to another engine's result in place.
    A row that saw no key (``lse = -inf``) resumes as ``0, 0, -inf``."""
    lse = tl.load(l_ptrs, mask=row_ok, other=float("-inf"))
    seen = lse > float("-inf")
    m_i = tl.where(seen, lse * 1.4426950408889634, float("-inf"))
    l_i = tl.where(seen, 1.0, 0.0)
    acc = tl.where(seen[:, None], tl.load(o_ptrs, mask=rd_ok, other=0.0).to(tl.float32), 0.0)
    return acc, l_i, m_i
