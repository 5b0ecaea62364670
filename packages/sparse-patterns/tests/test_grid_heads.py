"""The Grid heads' planner (:class:`~sparse_patterns.planner.grid.GridHeads`): the search path it
takes per stride space, and its fused path (the ``sparse_kernels.GridIndexer`` it owns) against
the unfused one, entry for entry, on the Triton interpreter on the CPU."""

import pytest
import torch
from sparse_kernels.grid_index import GridIndexSettings
from sparse_kernels.testing import default_device
from sparse_patterns import Grid, HeadConfig, TokenLayout, VerticalSlash, plan_layer
from sparse_patterns import estimate as E
from sparse_patterns.layout import as_token_layout
from sparse_patterns.planner.assemble import assemble
from sparse_patterns.planner.context import LayerContext, normalize_head_configs
from sparse_patterns.planner.grid import GridHeads
from sparse_patterns.testing import planted_grid_qkv

DEV = default_device()


def _plan(grid: GridHeads, q, k, heads, lay, blk):
    """``(plan, group plan)`` of a layer whose heads are all Grid heads without a boundary (one
    group), planned by ``grid`` as the layer planner plans it."""
    cfgs = normalize_head_configs(heads, q.shape[1])
    ctx = LayerContext(q, k, as_token_layout(lay, q.shape[2], q.device), blk, q.shape[-1] ** -0.5)
    g = grid.plan(ctx, list(range(ctx.H)), cfgs)
    plan = grid.layer_plan(ctx, g) if g.fused else assemble(ctx, [g], True)
    return plan, g


def _count_calls(monkeypatch, names):
    calls = []
    for name in names:
        fn = getattr(E, name)
        monkeypatch.setattr(
            E, name, lambda *a, _f=fn, _n=name, **kw: calls.append(_n) or _f(*a, **kw)
        )
    return calls


@pytest.mark.parametrize("max_period, want", [(4096, "last_line_folds"), (8, "last_line_scores")])
def test_grid_heads_use_folds_only_where_the_period_fits(monkeypatch, max_period, want):
    """Small common period: the search calls the fold path and never the full line scores;
    ``fold_max_period`` below the period: the full line scores. Both find the planted grid."""
    S = 997
    q, k, _ = planted_grid_qkv(1, 4, 2, S, 64, stride=12, phase=7, vline=True, slash=False, seed=1)
    lay = TokenLayout(torch.full((S,), 2), tokens_per_frame=24)
    calls = _count_calls(monkeypatch, ["last_line_folds", "last_line_scores"])
    grid = GridHeads(fold_max_period=max_period)
    plan, _ = _plan(grid, q, k, Grid(use_vline=True, use_slash=False), lay, 32)
    # (the folds' torch reference, on the CPU, composes the line scores after that call)
    assert calls[0] == want and calls.count("last_line_folds") == (want == "last_line_folds")
    assert torch.equal(plan.meta["stride"], torch.full((1, 4), 12))
    assert torch.equal(plan.meta["phase"], torch.full((1, 4), 7))


def test_plan_layer_grid_empty_stride_space_raises():
    """A frame size with no divisor that fits (7 tokens per frame, S=20: strides <= S/4 = 5)."""
    q, k = torch.randn(1, 2, 20, 16), torch.randn(1, 1, 20, 16)
    lay = TokenLayout(torch.full((20,), 2), tokens_per_frame=7)
    with pytest.raises(ValueError, match="expected a stride space with at least one stride"):
        plan_layer(q, k, Grid(), lay, block=4)


