import copy
import os
import sys

import pytest
import torch
from sparse_kernels.testing import assert_close_budget

transformers = pytest.importorskip("transformers")
from sparse_kernels.integrations.hf import fuse_per_token_ops  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _model(family: str, device: str):
    dims = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    torch.manual_seed(0)
    if family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**dims))
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**dims))
    for mod in model.modules():  # non-trivial norm weights, so a skipped weight would show
        if type(mod).__name__.endswith("RMSNorm"):
            mod.weight.data.uniform_(0.5, 1.5)
    return model.eval().to(device)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids.to(next(model.parameters()).device), use_cache=False).logits


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_fused_text_models_match_eager_and_undo(family, impl):
    """Text-only Llama and Qwen2: with the references the logits equal eager bit for bit; with
    the kernels (compiled, or the interpreter) they are within the budget of eager fp32 against
    the same model in float64. ``remove()`` restores the modules and the rotary function."""
    if impl == "triton" and not (torch.cuda.is_available() or INTERP):
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    device = "cuda" if impl == "triton" and not INTERP else "cpu"
    model = _model(family, device)
    ids = torch.randint(0, 97, (2, 37), generator=torch.Generator().manual_seed(1))
    eager = _logits(model, ids)
    modeling = sys.modules[type(model.model.layers[0].self_attn).__module__]
    rope = modeling.apply_rotary_pos_emb
    handle = fuse_per_token_ops(model, impl=impl)
    assert modeling.apply_rotary_pos_emb is not rope and "forward" in model.model.norm.__dict__
    fused = _logits(model, ids)
    handle.remove()
    handle.remove()  # a second remove changes nothing
    assert modeling.apply_rotary_pos_emb is rope and "forward" not in model.model.norm.__dict__
    if impl == "reference":
        assert torch.equal(fused, eager)
    else:
        gold = _logits(copy.deepcopy(model).double(), ids)
        assert_close_budget(fused, eager, gold.double(), dtype=torch.float32)
    assert torch.equal(_logits(model, ids), eager)  # undone


def test_refusals_name_the_part_and_patch_nothing():
    model = _model("qwen2", "cpu")
    model.model.layers[1].mlp.act_fn = torch.nn.GELU()
    with pytest.raises(
        ValueError, match=r"SiLU-gated MLP .* at layers\.1\.mlp, got Qwen2MLP with act_fn GELU"
    ):
        fuse_per_token_ops(model)
    assert not any("forward" in m.__dict__ for m in model.modules())
    with pytest.raises(ValueError, match="expected a model with decoder layers"):
        fuse_per_token_ops(torch.nn.Linear(2, 2))


def test_fused_handle_is_a_context_manager():
    model = _model("llama", "cpu")
    ids = torch.randint(0, 97, (1, 11), generator=torch.Generator().manual_seed(2))
    eager = _logits(model, ids)
    with fuse_per_token_ops(model, impl="reference"):
        assert "forward" in model.model.norm.__dict__
        assert torch.equal(_logits(model, ids), eager)
    assert "forward" not in model.model.norm.__dict__
