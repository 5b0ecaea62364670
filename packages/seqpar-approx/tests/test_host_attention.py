"""Spava x sparse: the host attention steps (dense, TriangleMix, MMInference).

* the simulation against masked PyTorch attention whose mask is rebuilt here from what each
  host attends (the anchor, the selected passing keys, the block; module docstring of
  ``seqpar_approx.host_attention``), intersected with each step's own mask;
* distributed (gloo, fp32, 2 and 4 ranks) == simulation for every step kind.
"""

import pytest
import torch
from seqpar_approx import (
    DENSE,
    DenseHost,
    HostSparsity,
    MMInferenceHost,
    TriangleHost,
    select_essential,
    simulate_spava_attention,
    spava_attention,
)
from seqpar_approx.testing import attention_cases, case_layout, make_full_qkv, spawn
from seqpar_approx.testing_hosts import case_heads, case_host_attention, case_token_layout
from sparse_kernels import attention
from sparse_kernels.attention.reference import masked_attention_reference

FP32 = dict(atol=2e-6, rtol=2e-5)


def _case(**kw):
    base = dict(seed=0, B=1, H=4, H_KV=2, D=16, method="spava")
    base.update(kw)
    return base


def _step_mask(host, q_seg, k_seg, k_prefix, start: int, scale: float) -> torch.Tensor:
    """``[B, H, L, P + L]`` bool: what the segment's rows attend, host key order (prefix, seg)."""
    B, H, L, _ = q_seg.shape
    P = k_prefix.shape[2]
    row = torch.arange(L)[:, None] + P
    col = torch.arange(P + L)[None, :]
    causal = col <= row
    if isinstance(host, DenseHost):
        m = causal
    elif isinstance(host, TriangleHost):
        m = causal & ((col < host.sink) | (row - col < host.window))
    elif isinstance(host, MMInferenceHost):
        # the prefix selection is checked against plain PyTorch in test_prefix_blocks.py
        pre = host.prefix_mask(q_seg, k_prefix, scale=scale)
        if host.block >= L:  # one plan block: the segment is dense
            seg = causal[:, P:].expand(B, H, L, L)
        else:
            seg = host.plan(q_seg, k_seg, start=start, scale=scale).row_mask(torch.arange(L))
        return torch.cat([pre, seg], dim=-1)
    else:
        raise TypeError(type(host).__name__)
    return m.expand(B, H, L, P + L)


def _reference_mask(q, k, v, layout, host, scale) -> torch.Tensor:
    """The global ``[B, H, n, n]`` mask of Spava with ``host`` as every host's step."""
    B, H, n, D = q.shape
    H_KV = k.shape[1]
    G = H // H_KV
    la, qs = layout.anchor_len, layout.context_end
    mask = torch.zeros(B, H, n, n, dtype=torch.bool)
    mask[..., qs:, :] = torch.ones(n, n, dtype=torch.bool).tril()[qs:]  # query rows: exact
    if la:
        mask[..., :la, :la] = _step_mask(host, q[:, :, :la], k[:, :, :la], k[:, :, :0], 0, scale)
    passed = []  # global positions of the passing keys, per block: [B, H_KV, c]
    for vb in range(layout.num_virtual):
        s, e = layout.block(vb)
        pre_kv = torch.cat([torch.arange(la).expand(B, H_KV, la), *passed], dim=-1)
        k_pre = k.gather(2, pre_kv[..., None].expand(-1, -1, -1, D))
        prefix = torch.cat(
            [pre_kv, torch.arange(s, e).expand(B, H_KV, -1)], dim=-1
        ).repeat_interleave(G, dim=1)  # host key order -> global key, per query head
        local = _step_mask(host, q[:, :, s:e], k[:, :, s:e], k_pre, s, scale)
        idx = prefix[:, :, None, :].expand(-1, -1, e - s, -1)
        mask[:, :, s:e].scatter_(-1, idx, local)
        _, _, sel = select_essential(
            q[:, :, qs:], k[:, :, s:e], v[:, :, s:e], layout.passing_count(vb), scale=scale
        )
        passed.append(sel + s)
    return mask


STEPS = {
    "triangle-sink3-win9": dict(host="triangle", sink=3, window=9),
    "triangle-sink0-win1": dict(host="triangle", sink=0, window=1),
    "mminference-mixed-heads": dict(host="mminference"),
}
# MMInference with a block selection over the prefix: prefixes of several 64-key blocks
PREFIX_STEP = dict(host="mminference", prefix_top_k=2)
PREFIX_SHAPE = dict(n=600, query_len=7, anchor_len=70, passing_len=40)


