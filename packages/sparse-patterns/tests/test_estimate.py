import pytest
import torch
from sparse_kernels.testing import default_device
from sparse_patterns import Grid, TokenLayout, plan_layer
from sparse_patterns import estimate as E
from sparse_patterns.metrics import recall_many
from sparse_patterns.testing import planted_grid_qkv

DEV = default_device()


def test_approx_scores_is_causal_softmax_with_gqa():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 6, 37, 16, generator=g)
    k = torch.randn(2, 2, 37, 16, generator=g)
    rows = torch.tensor([3, 20, 36])
    p = E.approx_scores(q, k, rows, scale=0.25)
    kk = k.repeat_interleave(3, dim=1)
    s = (q[:, :, rows] @ kk.transpose(-1, -2)) * 0.25
    s = s.masked_fill(torch.arange(37)[None, :] > rows[:, None], float("-inf"))
    torch.testing.assert_close(p, torch.softmax(s, -1), rtol=1e-5, atol=1e-6)
    assert torch.equal(p[..., 0, 4:] == 0, torch.ones_like(p[..., 0, 4:], dtype=torch.bool))


def test_slash_scores_sum_over_diagonals():
    p = torch.zeros(1, 2, 5)
    rows = torch.tensor([3, 4])
    p[0, 0, 1] = 0.5  # offset 2
    p[0, 1, 2] = 0.25  # offset 2
    p[0, 1, 4] = 0.125  # offset 0
    out = E.slash_scores(p, rows)
    assert torch.equal(out, torch.tensor([[0.125, 0.0, 0.75, 0.0, 0.0]]))


def test_topk_indices_forced_and_sorted():
    s = torch.tensor([[0.0, 0.1, 5.0, 0.2, 4.0, 3.0]])
    assert torch.equal(E.topk_indices(s, 3, forced=1), torch.tensor([[0, 2, 4]]))
    assert torch.equal(E.topk_indices(s, 10), torch.arange(6)[None])


def test_stride_space_is_tokens_per_frame_and_divisors():
    assert E.stride_space(24, max_stride=1024, S=10_000) == [2, 3, 4, 6, 8, 12, 24]
    assert E.stride_space(24, max_stride=8, S=10_000) == [2, 3, 4, 6, 8]
    assert E.stride_space(None, max_stride=6, S=10_000) == [2, 3, 4, 5, 6]


GRID_CASES = [
    # (stride, phase, tokens_per_frame, vline, slash)
    pytest.param(24, 5, 24, True, True, id="s24-p5-tpf24-vline-slash"),
    pytest.param(12, 7, 24, True, False, id="s12-p7-tpf24-vline-only"),
    pytest.param(8, 3, 24, True, True, id="s8-p3-tpf24"),
    pytest.param(16, 0, 48, True, True, id="s16-p0-tpf48"),
    pytest.param(6, 5, 36, True, False, id="s6-p5-tpf36-vline-only"),
]


@pytest.mark.parametrize("stride, phase, tpf, vline, slash", GRID_CASES)
def test_grid_stride_and_phase_recovered_exactly(stride, phase, tpf, vline, slash):
    S = 997
    q, k, v = planted_grid_qkv(
        1, 4, 2, S, 64, stride=stride, phase=phase, vline=vline, slash=slash, seed=stride
    )
    rows = torch.arange(S - 64, S)
    p = E.approx_scores(q, k, rows, scale=64**-0.5)
    st, ph, _ = E.search_grid(p, rows, E.stride_space(tpf, max_stride=1024, S=S))
    assert torch.equal(st, torch.full_like(st, stride))
    assert torch.equal(ph, torch.full_like(ph, phase))


@pytest.mark.parametrize(
    "stride, tpf", [pytest.param(16, 48, id="s16-tpf48"), pytest.param(9, 27, id="s9-tpf27")]
)
def test_grid_stride_recovered_from_slash_lines_only(stride, tpf):
    S = 801
    q, k, v = planted_grid_qkv(
        1, 2, 1, S, 64, stride=stride, phase=0, vline=False, slash=True, seed=3
    )
    rows = torch.arange(S - 64, S)
    p = E.approx_scores(q, k, rows, scale=64**-0.5)
    st, _, _ = E.search_grid(p, rows, E.stride_space(tpf, max_stride=1024, S=S))
    assert torch.equal(st, torch.full_like(st, stride))


