import pytest
import torch
from sparse_patterns import AShape, Dense, Grid, HeadConfig, QBoundary, TokenLayout, plan_layer
from sparse_patterns.plot import head_figure, head_images, plot_head
from sparse_patterns.testing import planted_boundary_qkv, planted_grid_qkv

pytest.importorskip("matplotlib")


def _grid_head():
    S = 512
    q, k, _ = planted_grid_qkv(1, 1, 1, S, 64, stride=16, phase=3, vline=True, slash=False, seed=2)
    plan = plan_layer(q, k, Grid(), TokenLayout(torch.full((S,), 2), tokens_per_frame=16), block=32)
    return q, k, plan


def test_plot_head_grid_permutation_makes_dense_tiles(tmp_path):
    q, k, plan = _grid_head()
    S = q.shape[2]
    imgs = head_images(q, k, plan, size=S)
    # Before: the vertical line mass sits in the columns 3, 19, 35, ...; after the grid
    # permutation it sits in the first S / 16 columns (line 0).
    col = imgs["attention"].sum(0)
    assert set(torch.topk(col, 8).indices.tolist()) <= set(range(3, S, 16))
    pcol = imgs["permuted"].sum(0)
    assert bool((torch.topk(pcol, 8).indices < S // 16).all())
    assert imgs["blocks"].shape == (16, 16)
    assert int(imgs["pool"]) == 1
    out = plot_head(q, k, plan, tmp_path / "grid.png", title="planted grid", head_config=Grid())
    assert out.stat().st_size > 10_000
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_head_figure_names_pattern_scale_and_colour():
    q, k, plan = _grid_head()
    fig = head_figure(q, k, plan, title="planted grid", head_config=HeadConfig(Grid()))
    sup = fig._suptitle.get_text()
    assert "planted grid" in sup
    assert "Grid(stride=None" in sup and "found stride 16, phase 3" in sup
    assert "% of the causal entries" in sup and "% of the attention mass" in sup
    attn, perm, cbar, tiles = fig.axes
    # 512 tokens drawn at 256 pixels: the factor is on the figure and the axes count tokens.
    assert "1 pixel = 2x2 tokens" in attn.get_title()
    assert attn.get_xlabel() == "key token" and attn.get_ylabel() == "query token"
    assert attn.get_images()[0].get_extent() == [0, 512, 512, 0]
    assert "permuted" in perm.get_xlabel()
    # One colorbar for both attention maps (one colour scale) says what the colour means.
    a_img, p_img = attn.get_images()[0], perm.get_images()[0]
    assert p_img.colorbar is not None and p_img.colorbar.ax is cbar
    assert a_img.norm is p_img.norm
    assert "attention probability (log scale)" in cbar.get_ylabel()
    # The tile grid is at true scale: one cell per 32-token block.
    assert tiles.get_images()[0].get_array().shape == (16, 16)
    assert "32 tokens" in tiles.get_xlabel() and "1 cell = 1 block of 32x32" in tiles.get_title()
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(labels) == 3 and all("% of tiles" in t for t in labels)


def test_head_figure_without_head_config_says_so():
    q, k, plan = _grid_head()
    fig = head_figure(q, k, plan)
    assert "pattern not given" in fig._suptitle.get_text()


def test_head_images_counts_exact_a_shape_heads():
    """An exact A-shape head has no block lists (its window runs in a kernel of its own); the
    picture shows what it computes, from the executed mask."""
    S, blk = 256, 32
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, S, 16, generator=g)
    k = torch.randn(1, 1, S, 16, generator=g)
    heads = [HeadConfig(AShape(sink=8, window=40, exact=True)), HeadConfig(Dense())]
    plan = plan_layer(q, k, heads, None, block=blk)
    imgs = head_images(q, k, plan, head=0)
    nb = S // blk
    assert imgs["blocks"].shape == (nb, nb)
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    em = (j <= i) & ((j < 8) | (i - j < 40))
    touched = em.reshape(nb, blk, nb, blk).any(3).any(1)
    assert torch.equal(imgs["blocks"] > 0, touched)
    assert bool((imgs["blocks"][:, 0] > 0).all())  # the sink column of every query block
    assert float(imgs["density"]) == pytest.approx(float(em.sum() / (S * (S + 1) / 2)))
    dense = head_images(q, k, plan, head=1)
    assert float(dense["density"]) == 1.0
    assert float(dense["recall"]) == pytest.approx(1.0, abs=1e-5)
    assert float(imgs["recall"]) < 1.0


def test_head_figure_boundary_head_reads_the_row_permutation():
    q, k, _, lay = planted_boundary_qkv([(0, 60), (2, 256), (0, 40), (2, 200), (0, 61)])
    hc = HeadConfig(AShape(sink=4, window=64), QBoundary())
    plan = plan_layer(q, k, hc, lay, block=32)
    fig = head_figure(q, k, plan, head=1, head_config=hc)
    assert "AShape(sink=4, window=64, exact=False) + QBoundary()" in fig._suptitle.get_text()


@pytest.mark.parametrize(
    "kw, err, match",
    [
        pytest.param({"head": 1}, ValueError, r"\[0, 1\).*got \(0, 1\)", id="head"),
        pytest.param({"batch": -1}, ValueError, r"got \(-1, 0\)", id="batch"),
        pytest.param({"size": 0}, ValueError, "size: expected an int >= 1, got 0", id="size"),
        pytest.param({"head_config": "grid"}, TypeError, "got str", id="head-config"),
    ],
)
def test_head_figure_errors(kw, err, match):
    q, k, plan = _grid_head()
    with pytest.raises(err, match=match):
        head_figure(q, k, plan, **kw)


def test_head_figure_rejects_an_execution_only_plan():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 128, 16, generator=g)
    k = torch.randn(1, 1, 128, 16, generator=g)
    hc = HeadConfig(AShape(sink=4, window=32, exact=True))
    plan = plan_layer(q, k, hc, None, block=32, exact_vertical_lists=False)
    with pytest.raises(ValueError, match="exact_vertical_lists=True.*execution-only plan"):
        head_figure(q, k, plan)


def test_head_figure_rejects_a_plan_of_another_shape():
    q, k, plan = _grid_head()
    with pytest.raises(ValueError, match=r"expected a plan for .* S = 256, got .* S = 512"):
        head_figure(q[:, :, :256], k[:, :, :256], plan)
