"""Public triangle (A-shape / tri-shape) attention op."""

from __future__ import annotations

import torch

from .._types import AttentionOutput
from .._validate import check_qkv, check_scale, check_triton_head_dim, resolve_impl
from ..fa4 import triangle_problem
from .reference import triangle_attention_reference
from .window import window_class


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return value


def triangle_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sink: int,
    window: int,
    last: int = 0,
    scale: float | None = None,
    impl: str = "auto",
) -> AttentionOutput:
    """Causal triangle attention (TriangleMix) and, with ``last=0``, A-shape attention.

    Query row ``i`` sits at position ``p = i + S_KV - S_Q`` (DESIGN.md) and attends key ``j`` iff
    ``j <= p`` and (``j < sink`` or ``p - j < window`` or ``i >= S_Q - last``): the first
    ``sink`` keys, a local window of ``window`` keys ending at the diagonal, and the last ``last``
    query rows dense.

    The Triton kernel is one launch for all of it: programs for the A-shape part walk only the
    sink and window key blocks; the dense last rows are split along the keys into chunks run by
    extra programs of the same launch, whose partial results are then merged by LSE, so a few rows
    never walk 100K+ keys serially. A-shape rows and last rows are disjoint, so every (row, key)
    pair is computed exactly once.

    Args:
        q: ``[B, H, S_Q, D]``; k, v: ``[B, H_KV, S_KV, D]`` (GQA, ``H % H_KV == 0``).
        sink: number of leading keys every row sees (>= 0).
        window: local window length (>= 1; the diagonal key counts as one).
        last: number of trailing query rows that attend all their causal keys (>= 0).
        scale: softmax scale, finite and positive; default ``D ** -0.5``.
        impl: ``"triton"``, ``"fa4"`` (FA4's sliding window for the window part, our kernels
            for the sink keys and the last rows: ``docs/kernels/fa4.md``; the ``hopper`` extra,
            fp16/bf16 on sm90, head dims up to 128; anything else raises, naming why),
            ``"reference"`` (scores and softmax in float32) or ``"auto"`` (on CUDA, FA4 where
            :data:`sparse_kernels.fa4.AUTO_FA4` lists the op for the window's class and FA4
            can run the input, else triton: on sm90 in bf16 with D=128, FA4 for windows over
            1024 keys, Triton for the others; the reference elsewhere).

    Non-finite inputs: a NaN or inf in ``k`` at a key that a row does not attend never reaches
    that row (its score is masked before the softmax). In ``v``, a key that no row attends cannot
    reach the output if the Triton kernel never reads it: it reads, for a tile of rows, the sink
    tiles (the first ``sink`` keys rounded up to a multiple of 16 or 32) and the tile's window
    band rounded out to whole key blocks (of at most 128 keys), and for the last ``last`` rows
    every causally visible key. A key that is read but not attended by a row (in a computed
    tile; in the reference, any key another row attends) may turn the row NaN (``0 * NaN`` in
    ``P @ V``), as in torch SDPA.
    """
    _, _, _, S_Q, S_KV, D = check_qkv(q, k, v)
    scale = check_scale(scale, D)
    sink = _check_int("sink", sink, 0)
    window = _check_int("window", window, 1)
    last = _check_int("last", last, 0)
    # Larger values select the same keys (j < S_KV, p - j < S_KV, i < S_Q) and would overflow
    # the kernels' int32 arguments and the reference's index arithmetic.
    sink, window, last = min(sink, S_KV), min(window, S_KV), min(last, S_Q)
    which = resolve_impl(
        impl, q.device, "triangle_attention", fa4=lambda: triangle_problem(q), like=q,
        variant=window_class(window),
    )  # fmt: skip
    if which == "reference":
        return triangle_attention_reference(
            q, k, v, sink=sink, window=window, last=last, scale=scale
        )
    if which == "fa4":
        from ..fa4.triangle import triangle

        return triangle(q, k, v, sink=sink, window=window, last=last, scale=scale)
    check_triton_head_dim(D, "triangle_attention")
    from .triton import _launch_triangle_fwd

    out, lse = _launch_triangle_fwd(q, k, v, sink=sink, window=window, last=last, scale=scale)
    return AttentionOutput(out, lse)


def a_shape_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sink: int,
    window: int,
    scale: float | None = None,
    impl: str = "auto",
) -> AttentionOutput:
    """A-shape (sink + local window, "streaming") attention: ``triangle_attention`` with ``last=0``."""
    return triangle_attention(q, k, v, sink=sink, window=window, last=0, scale=scale, impl=impl)