@pytest.mark.parametrize("stride, phase, tpf, vline, slash", GRID_CASES[:3])
def test_grid_head_recall_of_attention_mass(stride, phase, tpf, vline, slash):
    """Quality: the Grid plan keeps >= 95% of the dense attention mass at about half the causal
    blocks or fewer (at S=1031 lines are short, so block rounding costs a lot; the 128K+
    densities are in the benchmark)."""
    S = 1031
    q, k, v = planted_grid_qkv(
        1, 4, 2, S, 64, stride=stride, phase=phase, vline=vline, slash=slash, seed=7
    )
    lay = TokenLayout(torch.full((S,), 2), tokens_per_frame=tpf)
    plan = plan_layer(q, k, Grid(use_vline=vline, use_slash=slash), lay, block=32)
    assert torch.equal(plan.meta["stride"], torch.full((1, 4), stride))
    ((mass, _),) = recall_many(q, k, v, [plan.row_mask], scale=64**-0.5)
    assert float(mass.min()) >= 0.95, mass
    assert plan.density() < 0.55, plan.density()


def test_estimate_vertical_slash_indices_match_the_steps():
    from sparse_patterns import VerticalSlash, estimate_vertical_slash

    g = torch.Generator().manual_seed(8)
    q = torch.randn(2, 4, 150, 16, generator=g)
    k = torch.randn(2, 2, 150, 16, generator=g)
    pat = VerticalSlash(n_vertical=12, n_slash=9, last_q=20, sink=3, local=2)
    vert, sl = estimate_vertical_slash(q, k, pat)
    assert vert.shape == (2, 4, 12) and sl.shape == (2, 4, 9) and vert.dtype == torch.int32
    rows = torch.arange(130, 150)
    p = E.approx_scores(q, k, rows, scale=0.25)
    assert torch.equal(vert.long(), E.topk_indices(E.vertical_scores(p), 12, forced=3))
    assert torch.equal(sl.long(), E.topk_indices(E.slash_scores(p, rows), 9, forced=2))


def test_vertical_slash_recall_on_planted_head():
    """Quality: planted vertical columns + diagonals; VS with (64, 64) lines (the MInference
    budget 1000/1024 of a 25K context scaled to S=1536) keeps >= 0.95 of the attention mass and
    finds every planted column."""
    from sparse_patterns import VerticalSlash, estimate_vertical_slash
    from sparse_patterns.testing import planted_vertical_slash_qkv

    cols = [0, 5, 300, 301, 777]
    q, k, v = planted_vertical_slash_qkv(
        1, 4, 2, 1536, 128, columns=cols, offsets=[0, 1, 2, 100, 513], strength=12.0
    )
    pat = VerticalSlash(n_vertical=64, n_slash=64)
    plan = plan_layer(q, k, pat, None, block=64)
    ((mass, _),) = recall_many(q, k, v, [plan.row_mask], scale=128**-0.5)
    assert float(mass.min()) >= 0.95, mass
    vert, _ = estimate_vertical_slash(q, k, pat)
    assert all(
        torch.isin(torch.tensor(cols, dtype=torch.int32), vert[0, h]).all() for h in range(4)
    )


