"""``swap_attention``: the one seam through which the HF integrations replace attention."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
from sparse_kernels.integrations.hf import (  # noqa: E402
    AttentionSwap,
    attention_modules,
    swap_attention,
)
from sparse_kernels.testing import default_device  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402


def _llama(seed=0, layers=2):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.set_attn_implementation("sdpa")
    return model


def _ids(B=1, S=23):
    return torch.randint(0, 97, (B, S), generator=torch.Generator().manual_seed(1))


def _logits(model, ids, **kw):
    with torch.no_grad():
        return model(ids, **kw).logits


def _recording(calls, tag):
    """SDPA's own function, noting ``(tag, layer, mask is None)`` of each call."""

    def fn(module, q, k, v, attention_mask, **kwargs):
        calls.append((tag, module.layer_idx, attention_mask is None))
        return sdpa_attention_forward(module, q, k, v, attention_mask, **kwargs)

    return fn


def _swapped(model):
    return [m for m in model.modules() if "_attention_swap" in m.__dict__]


def test_swap_runs_fn_in_every_layer_and_remove_restores_exactly():
    model = _llama()
    ids = _ids()
    ref = _logits(model, ids)
    calls = []
    swap = swap_attention(model, _recording(calls, "a"), name="test_swap_basic", mask="sdpa")
    assert isinstance(swap, AttentionSwap) and swap.active
    assert model.config._attn_implementation == "test_swap_basic"
    got = _logits(model, ids)
    assert [c[:2] for c in calls] == [("a", 0), ("a", 1)]
    assert torch.equal(got, ref)  # the same function and mask: bit for bit
    swap.remove()
    assert not swap.active and _swapped(model) == []
    assert model.config._attn_implementation == "sdpa"
    calls.clear()
    assert torch.equal(_logits(model, ids), ref) and calls == []
    swap.remove()  # a second remove does nothing
    assert model.config._attn_implementation == "sdpa"


def test_nested_swaps_undo_in_reverse_order():
    model = _llama()
    ids = _ids()
    calls = []
    outer = swap_attention(model, _recording(calls, "outer"), name="test_swap_outer")
    inner = swap_attention(model, _recording(calls, "inner"), name="test_swap_inner")
    _logits(model, ids)
    assert {c[0] for c in calls} == {"inner"}
    with pytest.raises(RuntimeError, match="remove the later swap first"):
        outer.remove()
    assert outer.active and model.config._attn_implementation == "test_swap_inner"
    inner.remove()
    assert model.config._attn_implementation == "test_swap_outer"
    calls.clear()
    _logits(model, ids)
    assert {c[0] for c in calls} == {"outer"}
    outer.remove()
    assert model.config._attn_implementation == "sdpa" and _swapped(model) == []


def test_nested_swaps_of_one_name_keep_their_own_functions():
    model = _llama()
    calls = []
    with swap_attention(model, _recording(calls, "first"), name="test_swap_same"):
        with swap_attention(model, _recording(calls, "second"), name="test_swap_same"):
            _logits(model, _ids())
        assert {c[0] for c in calls} == {"second"}
        calls.clear()
        _logits(model, _ids())
        assert {c[0] for c in calls} == {"first"}
    assert model.config._attn_implementation == "sdpa" and _swapped(model) == []


def test_two_models_under_one_name_each_run_their_own_function():
    a, b = _llama(0), _llama(1)
    calls = []
    with (
        swap_attention(a, _recording(calls, "a"), name="test_swap_two_models"),
        swap_attention(b, _recording(calls, "b"), name="test_swap_two_models"),
    ):
        _logits(a, _ids())
        assert {c[0] for c in calls} == {"a"}
        calls.clear()
        _logits(b, _ids())
        assert {c[0] for c in calls} == {"b"}


def test_context_manager_removes_on_error_and_a_stale_remove_leaves_later_swaps():
    model = _llama()
    with (
        pytest.raises(KeyError),
        swap_attention(model, _recording([], "x"), name="test_swap_cm") as s,
    ):
        raise KeyError("boom")
    assert not s.active and model.config._attn_implementation == "sdpa"
    later = swap_attention(model, _recording([], "y"), name="test_swap_cm_later")
    s.remove()
    assert later.active and model.config._attn_implementation == "test_swap_cm_later"
    later.remove()


