"""The PyTorch Grid stride search (the oracles of the Grid index's search kernel): the folded and
direct views agree, and bad strides are refused."""

import pytest
import torch
from sparse_kernels.grid_index import grid_window, search_grid_folds, search_grid_lines
from sparse_kernels.grid_index.reference import _line_ratio


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
    st, ph, sc = search_grid_lines(col, sl, strides)
    both = torch.stack([col, sl])
    for n in range(3):
        s = int(st[n])
        r, arg = _line_ratio(both[:, n : n + 1], s)
        assert torch.allclose(sc[n], r.amax(0)[0], rtol=1e-5)
        assert int(ph[n]) == int(arg[0, 0])
    # and the chosen stride is the one the direct scores choose
    direct = torch.stack([_line_ratio(both, s)[0].amax(0) for s in strides], -1)
    best = direct.amax(-1, keepdim=True)
    first = (direct >= best * 0.85).to(torch.int8).argmax(-1)
    assert torch.equal(st, torch.tensor(strides)[first])


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
    lo, hi = grid_window(P, S)
    assert lo == P and hi == S // P * P
    st, ph, sc = search_grid_folds(
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
        search_grid_folds(torch.rand(2, 8), torch.rand(2, 8), strides)


def test_search_grid_folds_shape_mismatch():
    with pytest.raises(ValueError, match="expected the shape of col_fold"):
        search_grid_folds(torch.rand(2, 8), torch.rand(3, 8), [2, 4])