@pytest.mark.parametrize("L", [16, 64, 200])
def test_last_line_scores_triton_matches_torch_steps(L):
    """The streaming kernel path and the composed torch steps give the same sums (and so the
    same top-k lists and grid search)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(5)
    q = torch.randn(1, 4, 300, 32).to(dev)
    k = torch.randn(1, 2, 300, 32).to(dev)
    ref = E.last_line_scores(q, k, L, scale=0.2, impl="reference")
    if L > 128:
        with pytest.raises(ValueError, match="1 <= L <= 128"):
            E.last_line_scores(q, k, L, scale=0.2, impl="triton")
        return
    got = E.last_line_scores(q, k, L, scale=0.2, impl="triton")
    for a, b in zip(got, ref):
        assert torch.allclose(a, b, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "S, strides",
    [(1000, [2, 4, 8, 16, 32]), (4097, [2, 4, 8, 16, 32, 64, 128, 256]), (777, [3, 7, 21])],
)
def test_search_grid_folded_views_match_direct_views(S, strides):
    """Stride spaces with a small common period use one pass per vector and fold it per stride;
    the scores must be those of the direct per-stride views (the second path, kept for spaces
    without a small common period)."""
    g = torch.Generator().manual_seed(S)
    col = torch.rand(3, S, generator=g) ** 4
    sl = torch.rand(3, S, generator=g) ** 4
    col[:, 5::21] += 1.0
    sl[1, 3::16] += 0.5
    st, ph, sc = E.search_grid_lines(col, sl, strides)
    both = torch.stack([col, sl])
    for n in range(3):
        s = int(st[n])
        r, arg = E._line_ratio(both[:, n : n + 1], s)
        assert torch.allclose(sc[n], r.amax(0)[0], rtol=1e-5)
        assert int(ph[n]) == int(arg[0, 0])
    # and the chosen stride is the one the direct scores choose
    direct = torch.stack([E._line_ratio(both, s)[0].amax(0) for s in strides], -1)
    best = direct.amax(-1, keepdim=True)
    first = (direct >= best * 0.85).to(torch.int8).argmax(-1)
    assert torch.equal(st, torch.tensor(strides)[first])


@pytest.mark.parametrize("stride, phase, tpf, vline, slash", GRID_CASES)
def test_grid_stride_and_phase_recovered_from_folds(stride, phase, tpf, vline, slash):
    """The folded search (what plan_layer runs when the stride space has a small common period)
    recovers the planted stride and phase exactly, from the fold kernel's sums as from the torch
    reference's."""
    S = 997
    q, k, v = planted_grid_qkv(
        1, 4, 2, S, 64, stride=stride, phase=phase, vline=vline, slash=slash, seed=stride
    )
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q, k = q.to(dev), k.to(dev)
    space = E.stride_space(tpf, max_stride=1024, S=S)
    for impl in ("reference", "triton"):
        cf, sf = E.last_line_folds(q, k, 64, period=tpf, scale=64**-0.5, impl=impl)
        st, ph, _ = E.search_grid_folds(cf[0], sf[0], space)
        assert torch.equal(st, torch.full_like(st, stride)), impl
        assert torch.equal(ph, torch.full_like(ph, phase)), impl


@pytest.mark.parametrize(
    "S, strides",
    [(1000, [2, 4, 8, 16, 32]), (4097, [2, 4, 8, 16, 32, 64, 128, 256]), (777, [3, 7, 21])],
)
def test_search_grid_folds_matches_direct_views_of_the_window(S, strides):
    """Each stride's score and phase from the folded sums equal those of the direct view
    ``x[lo:hi].reshape(-1, s)`` of the full vectors over :func:`grid_window`, and the chosen
    stride is the smallest within rel_tol of the best, as in search_grid_lines."""
    import math

    from sparse_kernels.estimate.reference import fold_positions

    g = torch.Generator().manual_seed(S)
    col = torch.rand(3, S, generator=g) ** 4
    sl = torch.rand(3, S, generator=g) ** 4
    col[:, 5::21] += 1.0
    sl[1, 3::16] += 0.5
    P = math.lcm(*strides)
    lo, hi = E.grid_window(P, S)
    assert lo == P and hi == S // P * P
    st, ph, sc = E.search_grid_folds(
        fold_positions(col, P, lo, hi), fold_positions(sl, P, lo, hi), strides
    )
    both = torch.stack([col, sl])[..., lo:hi]
    direct, phases = [], []
    for s in strides:
        v = both.reshape(2, 3, -1, s).mean(-2)
        direct.append((v.amax(-1) / v.mean(-1)).amax(0))
        phases.append(v[0].argmax(-1))
    direct, phases = torch.stack(direct, -1), torch.stack(phases, -1)
    first = (direct >= direct.amax(-1, keepdim=True) * 0.85).to(torch.int8).argmax(-1)
    assert torch.equal(st, torch.tensor(strides)[first])
    assert torch.equal(ph, phases.gather(-1, first[:, None])[:, 0])
    assert torch.allclose(sc, direct.gather(-1, first[:, None])[:, 0], rtol=1e-5)