def test_mask_none_builds_no_mask_and_sdpa_builds_sdpa_mask():
    model = _llama()
    ids = _ids(B=2, S=11)
    pad = torch.ones_like(ids)
    pad[0, :3] = 0
    calls = []
    with swap_attention(model, _recording(calls, "none"), name="test_swap_mask_none"):
        _logits(model, ids, attention_mask=pad)
    with swap_attention(model, _recording(calls, "sdpa"), name="test_swap_mask_sdpa", mask="sdpa"):
        _logits(model, ids, attention_mask=pad)
    assert {(t, none) for t, _, none in calls} == {("none", True), ("sdpa", False)}


def test_vlm_swaps_the_language_model_only_and_restores_every_config():
    cfg = transformers.Qwen2_5_VLConfig(
        text_config=dict(
            hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=48, vocab_size=320,
            rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 1, 1]},
        ),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                           out_hidden_size=32),
    )  # fmt: skip
    model = transformers.Qwen2_5_VLForConditionalGeneration(cfg)
    model.set_attn_implementation("sdpa")
    configs = [model.config, model.config.text_config, model.config.vision_config]
    before = [c._attn_implementation for c in configs]
    with swap_attention(model, _recording([], "vlm"), name="test_swap_vlm"):
        assert sorted(m.layer_idx for m in _swapped(model)) == [0, 1, 2]
        assert model.config.text_config._attn_implementation == "test_swap_vlm"
        assert model.config.vision_config._attn_implementation == before[2]
    assert [c._attn_implementation for c in configs] == before and _swapped(model) == []


def test_bad_inputs_raise_before_anything_changes():
    model = _llama()
    fn = _recording([], "bad")
    with pytest.raises(ValueError, match="found none in Sequential"):
        swap_attention(torch.nn.Sequential(torch.nn.Linear(2, 2)), fn, name="test_swap_bad")
    with pytest.raises(TypeError, match="expected a torch.nn.Module, got str"):
        swap_attention("llama", fn, name="test_swap_bad")
    with pytest.raises(TypeError, match="expected an attention function, got int"):
        swap_attention(model, 3, name="test_swap_bad")
    for taken in ("sdpa", "eager", "flex_attention"):
        with pytest.raises(ValueError, match=f"got '{taken}'"):
            swap_attention(model, fn, name=taken)
    with pytest.raises(ValueError, match="identifier"):
        swap_attention(model, fn, name="paged|x")
    with pytest.raises(ValueError, match="registered mask function name"):
        swap_attention(model, fn, name="test_swap_bad", mask="nope")
    swap_attention(model, fn, name="test_swap_bad_mask", mask="sdpa").remove()
    with pytest.raises(ValueError, match="first swapped with"):
        swap_attention(model, fn, name="test_swap_bad_mask")
    assert model.config._attn_implementation == "sdpa" and _swapped(model) == []


def test_a_name_set_by_hand_without_a_swap_is_refused_at_call_time():
    model = _llama()
    swap_attention(model, _recording([], "x"), name="test_swap_by_hand").remove()
    model.config._attn_implementation = "test_swap_by_hand"
    with pytest.raises(RuntimeError, match="no swap is active on this module"):
        _logits(model, _ids())


def test_attention_modules_are_the_decoder_self_attention():
    model = _llama(layers=3)
    mods = attention_modules(model)
    assert [m.layer_idx for m in mods] == [0, 1, 2]
    assert all(m is layer.self_attn for m, layer in zip(mods, model.model.layers))


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_dense_attention_matches_sdpa_logits(impl):
    from sparse_kernels.integrations.hf import dense_attention

    # the Triton kernel needs CUDA tensors, or CPU ones under the interpreter
    dev = default_device() if impl == "triton" else "cpu"
    model = _llama(seed=3).float().to(dev)
    ids = _ids(S=37).to(dev)
    ref = _logits(model, ids)
    with swap_attention(model, dense_attention(impl=impl), name=f"test_dense_{impl}"):
        got = _logits(model, ids)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)


def test_dense_attention_refuses_what_it_would_ignore():
    from sparse_kernels.integrations.hf import dense_attention

    model = _llama(seed=3).float()
    ids = _ids(B=2, S=12)
    pad = torch.ones(2, 12, dtype=torch.long)
    pad[1, :5] = 0  # the second prompt left-padded: transformers builds no mask for mask=None
    with swap_attention(model, dense_attention(impl="reference"), name="test_dense_refuse"):
        with pytest.raises(NotImplementedError, match="a batch of 2 prompts"):
            _logits(model, ids, attention_mask=pad)
    fn, q = dense_attention(), torch.zeros(1, 2, 4, 8)
    with pytest.raises(NotImplementedError, match=r"sliding_window=4096, an attention mask"):
        fn(None, q, q, q, torch.ones(1, 1, 4, 4, dtype=torch.bool), sliding_window=4096)
