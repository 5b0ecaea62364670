"""The sparse host steps of bench_spava.py: MMInference patterns and a TriangleMix policy for the
benchmark's model shape, and the prompt's token layout (text, video frames, text).

The per-head mix follows the MMInference paper's Qwen2.5-VL choice, per group of 7 query heads:
4 Grid (stride = tokens per frame), 2 Vertical-Slash (1000 columns, 1024 diagonals), 1 A-shape
(sink 128, window 4096); the smoke shape scales them down. TriangleMix: dense (or MMInference)
below ``start_layer`` (half the layers by default), triangle (sink 8, window 512) from it.
"""

from __future__ import annotations

from seqpar_approx import HostSparsity, PrefixBlocks
from sparse_patterns import AShape, Grid, HeadConfig, PatternConfig, TokenLayout, VerticalSlash
from triangle_mix import LayerPolicy

SPARSE_METHODS = ("spava+trianglemix", "spava+mminference", "spava+mminference+trianglemix")
TEXT_PREFIX = 64


def head_mix(heads: int, *, tokens_per_frame: int, smoke: bool) -> tuple[HeadConfig, ...]:
    if smoke:
        kinds = (
            HeadConfig(Grid(stride=tokens_per_frame, last_q=16)),
            HeadConfig(VerticalSlash(n_vertical=32, n_slash=32, last_q=16)),
            HeadConfig(AShape(sink=8, window=64)),
        )
        return tuple(kinds[h % 3] for h in range(heads))
    grid = HeadConfig(Grid(stride=tokens_per_frame))
    vs = HeadConfig(VerticalSlash(n_vertical=1000, n_slash=1024, exact_verticals=True))
    a_shape = HeadConfig(AShape(sink=128, window=4096))
    mix = (grid,) * 4 + (vs,) * 2 + (a_shape,)
    return tuple(mix[h % 7] for h in range(heads))


def token_layout(n: int, query_len: int, *, tokens_per_frame: int, device) -> TokenLayout:
    """Text prefix, video (modality 2), the text query."""
    video = n - TEXT_PREFIX - query_len
    spans = [(0, TEXT_PREFIX), (2, video), (0, query_len)]
    return TokenLayout.from_spans(spans, tokens_per_frame=tokens_per_frame, device=device)


def sparsity(
    method: str,
    m: dict,
    *,
    tokens_per_frame: int,
    smoke: bool,
    start_layer: int | None = None,
    config: PatternConfig | None = None,
    block: int | None = None,
    prefix_blocks: int | None = None,
    dense_rows: int = 0,
) -> HostSparsity | None:
    """The :class:`HostSparsity` of a benchmark method name (None for dense hosts). ``config``:
    the MMInference layers' heads (a searched ``PatternConfig`` of the model's shape; None: the
    fixed mix of :func:`head_mix` in every layer). ``block``: the MMInference planner's block
    (None: 16 for the smoke shape, else 64). ``prefix_blocks``: the MMInference layers attend
    that many 64-key blocks of the prefix per head (``PrefixBlocks(top_k=prefix_blocks)``;
    None: every prefix key). ``dense_rows``: the MMInference hosts attend segments of at most
    that many rows densely (``HostSparsity.dense_rows``)."""
    if method not in SPARSE_METHODS:
        return None
    L = m["layers"]
    patterns = None
    if "mminference" in method:
        patterns = config
        if patterns is None:
            heads = head_mix(m["heads"], tokens_per_frame=tokens_per_frame, smoke=smoke)
            patterns = PatternConfig(
                model_id="bench-shape", num_layers=L, num_heads=m["heads"], layers=(heads,) * L
            )
    policy = None
    if "trianglemix" in method:
        start = L // 2 if start_layer is None else start_layer
        shallow = "dynamic" if patterns is not None else "dense"
        shape = dict(sink=8, window=64) if smoke else dict(sink=8, window=512)
        policy = LayerPolicy.triangle_from(L, start, shallow=shallow, **shape)
    if block is None:
        block = 16 if smoke else 64
    prefix = None
    if prefix_blocks is not None and patterns is not None:
        prefix = PrefixBlocks(top_k=prefix_blocks)
    dense_rows = dense_rows if patterns is not None else 0
    return HostSparsity(
        patterns=patterns, policy=policy, block=block, prefix=prefix, dense_rows=dense_rows
    )