@pytest.mark.parametrize(
    "strides, match",
    [
        pytest.param([2, 5], "dividing the period 8", id="stride-not-dividing"),
        pytest.param([], "dividing the period 8", id="no-stride"),
    ],
)
def test_search_grid_folds_bad_strides(strides, match):
    with pytest.raises(ValueError, match=match):
        E.search_grid_folds(torch.rand(2, 8), torch.rand(2, 8), strides)


def test_search_grid_folds_shape_mismatch():
    with pytest.raises(ValueError, match="expected the shape of col_fold"):
        E.search_grid_folds(torch.rand(2, 8), torch.rand(3, 8), [2, 4])


@pytest.mark.parametrize("L", [16, 64, 200])
def test_last_line_folds_triton_matches_torch_steps(L):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(5)
    q = torch.randn(1, 4, 300, 32).to(dev)
    k = torch.randn(1, 2, 300, 32).to(dev)
    ref = E.last_line_folds(q, k, L, period=24, scale=0.2, impl="reference")
    if L > 128:
        with pytest.raises(ValueError, match="1 <= L <= 128"):
            E.last_line_folds(q, k, L, period=24, scale=0.2, impl="triton")
        return
    got = E.last_line_folds(q, k, L, period=24, scale=0.2, impl="triton")
    for a, b in zip(got, ref):
        assert a.shape == (1, 4, 24)
        assert torch.allclose(a, b, atol=2e-5, rtol=1e-5)


def test_plan_layer_grid_uses_folds_only_where_the_period_fits(monkeypatch):
    """Small common period: plan_layer's Grid search calls the fold path and never the full line
    scores; FOLD_MAX_PERIOD below the period: the full line scores. Both find the planted grid."""
    from sparse_patterns.planner import grid as MM

    S = 997
    q, k, _ = planted_grid_qkv(1, 4, 2, S, 64, stride=12, phase=7, vline=True, slash=False, seed=1)
    lay = TokenLayout(torch.full((S,), 2), tokens_per_frame=24)
    calls = []
    for name in ("last_line_folds", "last_line_scores"):
        fn = getattr(E, name)
        monkeypatch.setattr(
            E, name, lambda *a, _f=fn, _n=name, **kw: calls.append(_n) or _f(*a, **kw)
        )
    for max_period, want in ((4096, "last_line_folds"), (8, "last_line_scores")):
        calls.clear()
        monkeypatch.setattr(MM, "FOLD_MAX_PERIOD", max_period)
        plan = plan_layer(q, k, Grid(use_vline=True, use_slash=False), lay, block=32)
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


def _count_calls(monkeypatch, names):
    calls = []
    for name in names:
        fn = getattr(E, name)
        monkeypatch.setattr(
            E, name, lambda *a, _f=fn, _n=name, **kw: calls.append(_n) or _f(*a, **kw)
        )
    return calls


def test_plan_layer_mixed_vs_grid_layer_passes_over_the_keys_once(monkeypatch):
    """A layer whose first head is Grid and whose others are Vertical-Slash: the line scores are
    made once (the Vertical-Slash group is planned first) and the Grid search folds them, with
    the same plan as when the Grid heads run the fold pass of their own."""
    from sparse_patterns import HeadConfig, VerticalSlash
    from sparse_patterns.planner import grid as MM

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
    assert MM.FOLD_MAX_PERIOD == 4096


def test_plan_layer_grid_several_periods_make_the_line_scores_once(monkeypatch):
    """Grid heads with two fixed strides (two common periods): one line-score pass, folded per
    period, and each head gets its own stride."""
    S = 997
    q, k, _ = planted_grid_qkv(1, 4, 2, S, 64, stride=12, phase=7, vline=True, slash=False, seed=1)
    from sparse_patterns import HeadConfig

    calls = _count_calls(monkeypatch, ["last_line_folds", "last_line_scores"])
    heads = [HeadConfig(Grid(stride=12)), HeadConfig(Grid(stride=8))] * 2
    plan = plan_layer(q, k, heads, None, block=32)
    assert calls == ["last_line_scores"]
    assert plan.meta["stride"].tolist() == [[12, 8, 12, 8]]
    assert plan.meta["phase"][0, 0] == 7 and plan.meta["phase"][0, 2] == 7


