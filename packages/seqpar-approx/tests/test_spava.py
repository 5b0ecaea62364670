"""Spava attention: simulation properties (single process) and distributed == simulation (gloo)."""

import pytest
import torch
from seqpar_approx import (
    SpavaConfig,
    build_layout,
    select_essential,
    simulate_spava_attention,
    spava_attention,
    top_indices,
)
from seqpar_approx.testing import attention_cases, case_layout, make_full_qkv, spawn
from sparse_kernels import attention
from sparse_kernels.attention.reference import masked_attention_reference

FP32 = dict(atol=2e-6, rtol=2e-5)


def _case(**kw):
    base = dict(seed=0, B=1, H=4, H_KV=2, D=16, method="spava")
    base.update(kw)
    return base


def test_exact_when_passing_covers_whole_blocks():
    case = _case(n=131, query_len=9, anchor_len=6, passing_len=64)
    layout, cfg = case_layout(case, 2)
    assert layout.passing_len >= max(layout.block_len(v) for v in range(layout.num_virtual))
    q, k, v = make_full_qkv(case)
    got = simulate_spava_attention(q, k, v, layout, cfg)
    ref = attention(q, k, v, causal=True)
    torch.testing.assert_close(got.out, ref.out, **FP32)
    torch.testing.assert_close(got.lse, ref.lse, **FP32)


def test_approximation_masks_exactly_the_documented_keys():
    """Rebuild Spava's mask from the selected indices and compare with masked dense attention."""
    case = _case(n=120, query_len=7, anchor_len=5, passing_len=3, H=6, H_KV=3, seed=3)
    layout, cfg = case_layout(case, 2)
    q, k, v = make_full_qkv(case)
    n, la, qs = layout.seq_len, layout.anchor_len, layout.context_end
    scale = q.shape[-1] ** -0.5
    mask = torch.zeros(1, case["H_KV"], n, n, dtype=torch.bool)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    mask[..., :la, :la] = causal[:la, :la]
    mask[..., qs:, :] = causal[qs:, :]
    passed = torch.zeros(1, case["H_KV"], n, dtype=torch.bool)
    for vb in range(layout.num_virtual):
        s, e = layout.block(vb)
        mask[..., s:e, :la] = True
        mask[..., s:e, :] |= passed[..., None, :]
        mask[..., s:e, s:e] = causal[: e - s, : e - s]
        _, _, idx = select_essential(q[:, :, qs:], k[:, :, s:e], v[:, :, s:e], 3, scale=scale)
        passed.scatter_(2, idx + s, True)
    mask = mask.repeat_interleave(case["H"] // case["H_KV"], dim=1)
    ref = masked_attention_reference(q, k, v, mask, scale=scale, compute_dtype=torch.float64)
    got = simulate_spava_attention(q, k, v, layout, cfg)
    torch.testing.assert_close(got.out, ref.out.float(), **FP32)
    torch.testing.assert_close(got.lse, ref.lse, **FP32)
    # and it is a real approximation: differs from dense
    dense = attention(q, k, v, causal=True)
    assert (got.out - dense.out).abs().max() > 1e-3


def test_selection_is_gqa_aware_and_deterministic():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 5, 8, generator=g)
    k = torch.randn(1, 2, 11, 8, generator=g)
    v = torch.randn(1, 2, 11, 8, generator=g)
    # make key 7 of kv head 1 dominant for query heads 2 and 3 (the group of kv head 1)
    k[0, 1, 7] = q[0, 2:].mean(dim=0).mean(dim=0) * 10
    kc, vc, idx = select_essential(q, k, v, 3, scale=8**-0.5)
    assert 7 in idx[0, 1].tolist()
    assert torch.equal(idx, idx.sort(dim=-1).values)
    assert torch.equal(kc, k.gather(2, idx[..., None].expand(-1, -1, -1, 8)))
    # exact ties go to the lower positions
    scores = torch.tensor([[[1.0, 3.0, 3.0, 2.0, 3.0, 3.0]]])
    assert torch.equal(top_indices(scores, 3), torch.tensor([[[1, 2, 4]]]))
    assert torch.equal(top_indices(torch.zeros(1, 1, 6), 2), torch.tensor([[[0, 1]]]))


