"""Triangle and A-shape attention with FA4's sliding window as the bulk of the work.

The triangle pattern (``triangle_attention``'s docstring) splits, per row at position ``p``, into
disjoint key sets: the window ``[p - window + 1, p]``; the sink keys before it (``j < sink`` and
``j <= p - window``); and, for the last ``last`` rows only, everything else. FA4's local
attention (``window_size=(window - 1, 0)``) computes the window for every row; our sink-merge
kernel adds the sink keys to the A-shape rows in place; the last rows, dense over all their causal
keys, are our triangle kernel's split-K programs (FA4 on sm90 has no split-KV, and a few rows
walking 100K+ keys serially would dominate), written over those rows.
"""

from __future__ import annotations

import torch

from .._types import AttentionOutput
from .engine import _bshd


def triangle(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sink: int,
    window: int,
    last: int,
    scale: float,
) -> AttentionOutput:
    """``sink``, ``window`` (>= 1) and ``last`` already clipped to the lengths by the op."""
    from flash_attn.cute import flash_attn_func

    from ..triangle.sink_merge_triton import _launch_sink_merge_fwd
    from ..triangle.triton import _launch_triangle_fwd

    S_Q, S_KV = q.shape[2], k.shape[2]
    with torch.no_grad():  # forward only, like every engine (engine.py)
        out, lse = flash_attn_func(
            _bshd(q), _bshd(k), _bshd(v),
            softmax_scale=scale, causal=False, window_size=(window - 1, 0), return_lse=True,
        )  # fmt: skip
    out = out.transpose(1, 2)
    a_hi = S_Q - last  # rows [0, a_hi) are A-shape rows
    # The first row with a sink key before its window sits at position `window`.
    a_lo = max(0, window - (S_KV - S_Q))
    _launch_sink_merge_fwd(
        out, lse, q, k, v, sink=sink, window=window, row_lo=a_lo, row_hi=a_hi, scale=scale
    )
    if last:
        # All rows of this slice are last rows: its positions are the full sequence's.
        tail_out, tail_lse = _launch_triangle_fwd(
            q[:, :, a_hi:], k, v, sink=sink, window=window, last=last, scale=scale
        )
        out[:, :, a_hi:] = tail_out
        lse[:, :, a_hi:] = tail_lse
    return AttentionOutput(out, lse)
