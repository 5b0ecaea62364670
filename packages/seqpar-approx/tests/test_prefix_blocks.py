"""PrefixBlocks: the block selection over a segment's prefix keys and its attention.

The selection and the mask are rebuilt here in plain PyTorch, one head at a time (float64
scores), and compared exactly; the attention is compared with masked PyTorch attention over that
mask (float64 golden), both engines (the Triton kernel under TRITON_INTERPRET=1).
"""

import os

import pytest
import torch
from seqpar_approx import HostSparsity, MMInferenceHost, PrefixBlocks
from seqpar_approx.testing_hosts import case_heads
from sparse_kernels import attention
from sparse_kernels.attention.reference import masked_attention_reference

FP32 = dict(atol=2e-6, rtol=2e-5)


def _qkv(seed, B, H, H_KV, S, P, D=16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, S, D, generator=g)
    k = torch.randn(B, H_KV, P, D, generator=g)
    v = torch.randn(B, H_KV, P, D, generator=g)
    return q, k, v


def _reference_mask(q, k, top_k, last_q, block, scale):
    """``[B, H, S, P]``: each head's selected prefix blocks, one head at a time."""
    B, H, S, _ = q.shape
    H_KV, P = k.shape[1], k.shape[2]
    nb = -(-P // block)
    mask = torch.zeros(B, H, S, P, dtype=torch.bool)
    for b in range(B):
        for h in range(H):
            ql = q[b, h, max(0, S - last_q) :].double()
            p = torch.softmax(ql @ k[b, h // (H // H_KV)].double().T * scale, dim=-1).mean(0)
            score = [float(p[j * block : (j + 1) * block].sum()) for j in range(nb)]
            rest = sorted(range(1, nb), key=lambda j: -score[j])[: top_k - 1]
            for j in [0, *rest]:
                mask[b, h, :, j * block : (j + 1) * block] = True
    return mask


SHAPES = [
    pytest.param(dict(B=1, H=4, H_KV=2, S=97, P=300), 2, id="B1-H4-HKV2-S97-P300-top2"),
    pytest.param(dict(B=2, H=2, H_KV=2, S=130, P=257), 3, id="B2-H2-S130-P257-top3"),
    pytest.param(dict(B=1, H=4, H_KV=1, S=1, P=200), 1, id="B1-H4-HKV1-S1-P200-top1"),
]


@pytest.mark.parametrize(("shape", "top_k"), SHAPES)
def test_selection_and_mask_match_plain_pytorch(shape, top_k):
    q, k, _ = _qkv(1, **shape)
    step = PrefixBlocks(top_k=top_k, last_q=16)
    scale = q.shape[-1] ** -0.5
    sel = step.select(q, k, scale=scale)
    got = step.row_mask(sel, q.shape[2], k.shape[2])
    assert torch.equal(got, _reference_mask(q, k, top_k, 16, 64, scale))
    assert sel.shape[-1] == top_k and bool((sel[..., 0] == 0).all())


IMPLS = ["reference"]
if os.environ.get("TRITON_INTERPRET") == "1":
    IMPLS.append("triton")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("shape", "top_k"), SHAPES)
def test_attend_equals_masked_attention(shape, top_k, impl):
    q, k, v = _qkv(2, **shape)
    step = PrefixBlocks(top_k=top_k, last_q=16)
    scale = q.shape[-1] ** -0.5
    mask = _reference_mask(q, k, top_k, 16, 64, scale)
    ref = masked_attention_reference(q, k, v, mask, scale=scale, compute_dtype=torch.float64)
    got = step.attend(q, k, v, step.select(q, k, scale=scale), scale=scale, impl=impl)
    torch.testing.assert_close(got.out, ref.out.float(), **FP32)
    torch.testing.assert_close(got.lse, ref.lse.float(), **FP32)
    dense = attention(q, k, v, causal=False, scale=scale, impl="reference")
    assert (got.out - dense.out).abs().max() > 1e-3  # a real restriction of the prefix


def test_short_prefix_is_attended_whole():
    q, k, v = _qkv(3, B=1, H=2, H_KV=2, S=40, P=128)
    step = PrefixBlocks(top_k=2)
    sel = step.select(q, k, scale=0.25)
    assert sel.tolist() == [[[0, 1], [0, 1]]]
    got = step.attend(q, k, v, sel, scale=0.25, impl="reference")
    ref = attention(q, k, v, causal=False, scale=0.25, impl="reference")
    assert torch.equal(got.out, ref.out) and torch.equal(got.lse, ref.lse)


def test_mminference_host_prefix_part_is_the_selection():
    """The host's output is the LSE merge of its segment plan and the selected prefix blocks."""
    q, kp, vp = _qkv(4, B=1, H=4, H_KV=2, S=100, P=260)
    g = torch.Generator().manual_seed(5)
    k, v = torch.randn(2, 1, 2, 100, 16, generator=g)
    scale = 0.25
    host = MMInferenceHost(case_heads(4), block=8, prefix=PrefixBlocks(top_k=2, last_q=8))
    seg = host.plan(q, k, start=0, scale=scale).row_mask(torch.arange(100))
    pre = _reference_mask(q, kp, 2, 8, 64, scale)
    assert torch.equal(host.prefix_mask(q, kp, scale=scale), pre)
    mask = torch.cat([pre, seg], dim=-1)
    kk, vv = torch.cat([kp, k], dim=2), torch.cat([vp, v], dim=2)
    ref = masked_attention_reference(q, kk, vv, mask, scale=scale, compute_dtype=torch.float64)
    got = host(q, k, v, kp, vp, start=0, scale=scale, impl="reference")
    torch.testing.assert_close(got.out, ref.out.float(), **FP32)
    torch.testing.assert_close(got.lse, ref.lse.float(), **FP32)
    dense_prefix = MMInferenceHost(case_heads(4), block=8)
    old = dense_prefix(q, k, v, kp, vp, start=0, scale=scale, impl="reference")
    assert (got.out - old.out).abs().max() > 1e-3


def test_errors_name_expected_and_received():
    from triangle_mix import LayerPolicy

    with pytest.raises(ValueError, match="PrefixBlocks.top_k: expected an int >= 1, got 0"):
        PrefixBlocks(top_k=0)
    with pytest.raises(ValueError, match=r"PrefixBlocks.last_q: expected an int >= 1, got True"):
        PrefixBlocks(top_k=1, last_q=True)
    with pytest.raises(
        ValueError, match=r"PrefixBlocks.block: expected one of \(64, 128\).*got 32"
    ):
        PrefixBlocks(top_k=1, block=32)
    with pytest.raises(
        TypeError, match="MMInferenceHost.prefix: expected a PrefixBlocks .*got int"
    ):
        MMInferenceHost(case_heads(2), prefix=4)
    with pytest.raises(TypeError, match="HostSparsity.prefix: expected a PrefixBlocks .*got str"):
        HostSparsity(patterns=_patterns(), prefix="top2")
    with pytest.raises(ValueError, match="prefix is the MMInference layers' setting"):
        HostSparsity(policy=LayerPolicy(("dense", "triangle")), prefix=PrefixBlocks(top_k=1))


def _patterns():
    from sparse_patterns import PatternConfig

    heads = case_heads(2)
    return PatternConfig(model_id="m", num_layers=2, num_heads=2, layers=(heads,) * 2)


def test_host_sparsity_hands_the_prefix_to_its_mminference_layers():
    prefix = PrefixBlocks(top_k=3)
    host = HostSparsity(patterns=_patterns(), prefix=prefix).for_layer(1)
    assert isinstance(host, MMInferenceHost) and host.prefix == prefix