def test_query_partial_does_not_drop_trailing_context_keys():
    """The query block's output is exact dense attention whatever l_p is."""
    case = _case(n=150, query_len=11, anchor_len=8, passing_len=1, seed=5)
    layout, cfg = case_layout(case, 4)
    q, k, v = make_full_qkv(case)
    got = simulate_spava_attention(q, k, v, layout, cfg)
    ref = attention(q, k, v, causal=True)
    qs = layout.context_end
    torch.testing.assert_close(got.out[:, :, qs:], ref.out[:, :, qs:], **FP32)
    torch.testing.assert_close(got.out[:, :, :8], ref.out[:, :, :8], **FP32)


def test_single_process_group_of_one_equals_simulation():
    case = _case(n=77, query_len=5, anchor_len=3, passing_len=4)
    layout, cfg = case_layout(case, 1)
    q, k, v = make_full_qkv(case)
    got = spava_attention(*(layout.shard(t, 0, dim=2) for t in (q, k, v)), layout, cfg)
    ref = simulate_spava_attention(q, k, v, layout, cfg)
    torch.testing.assert_close(layout.unshard([got.out], dim=2), ref.out, **FP32)


def test_errors_name_expected_and_received():
    cfg = SpavaConfig(num_hosts=1, anchor_len=2, passing_len=2)
    layout = build_layout(30, query_len=3, config=cfg)
    q = torch.zeros(1, 2, 29, 8)
    with pytest.raises(ValueError, match="expected host 0's 30 local rows.*got 29"):
        spava_attention(q, q, q, layout, cfg)
    with pytest.raises(ValueError, match="layout is for 2 hosts, the process group has 1 ranks"):
        spava_attention(
            q, q, q, build_layout(30, query_len=3, config=SpavaConfig(num_hosts=2)), cfg
        )


# ---- distributed (gloo, CPU, fp32): one spawn per world size, many cases -----------------------

CASES = {
    "n131-q9-la6-lp5-zigzag": _case(n=131, query_len=9, anchor_len=6, passing_len=5),
    "n131-q9-la6-lp5-sync": _case(
        n=131, query_len=9, anchor_len=6, passing_len=5, overlap_comm=False
    ),
    "n97-q1-la0-lp3-GQA6:1": _case(
        n=97, query_len=1, anchor_len=0, passing_len=3, H=6, H_KV=1, seed=2
    ),
    "n150-q12-lp-covers-blocks": _case(n=150, query_len=12, anchor_len=4, passing_len=40, seed=4),
    "n101-q6-contiguous": _case(n=101, query_len=6, anchor_len=5, passing_len=4, zigzag=False),
    "n120-q8-star": _case(n=120, query_len=8, anchor_len=8, method="star", seed=6),
    "n256-q8-apb-defaults": _case(n=256, query_len=8, method="apb", seed=7),
    "n103-ring-p2p": _case(n=103, method="ring", seed=8),
    "n103-ring-allgather": _case(n=103, method="ring", comm="allgather", seed=8),
    "n103-ring-sync": _case(n=103, method="ring", overlap_comm=False, seed=9),
}


@pytest.fixture(scope="module", params=[2, 4], ids=["H2", "H4"])
def dist_results(request):
    H = request.param
    res = spawn(attention_cases, H, cases=list(CASES.values()), timeout_s=120)
    return H, res


@pytest.mark.parametrize("name", list(CASES))
def test_distributed_matches_reference(dist_results, name):
    H, res = dist_results
    case = CASES[name]
    i = list(CASES).index(name)
    layout, cfg = case_layout(case, H)
    outs = [r[i][0] for r in res]
    lses = [r[i][1] for r in res]
    q, k, v = make_full_qkv(case)
    dense = attention(q, k, v, causal=True)
    got_out, got_lse = layout.unshard(outs, dim=2), layout.unshard(lses, dim=2)
    if case["method"] == "ring":
        ref = dense
    else:
        ref = simulate_spava_attention(q, k, v, layout, cfg)
        # rows every host holds (anchor, query) are bitwise identical across hosts
        for h in range(1, H):
            la, nq = layout.anchor_len, layout.query_len
            assert torch.equal(outs[h][:, :, :la], outs[0][:, :, :la])
            assert torch.equal(outs[h][:, :, -nq:], outs[0][:, :, -nq:])
    torch.testing.assert_close(got_out, ref.out, **FP32)
    torch.testing.assert_close(got_lse, ref.lse, **FP32)
    if case.get("passing_len") == 40:
        torch.testing.assert_close(got_out, dense.out, **FP32)