def _plans_fused_and_not(monkeypatch, q, k, heads, lay, blk):
    """The plan (and the run split ``run`` launches with) of ``_plan_grid`` and of
    ``_plan_grid_fused`` (on the Triton interpreter on the CPU), with which path each took."""
    from sparse_patterns.planner import grid as MM

    took = []
    fused = MM._plan_grid_fused
    monkeypatch.setattr(
        MM, "_plan_grid_fused", lambda *a, **kw: took.append("fused") or fused(*a, **kw)
    )
    out = []
    for mode in ("off", "triton"):
        monkeypatch.setattr(MM, "GRID_FUSED", mode)
        plan = plan_layer(q, k, heads, lay, block=blk)
        out.append((plan, plan._launch_lists))
    return out, took


@pytest.mark.parametrize(
    "B, S, H, H_KV, tpf, blk, heads, dtype",
    [
        pytest.param(1, 1025, 4, 2, 16, 64, [Grid()] * 4, torch.float16, id="searched-tpf16"),
        pytest.param(2, 1000, 4, 2, 24, 32, [Grid()] * 4, torch.float32, id="B2-tpf24"),
        pytest.param(1, 777, 4, 1, None, 64, [Grid(stride=7)] * 4, torch.float16, id="fixed"),
        pytest.param(
            1,
            1025,
            4,
            2,
            16,
            48,
            [Grid(use_vline=False), Grid(use_slash=False), Grid(), Grid()],
            torch.float16,
            id="blk48-line-flags-per-head",
        ),  # fmt: skip
        pytest.param(1, 900, 2, 2, 30, 64, [Grid()] * 2, torch.float16, id="tpf30"),
    ],
)
def test_plan_layer_fused_grid_equals_the_unfused_plan(
    monkeypatch, B, S, H, H_KV, tpf, blk, heads, dtype
):
    """``_plan_grid_fused`` (fold, merge, search, block index and lists kernels) gives exactly
    the plan of the unfused path: strides, phases, permutation, lists, runs and run split."""
    from sparse_patterns import HeadConfig

    g = torch.Generator().manual_seed(S + blk)
    q = torch.randn(B, H, S, 32, generator=g)
    k = torch.randn(B, H_KV, S, 32, generator=g)
    if tpf:
        k[..., 5::tpf, :8] += 1.5
    lay = TokenLayout(torch.full((S,), 2, device=DEV), tokens_per_frame=tpf) if tpf else None
    cfgs = [HeadConfig(h) for h in heads]
    q, k = q.to(DEV, dtype), k.to(DEV, dtype)
    ((a, la), (b, lb)), took = _plans_fused_and_not(monkeypatch, q, k, cfgs, lay, blk)
    assert took == ["fused"]
    _same_plans(a, la, b, lb)
    assert len(set(b.meta["stride"].flatten().tolist())) > 1 or heads[0].stride is not None