@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize(
    "shape",
    [
        pytest.param(dict(n=120, query_len=7, anchor_len=5, passing_len=3), id="n120-la5-lp3"),
        pytest.param(dict(n=97, query_len=1, anchor_len=0, passing_len=4), id="n97-la0-lp4"),
    ],
)
def test_simulation_attends_exactly_the_composed_mask(step, shape):
    _check_composed_mask(_case(seed=3, **shape, **STEPS[step]))


@pytest.mark.parametrize("hosts", [2, 4])
def test_simulation_with_sparse_prefix_attends_exactly_the_composed_mask(hosts):
    _check_composed_mask(_case(seed=6, **PREFIX_SHAPE, **PREFIX_STEP), hosts)


def _check_composed_mask(case, hosts=2):
    layout, cfg = case_layout(case, hosts)
    q, k, v = make_full_qkv(case)
    host = case_host_attention(case)
    scale = q.shape[-1] ** -0.5
    mask = _reference_mask(q, k, v, layout, host, scale)
    ref = masked_attention_reference(q, k, v, mask, scale=scale, compute_dtype=torch.float64)
    got = simulate_spava_attention(q, k, v, layout, cfg, host_attention=host)
    torch.testing.assert_close(got.out, ref.out.float(), **FP32)
    torch.testing.assert_close(got.lse, ref.lse.float(), **FP32)
    # a real restriction of Spava's key set, and the query block still exact
    dense_spava = simulate_spava_attention(q, k, v, layout, cfg)
    assert (got.out - dense_spava.out).abs().max() > 1e-3
    qs = layout.context_end
    exact = attention(q, k, v, causal=True)
    torch.testing.assert_close(got.out[:, :, qs:], exact.out[:, :, qs:], **FP32)


def test_mminference_step_runs_an_execution_only_plan(monkeypatch):
    """The host's step plans without the exact heads' block lists (``BlockPlan.run`` reads none)
    and gives exactly what the plan with every list gives."""
    from sparse_patterns import AShape, Grid, HeadConfig, VerticalSlash

    heads = (
        HeadConfig(VerticalSlash(n_vertical=8, n_slash=8, last_q=16, exact_verticals=True)),
        HeadConfig(AShape(sink=4, window=32, exact=True)),
        HeadConfig(Grid(last_q=16)),
        HeadConfig(VerticalSlash(n_vertical=8, n_slash=8, last_q=16)),
    )
    S = 256
    host = MMInferenceHost(heads, token_layout=case_token_layout(S), block=64)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 4, S, 16, generator=g)
    k, v = torch.randn(2, 1, 2, S, 16, generator=g)
    none = k[:, :, :0]
    asked = []
    plan = host.planner.plan

    def spy(*args, **kwargs):
        asked.append(kwargs["exact_vertical_lists"])
        return plan(*args, **kwargs)

    monkeypatch.setattr(host.planner, "plan", spy)
    got = host(q, k, v, none, none, start=0, scale=0.25, impl="reference")
    assert asked == [False]
    full = host.plan(q, k, start=0, scale=0.25)
    assert asked == [False, True] and full.exact_lists
    ref = full.run(q, k, v, scale=0.25, impl="reference")
    assert torch.equal(got.out, ref.out) and torch.equal(got.lse, ref.lse)


def test_mminference_step_plans_a_segment_reading_back_only_list_widths():
    """A host's plan of its segment: the segment's layout is a slice of the checked global one
    (no read of its modality) and the exact Vertical-Slash heads' counts come from their
    configs, so the only reads left are the planner's list widths (one for the Grid heads)."""
    from sparse_patterns import AShape, Grid, HeadConfig, VerticalSlash
    from sparse_patterns.testing import SyncRecorder

    heads = (
        HeadConfig(Grid(last_q=16)),
        HeadConfig(VerticalSlash(n_vertical=8, n_slash=8, last_q=16, exact_verticals=True)),
        HeadConfig(AShape(sink=4, window=32, exact=True)),
        HeadConfig(VerticalSlash(n_vertical=4, n_slash=8, last_q=16, exact_verticals=True)),
    )
    n, S, start = 512, 256, 192
    host = MMInferenceHost(heads, token_layout=case_token_layout(n), block=64)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, S, 16, generator=g)
    k = torch.randn(1, 2, S, 16, generator=g)
    host.plan(q, k, start=start, scale=0.25, exact_vertical_lists=False)  # warm the caches
    with SyncRecorder() as rec:
        plan = host.plan(q, k, start=start, scale=0.25, exact_vertical_lists=False)
    assert len(rec.events) == 1 and "(host_ints)" in rec.events[0][1]
    assert sorted(e.heads for e in plan.exact_vertical) == [(1,), (3,)]


