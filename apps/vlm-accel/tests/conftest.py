"""Shared checks of the vlm-accel tests."""

from __future__ import annotations

import pytest
import torch


def _logits(model, inputs, applied=None):
    with torch.no_grad(), applied.context() if applied else torch.no_grad():
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
                got = _logits(model, inputs, applied)
            finally:
                applied.remove()
            assert torch.equal(got, ref), method
        assert torch.equal(_logits(model, inputs), ref)

    return check