@pytest.mark.parametrize("cap", ["wider", "narrower"])
@pytest.mark.parametrize("block_w", [4, 128], ids=lambda b: f"chunk{b}")
@pytest.mark.parametrize(
    "H, H_KV, S", [(4, 2, 997), pytest.param(3, 1, 996, id="odd-int32-count")], ids=str
)
def test_plan_layer_fused_grid_lists_launched_before_the_width_read(
    monkeypatch, cap, block_w, H, H_KV, S
):
    """Once a shape's row width is recorded, the fused planner launches the lists that wide
    before it reads the width: wider than this call's rows (the plan keeps the first W
    entries) and narrower (launched again after the read; the record grows to W). Either way
    the plan of the unfused path, entry for entry, with the candidates walked ``block_w`` at a
    time. With 3 heads and 996 tokens the launch's int32 storage is padded to whole int64."""
    from sparse_kernels.permuted import lists_triton
    from sparse_patterns import HeadConfig
    from sparse_patterns.planner import grid as MM

    monkeypatch.setattr(lists_triton, "_LISTS_BLOCK_W", block_w)
    monkeypatch.setattr(MM, "_GRID_LISTS_CAP", {})
    monkeypatch.setattr(MM, "GRID_GRAPHS", "off")  # each call launches (graphs: the next test)
    q, k, _ = planted_grid_qkv(1, H, H_KV, S, 32, stride=8, phase=3, seed=5)
    lay = TokenLayout(torch.full((S,), 2, device=DEV), tokens_per_frame=16)
    q, k, heads = q.to(DEV), k.to(DEV), [HeadConfig(Grid())] * H
    monkeypatch.setattr(MM, "GRID_FUSED", "off")
    ref = plan_layer(q, k, heads, lay, block=32)
    ref_lists = ref._launch_lists
    monkeypatch.setattr(MM, "GRID_FUSED", "triton")
    first = plan_layer(q, k, heads, lay, block=32)
    W = ref.kv_block_indices.shape[-1]
    assert W > 4 and list(MM._GRID_LISTS_CAP.values()) == [W]  # recorded by the first call
    assert first.kv_block_indices.shape[-1] == W
    (key,) = MM._GRID_LISTS_CAP
    MM._GRID_LISTS_CAP[key] = W + 7 if cap == "wider" else W - 3
    launched = []
    real = MM.launch_grid_lists
    monkeypatch.setattr(
        MM, "launch_grid_lists", lambda *a, **kw: launched.append(a[6]) or real(*a, **kw)
    )
    plan = plan_layer(q, k, heads, lay, block=32)
    got = plan._launch_lists
    assert launched == ([W + 7] if cap == "wider" else [W - 3, W])
    assert MM._GRID_LISTS_CAP[key] == (W + 7 if cap == "wider" else W)
    assert torch.equal(plan.kv_block_indices, ref.kv_block_indices)
    assert torch.equal(plan.kv_block_counts, ref.kv_block_counts)
    for x, y in zip((*got[:2], *got[2][:2]), (*ref_lists[:2], *ref_lists[2][:2])):
        assert torch.equal(x, y)


def test_plan_layer_fused_grid_rows_wider_than_the_lists_kernel(monkeypatch):
    """Candidate rows wider than ``GRID_LISTS_MAX_WIDTH``: the fused planner builds the lists
    in torch (and ``run`` splits them), with the same plan as the unfused path."""
    from sparse_kernels.permuted import lists_triton
    from sparse_patterns import HeadConfig
    from sparse_patterns.planner import grid as MM

    monkeypatch.setattr(lists_triton, "GRID_LISTS_MAX_WIDTH", 4)
    monkeypatch.setattr(MM, "GRID_LISTS_MAX_WIDTH", 4)
    S = 997
    q, k, _ = planted_grid_qkv(1, 4, 2, S, 32, stride=8, phase=3, vline=True, slash=True, seed=5)
    lay = TokenLayout(torch.full((S,), 2, device=DEV), tokens_per_frame=16)
    ((a, la), (b, lb)), took = _plans_fused_and_not(
        monkeypatch, q.to(DEV), k.to(DEV), [HeadConfig(Grid())] * 4, lay, 32
    )
    assert took == ["fused"] and b.run_split is None
    assert torch.equal(a.kv_block_indices, b.kv_block_indices)
    assert torch.equal(a.kv_block_counts, b.kv_block_counts)
    for x, y in zip((*la[:2], *la[2][:2]), (*lb[:2], *lb[2][:2])):
        assert torch.equal(x, y)


@pytest.mark.parametrize(
    "heads, tpf, why",
    [
        pytest.param([Grid(use_hline=True)] + [Grid()] * 3, 16, "hline", id="hline"),
        pytest.param([Grid(stride=12), Grid(stride=8)] * 2, None, "two spaces", id="two-spaces"),
        pytest.param([Grid(stride=600)] * 4, None, "period past S/2", id="period-past-half"),
        pytest.param([Grid(last_q=200)] * 4, 16, "rows", id="more-than-128-rows"),
    ],
)
def test_plan_layer_fused_grid_only_where_it_fits(monkeypatch, heads, tpf, why):
    """Layers the fused planner does not take go through ``_plan_grid``'s other paths."""
    from sparse_patterns import HeadConfig, VerticalSlash

    S = 997
    q, k, _ = planted_grid_qkv(1, 4, 2, S, 32, stride=8, phase=3, vline=True, slash=True, seed=3)
    lay = TokenLayout(torch.full((S,), 2), tokens_per_frame=tpf) if tpf else None
    _, took = _plans_fused_and_not(monkeypatch, q, k, [HeadConfig(h) for h in heads], lay, 32)
    assert took == [], why
    mixed = [HeadConfig(Grid())] * 2 + [HeadConfig(VerticalSlash(n_vertical=30, n_slash=40))] * 2
    _, took = _plans_fused_and_not(
        monkeypatch, q, k, mixed, TokenLayout(torch.full((S,), 2), tokens_per_frame=16), 32
    )
    assert took == []  # a group of some heads only


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


