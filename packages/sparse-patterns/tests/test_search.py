import resource

import pytest
import torch
from sparse_patterns import (
    AShape,
    Grid,
    HeadConfig,
    MMInferencePlanner,
    PatternConfig,
    QBoundary,
    TokenLayout,
    TwoDBoundary,
    VerticalSlash,
    search_config,
    search_layer,
    table3_candidates,
)
from sparse_patterns.testing import planted_boundary_qkv, planted_grid_qkv

SPANS = [(0, 60), (2, 256), (0, 40), (2, 200), (0, 61)]  # S = 617


def _mixed_layer():
    """KV head 0: planted grid (stride 16, phase 3); KV head 1: planted Q-boundary head."""
    qb, kb, vb, lay = planted_boundary_qkv(SPANS)
    S = lay.modality.numel()
    qg, kg, vg = planted_grid_qkv(1, 2, 1, S, 64, stride=16, phase=3, seed=4)
    q = torch.cat([qg, qb], 1)
    k = torch.cat([kg, kb], 1)
    v = torch.cat([vg, vb], 1)
    return q, k, v, TokenLayout(lay.modality, tokens_per_frame=32)


CANDS = [
    HeadConfig(AShape(sink=8, window=64)),
    HeadConfig(VerticalSlash(n_vertical=8, n_slash=8, last_q=32, sink=1, local=4)),
    HeadConfig(Grid()),
]


def test_search_layer_picks_grid_and_boundary_heads():
    q, k, v, lay = _mixed_layer()
    chosen, info = search_layer(
        q, k, v, lay, candidates=CANDS, budget_pattern=AShape(sink=64, window=224), block=32
    )
    assert [type(c.pattern) for c in chosen[:2]] == [Grid, Grid]
    for c in chosen[2:]:
        assert isinstance(c.pattern, VerticalSlash)
        assert isinstance(c.boundary, (QBoundary, TwoDBoundary))
    assert info["cost_model"] == "computed_blocks_proxy"
    for h, hi in enumerate(info["heads"]):
        assert hi["cost"] <= info["budget"][h]
        assert hi["output_recall"] > 0.8
    # 3 intra candidates + Q- and 2D-Boundary variants of the 2 best (Grid: Q-Boundary only)
    assert info["n_candidates"] in (3 + 3, 3 + 4)


def test_search_respects_the_budget():
    """With a budget below every candidate but the budget pattern, heads get the budget pattern."""
    q, k, v, lay = _mixed_layer()
    tiny = AShape(sink=1, window=8)
    chosen, info = search_layer(
        q,
        k,
        v,
        lay,
        candidates=[HeadConfig(Grid(use_hline=True))],
        budget_pattern=tiny,
        budget_slack=1.0,
        block=32,
    )
    assert all(c.pattern == tiny for c in chosen)


def test_min_output_recall_goes_over_budget_or_dense():
    """With a floor, a head whose in-budget choice recalls less gets the cheapest candidate
    reaching the floor (over budget), or Dense when none does; without it, the budget rules."""
    from sparse_patterns import Dense

    q, k, v, lay = _mixed_layer()
    tiny = AShape(sink=1, window=8)
    kw = dict(candidates=CANDS, budget_pattern=tiny, budget_slack=1.0, block=32)
    base, base_info = search_layer(q, k, v, lay, **kw)
    assert all(c.pattern == tiny for c in base)  # nothing fits the tiny budget
    chosen, info = search_layer(q, k, v, lay, min_output_recall=0.8, **kw)
    assert info["min_output_recall"] == 0.8
    # every head has a candidate reaching 0.8, over the tiny budget: the cheapest such one
    for h, hi in enumerate(info["heads"]):
        assert hi["output_recall"] >= 0.8 and hi["over_budget"] is True
        assert hi["cost"] > info["budget"][h]
    assert [type(c.pattern) for c in chosen] == [Grid, Grid, VerticalSlash, VerticalSlash]
    # A floor no candidate reaches: every head dense.
    chosen, info = search_layer(q, k, v, lay, min_output_recall=1.0, **kw)
    assert all(c.pattern == Dense() for c in chosen)
    assert all(hi["dense_fallback"] and hi["output_recall"] == 1.0 for hi in info["heads"])


