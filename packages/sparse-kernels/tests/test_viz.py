import sys

import pytest
import torch
from sparse_kernels import build_vertical_slash_index
from sparse_kernels.viz import (
    FULL,
    PARTIAL,
    SKIPPED,
    block_states,
    block_states_figure,
    plot_block_mask,
    plot_vertical_slash_index,
    vertical_slash_block_states,
)
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_block_states_of_causal_create_block_mask(tmp_path):
    bm = create_block_mask(
        lambda b, h, q, k: q >= k, 1, 1, 256, 256, device="cpu", BLOCK_SIZE=(64, 64)
    )
    expect = torch.tensor(
        [[1, 0, 0, 0], [2, 1, 0, 0], [2, 2, 1, 0], [2, 2, 2, 1]], dtype=torch.int8
    )
    st = plot_block_mask(bm, tmp_path / "causal.png", title="causal")
    assert torch.equal(st, expect)
    assert (tmp_path / "causal.png").read_bytes()[:8] == PNG_MAGIC


def test_block_states_per_head_blockmask():
    num = torch.tensor([[[1, 0], [2, 1]]], dtype=torch.int32)  # [1, 2 heads, 2 q blocks]
    idx = torch.tensor([[[[1, 0], [0, 0]], [[0, 1], [1, 0]]]], dtype=torch.int32)
    bm = BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=(128, 64))
    assert torch.equal(block_states(bm, head=0), torch.tensor([[0, 1], [0, 0]], dtype=torch.int8))
    assert torch.equal(block_states(bm, head=1), torch.tensor([[1, 1], [0, 1]], dtype=torch.int8))


def test_block_states_dense_bool(tmp_path):
    m = torch.zeros(1, 2, 100, 70, dtype=torch.bool)
    m[0, 1, :64, :64] = True  # one full tile
    m[0, 1, 80, 65] = True  # one element: partial
    m[0, 1, 64:, :64] = True  # ragged last row of tiles, full within bounds
    st = plot_block_mask(m, tmp_path / "dense.png", head=1, block=64)
    assert torch.equal(st, torch.tensor([[FULL, SKIPPED], [FULL, PARTIAL]], dtype=torch.int8))
    assert (tmp_path / "dense.png").read_bytes()[:8] == PNG_MAGIC


def test_vertical_slash_states(tmp_path):
    v = torch.tensor([[[10, 200]]], dtype=torch.int32)
    s = torch.tensor([[[0]]], dtype=torch.int32)
    idx = build_vertical_slash_index(v, s, seq_len=256, block_m=64, block_n=64)
    st = plot_vertical_slash_index(idx, tmp_path / "vs.png", title="vs")
    # Diagonal tiles partial (causal); column 10 is gathered in query blocks 1..3 (partial);
    # column 200 lies in the diagonal tile of block 3.
    expect = torch.tensor(
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]], dtype=torch.int8
    )
    assert torch.equal(st, expect)
    assert torch.equal(vertical_slash_block_states(idx), expect)
    assert (tmp_path / "vs.png").read_bytes()[:8] == PNG_MAGIC


def test_bad_inputs():
    with pytest.raises(ValueError, match="bool tensor"):
        block_states(torch.zeros(3, 3))
    with pytest.raises(TypeError, match="BlockMask or a bool tensor, got list"):
        block_states([1])
    with pytest.raises(ValueError, match=r"out of range"):
        block_states(torch.zeros(1, 2, 4, 4, dtype=torch.bool), head=2)


def test_missing_matplotlib_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.colors", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"sparse-kernels\[viz\]"):
        plot_block_mask(torch.ones(4, 4, dtype=torch.bool), tmp_path / "x.png")


def test_block_states_figure_tiles_at_true_scale():
    bm = create_block_mask(
        lambda b, h, q, k: q >= k, 1, 1, 256, 512, device="cpu", BLOCK_SIZE=(128, 64)
    )
    st = block_states(bm)
    fig = block_states_figure(st, block=(128, 64), title="causal")
    (ax,) = fig.axes
    assert torch.equal(torch.as_tensor(ax.get_images()[0].get_array()), st.to(torch.int64))
    assert ax.get_title() == "causal\n2 x 8 tiles; 1 cell = 1 tile of 128x64 tokens"
    assert ax.get_xlabel() == "key block (BLOCK_N = 64 tokens)"
    assert ax.get_ylabel() == "query block (BLOCK_M = 128 tokens)"
    # A cell has the tile's shape: the axes box is 512 tokens wide for 256 tall.
    box = ax.get_position()
    w, h = box.width * fig.get_figwidth(), box.height * fig.get_figheight()
    assert w / h == pytest.approx(512 / 256)
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["skipped: 62.5%", "partial (element-masked): 25.0%", "full: 12.5%"]
    assert legend.get_title().get_text() == "share of tiles"


def test_block_states_figure_pools_large_grids_and_says_so():
    n = 1000
    st = torch.zeros(n, n, dtype=torch.int8)
    st[4, 5] = FULL  # one full tile in the 3x3 group (1, 1)
    st[998, 0] = PARTIAL  # in the last, ragged group
    fig = block_states_figure(st, block=64)
    (ax,) = fig.axes
    shown = torch.as_tensor(ax.get_images()[0].get_array())
    assert shown.shape == (334, 334)
    assert int(shown[1, 1]) == FULL and int(shown[332, 0]) == PARTIAL and int(shown.sum()) == 3
    assert "1 cell = 3x3 tiles of 64x64 tokens (the most computed shown)" in ax.get_title()
    assert ax.get_images()[0].get_extent() == [-0.5, 1001.5, 1001.5, -0.5]


def test_block_states_figure_rejects_other_tables():
    with pytest.raises(ValueError, match=r"int8 \[NQB, NKB\].*got torch.int64 with shape \(2, 2\)"):
        block_states_figure(torch.zeros(2, 2, dtype=torch.int64), block=64)