def test_plan_layer_mixed_vs_grid_layer_passes_over_the_keys_once(monkeypatch):
    """A layer whose first head is Grid and whose others are Vertical-Slash: the line scores are
    made once (the Vertical-Slash group is planned first) and the Grid search folds them, with
    the same plan as when the Grid heads run the fold pass of their own."""
    S = 997
    q, k, _ = planted_grid_qkv(1, 4, 2, S, 64, stride=12, phase=7, vline=True, slash=True, seed=2)
    lay = TokenLayout(torch.full((S,), 2), tokens_per_frame=24)
    heads = [HeadConfig(Grid())] + [HeadConfig(VerticalSlash(n_vertical=30, n_slash=40))] * 3
    calls = _count_calls(monkeypatch, ["last_line_folds", "last_line_scores"])
    mixed = plan_layer(q, k, heads, lay, block=32)
    assert calls == ["last_line_scores"]
    alone = plan_layer(q, k, Grid(), lay, block=32)
    assert int(mixed.meta["stride"][0, 0]) == int(alone.meta["stride"][0, 0]) == 12
    assert int(mixed.meta["phase"][0, 0]) == int(alone.meta["phase"][0, 0]) == 7
    W = alone.kv_block_indices.shape[-1]  # the mixed layer's lists are as wide as its widest group
    assert torch.equal(mixed.kv_block_indices[:, 0, :, :W], alone.kv_block_indices[:, 0])
    assert torch.equal(mixed.kv_block_counts[:, 0], alone.kv_block_counts[:, 0])


def test_plan_layer_grid_several_periods_make_the_line_scores_once(monkeypatch):
    """Grid heads with two fixed strides (two common periods): one line-score pass, folded per
    period, and each head gets its own stride."""
    S = 997
    q, k, _ = planted_grid_qkv(1, 4, 2, S, 64, stride=12, phase=7, vline=True, slash=False, seed=1)
    calls = _count_calls(monkeypatch, ["last_line_folds", "last_line_scores"])
    heads = [HeadConfig(Grid(stride=12)), HeadConfig(Grid(stride=8))] * 2
    plan = plan_layer(q, k, heads, None, block=32)
    assert calls == ["last_line_scores"]
    assert plan.meta["stride"].tolist() == [[12, 8, 12, 8]]
    assert plan.meta["phase"][0, 0] == 7 and plan.meta["phase"][0, 2] == 7