def test_mminference_step_with_a_sparse_prefix_reads_back_only_list_widths():
    """The whole step of a segment (plan, run, prefix selection and its block-sparse attention,
    merge): the prefix's selection is distinct and in range by construction, so its attention
    runs unchecked; the one read left is the Grid lists' width."""
    from seqpar_approx import PrefixBlocks
    from sparse_patterns import AShape, Grid, HeadConfig
    from sparse_patterns.testing import SyncRecorder

    heads = (HeadConfig(Grid(last_q=16)), HeadConfig(AShape(sink=4, window=32))) * 2
    n, S, P, start = 512, 256, 192, 256
    host = MMInferenceHost(
        heads, token_layout=case_token_layout(n), block=32, prefix=PrefixBlocks(top_k=2)
    )
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, S, 16, generator=g)
    k, v, kp, vp = (torch.randn(1, 2, L, 16, generator=g) for L in (S, S, P, P))

    def step():
        return host(q, k, v, kp, vp, start=start, scale=0.25, impl="auto")

    step()  # warm the caches
    with SyncRecorder() as rec:
        got = step()
    assert len(rec.events) == 1 and "(host_ints)" in rec.events[0][1]
    assert got.out.shape == q.shape
    sel = host.prefix.select(q, kp, scale=0.25)
    reads = []
    for check in (True, False):
        with SyncRecorder() as rec:
            host.prefix.attend(q, kp, vp, sel, scale=0.25, impl="auto", check_indices=check)
        reads.append(len(rec.events))
    assert reads[0] > 0 and reads[1] == 0  # the checks are what the step leaves out


def test_dense_step_is_bitwise_spava():
    case = _case(n=131, query_len=9, anchor_len=6, passing_len=5)
    layout, cfg = case_layout(case, 1)
    q, k, v = make_full_qkv(case)
    shard = [layout.shard(t, 0, dim=2) for t in (q, k, v)]
    a = spava_attention(*shard, layout, cfg)
    b = spava_attention(*shard, layout, cfg, host_attention=DenseHost())
    assert torch.equal(a.out, b.out) and torch.equal(a.lse, b.lse)


def test_host_sparsity_picks_the_step_of_each_layer():
    from sparse_patterns import PatternConfig
    from triangle_mix import LayerPolicy

    heads = case_heads(4)
    patterns = PatternConfig(model_id="m", num_layers=3, num_heads=4, layers=(heads,) * 3)
    lay = case_token_layout(50)
    mix = HostSparsity(
        patterns=patterns, policy=LayerPolicy(("dense", "dynamic", "triangle"), sink=2, window=5)
    )
    assert mix.for_layer(0) is DENSE
    assert mix.for_layer(1, lay) == MMInferenceHost(heads, token_layout=lay)
    assert mix.for_layer(2) == TriangleHost(sink=2, window=5)
    only = HostSparsity(patterns=patterns)
    assert all(isinstance(only.for_layer(i), MMInferenceHost) for i in range(3))
    tri = HostSparsity(policy=LayerPolicy.triangle_from(3, 1, window=7))
    assert tri.for_layer(0) is DENSE and tri.for_layer(1) == TriangleHost(sink=8, window=7)


def test_errors_name_expected_and_received():
    from triangle_mix import LayerPolicy

    with pytest.raises(ValueError, match="expected patterns, a policy or both, got neither"):
        HostSparsity()
    with pytest.raises(ValueError, match="'dynamic' layers, expected patterns"):
        HostSparsity(policy=LayerPolicy(("dynamic", "triangle")))
    with pytest.raises(TypeError, match="expected a LayerPolicy, got str"):
        HostSparsity(policy="trianglemix")
    with pytest.raises(ValueError, match=r"layer_idx: expected 0..1, got 2"):
        HostSparsity(policy=LayerPolicy(("dense", "triangle"))).for_layer(2)
    with pytest.raises(ValueError, match="TriangleHost.window: expected an int >= 1, got 0"):
        TriangleHost(sink=1, window=0)
    host = MMInferenceHost(case_heads(2))
    q = torch.zeros(1, 4, 8, 16)
    with pytest.raises(ValueError, match="expected 2 query heads .* got q with 4"):
        host(q, q, q, q[:, :, :0], q[:, :, :0], start=0, scale=0.25, impl="reference")
    case = _case(n=60, query_len=3, anchor_len=2, passing_len=2)
    layout, cfg = case_layout(case, 1)
    q, k, v = make_full_qkv(case)
    with pytest.raises(TypeError, match="host_attention: expected a HostAttention.*got str"):
        simulate_spava_attention(q, k, v, layout, cfg, host_attention="triangle")


