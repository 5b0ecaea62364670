"""Shared checks of the vlm-accel tests."""

from __future__ import annotations

import pytest
import torch


def _logits(model, inputs):
    with torch.no_grad():
        return model(**inputs, use_cache=False).logits


@pytest.fixture
def assert_dense_methods_exact():
    """``check(model, inputs, layout, model_type)``: the dense method, the all-dense TriangleMix
    policy and an all-Dense pattern config reproduce the unpatched logits bit for bit, and after
    ``remove()`` the model is unpatched again."""

    def check(model, inputs, layout, model_type):
        from sparse_patterns import Dense, HeadConfig, PatternConfig
        from vlm_accel import engine

        lm = engine.language_model(model)
        n, H = lm.config.num_hidden_layers, lm.config.num_attention_heads
        ref = _logits(model, inputs)
        dense_cfg = PatternConfig(model_type, n, H, ((HeadConfig(Dense()),) * H,) * n, {})
        for method, kw in [
            ("dense", {}),
            ("trianglemix", {"start_layer": n}),
            ("mminference", {"pattern_config": dense_cfg}),
        ]:
            applied = engine.apply_method(model, method, layout=layout, **kw)
            try:
                got = _logits(model, inputs)
            finally:
                applied.remove()
            assert torch.equal(got, ref), method
        assert torch.equal(_logits(model, inputs), ref)

    return check


class MethodCalls:
    """Query lengths of every call of a method's attention function, by method (and of
    ``sparse_patterns.MMInferencePlanner.plan``, with the head configs it planned), and the check
    that a method ran where it changes the attention."""

    # Shortest prompt where each method differs from dense: mminference (the patterns'
    # attention function) runs dense SDPA below 256 tokens; a triangle layer with the CLI's
    # shape (sink 8, window 512, last 128) drops keys only when S > window + last.
    APPLIES_FROM = {"mminference": 256, "triangle": 512 + 128 + 1}

    def __init__(self):
        self.lengths = {"mminference": [], "triangle": [], "plan": []}
        self.planned_heads = []  # the heads argument of each plan call

    def reset(self) -> None:
        for lengths in self.lengths.values():
            lengths.clear()
        self.planned_heads.clear()

    def assert_ran(self, name: str, *, calls: int, applies_from: int | None = None) -> None:
        """At least ``calls`` calls, each at a length of at least ``applies_from`` (default: the
        CLI's shape, :attr:`APPLIES_FROM`)."""
        got = self.lengths[name]
        low = self.APPLIES_FROM[name] if applies_from is None else applies_from
        assert len(got) >= calls, f"{name}: expected >= {calls} calls, got {len(got)}"
        assert min(got) >= low, f"{name}: expected lengths >= {low}, ran at {got}"


@pytest.fixture
def method_calls(monkeypatch):
    """A :class:`MethodCalls` counting ``mminference_attention``, TriangleMix's
    ``triangle_attention`` and ``MMInferencePlanner.plan`` (every planned layer, whichever entry
    planned it) as the CLI reaches them. Install it before the method is applied (the
    patterns' attention function binds ``mminference_attention`` when it is made)."""
    import sparse_patterns
    import sparse_patterns.mminference as mm
    import triangle_mix.integrations.hf as tm_hf

    calls = MethodCalls()
    real_mm, real_tri = mm.mminference_attention, tm_hf.triangle_attention
    real_plan = sparse_patterns.MMInferencePlanner.plan

    def mm_spy(q, *args, **kwargs):
        calls.lengths["mminference"].append(q.shape[2])
        return real_mm(q, *args, **kwargs)

    def tri_spy(q, *args, **kwargs):
        calls.lengths["triangle"].append(q.shape[2])
        return real_tri(q, *args, **kwargs)

    def plan_spy(self, q, k, heads, *args, **kwargs):
        calls.lengths["plan"].append(q.shape[2])
        calls.planned_heads.append(tuple(heads) if isinstance(heads, (list, tuple)) else (heads,))
        return real_plan(self, q, k, heads, *args, **kwargs)

    monkeypatch.setattr(sparse_patterns.MMInferencePlanner, "plan", plan_spy)
    monkeypatch.setattr(mm, "mminference_attention", mm_spy)
    monkeypatch.setattr(sparse_patterns, "mminference_attention", mm_spy)
    monkeypatch.setattr(tm_hf, "triangle_attention", tri_spy)
    return calls