def _same_plans(a, la, b, lb):
    """Two plans and the lists their ``run`` launches with, entry for entry."""
    for key in ("stride", "phase"):
        assert torch.equal(a.meta[key], b.meta[key]), key
    assert torch.equal(a.kv_perm, b.kv_perm) and torch.equal(a.q_perm, b.q_perm)
    assert torch.equal(a.kv_block_indices, b.kv_block_indices)
    assert torch.equal(a.kv_block_counts, b.kv_block_counts)
    assert torch.equal(a.kv_runs[0], b.kv_runs[0]) and torch.equal(a.kv_runs[1], b.kv_runs[1])
    for x, y in zip((*la[:2], *la[2][:2]), (*lb[:2], *lb[2][:2]), strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize(
    "B, S, H, H_KV, tpf, blk, heads, dtype",
    [
        pytest.param(1, 1025, 4, 2, 16, 64, [Grid()] * 4, torch.float16, id="searched-tpf16"),
        pytest.param(2, 1000, 4, 2, 24, 32, [Grid()] * 4, torch.float32, id="B2-tpf24"),
        pytest.param(1, 777, 4, 1, None, 64, [Grid(stride=7)] * 4, torch.float16, id="fixed"),
        pytest.param(1, 1025, 4, 2, 16, 48,
                     [Grid(use_vline=False), Grid(use_slash=False), Grid(), Grid()],
                     torch.float16, id="blk48-line-flags-per-head"),
        pytest.param(1, 900, 2, 2, 30, 64, [Grid()] * 2, torch.float16, id="tpf30"),
    ],
)  # fmt: skip
def test_fused_grid_equals_the_unfused_plan(B, S, H, H_KV, tpf, blk, heads, dtype):
    """The fused path (fold, merge, search, block index and lists kernels) gives exactly the
    plan of the unfused path: strides, phases, permutation, lists, runs and run split."""
    g = torch.Generator().manual_seed(S + blk)
    q = torch.randn(B, H, S, 32, generator=g)
    k = torch.randn(B, H_KV, S, 32, generator=g)
    if tpf:
        k[..., 5::tpf, :8] += 1.5
    lay = TokenLayout(torch.full((S,), 2, device=DEV), tokens_per_frame=tpf) if tpf else None
    cfgs = [HeadConfig(h) for h in heads]
    q, k = q.to(DEV, dtype), k.to(DEV, dtype)
    a, ga = _plan(GridHeads(fused="off"), q, k, cfgs, lay, blk)
    b, gb = _plan(GridHeads(fused="triton"), q, k, cfgs, lay, blk)
    assert not ga.fused and gb.fused  # the path each took
    _same_plans(a, a._launch_lists, b, b._launch_lists)
    assert len(set(b.meta["stride"].flatten().tolist())) > 1 or heads[0].stride is not None


@pytest.mark.parametrize("cap", ["wider", "narrower"])
@pytest.mark.parametrize("block_w", [4, 128], ids=lambda b: f"chunk{b}")
@pytest.mark.parametrize(
    "H, H_KV, S", [(4, 2, 997), pytest.param(3, 1, 996, id="odd-int32-count")], ids=str
)
def test_fused_grid_lists_launched_before_the_width_read(cap, block_w, H, H_KV, S):
    """Once a shape's row width is recorded, the fused path launches the lists that wide
    before it reads the width: wider than this call's rows (the plan keeps the first W
    entries) and narrower (launched again after the read; the record grows to W). Either way
    the plan of the unfused path, entry for entry, with the candidates walked ``block_w`` at a
    time. With 3 heads and 996 tokens the launch's int32 storage is padded to whole int64."""
    q, k, _ = planted_grid_qkv(1, H, H_KV, S, 32, stride=8, phase=3, seed=5)
    lay = TokenLayout(torch.full((S,), 2, device=DEV), tokens_per_frame=16)
    q, k, heads = q.to(DEV), k.to(DEV), [HeadConfig(Grid())] * H
    ref, _ = _plan(GridHeads(fused="off"), q, k, heads, lay, 32)
    settings = GridIndexSettings(lists_block_w=block_w)
    grid = GridHeads(fused="triton", graphs="off", kernel_settings=settings)
    first, g1 = _plan(grid, q, k, heads, lay, 32)
    W = ref.kv_block_indices.shape[-1]
    assert g1.early is None and first.kv_block_indices.shape[-1] == W
    widths = grid.indexer._lists_cap
    assert W > 4 and list(widths.values()) == [W]  # recorded by the first call
    (key,) = widths
    widths[key] = W + 7 if cap == "wider" else W - 3
    plan, g2 = _plan(grid, q, k, heads, lay, 32)
    assert g2.early[0].shape[-1] == (W + 7 if cap == "wider" else W - 3)
    assert widths[key] == (W + 7 if cap == "wider" else W)
    _same_plans(plan, plan._launch_lists, ref, ref._launch_lists)


def test_fused_grid_rows_wider_than_the_lists_kernel():
    """Candidate rows wider than ``lists_max_width``: the fused path builds the lists in torch
    (and ``run`` splits them), with the same plan as the unfused path."""
    S = 997
    q, k, _ = planted_grid_qkv(1, 4, 2, S, 32, stride=8, phase=3, vline=True, slash=True, seed=5)
    lay = TokenLayout(torch.full((S,), 2, device=DEV), tokens_per_frame=16)
    q, k, heads = q.to(DEV), k.to(DEV), [HeadConfig(Grid())] * 4
    narrow = GridIndexSettings(lists_max_width=4)
    a, _ = _plan(GridHeads(fused="off", kernel_settings=narrow), q, k, heads, lay, 32)
    b, gb = _plan(GridHeads(fused="triton", kernel_settings=narrow), q, k, heads, lay, 32)
    assert gb.fused and b.run_split is None
    _same_plans(a, a._launch_lists, b, b._launch_lists)


@pytest.mark.parametrize(
    "heads, tpf, why",
    [
        pytest.param([Grid(use_hline=True)] + [Grid()] * 3, 16, "hline", id="hline"),
        pytest.param([Grid(stride=12), Grid(stride=8)] * 2, None, "two spaces", id="two-spaces"),
        pytest.param([Grid(stride=600)] * 4, None, "period past S/2", id="period-past-half"),
        pytest.param([Grid(last_q=200)] * 4, 16, "rows", id="more-than-128-rows"),
    ],
)
def test_fused_grid_only_where_it_fits(heads, tpf, why):
    """Layers the fused path does not take go through the unfused one."""
    S = 997
    q, k, _ = planted_grid_qkv(1, 4, 2, S, 32, stride=8, phase=3, vline=True, slash=True, seed=3)
    lay = TokenLayout(torch.full((S,), 2), tokens_per_frame=tpf) if tpf else None
    _, g = _plan(GridHeads(fused="triton"), q, k, [HeadConfig(h) for h in heads], lay, 32)
    assert not g.fused, why


def test_fused_grid_not_for_some_heads_or_the_reference_engine():
    """A group of some of the layer's heads, and a layer planned with ``impl="reference"``, take
    the unfused path."""
    S = 997
    q, k, _ = planted_grid_qkv(1, 4, 2, S, 32, stride=8, phase=3, vline=True, slash=True, seed=3)
    lay = as_token_layout(TokenLayout(torch.full((S,), 2), tokens_per_frame=16), S, q.device)
    grid = GridHeads(fused="triton")
    cfgs = normalize_head_configs(Grid(), 4)
    spaces = {(2, 4, 8, 16): list(range(4))}
    ctx = LayerContext(q, k, lay, 32, 32**-0.5)
    assert grid.fused_fits(ctx, [0, 1, 2, 3], cfgs, spaces, 64)
    assert not grid.fused_fits(ctx, [0, 1], cfgs[:2], spaces, 64)
    ref = LayerContext(q, k, lay, 32, 32**-0.5, impl="reference")
    assert not grid.fused_fits(ref, [0, 1, 2, 3], cfgs, spaces, 64)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(fused="on"), r"fused: expected one of \('auto', 'triton', 'off'\), got 'on'"),
        (dict(graphs="yes"), r"graphs: expected one of \('auto', 'off'\), got 'yes'"),
        (dict(fold_max_period=0), "fold_max_period: expected an int >= 1, got 0"),
    ],
)
def test_grid_heads_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GridHeads(**kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "H, H_KV, S",
    [(4, 2, 4000), pytest.param(3, 1, 4096, id="odd-heads-odd-int32-count")],
    ids=str,
)
def test_fused_grid_replays_a_cuda_graph_gpu(H, H_KV, S):
    """The call that records a shape's width captures a CUDA graph of the fused launches; later
    calls replay it. For other q and k (other addresses, other grids) each plan equals the plan
    launched without graphs, entry for entry, also after later replays (a plan never aliases
    the graph's memory); a call whose rows are wider than the recorded width (the stride-4
    grid) launches its lists again after the read and captures a graph that wide."""
    heads = [HeadConfig(Grid())] * H
    lay = TokenLayout(torch.full((S,), 2, device=DEV), tokens_per_frame=16)
    grids = [(8, 3), (16, 5), (4, 1), (8, 6), (4, 2)]
    inputs = [
        planted_grid_qkv(1, H, H_KV, S, 64, stride=s, phase=p, seed=i)[:2]
        for i, (s, p) in enumerate(grids)
    ]
    inputs = [(q.to(DEV, torch.bfloat16), k.to(DEV, torch.bfloat16)) for q, k in inputs]
    graphed, plain = GridHeads(), GridHeads(graphs="off")
    got = []
    for q, k in inputs:
        plan, _ = _plan(graphed, q, k, heads, lay, 64)
        got.append((plan, plan._launch_lists))
    assert len(graphed.indexer._graphs) == 2  # two widths
    for (q, k), (s, _), (plan, lists) in zip(inputs, grids, got, strict=True):
        ref, _ = _plan(plain, q, k, heads, lay, 64)
        _same_plans(plan, lists, ref, ref._launch_lists)
        assert plan.meta["stride"].unique().tolist() == [s]
    assert not plain.indexer._graphs


def test_group_plan_rejects_inconsistent_fields():
    from sparse_patterns.planner.group import GroupPlan

    z = torch.zeros(1, 2, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="expected a lists callable with fused=True, got None"):
        GroupPlan((0,), z, z[..., 0], fused=True)
    with pytest.raises(ValueError, match="expected either block lists or a lists callable"):
        GroupPlan((0,))
    with pytest.raises(ValueError, match="both set or both None"):
        GroupPlan((0,), z, None)
