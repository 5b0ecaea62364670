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