@pytest.mark.gpu
@pytest.mark.parametrize(
    "H, H_KV, S",
    [(4, 2, 4000), pytest.param(3, 1, 4096, id="odd-heads-odd-int32-count")],
    ids=str,
)
def test_plan_layer_fused_grid_replays_a_cuda_graph_gpu(monkeypatch, H, H_KV, S):
    """The first call of a shape captures a CUDA graph of the fused launches; later calls replay it.
    For other q and k (other addresses, other grids) each plan equals the plan launched
    without graphs, entry for entry, also after later replays (a plan never aliases the
    graph's memory); a call whose rows are wider than the recorded width (the stride-4 grid)
    launches its lists again after the read and captures a graph that wide for the next call."""
    from sparse_patterns import HeadConfig
    from sparse_patterns.planner import grid as MM

    replays = []

    class Counted(MM.OffsetGraph):
        def __call__(self, q, k):
            replays.append(id(self))
            return super().__call__(q, k)

    monkeypatch.setattr(MM, "OffsetGraph", Counted)
    monkeypatch.setattr(MM, "_GRID_LISTS_CAP", {})
    monkeypatch.setattr(MM, "_GRID_GRAPHS", {})
    D = 64
    heads = [HeadConfig(Grid())] * H
    lay = TokenLayout(torch.full((S,), 2, device=DEV), tokens_per_frame=16)
    grids = [(8, 3), (16, 5), (4, 1), (8, 6), (4, 2)]
    inputs = [
        planted_grid_qkv(1, H, H_KV, S, D, stride=s, phase=p, seed=i)[:2]
        for i, (s, p) in enumerate(grids)
    ]
    inputs = [(q.to(DEV, torch.bfloat16), k.to(DEV, torch.bfloat16)) for q, k in inputs]
    got = []
    for q, k in inputs:
        plan = plan_layer(q, k, heads, lay, block=64)
        got.append((plan, plan._launch_lists))
    assert len(replays) == 4 and len(set(replays)) == 2  # calls 2, 3 and 4, 5: two widths
    assert len(MM._GRID_GRAPHS) == 2
    monkeypatch.setattr(MM, "_GRID_GRAPHS_MAX_S", S - 1)  # past it: launched, no graph
    plan_layer(*inputs[0], heads, lay, block=64)
    assert len(replays) == 4 and len(MM._GRID_GRAPHS) == 2
    monkeypatch.setattr(MM, "GRID_GRAPHS", "off")
    for (q, k), (s, _), (plan, lists) in zip(inputs, grids, got, strict=True):
        ref = plan_layer(q, k, heads, lay, block=64)
        _same_plans(plan, lists, ref, ref._launch_lists)
        assert plan.meta["stride"].unique().tolist() == [s]


def test_offset_graph_bad_input():
    from sparse_patterns._graphs import OffsetGraph, _check_outputs

    with pytest.raises(ValueError, match="expected one dtype, got torch.float16 and torch.float32"):
        OffsetGraph(None, torch.zeros(2, dtype=torch.float16), torch.zeros(2))
    base = torch.zeros(10, dtype=torch.int32)
    _check_outputs(base, (base[2:4], base[:4].view(torch.int64)))  # what a launch may return
    with pytest.raises(ValueError, match="its own allocation, got storage offset 1"):
        _check_outputs(base[1:], ())
    with pytest.raises(ValueError, match="view of its base, got output 1 outside it"):
        _check_outputs(base, (base[:2], torch.zeros(2, dtype=torch.int32)))
    odd = torch.zeros(9, dtype=torch.int32)
    with pytest.raises(ValueError, match="whole number of torch.int64 elements .output 0., got 36"):
        _check_outputs(odd, (odd[:4].view(torch.int64),))
