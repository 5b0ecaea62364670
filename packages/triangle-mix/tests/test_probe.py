import pytest
import torch
from triangle_mix import kv_retrieval_prompt, probe_start_layer, suggest_start_layer
from triangle_mix.probe import _Acc, _ProbeAttention

transformers = pytest.importorskip("transformers")


def test_probe_gradients_equal_explicit_theta():
    # Reference: theta (all ones) multiplies the probabilities explicitly; autograd gives d y / d theta.
    torch.manual_seed(0)
    B, H, H_KV, N, D = 1, 4, 2, 24, 8
    sink, window, last = 2, 4, 5
    q = torch.randn(B, H, N, D, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, H_KV, N, D, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, H_KV, N, D, dtype=torch.float64, requires_grad=True)
    w = torch.randn(B, H, N, D, dtype=torch.float64)
    scale = D**-0.5
    theta = torch.ones(B, H, N, N, dtype=torch.float64, requires_grad=True)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    causal = j <= i
    A = torch.softmax((q @ kk.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf")), -1)
    ((theta * A) @ vv * w).sum().backward()
    gq, gk, gv, gt = q.grad.clone(), k.grad.clone(), v.grad.clone(), theta.grad
    outside = causal & ~((j < sink) | (i - j < window))
    mid, lst = outside & (i < N - last), outside & (i >= N - last)
    want_mid = sum(float(gt[0, h][mid].mean()) for h in range(H))
    want_last = sum(float(gt[0, h][lst].mean()) for h in range(H))
    want_amid = sum(float(A.detach()[0, h][mid].mean()) for h in range(H))

    q.grad = k.grad = v.grad = None
    acc = _Acc(1)
    out = _ProbeAttention.apply(q, k, v, scale, 0, acc, sink, window, last)
    (out * w).sum().backward()
    torch.testing.assert_close(q.grad, gq)
    torch.testing.assert_close(k.grad, gk)
    torch.testing.assert_close(v.grad, gv)
    assert acc.g_mid[0].item() == pytest.approx(want_mid, rel=1e-9, abs=1e-12)
    assert acc.g_last[0].item() == pytest.approx(want_last, rel=1e-9, abs=1e-12)
    assert acc.a_mid[0].item() == pytest.approx(want_amid, rel=1e-9)


class _CharTokenizer:
    chat_template = None

    def __call__(self, text, return_tensors=None, add_special_tokens=True):
        ids = [ord(c) % 120 + 1 for c in text]
        out = type("Enc", (), {})()
        out.input_ids = torch.tensor([ids]) if return_tensors == "pt" else ids
        return out


def test_probe_runs_on_a_tiny_llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=2048,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.set_attn_implementation("sdpa")
    res = probe_start_layer(
        model, _CharTokenizer(), samples=2, tokens=400, sink=4, window=16, last=16,
        model_id="tiny-llama",
    )  # fmt: skip
    assert len(res.grad_middle) == 3 and res.tokens > 300 and res.model_id == "tiny-llama"
    # The next-token logit does not depend on the last layer's other rows: its Middle gradient is 0.
    assert res.grad_middle[-1] == 0.0
    assert res.grad_last[-1] != 0.0 and res.att_middle[0] > 0.0
    assert model.config._attn_implementation == "sdpa"
    assert all(p.requires_grad for p in model.parameters())


def test_suggest_start_layer():
    assert suggest_start_layer([1.0, 0.8, 0.5, 0.05, 0.01, 0.0]) == 3
    assert suggest_start_layer([1.0, 0.05, 0.5, 0.0]) == 3
    assert suggest_start_layer([0.0, 0.0]) == 0


def test_kv_prompt_is_seeded_and_contains_answer():
    a, b = kv_retrieval_prompt(5, 3), kv_retrieval_prompt(5, 3)
    assert a == b and a.answer in a.prompt and f"key: {a.key}" in a.prompt
    assert a.prompt.endswith("value:")
    assert kv_retrieval_prompt(5, 4).answer != a.answer


def test_plot_probe_marks_start_layer_and_threshold(tmp_path):
    pytest.importorskip("matplotlib")
    from triangle_mix import ProbeResult, plot_probe

    gm = (0.9, 1.0, 0.7, 0.4, 0.05, 0.02, 0.0)
    res = ProbeResult(
        grad_middle=gm, grad_last=(0.5,) * 7, att_middle=(0.3,) * 7, att_last=(0.2,) * 7,
        suggested_start_layer=suggest_start_layer(gm, 0.1), threshold=0.1, n_samples=4,
        tokens=2000, sink=64, window=128, last=128,
    )  # fmt: skip
    fig = plot_probe(res, tmp_path / "probe.png", title="tiny")
    assert (tmp_path / "probe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sup = fig._suptitle.get_text()
    assert sup.startswith("tiny\n") and "4 key-value retrieval prompts of ~2000 tokens" in sup
    assert "sink 64, window 128" in sup
    att, grad = fig.axes
    assert att.get_ylabel().startswith("Att(M, l)") and grad.get_ylabel().startswith("Grad(M, l)")
    assert grad.get_xlabel() == "layer"
    for ax in (att, grad):
        labels = ax.get_legend_handles_labels()[1]
        assert "suggested start layer: 4" in labels and "Last Q-K (last 128 rows)" in labels
        (vline,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("suggested")]
        assert list(vline.get_xdata()) == [4, 4]
    (hline,) = [ln for ln in grad.get_lines() if ln.get_label().startswith("threshold")]
    assert list(hline.get_ydata()) == pytest.approx([0.1, 0.1])
    assert all(t == int(t) for t in grad.xaxis.get_major_locator()())


def test_plot_probe_rejects_other_results(tmp_path):
    from triangle_mix import plot_probe

    with pytest.raises(TypeError, match="expected a ProbeResult, got dict"):
        plot_probe({"grad_middle": [1.0]}, tmp_path / "x.png")


def _result(**change):
    import dataclasses

    from triangle_mix import ProbeResult

    base = ProbeResult(
        grad_middle=(1.0, 0.5, 0.0), grad_last=(0.2,) * 3, att_middle=(0.3,) * 3,
        att_last=(0.4,) * 3, suggested_start_layer=2, threshold=0.1, n_samples=2, tokens=400,
        sink=4, window=16, last=16,
    )  # fmt: skip
    return dataclasses.replace(base, **change)


def test_probe_result_json_round_trip_and_files_without_model_id():
    import json

    from triangle_mix import ProbeResult

    for res in (_result(), _result(model_id="Qwen2.5-VL-7B-Instruct")):
        assert ProbeResult.from_json(res.to_json()) == res
    old = json.loads(_result().to_json())
    del old["model_id"]  # written before the field existed
    assert ProbeResult.from_json(json.dumps(old)) == _result()


@pytest.mark.parametrize(
    "change, match",
    [
        pytest.param({"grad_last": [0.2]}, r"grad_last: expected a list of 3 numbers", id="short-curve"),
        pytest.param({"grad_middle": []}, "grad_middle: expected a list of one or more", id="no-layers"),
        pytest.param({"att_last": [0.1, "x", 0.2]}, "att_last: expected a list of 3", id="not-a-number"),
        pytest.param({"suggested_start_layer": 4}, r"expected 0..3 \(the curves have 3 layers\), got 4",
                     id="start-past-the-end"),
        pytest.param({"tokens": -1}, "tokens: expected an integer >= 0, got -1", id="negative"),
        pytest.param({"sink": True}, "sink: expected an integer >= 0, got True", id="bool"),
        pytest.param({"threshold": "0.1"}, "threshold: expected a number, got '0.1'", id="threshold"),
        pytest.param({"model_id": 7}, "model_id: expected a string or null, got 7", id="model-id"),
        pytest.param({"extra": 1}, r"unknown keys \['extra'\]", id="unknown-key"),
        pytest.param({"window": None}, "window: expected an integer >= 0, got None", id="none"),
    ],
)  # fmt: skip
def test_probe_result_from_json_names_the_bad_field(change, match):
    import json

    from triangle_mix import ProbeResult

    data = json.loads(_result().to_json())
    data.update(change)
    with pytest.raises(ValueError, match=match):
        ProbeResult.from_json(json.dumps(data))
    with pytest.raises(ValueError, match="expected a ProbeResult JSON object, got list"):
        ProbeResult.from_json("[]")
    with pytest.raises(ValueError, match=r"expected the ProbeResult fields \['grad_last'"):
        ProbeResult.from_json(json.dumps({k: v for k, v in data.items() if k != "grad_last"}))
    with pytest.raises(ValueError, match="invalid JSON"):
        ProbeResult.from_json("{")