# ---- distributed (gloo, CPU, fp32) == simulation, 2 and 4 ranks ---------------------------------

SHAPE = dict(n=131, query_len=9, anchor_len=6, passing_len=5)
CASES = {
    "triangle": _case(**SHAPE, host="triangle", sink=3, window=9, seed=11),
    "mminference": _case(**SHAPE, host="mminference", seed=12),
    "mminference-contiguous-sync": _case(
        **SHAPE, host="mminference", zigzag=False, overlap_comm=False, seed=13
    ),
    "policy-dense-layer": _case(**SHAPE, host="policy", sink=3, window=9, layer=0, seed=14),
    "policy-dynamic-layer": _case(**SHAPE, host="policy", sink=3, window=9, layer=1, seed=14),
    "policy-triangle-layer": _case(**SHAPE, host="policy", sink=3, window=9, layer=2, seed=14),
    "mminference-sparse-prefix": _case(**PREFIX_SHAPE, **PREFIX_STEP, seed=15),
    "policy-dynamic-layer-sparse-prefix": _case(
        **PREFIX_SHAPE, **dict(PREFIX_STEP, host="policy"), sink=3, window=9, layer=1, seed=16
    ),
}


@pytest.fixture(scope="module", params=[2, 4], ids=["H2", "H4"])
def dist_results(request):
    H = request.param
    return H, spawn(attention_cases, H, cases=list(CASES.values()), timeout_s=180)


@pytest.mark.parametrize("name", list(CASES))
def test_distributed_matches_simulation(dist_results, name):
    H, res = dist_results
    case = CASES[name]
    i = list(CASES).index(name)
    layout, cfg = case_layout(case, H)
    q, k, v = make_full_qkv(case)
    ref = simulate_spava_attention(q, k, v, layout, cfg, host_attention=case_host_attention(case))
    got_out = layout.unshard([r[i][0] for r in res], dim=2)
    got_lse = layout.unshard([r[i][1] for r in res], dim=2)
    torch.testing.assert_close(got_out, ref.out, **FP32)
    torch.testing.assert_close(got_lse, ref.lse, **FP32)


@pytest.mark.parametrize("dense_rows", [255, 256])
def test_mminference_step_attends_segments_up_to_dense_rows_densely(monkeypatch, dense_rows):
    """A segment of at most ``dense_rows`` rows is not planned and gives DenseHost's result
    exactly; one row more and it is planned."""
    S = 256
    host = MMInferenceHost(
        case_heads(4), token_layout=case_token_layout(S), block=64, dense_rows=dense_rows
    )
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, S, 16, generator=g)
    k, v = torch.randn(2, 1, 2, S, 16, generator=g)
    kp, vp = torch.randn(2, 1, 2, 40, 16, generator=g)
    planned = []
    plan = host.planner.plan
    monkeypatch.setattr(host.planner, "plan", lambda *a, **kw: planned.append(1) or plan(*a, **kw))
    got = host(q, k, v, kp, vp, start=0, scale=0.25, impl="reference")
    if dense_rows >= S:
        ref = DENSE(q, k, v, kp, vp, start=0, scale=0.25, impl="reference")
        assert planned == [] and torch.equal(got.out, ref.out) and torch.equal(got.lse, ref.lse)
    else:
        assert planned == [1]


def test_dense_rows_must_be_a_non_negative_int_for_mminference_layers():
    from sparse_patterns import PatternConfig

    with pytest.raises(
        ValueError, match="MMInferenceHost.dense_rows: expected an int >= 0, got -1"
    ):
        MMInferenceHost(case_heads(2), dense_rows=-1)
    patterns = PatternConfig(model_id="m", num_layers=1, num_heads=2, layers=(case_heads(2),))
    with pytest.raises(ValueError, match="HostSparsity.dense_rows: expected an int >= 0, got 1.5"):
        HostSparsity(patterns=patterns, dense_rows=1.5)
    from triangle_mix import LayerPolicy

    with pytest.raises(ValueError, match="expected patterns .* with dense_rows=64, got None"):
        HostSparsity(policy=LayerPolicy(("dense", "triangle")), dense_rows=64)
