import pytest
import torch
from sparse_patterns import Grid, TokenLayout, plan_layer
from sparse_patterns.plot import head_images, plot_head
from sparse_patterns.testing import planted_grid_qkv

pytest.importorskip("matplotlib")


def test_plot_head_grid_permutation_makes_dense_tiles(tmp_path):
    S = 512
    q, k, v = planted_grid_qkv(1, 1, 1, S, 64, stride=16, phase=3, vline=True, slash=False, seed=2)
    plan = plan_layer(q, k, Grid(), TokenLayout(torch.full((S,), 2), tokens_per_frame=16), block=32)
    imgs = head_images(q, k, plan, size=S)
    # Before: the vertical line mass sits in the columns 3, 19, 35, ...; after the grid
    # permutation it sits in the first S / 16 columns (line 0).
    col = imgs["attention"].sum(0)
    assert set(torch.topk(col, 8).indices.tolist()) <= set(range(3, S, 16))
    pcol = imgs["permuted"].sum(0)
    assert bool((torch.topk(pcol, 8).indices < S // 16).all())
    assert imgs["blocks"].shape == (16, 16)
    out = plot_head(q, k, plan, tmp_path / "grid.png", title="planted grid")
    assert out.stat().st_size > 10_000
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
