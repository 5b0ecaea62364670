import pytest
import torch

transformers = pytest.importorskip("transformers")

from sparse_patterns import (  # noqa: E402
    AShape,
    Dense,
    HeadConfig,
    PatternConfig,
    TokenLayout,
    VerticalSlash,
)
from sparse_patterns.integrations.hf import (  # noqa: E402
    apply_pattern_config,
    capture_qkv,
)


def _tiny_llama(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    cfg._attn_implementation = "sdpa"
    return transformers.LlamaForCausalLM(cfg).eval()


def _ids(S, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 97, (1, S), generator=g)


def test_dense_config_matches_unpatched_model_and_handle_restores():
    model = _tiny_llama()
    ids = _ids(300)
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    cfg = PatternConfig("tiny-llama", 2, 4, ((HeadConfig(Dense()),) * 4,) * 2)
    handle = apply_pattern_config(model, cfg, block=32, min_sparse_len=64)
    with torch.no_grad():
        out = model(input_ids=ids).logits
    torch.testing.assert_close(out, ref, rtol=2e-4, atol=2e-4)
    handle.remove()
    assert model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        again = model(input_ids=ids).logits
    torch.testing.assert_close(again, ref, rtol=0, atol=0)


def test_sparse_config_changes_output_and_reads_layout_from_the_forward_kwarg():
    model = _tiny_llama()
    ids = _ids(300)
    heads = (HeadConfig(AShape(sink=4, window=32)),) * 4
    cfg = PatternConfig("tiny-llama", 2, 4, (heads, heads))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    with apply_pattern_config(model, cfg, block=32, min_sparse_len=64):
        with torch.no_grad():
            out = model(input_ids=ids, modality_layout=TokenLayout.text(300)).logits
        # a wrong-length layout reaches the attention function and is rejected
        with pytest.raises(ValueError, match="expected 300"), torch.no_grad():
            model(input_ids=ids, modality_layout=TokenLayout.text(299))
    assert not torch.allclose(out, ref, atol=1e-3)
    # the last row of the first layer with A-shape still sees its window: logits finite
    assert torch.isfinite(out).all()


def test_capture_qkv_and_layer_count_check():
    model = _tiny_llama()
    got = capture_qkv(model, {"input_ids": _ids(50)}, layers=[1])
    assert [g[0] for g in got] == [1]
    _, q, k, v = got[0]
    assert q.shape == (1, 4, 50, 16) and k.shape == (1, 2, 50, 16) and v.shape == k.shape
    assert model.config._attn_implementation == "sdpa"
    bad = PatternConfig("x", 3, 4, ((HeadConfig(VerticalSlash()),) * 4,) * 3)
    with pytest.raises(ValueError, match="3 layers"):
        apply_pattern_config(model, bad)


def test_vlm_config_sizes_are_checked_against_the_text_config():
    from modality_index.integrations.hf import tiny_qwen2_5_vl_config

    model = transformers.Qwen2_5_VLForConditionalGeneration(tiny_qwen2_5_vl_config(layers=2))
    vs = (HeadConfig(VerticalSlash()),)
    with pytest.raises(ValueError, match="3 layers, the model has 2"):
        apply_pattern_config(model, PatternConfig("x", 3, 4, (vs * 4,) * 3))
    with pytest.raises(ValueError, match="8 query heads per layer, the model has 4"):
        apply_pattern_config(model, PatternConfig("x", 2, 8, (vs * 8,) * 2))


def test_nested_configs_undo_in_reverse_order_to_the_exact_previous_state():
    from sparse_kernels.integrations.hf import AttentionSwap

    model = _tiny_llama()
    model.set_attn_implementation("eager")
    ids = _ids(300)
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    sparse = PatternConfig("tiny-llama", 2, 4, ((HeadConfig(AShape(sink=4, window=32)),) * 4,) * 2)
    dense = PatternConfig("tiny-llama", 2, 4, ((HeadConfig(Dense()),) * 4,) * 2)
    outer = apply_pattern_config(model, sparse, block=32, min_sparse_len=64)
    assert isinstance(outer, AttentionSwap)
    with torch.no_grad():
        sparse_out = model(input_ids=ids).logits
        with apply_pattern_config(model, dense, block=32, min_sparse_len=64):
            torch.testing.assert_close(model(input_ids=ids).logits, ref, rtol=2e-4, atol=2e-4)
        assert torch.equal(model(input_ids=ids).logits, sparse_out)
    outer.remove()
    assert model.config._attn_implementation == "eager"
    assert not torch.allclose(sparse_out, ref, atol=1e-3)


def test_vlm_language_model_attention_only_is_swapped():
    from modality_index.integrations.hf import tiny_qwen2_5_vl_config

    model = transformers.Qwen2_5_VLForConditionalGeneration(tiny_qwen2_5_vl_config(layers=2))
    cfg = PatternConfig("x", 2, 4, ((HeadConfig(Dense()),) * 4,) * 2)
    vision = model.config.vision_config._attn_implementation
    with apply_pattern_config(model, cfg) as h:
        assert model.config.text_config._attn_implementation == h.name
        assert model.config.vision_config._attn_implementation == vision
    assert model.config.text_config._attn_implementation == vision  # both were set alike