@pytest.mark.parametrize("bad", [0.0, 1.5, "0.9"])
def test_min_output_recall_rejects_out_of_range(bad):
    q, k, v, lay = _mixed_layer()
    with pytest.raises(
        ValueError, match=r"min_output_recall: expected None or a float in \(0, 1\]"
    ):
        search_layer(q, k, v, lay, candidates=CANDS, block=32, min_output_recall=bad)


def test_search_config_from_a_tensor_provider(tmp_path):
    q, k, v, lay = _mixed_layer()

    def provider(inputs):
        for li in inputs:
            yield li, q, k, v

    seen = []
    cfg = search_config(
        provider,
        [0, 2],
        lay,
        model_id="synthetic",
        num_layers=3,
        candidates=CANDS[:2],
        budget_pattern=AShape(sink=64, window=224),
        block=32,
        n_eval_rows=200,
        progress=lambda li, info: seen.append((li, info["n_candidates"])),
    )
    assert seen == [(0, 6), (2, 6)]  # 2 intra candidates + their Q- and 2D-Boundary variants
    assert cfg.num_layers == 3 and cfg.num_heads == 4
    assert cfg.metadata["searched_layers"] == [0, 2]
    assert cfg.metadata["cost_model"] == "computed_blocks_proxy"
    assert all(h.pattern.kind == "dense" for h in cfg.layer(1))
    cfg.save(tmp_path / "c.json")
    assert PatternConfig.load(tmp_path / "c.json", model_id="synthetic") == cfg


def test_table3_candidates():
    c = table3_candidates(25_000, tokens_per_frame=196)
    assert len(c) == 3 + 9 + 12
    assert c[0].pattern == AShape(sink=128, window=1024, exact=True)
    assert c[3].pattern == VerticalSlash(n_vertical=1000, n_slash=1024)
    assert c[12].pattern == Grid(stride=196, use_hline=True, use_vline=False, use_slash=False)
    small = table3_candidates(2500)
    assert small[3].pattern.n_vertical == 100 and len(small) == 3 + 9 + 6
    rounded = table3_candidates(25_000, tokens_per_frame=196, exact_a_shape=False)
    assert [h.pattern for h in rounded[:3]] == [AShape(128, w) for w in (1024, 2048, 4096)]
    assert [h.pattern for h in c[:3]] == [AShape(128, w, exact=True) for w in (1024, 2048, 4096)]
    assert rounded[3:] == c[3:]


@pytest.mark.slow
def test_search_25k_tokens_without_an_s_by_s_matrix():
    """A 25.6K-token calibration layer: recall is chunked over rows; peak RSS growth stays far
    below one S x S float32 matrix per head (2.6 GB)."""
    S = 25_600
    q, k, v = planted_grid_qkv(1, 2, 1, S, 64, stride=32, phase=7, seed=1)
    lay = TokenLayout(torch.full((S,), 2), tokens_per_frame=64)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    chosen, info = search_layer(
        q,
        k,
        v,
        lay,
        candidates=[HeadConfig(Grid()), HeadConfig(AShape(sink=64, window=1024))],
        block=64,
        n_eval_rows=256,
    )
    grown_gb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 2**20
    assert grown_gb < 1.5, grown_gb
    assert all(isinstance(c.pattern, Grid) for c in chosen)


def _mixed_layer_cuda():
    q, k, v, lay = _mixed_layer()
    return (
        q.cuda().half(),
        k.cuda().half(),
        v.cuda().half(),
        TokenLayout(lay.modality.cuda(), tokens_per_frame=32),
    )


def _search_cuda(q, k, v, lay, table):
    return search_layer(
        q, k, v, lay, candidates=CANDS, budget_pattern=AShape(sink=64, window=224), block=32,
        cost_table=table,
    )  # fmt: skip


