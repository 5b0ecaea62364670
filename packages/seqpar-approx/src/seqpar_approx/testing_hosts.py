"""Test helpers: the host attention step of an attention case (a picklable dict), so spawned
ranks and the single-process reference build the same step.

``case["host"]``: absent or ``"dense"``, ``"triangle"`` (``sink``, ``window``), ``"mminference"``
(mixed per-head patterns on a text / video / text layout) or ``"policy"`` (TriangleMix with
MMInference shallow layers: layer kinds ``dense, dynamic, triangle``; ``case["layer"]`` picks
one). ``case["block"]``: the MMInference plan's block (default 8; >= 16 for Triton).
``case["prefix_top_k"]``: MMInference layers select that many 64-key blocks of their prefix
(:class:`PrefixBlocks`, estimated from the last 8 rows; absent: every prefix key).
"""

from __future__ import annotations

from .host_attention import DENSE, HostAttention, HostSparsity, MMInferenceHost, TriangleHost
from .prefix_blocks import PrefixBlocks

POLICY_KINDS = ("dense", "dynamic", "triangle")


def case_heads(num_heads: int) -> tuple:
    """One HeadConfig per head, cycling through Vertical-Slash, A-shape, Grid and Tri-shape,
    sized for sequences of ~100 tokens."""
    from sparse_patterns import AShape, Grid, HeadConfig, TriShape, VerticalSlash

    cycle = (
        HeadConfig(VerticalSlash(n_vertical=4, n_slash=4, last_q=8, sink=2, local=4)),
        HeadConfig(AShape(sink=2, window=8)),
        HeadConfig(Grid(last_q=8)),
        HeadConfig(TriShape(sink=2, window=8, last=4)),
    )
    return tuple(cycle[h % len(cycle)] for h in range(num_heads))


def case_token_layout(seq_len: int):
    """Text, then video frames of 6 tokens, then text (the last 9 tokens)."""
    from sparse_patterns import TokenLayout

    head, tail = min(10, seq_len // 4), min(9, seq_len // 4)
    spans = [(0, head), (2, seq_len - head - tail), (0, tail)]
    return TokenLayout.from_spans(spans, tokens_per_frame=6)


def case_host_attention(case: dict) -> HostAttention:
    kind = case.get("host", "dense")
    if kind == "dense":
        return DENSE
    if kind == "triangle":
        return TriangleHost(sink=case["sink"], window=case["window"])
    layout = case_token_layout(case["n"])
    top_k = case.get("prefix_top_k")
    prefix = None if top_k is None else PrefixBlocks(top_k=top_k, last_q=8)
    if kind == "mminference":
        return MMInferenceHost(
            case_heads(case["H"]), token_layout=layout, block=case.get("block", 8), prefix=prefix
        )
    if kind == "policy":
        from sparse_patterns import PatternConfig
        from triangle_mix import LayerPolicy

        heads = case_heads(case["H"])
        patterns = PatternConfig(
            model_id="test",
            num_layers=len(POLICY_KINDS),
            num_heads=case["H"],
            layers=(heads,) * len(POLICY_KINDS),
        )
        policy = LayerPolicy(POLICY_KINDS, sink=case["sink"], window=case["window"])
        sparsity = HostSparsity(
            patterns=patterns, policy=policy, block=case.get("block", 8), prefix=prefix
        )
        return sparsity.for_layer(case["layer"], layout)
    raise ValueError(f"host: expected 'dense', 'triangle', 'mminference' or 'policy', got {kind!r}")


SPARSE_KINDS = ("mminference", "trianglemix", "mminference+trianglemix")


def model_sparsity(kind: str | None, model, *, start_layer: int = 1) -> HostSparsity | None:
    """The :class:`HostSparsity` of ``--sparse kind`` for a tiny model: MMInference with
    :func:`case_heads` in every layer, and/or TriangleMix from ``start_layer`` (sink 2, window 8)."""
    if kind is None:
        return None
    if kind not in SPARSE_KINDS:
        raise ValueError(f"sparse: expected one of {SPARSE_KINDS}, got {kind!r}")
    from sparse_patterns import PatternConfig
    from triangle_mix import LayerPolicy

    from .integrations.hf import language_model

    cfg = language_model(model).config
    L, H = cfg.num_hidden_layers, cfg.num_attention_heads
    patterns = None
    if "mminference" in kind:
        heads = case_heads(H)
        patterns = PatternConfig(model_id="tiny", num_layers=L, num_heads=H, layers=(heads,) * L)
    policy = None
    if "trianglemix" in kind:
        shallow = "dynamic" if patterns is not None else "dense"
        policy = LayerPolicy.triangle_from(L, start_layer, shallow=shallow, sink=2, window=8)
    return HostSparsity(patterns=patterns, policy=policy, block=8)
