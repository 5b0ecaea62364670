import pytest
import torch
from sparse_kernels.attention import masked_attention_reference
from sparse_kernels.triangle import triangle_mask
from triangle_mix import LayerPolicy
from triangle_mix.integrations.hf import apply_triangle_mix

transformers = pytest.importorskip("transformers")


def _tiny(family: str):
    common = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    if family == "llama":
        cfg = transformers.LlamaConfig(**common, head_dim=16)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(**common)
        model = transformers.Qwen2ForCausalLM(cfg)
    model.set_attn_implementation("sdpa")
    return model.eval()


FAMILIES = [pytest.param("llama", id="llama"), pytest.param("qwen2", id="qwen2")]
SHAPE = dict(sink=2, window=8, last=5)


def _ids(B=2, S=60):
    return torch.randint(0, 128, (B, S), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("family", FAMILIES)
def test_dense_policy_reproduces_unpatched_logits_exactly(family):
    model = _tiny(family)
    ids = _ids()
    with torch.no_grad():
        ref = model(ids).logits
        with apply_triangle_mix(model, LayerPolicy.dense(4, **SHAPE)):
            got = model(ids).logits
        after = model(ids).logits
    assert torch.equal(got, ref)
    assert torch.equal(after, ref)
    assert model.config._attn_implementation == "sdpa"


def _reference_model_logits(model, ids, policy):
    """The same model with an eager attention that applies the policy's mask explicitly."""
    from transformers import AttentionInterface

    def eager(module, q, k, v, attention_mask, scaling=None, dropout=0.0, **kw):
        S = q.shape[2]
        kind = policy.kinds[module.layer_idx]
        if kind == "dense":
            mask = triangle_mask(S, S, sink=0, window=S, last=0)
        else:
            last = policy.last if kind == "triangle" else 0
            mask = triangle_mask(S, S, sink=policy.sink, window=policy.window, last=last)
        out = masked_attention_reference(q, k, v, mask, scale=scaling).out
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register("tm_test_mask", eager)
    prev = model.config._attn_implementation
    model.set_attn_implementation("tm_test_mask")
    try:
        return model(ids).logits
    finally:
        model.set_attn_implementation(prev)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "make",
    [
        lambda: LayerPolicy.triangle_from(4, 2, **SHAPE),
        lambda: LayerPolicy.streaming_everywhere(4, **SHAPE),
    ],
    ids=["trianglemix-start2", "streaming"],
)
def test_sparse_policy_matches_explicit_mask_model(family, make):
    model = _tiny(family)
    policy = make()
    ids = _ids()
    with torch.no_grad():
        want = _reference_model_logits(model, ids, policy)
        with apply_triangle_mix(model, policy):
            got = model(ids).logits
        dense = model(ids).logits
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    assert not torch.allclose(got, dense, atol=1e-3)  # the pattern really changed the result


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_with_cache_on_and_off(family):
    model = _tiny(family)
    ids = _ids(B=2, S=40)
    pol = LayerPolicy.triangle_from(4, 1, **SHAPE)
    with torch.no_grad(), apply_triangle_mix(model, pol):
        a = model.generate(ids, max_new_tokens=4, do_sample=False, use_cache=True)
        b = model.generate(ids, max_new_tokens=4, do_sample=False, use_cache=False)
    # With the cache, decode steps attend all keys (dense); without it, each step re-runs the
    # prefill pattern. Both must run; the first token comes from the same prefill.
    assert a.shape == b.shape == (2, 44)
    assert torch.equal(a[:, :41], b[:, :41])


def test_last_row_only_gives_exact_last_logits():
    model = _tiny("llama")
    ids = _ids(B=1, S=50)
    pol = LayerPolicy.triangle_from(4, 2, **SHAPE)
    pol_last = LayerPolicy(pol.kinds, **SHAPE, last_row_only=True)
    with torch.no_grad():
        with apply_triangle_mix(model, pol):
            full = model(ids).logits[:, -1]
        with apply_triangle_mix(model, pol_last):
            last = model(ids, logits_to_keep=1).logits[:, -1]
    torch.testing.assert_close(last, full, atol=2e-5, rtol=1e-4)


def test_padding_mask_in_sparse_layer_is_refused():
    model = _tiny("qwen2")
    ids = _ids(B=2, S=30)
    am = torch.ones_like(ids)
    am[0, :5] = 0
    with torch.no_grad(), apply_triangle_mix(model, LayerPolicy.triangle_from(4, 2, **SHAPE)):
        with pytest.raises(NotImplementedError, match="padding"):
            model(ids, attention_mask=am)


def test_apply_errors():
    model = _tiny("llama")
    with pytest.raises(ValueError, match="expected 4 layers"):
        apply_triangle_mix(model, LayerPolicy.dense(3))
    with pytest.raises(ValueError, match="dynamic"):
        apply_triangle_mix(model, LayerPolicy.triangle_from(4, 2, shallow="dynamic"))
    with pytest.raises(TypeError, match="LayerPolicy"):
        apply_triangle_mix(model, "dense")


def test_dynamic_layers_call_the_estimator():
    model = _tiny("llama")
    calls = []

    def dyn(q, k, v, *, layer_idx, scale):
        calls.append(layer_idx)
        from sparse_kernels import attention

        return attention(q, k, v, scale=scale).out

    ids = _ids(B=1, S=20)
    with torch.no_grad():
        ref = model(ids).logits
        with apply_triangle_mix(
            model, LayerPolicy.triangle_from(4, 4, shallow="dynamic"), dynamic=dyn
        ):
            got = model(ids).logits
    assert calls == [0, 1, 2, 3]
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)


def test_nested_policies_undo_in_reverse_order():
    from sparse_kernels.integrations.hf import AttentionSwap

    model = _tiny("llama")
    ids = _ids(B=1, S=40)
    with torch.no_grad():
        ref = model(ids).logits
        outer = apply_triangle_mix(model, LayerPolicy.dense(4, **SHAPE))
        assert isinstance(outer, AttentionSwap)
        with apply_triangle_mix(model, LayerPolicy.streaming_everywhere(4, **SHAPE)):
            sparse = model(ids).logits
        assert torch.equal(model(ids).logits, ref)  # the outer dense policy is back
        outer.remove()
        outer.remove()
        assert torch.equal(model(ids).logits, ref)
    assert not torch.allclose(sparse, ref, atol=1e-3)
    assert model.config._attn_implementation == "sdpa"


def test_model_without_attention_modules_is_refused():
    with pytest.raises(NotImplementedError, match="no attention modules"):
        apply_triangle_mix(torch.nn.Linear(2, 2), LayerPolicy.dense(1))