@pytest.mark.gpu
def test_search_measures_kernel_cost_on_gpu_and_caches_it(tmp_path):
    """Every candidate and the budget pattern are timed once and written to the table; a second
    search times none of them again. (It may time new boundary variants: the two best intra
    candidates it extends with boundaries can swap between searches when their scores are
    close; on an H100 the second one was A-shape in one search and Vertical-Slash in another.)"""
    from sparse_patterns import CostTable

    q, k, v, lay = _mixed_layer_cuda()
    table = CostTable(tmp_path / "costs.json")
    chosen, info = _search_cuda(q, k, v, lay, table)
    assert info["cost_model"] == "measured_estimation_plus_kernel_ms"
    first = set(CostTable(tmp_path / "costs.json").table)
    assert len(first) == info["n_candidates"] + 1  # every candidate + the budget pattern
    timed = []
    put = table.put
    table.put = lambda key, value: timed.append(key) or put(key, value)
    chosen2, _ = _search_cuda(q, k, v, lay, table)
    assert not set(timed) & first
    assert all(c.pattern.kind in ("grid", "vertical_slash", "a_shape") for c in chosen + chosen2)


@pytest.mark.gpu
def test_measured_cost_is_estimation_plus_kernel(monkeypatch):
    """Each measured cost is the candidate's plan_layer time plus its kernel launch time: a fake
    timer returns 10 ms for a call that builds a plan and 1 ms for any other (the estimation is
    timed twice, its first warm call and the minimum of two more)."""
    from sparse_patterns import BlockPlan, CostTable
    from sparse_patterns import search as search_mod

    calls = {"estimate": 0, "kernel": 0}

    def fake(fn, *, warmup, rep):
        kind = "estimate" if isinstance(fn(), BlockPlan) else "kernel"
        calls[kind] += 1
        return 10.0 if kind == "estimate" else 1.0

    monkeypatch.setattr(search_mod, "_time_ms", fake)
    q, k, v, lay = _mixed_layer_cuda()
    table = CostTable()
    _, info = _search_cuda(q, k, v, lay, table)
    n = info["n_candidates"] + 1
    assert calls == {"estimate": 2 * n, "kernel": n}
    assert sorted(table.table.values()) == [11.0] * n
    assert info["budget"] == [pytest.approx(11.0 * 1.1)] * q.shape[1]
    # A candidate whose cached cost is over budget is neither planned nor timed again.
    planned = []
    real_plan = MMInferencePlanner.plan

    def recording_plan(self, q, k, heads, *args, **kwargs):
        planned.append(heads)
        return real_plan(self, q, k, heads, *args, **kwargs)

    monkeypatch.setattr(MMInferencePlanner, "plan", recording_plan)
    table.put(search_mod._cost_key(CANDS[1], q, k, 32), 1e9)
    chosen, info = _search_cuda(q, k, v, lay, table)
    assert info["skipped_over_budget"] == 1
    assert CANDS[1] not in planned and CANDS[0] in planned and CANDS[2] in planned
    assert not any(isinstance(c.pattern, VerticalSlash) for c in chosen)


@pytest.mark.gpu
def test_an_estimation_over_budget_is_timed_once_and_its_kernel_never(monkeypatch):
    """A candidate whose one warm plan_layer call already exceeds the budget costs that time;
    neither its estimation nor its kernel is timed again."""
    from sparse_patterns import BlockPlan, CostTable
    from sparse_patterns import search as search_mod

    calls, last = [], {}
    real_plan = MMInferencePlanner.plan

    def recording_plan(self, q, k, heads, *args, **kwargs):
        last["heads"] = heads
        return real_plan(self, q, k, heads, *args, **kwargs)

    def fake(fn, *, warmup, rep):
        r = fn()
        slow = isinstance(r, BlockPlan) and isinstance(last["heads"].pattern, VerticalSlash)
        calls.append(("estimate" if isinstance(r, BlockPlan) else "kernel", slow))
        return 100.0 if slow else 1.0

    monkeypatch.setattr(MMInferencePlanner, "plan", recording_plan)
    monkeypatch.setattr(search_mod, "_time_ms", fake)
    q, k, v, lay = _mixed_layer_cuda()
    table = CostTable()
    chosen, _ = _search_cuda(q, k, v, lay, table)
    assert calls.count(("estimate", True)) == 1
    assert table.get(search_mod._cost_key(CANDS[1], q, k, 32)) == 100.0
    assert not any(isinstance(c.pattern, VerticalSlash) for c in chosen)
