import pytest
import torch
from sparse_kernels.attention import masked_attention_reference
from sparse_kernels.testing import assert_close_budget, kernel_dtypes
from sparse_patterns import (
    AShape,
    BlockSparse,
    Dense,
    Grid,
    HeadConfig,
    KBoundary,
    QBoundary,
    SFStrided,
    TokenLayout,
    TriShape,
    TwoDBoundary,
    VerticalSlash,
    mminference_attention,
    plan_layer,
)
from sparse_patterns.block_lists import static_block_mask, vertical_slash_block_mask
from sparse_patterns.metrics import recall_many
from sparse_patterns.testing import planted_boundary_qkv

ELEMENT = {
    "dense": lambda i, j, p: torch.ones_like(i - j, dtype=torch.bool),
    "a_shape": lambda i, j, p: (j < p["sink"]) | (i - j < p["window"]),
    "tri_shape": lambda i, j, p: (
        (j < p["sink"]) | (i - j < p["window"]) | (i >= p["S"] - p["last"])
    ),
    "sf_fixed": lambda i, j, p: (
        (i // p["local"] == j // p["local"]) | (j % p["vline_stride"] == p["vline_stride"] - 1)
    ),
    "sf_strided": lambda i, j, p: (i - j < p["local"]) | ((i - j) % p["vline_stride"] == 0),
}


def _reduce(em: torch.Tensor, blk: int) -> torch.Tensor:
    S = em.shape[-1]
    nb = -(-S // blk)
    pad = nb * blk - S
    em = torch.nn.functional.pad(em, (0, pad, 0, pad))
    return em.reshape(nb, blk, nb, blk).any(-1).any(1)


@pytest.mark.parametrize(
    "kind, params, S, blk",
    [
        pytest.param("dense", {}, 97, 16, id="dense-S97-b16"),
        pytest.param("a_shape", {"sink": 5, "window": 23}, 211, 16, id="ashape-S211-b16"),
        pytest.param("a_shape", {"sink": 0, "window": 1}, 130, 32, id="ashape-diag-only"),
        pytest.param(
            "tri_shape", {"sink": 7, "window": 40, "last": 19}, 203, 32, id="trishape-S203"
        ),
        pytest.param("sf_fixed", {"local": 24, "vline_stride": 24}, 187, 16, id="sffixed-S187"),
        pytest.param("sf_strided", {"local": 20, "vline_stride": 20}, 187, 16, id="sfstrided-S187"),
    ],
)
def test_static_block_mask_is_exact_block_rounding(kind, params, S, blk):
    t = {k: torch.tensor([v]) for k, v in params.items()} or {
        "n": torch.zeros(1, dtype=torch.int64)
    }
    nb = -(-S // blk)
    got = static_block_mask(kind, t, S, blk)(0, nb)[0]
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    em = ELEMENT[kind](i, j, {**params, "S": S}) & (j <= i)
    assert torch.equal(got, _reduce(em, blk))


def test_vertical_slash_block_mask_is_exact_block_rounding():
    S, blk = 301, 32
    vert = torch.tensor([[0, 1, 77, 200, 300, -1]])
    sl = torch.tensor([[0, 3, 64, 150, 299, -1]])
    got = vertical_slash_block_mask(vert, sl, S, blk)(0, -(-S // blk))[0]
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    em = torch.isin(j, vert[vert >= 0]) | torch.isin(i - j, sl[sl >= 0])
    em = em & (j <= i)
    assert torch.equal(got, _reduce(em, blk))


@pytest.mark.parametrize("S, blk", [(301, 32), (256, 64), (1000, 16), (70, 64)])
def test_vertical_slash_block_mask_random_chunks(S, blk):
    """Random columns and diagonals (with -1 padding) for several heads, built in chunks of
    query blocks: every chunk equals the block reduction of the element mask."""
    g = torch.Generator().manual_seed(S + blk)
    N = 3
    vert = torch.randint(-1, S, (N, 9), generator=g)
    sl = torch.randint(-1, S, (N, 7), generator=g)
    nb = -(-S // blk)
    fn = vertical_slash_block_mask(vert, sl, S, blk)
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    for n in range(N):
        v, o = vert[n][vert[n] >= 0], sl[n][sl[n] >= 0]
        em = (torch.isin(j, v) | torch.isin(i - j, o)) & (j <= i)
        want = _reduce(em, blk)
        for m0, m1 in ((0, nb), (0, 1), (nb // 2, nb), (max(0, nb - 1), nb)):
            assert torch.equal(fn(m0, m1)[n], want[m0:m1]), (n, m0, m1)


@pytest.mark.parametrize(
    "S, blk, nv, ns",
    [(301, 32, 9, 7), (256, 64, 9, 7), (1000, 16, 40, 30), (70, 64, 5, 5), (4096, 64, 0, 60),
     (2049, 16, 200, 3), (64, 64, 3, 3), (40, 64, 3, 3)],
)  # fmt: skip
def test_vertical_slash_lists_equal_the_block_mask_path(S, blk, nv, ns):
    """The rank-merged lists equal, entry for entry (indices, counts, width, zero padding), the
    lists compacted from the NQB x NKB block mask: random columns and diagonals with -1 padding,
    repeats, column blocks that coincide with diagonal blocks, partial last blocks."""
    from sparse_patterns.block_lists import lists_from_chunks, vertical_slash_lists

    g = torch.Generator().manual_seed(S * 7 + blk + nv)
    N = 4
    vert = torch.randint(-1, S, (N, max(nv, 1)), generator=g)
    if nv == 0:
        vert.fill_(-1)  # the exact-verticals planner's slash-only lists
    sl = torch.randint(-1, S, (N, ns), generator=g)
    sl[0, :2] = torch.tensor([0, 1])  # repeats of the same block distance
    sl[1] = torch.where(sl[1] >= 0, sl[1] % (4 * blk), -1)  # dense near the diagonal
    vert[2, : min(3, vert.shape[1])] = 0
    nb = -(-S // blk)
    want = lists_from_chunks(vertical_slash_block_mask(vert, sl, S, blk), N, nb, nb, "cpu")
    got = vertical_slash_lists(vert, sl, S, blk, path="lines")
    assert torch.equal(vertical_slash_lists(vert, sl, S, blk, path="mask")[0], want[0])
    assert torch.equal(got[1], want[1])
    assert torch.equal(got[0], want[0])


@pytest.mark.parametrize(
    "S, blk, sinks, windows",
    [(211, 16, [5, 0, 64, 300], [23, 1, 0, 18]), (4096, 64, [128, 64, 1, 0], [4096, 513, 66, 65]),
     (1000, 32, [7, 33, 1000, 2], [5000, 34, 32, 1]), (64, 64, [1, 0, 8, 70], [1, 5, 64, 0])],
)  # fmt: skip
def test_a_shape_lists_equal_the_block_mask_path(S, blk, sinks, windows):
    from sparse_patterns.block_lists import a_shape_lists, lists_from_chunks

    params = {"sink": torch.tensor(sinks), "window": torch.tensor(windows)}
    nb = -(-S // blk)
    fn = static_block_mask("a_shape", params, S, blk)
    want = lists_from_chunks(fn, len(sinks), nb, nb, "cpu")
    got = a_shape_lists(sinks, windows, S, blk, "cpu", path="lines")
    assert torch.equal(a_shape_lists(sinks, windows, S, blk, "cpu", path="mask")[0], want[0])
    assert torch.equal(got[1], want[1])
    assert torch.equal(got[0], want[0])


def test_a_shape_line_lists_width_without_a_read_back():
    """The line path's width is the longest count (the mask path's width), found on the host: a
    sweep of sinks and windows around the block edges, none read back."""
    from sparse_patterns.block_lists import a_shape_lists
    from sparse_patterns.testing import SyncRecorder

    for S, blk in [(256, 16), (250, 16), (64, 16)]:
        sinks = [0, 1, 15, 16, 17, 40, 250, 300]
        windows = [1, 2, 16, 17, 33, 100, 255, 400]
        for w in windows:
            want = a_shape_lists(sinks, [w] * len(sinks), S, blk, "cpu", path="mask")
            with SyncRecorder() as rec:
                got = a_shape_lists(sinks, [w] * len(sinks), S, blk, "cpu", path="lines")
            assert rec.events == []
            assert got[0].shape == want[0].shape, (S, blk, w)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_list_paths_auto_choice_and_bad_path():
    from sparse_patterns.block_lists import _use_lines, vertical_slash_lists

    assert _use_lines("auto", 2049, 16384) and not _use_lines("auto", 2049, 2048)
    assert _use_lines("lines", 10**6, 1) and not _use_lines("mask", 1, 10**6)
    with pytest.raises(ValueError, match="expected one of"):
        vertical_slash_lists(
            torch.zeros(1, 1, dtype=torch.long),
            torch.zeros(1, 1, dtype=torch.long),
            64,
            16,
            path="fast",
        )


def test_line_block_lists_chunked_rows_equal_one_chunk():
    """Several row chunks (a small element budget) give the same lists as one chunk."""
    import sparse_patterns.block_lists as P

    g = torch.Generator().manual_seed(5)
    S, blk = 3000, 16
    vert = torch.randint(-1, S, (3, 50), generator=g)
    sl = torch.randint(-1, S, (3, 40), generator=g)
    one = P.vertical_slash_lists(vert, sl, S, blk, path="lines")
    many = P.vertical_slash_lists(vert, sl, S, blk, path="lines", line_chunk_elems=3 * 140 * 7)
    assert torch.equal(one[0], many[0]) and torch.equal(one[1], many[1])
    with pytest.raises(ValueError, match="line_chunk_elems: expected a positive count, got 0"):
        P.vertical_slash_lists(vert, sl, S, blk, path="lines", line_chunk_elems=0)


def test_grid_plan_covers_the_grid_pattern():
    """Every (i, j) of the element Grid pattern (stride, phase found) is executed."""
    S, st, ph = 517, 12, 4
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 2, S, 32, generator=g), torch.randn(1, 1, S, 32, generator=g)
    plan = plan_layer(
        q, k, Grid(stride=st, use_hline=True, use_vline=True, use_slash=True), None, block=16
    )
    phase = plan.meta["phase"][0, 0].item()
    rows = torch.arange(S)
    m = plan.row_mask(rows)[0, 0]
    i, j = rows[:, None], rows[None, :]
    em = ((j - phase) % st == 0) | ((i - phase) % st == 0) | ((i - j) % st == 0)
    em = em & (j <= i)
    assert bool((m | ~em).all())
    assert torch.equal(plan.meta["stride"], torch.full((1, 2), st))
    del ph
    # The blocks inside one grid line are runs with step = stride; run() takes them from a run
    # list and the result is the same as with every block gathered.
    _, cnt, (_, run_cnt, step) = plan._launch_lists
    assert torch.equal(step, torch.full((1, 2), st)) and int(run_cnt.sum()) > 0
    assert torch.equal(cnt + run_cnt, plan.kv_block_counts)
    v = torch.randn(1, 1, S, 32, generator=g)
    out = plan.run(q, k, v, impl="reference")
    ref = masked_attention_reference(q, k, v, plan.row_mask(rows), scale=32**-0.5)
    torch.testing.assert_close(out.out, ref.out, rtol=1e-5, atol=1e-5)


HEADS = [
    HeadConfig(Grid()),
    HeadConfig(VerticalSlash(n_vertical=20, n_slash=20, last_q=32)),
    HeadConfig(AShape(sink=8, window=48), KBoundary()),
    HeadConfig(TriShape(sink=4, window=32, last=16)),
    HeadConfig(BlockSparse(top_k=3, block=32)),
    HeadConfig(SFStrided(local=24, vline_stride=24)),
    HeadConfig(VerticalSlash(n_vertical=16, n_slash=16, last_q=32), QBoundary()),
    HeadConfig(VerticalSlash(n_vertical=16, n_slash=16, last_q=32), TwoDBoundary(cross_vertical=8)),
]
LAYOUT_SPANS = [(0, 41), (2, 144), (0, 30), (2, 96), (0, 24)]  # S = 335


def _layer_inputs(seed: int, D: int):
    """The layout of ``LAYOUT_SPANS`` and seeded float32 q ``[1, 8, 335, D]``, k / v
    ``[1, 4, 335, D]`` (GQA 2)."""
    lay = TokenLayout.from_spans(LAYOUT_SPANS, tokens_per_frame=24)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 8, 335, D, generator=g)
    k = torch.randn(1, 4, 335, D, generator=g)
    v = torch.randn(1, 4, 335, D, generator=g)
    return lay, q, k, v


def test_layer_reference_equals_masked_attention_of_the_plan():
    """The whole layer (8 pattern/boundary groups, GQA) equals dense attention restricted to
    the plan's executed mask (float64)."""
    S = 335
    lay, q, k, v = _layer_inputs(seed=5, D=64)
    plan = plan_layer(q, k, HEADS, lay, block=32)
    out = mminference_attention(q, k, v, HEADS, lay, block=32, impl="reference")
    ref = masked_attention_reference(q, k, v, plan.row_mask(torch.arange(S)), scale=64**-0.5)
    torch.testing.assert_close(out.out, ref.out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.lse, ref.lse)
    assert plan.q_perm is not None and plan.kv_perm is not None
    # identity rows for heads that need no permutation
    ident = torch.arange(S, dtype=torch.int32)
    for h in (1, 2, 3, 4, 5):
        assert torch.equal(plan.q_perm[0, h], ident)
    # Q-boundary: rows in modality order; 2D: rows and columns in modality order
    morder = torch.sort(lay.modality, stable=True).indices.to(torch.int32)
    assert torch.equal(plan.q_perm[0, 6], morder) and torch.equal(plan.kv_perm[0, 6], ident)
    assert torch.equal(plan.q_perm[0, 7], morder) and torch.equal(plan.kv_perm[0, 7], morder)
    # run() launches the key blocks that are runs of consecutive keys from a run list: all of
    # them for identity key orders, some for the 2D head's modality order.
    idx, cnt, (starts, run_cnt, _) = plan._launch_lists
    for h in range(1, 7):
        assert int(cnt[0, h].sum()) == 0 and int(run_cnt[0, h].sum()) > 0
    assert int(cnt[0, 7].sum()) > 0 and int(run_cnt[0, 7].sum()) > 0
    assert torch.equal(cnt + run_cnt, plan.kv_block_counts)


@pytest.mark.parametrize("dtype", kernel_dtypes(), ids=str)
def test_layer_triton_within_error_budget(dtype):
    S = 335
    lay = TokenLayout.from_spans(LAYOUT_SPANS, tokens_per_frame=24)
    g = torch.Generator().manual_seed(6)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q = torch.randn(1, 8, S, 64, generator=g).to(dev, dtype)
    k = torch.randn(1, 4, S, 64, generator=g).to(dev, dtype)
    v = torch.randn(1, 4, S, 64, generator=g).to(dev, dtype)
    plan = plan_layer(q, k, HEADS, lay, block=32)
    out = plan.run(q, k, v, impl="triton")
    m = plan.row_mask(torch.arange(S, device=dev))
    gold = masked_attention_reference(q, k, v, m, scale=64**-0.5, compute_dtype=torch.float64)
    low = masked_attention_reference(q, k, v, m, scale=64**-0.5, compute_dtype=q.dtype)
    assert_close_budget(out.out, low.out, gold.out, dtype=dtype)


@pytest.mark.parametrize(
    "spans, blk",
    [
        # text and video interleaved, segments off the block edges, a partial last block
        pytest.param([(0, 60), (2, 256), (0, 40), (2, 200), (0, 61)], 32, id="tvtvt-b32"),
        # short segments: several runs per query block; three modalities
        pytest.param([(0, 7), (1, 30), (2, 9), (0, 13), (1, 50), (2, 71), (0, 33)], 16, id="3mod"),
        pytest.param([(2, 200), (0, 129)], 64, id="two-segments-b64"),
    ],
)
@pytest.mark.parametrize("boundary", [QBoundary(), TwoDBoundary(cross_vertical=3)], ids=["q", "2d"])
def test_boundary_block_level_lists_equal_the_element_path(spans, blk, boundary, monkeypatch):
    """Q- and 2D-Boundary heads of dense, A-shape, TriShape and Vertical-Slash patterns build
    their block lists from row runs at block level; indices, counts and permutations equal the
    element path's exactly (``boundary_lists="reference"``); one run per range batch too."""
    from sparse_patterns import MMInferencePlanner
    from sparse_patterns.planner import boundary as boundary_planner

    element_calls = []
    real = boundary_planner.lists_from_element_chunks
    monkeypatch.setattr(
        boundary_planner,
        "lists_from_element_chunks",
        lambda *a, **kw: element_calls.append(1) or real(*a, **kw),
    )

    q, k, _, lay = planted_boundary_qkv(spans)
    H = q.shape[1]
    pats = [
        Dense(),
        AShape(sink=5, window=23),
        AShape(sink=0, window=1),
        AShape(sink=40, window=70),
        TriShape(sink=7, window=40, last=19),
        TriShape(sink=3, window=9, last=300),
        VerticalSlash(n_vertical=8, n_slash=8, last_q=32, sink=1, local=4),
        VerticalSlash(n_vertical=30, n_slash=5, last_q=16),
    ]
    for i in range(0, len(pats), H):
        heads = [HeadConfig(p, boundary) for p in (pats[i : i + H] * H)[:H]]
        element_calls.clear()
        block = plan_layer(q, k, heads, lay, block=blk)
        assert element_calls == []
        element = MMInferencePlanner(block=blk, boundary_lists="reference").plan(q, k, heads, lay)
        assert element_calls  # the reference path ran
        assert torch.equal(block.kv_block_counts, element.kv_block_counts), heads
        assert torch.equal(block.kv_block_indices, element.kv_block_indices), heads
        # one run per batch of ranges
        batched = MMInferencePlanner(block=blk, boundary_chunk_elems=1).plan(q, k, heads, lay)
        assert torch.equal(batched.kv_block_indices, element.kv_block_indices), heads
        assert torch.equal(batched.kv_block_counts, element.kv_block_counts), heads
        assert torch.equal(block.q_perm, element.q_perm)
        if element.kv_perm is None:
            assert block.kv_perm is None
        else:
            assert torch.equal(block.kv_perm, element.kv_perm)


@pytest.mark.parametrize(
    "boundary",
    [
        pytest.param(QBoundary(), id="q-boundary"),
        pytest.param(TwoDBoundary(cross_vertical=4), id="2d-boundary"),
    ],
)
def test_boundary_heads_recover_per_modality_columns(boundary):
    """Quality: a planted Q-boundary head (text rows and video rows attend different columns;
    the last rows are text). No-Boundary VS, estimated from the last (text) queries, loses the
    video rows' columns; Q-/2D-Boundary VS estimate each modality from its own last queries and
    recall >= 0.95 of the attention mass."""
    q, k, v, lay = planted_boundary_qkv([(0, 60), (2, 256), (0, 40), (2, 200), (0, 61)])
    pat = VerticalSlash(n_vertical=8, n_slash=8, last_q=32, sink=1, local=4)
    plans = [plan_layer(q, k, HeadConfig(pat, b), lay, block=32) for b in (KBoundary(), boundary)]
    (m_none, _), (m_b, _) = recall_many(q, k, v, [p.row_mask for p in plans], scale=64**-0.5)
    assert float(m_b.min()) >= 0.95, m_b
    assert float(m_none.max()) < 0.9, m_none


@pytest.mark.parametrize(
    "head, layout, err, match",
    [
        pytest.param(
            HeadConfig(Grid(), TwoDBoundary()),
            True,
            NotImplementedError,
            "2D-Boundary with a Grid",
            id="grid-2dboundary",
        ),
        pytest.param(
            HeadConfig(BlockSparse(top_k=2), TwoDBoundary()),
            True,
            NotImplementedError,
            "2D-Boundary",
            id="bs-2d",
        ),
        pytest.param(
            HeadConfig(BlockSparse(top_k=2, block=16)),
            False,
            NotImplementedError,
            "block",
            id="bs-block",
        ),
        pytest.param(
            [HeadConfig(Dense())] * 3, False, ValueError, "expected 4 entries", id="head-count"
        ),
        pytest.param("dense", False, TypeError, "head_config", id="head-type"),
    ],
)
def test_errors(head, layout, err, match):
    q = torch.randn(1, 4, 100, 16)
    k = torch.randn(1, 2, 100, 16)
    lay = TokenLayout.from_spans([(0, 50), (1, 50)]) if layout else None
    with pytest.raises(err, match=match):
        plan_layer(q, k, head, lay, block=32)


def test_prefill_only_and_layout_length():
    q, k = torch.randn(1, 2, 10, 16), torch.randn(1, 2, 12, 16)
    with pytest.raises(NotImplementedError, match="S_Q == S_KV"):
        plan_layer(q, k, Dense())
    with pytest.raises(ValueError, match="expected 12 tokens"):
        plan_layer(k, k, Dense(), TokenLayout.text(11))


def test_plan_run_map_equals_kv_block_runs():
    """``plan_layer``'s ``kv_runs`` (identity, Grid, 2D- and Q-Boundary heads in one layer)
    equals ``kv_block_runs`` of the plan's key order with each head's step, and run() splits
    with it exactly as with runs found from ``kv_perm`` (same lists, same output)."""
    import dataclasses

    from sparse_kernels.permuted import kv_block_runs

    lay, q, k, v = _layer_inputs(seed=9, D=32)
    heads = [HeadConfig(Grid(stride=8))] + HEADS[1:]
    plan = plan_layer(q, k, heads, lay, block=32)
    runs, step = plan.kv_runs
    assert isinstance(step, torch.Tensor) and int(step[0, 0]) == 8
    assert torch.equal(step[0, 1:], torch.ones(7, dtype=torch.int64))
    assert torch.equal(runs, kv_block_runs(plan.kv_perm, 32, step))
    assert int((runs[0, 7] < 0).sum()) > 0  # the 2D head's modality order crosses segment ends
    found = dataclasses.replace(plan, kv_runs=None)
    a, b = plan._launch_lists, found._launch_lists
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert torch.equal(a[2][0], b[2][0]) and torch.equal(a[2][1], b[2][1])
    assert torch.equal(a[2][2], b[2][2])
    out_a = plan.run(q, k, v, impl="reference")
    out_b = found.run(q, k, v, impl="reference")
    assert torch.equal(out_a.out, out_b.out)
    # Without Grid heads the step is the int 1, which the kernel compiles in.
    no_grid = plan_layer(q, k, HEADS[1:2] + HEADS[1:], lay, block=32)
    assert no_grid.kv_runs[1] == 1
    assert torch.equal(no_grid.kv_runs[0], kv_block_runs(no_grid.kv_perm, 32))


@pytest.mark.gpu
@pytest.mark.parametrize("block", [64, 128], ids=lambda b: f"block{b}")
def test_layer_gpu_bf16_real_head_shape(block):
    """Qwen2.5-VL head shape (H=28, H_KV=4, D=128), bf16, S=8195, every pattern and boundary
    kind in one layer; sampled rows against the float64 masked reference with an error budget."""
    S = 8195
    spans = [(0, 700), (2, 3000), (0, 495), (2, 3500), (0, 500)]
    lay = TokenLayout.from_spans(spans, tokens_per_frame=256, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn(1, 28, S, 128, device="cuda", generator=g).bfloat16()
    k = torch.randn(1, 4, S, 128, device="cuda", generator=g).bfloat16()
    v = torch.randn(1, 4, S, 128, device="cuda", generator=g).bfloat16()
    heads = (
        [
            HeadConfig(Grid()),
            HeadConfig(VerticalSlash(n_vertical=500, n_slash=500)),
            HeadConfig(AShape(sink=128, window=1024)),
            HeadConfig(TriShape(sink=128, window=1024, last=128)),
            HeadConfig(BlockSparse(top_k=8, block=block)),
            HeadConfig(SFStrided(local=256, vline_stride=256)),
            HeadConfig(VerticalSlash(n_vertical=300, n_slash=300), QBoundary()),
            HeadConfig(
                VerticalSlash(n_vertical=300, n_slash=300), TwoDBoundary(cross_vertical=128)
            ),
        ]
        * 3
        + [HeadConfig(Dense())] * 2
        + [HeadConfig(Grid(), QBoundary())] * 2
    )
    plan = plan_layer(q, k, heads, lay, block=block)
    out = plan.run(q, k, v, impl="triton")
    rows = torch.cat(
        [torch.arange(0, S, 97, device="cuda"), torch.arange(S - 64, S, device="cuda")]
    )
    m = plan.row_mask(rows)
    gold = masked_attention_reference(
        q[:, :, rows], k, v, m, scale=128**-0.5, compute_dtype=torch.float64
    )
    low = masked_attention_reference(q[:, :, rows], k, v, m, scale=128**-0.5, compute_dtype=q.dtype)
    assert_close_budget(out.out[:, :, rows], low.out, gold.out, dtype=torch.bfloat16)


def test_modality_index_layout_is_accepted_and_matches_token_layout():
    """``modality_index.ModalityLayout`` gives the same plan as the equivalent TokenLayout, and
    the Q-boundary row order equals its ``perm``."""
    from modality_index import ModalityLayout

    spans = [(0, 41), (2, 144, 24), (0, 30), (2, 96, 24), (0, 24)]
    ml = ModalityLayout.from_spans(spans)
    tl = TokenLayout.from_spans([(m, n) for m, n, *_ in spans], tokens_per_frame=24)
    g = torch.Generator().manual_seed(9)
    q, k = torch.randn(1, 8, 335, 64, generator=g), torch.randn(1, 4, 335, 64, generator=g)
    a = plan_layer(q, k, HEADS, ml, block=32)
    b = plan_layer(q, k, HEADS, tl, block=32)
    assert torch.equal(a.kv_block_indices, b.kv_block_indices)
    assert torch.equal(a.kv_block_counts, b.kv_block_counts)
    assert torch.equal(a.meta["stride"], b.meta["stride"])
    assert torch.equal(a.q_perm[0, 6].long(), ml.perm)


def _block_mask_case(dev):
    S = 200
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, S, 64, generator=g).to(dev)
    k = torch.randn(1, 2, S, 64, generator=g).to(dev)
    v = torch.randn(1, 2, S, 64, generator=g).to(dev)
    heads = [
        HeadConfig(VerticalSlash(n_vertical=10, n_slash=10, last_q=16)),
        HeadConfig(AShape(4, 40)),
    ] * 2
    return q, k, v, plan_layer(q, k, heads, None, block=32)


def test_to_block_mask_lists_the_plan_blocks():
    q, k, v, plan = _block_mask_case("cpu")
    S = q.shape[2]
    dense = plan.to_block_mask().to_dense()[..., :7, :7].bool()  # [B, H, NQB, NKB]
    valid = torch.arange(plan.kv_block_indices.shape[-1]) < plan.kv_block_counts[..., None]
    want = torch.zeros(1, 4, 7, 8, dtype=torch.bool)
    want.scatter_(-1, torch.where(valid, plan.kv_block_indices.long(), 7), True)
    assert torch.equal(dense, want[..., :7])
    grid = plan_layer(q, k, Grid(stride=8), None, block=32)
    with pytest.raises(NotImplementedError, match="q_perm"):
        grid.to_block_mask()
    del S


def test_to_block_mask_flex_attention_eager_equals_the_plan():
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v, plan = _block_mask_case("cpu")
    out = flex_attention(q, k, v, block_mask=plan.to_block_mask(), enable_gqa=True)
    want = plan.run(q, k, v, impl="reference").out
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_to_block_mask_flex_attention_equals_the_plan():
    from sparse_kernels.testing import flex_attention_compiled

    q, k, v, plan = _block_mask_case("cuda")
    out = flex_attention_compiled(q, k, v, plan.to_block_mask())
    want = plan.run(q, k, v, impl="reference").out
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


def test_one_kernel_launch_per_layer(monkeypatch):
    """Eight pattern/boundary groups over eight heads: exactly one kernel call for the layer."""
    import sparse_kernels

    calls = []
    real = sparse_kernels.permuted_block_sparse_attention

    def counting(q, k, v, plan, **kw):
        calls.append(plan.kv_indices.shape)
        return real(q, k, v, plan, **kw)

    monkeypatch.setattr(sparse_kernels, "permuted_block_sparse_attention", counting)
    S = 335
    lay = TokenLayout.from_spans(LAYOUT_SPANS, tokens_per_frame=24)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 8, S, 64, generator=g)
    k = torch.randn(1, 4, S, 64, generator=g)
    v = torch.randn(1, 4, S, 64, generator=g)
    mminference_attention(q, k, v, HEADS, lay, block=32)
    assert len(calls) == 1 and calls[0][:3] == (1, 8, 11)


def test_two_d_boundary_static_pattern_in_modality_coordinates():
    """2D-Boundary Tri-shape: same-modality pairs use ranks inside the modality (window and the
    dense last rows of EACH modality); cross pairs only the estimated top columns (here 0)."""
    spans = [(0, 40), (2, 64), (0, 40), (2, 64)]
    lay = TokenLayout.from_spans(spans)
    S = 208
    g = torch.Generator().manual_seed(12)
    q, k = torch.randn(1, 1, S, 16, generator=g), torch.randn(1, 1, S, 16, generator=g)
    pat = TriShape(sink=2, window=5, last=3)
    plan = plan_layer(q, k, HeadConfig(pat, TwoDBoundary(cross_vertical=0)), lay, block=1)
    m = plan.row_mask(torch.arange(S))[0, 0]
    mod = lay.modality
    rank = torch.zeros(S, dtype=torch.long)
    for val in (0, 2):
        idx = torch.nonzero(mod == val).flatten()
        rank[idx] = torch.arange(idx.numel())
    n = torch.bincount(mod)[mod]
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    ri, rj = rank[:, None], rank[None, :]
    want = (
        (mod[:, None] == mod[None, :])
        & ((rj < 2) | (ri - rj < 5) | (ri >= n[:, None] - 3))
        & (j <= i)
    )
    assert torch.equal(m, want)


def test_q_boundary_grid_per_modality_stride_and_phase():
    """Quality: text rows attend a vertical grid (stride 24, phase 3), video rows another
    (stride 16, phase 5); the last rows are text. No-Boundary Grid (one stride from the last
    rows) loses the video rows; Q-Boundary Grid finds each modality's grid: mass recall >= 0.95,
    and its output equals dense attention under its executed mask."""
    lay = TokenLayout.from_spans(
        [(0, 100), (2, 500), (0, 131), (2, 300), (0, 96)], tokens_per_frame=48
    )
    S = lay.modality.numel()
    g = torch.Generator().manual_seed(21)
    D = 64
    q = torch.randn(1, 2, S, D, generator=g) * 0.3
    k = torch.randn(1, 1, S, D, generator=g) * 0.3
    v = torch.randn(1, 1, S, D, generator=g)
    amp = (10.0 * D**0.5) ** 0.5
    i = torch.arange(S)
    text = lay.modality == 0
    q[..., text, 1] += amp
    q[..., ~text, 0] += amp
    k[..., (i - 5) % 16 == 0, 0] += amp
    k[..., (i - 3) % 24 == 0, 1] += amp
    pat = Grid(use_vline=True, use_slash=False)
    plans = [
        plan_layer(q, k, HeadConfig(pat, b), lay, block=32) for b in (KBoundary(), QBoundary())
    ]
    (m_none, _), (m_q, _) = recall_many(q, k, v, [p.row_mask for p in plans], scale=D**-0.5)
    assert float(m_q.min()) >= 0.95, m_q
    assert float(m_none.max()) < 0.9, m_none
    qb = plans[1]
    assert torch.equal(qb.meta["stride"], torch.full((1, 2), 16))  # the video grid owns the columns
    assert torch.equal(qb.meta["phase"], torch.full((1, 2), 5))
    out = qb.run(q, k, v, impl="reference")
    ref = masked_attention_reference(q, k, v, qb.row_mask(i), scale=D**-0.5)
    torch.testing.assert_close(out.out, ref.out, rtol=1e-5, atol=1e-5)


def _triton_available() -> bool:
    import os

    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _six_head_inputs(impl: str, seed: int):
    """``(device, q [2, 6, 300, 32], k, v [2, 2, 300, 32])``, seeded; skips the Triton case
    where it cannot run."""
    if impl == "triton" and not _triton_available():
        pytest.skip("needs a GPU or TRITON_INTERPRET=1")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, h, 300, 32, generator=g).to(dev) for h in (6, 2, 2))
    return dev, q, k, v


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_exact_vertical_heads_run_the_minference_set(impl):
    """VerticalSlash(exact_verticals=True) heads: grouped by their counts into their own
    launches, their executed set is exactly sparse_kernels' vertical-slash set (columns not
    rounded), the rest of the layer is unchanged, and the output is attention over row_mask."""
    from sparse_kernels.vertical_slash import vertical_slash_mask

    dev, q, k, v = _six_head_inputs(impl, seed=4)
    B, H, S, D = q.shape
    ex = VerticalSlash(n_vertical=10, n_slash=8, exact_verticals=True)
    cfgs = [
        HeadConfig(ex),
        HeadConfig(AShape(sink=4, window=64)),
        HeadConfig(ex),
        HeadConfig(VerticalSlash(n_vertical=5, n_slash=8, exact_verticals=True)),
        HeadConfig(VerticalSlash(n_vertical=10, n_slash=8)),
        HeadConfig(ex),
    ]
    plan = plan_layer(q, k, cfgs, None, block=64)
    assert sorted(p.heads for p in plan.exact_vertical) == [(0, 2, 5), (3,)]
    rows = torch.arange(S, device=dev)
    mask = plan.row_mask(rows)
    for part in plan.exact_vertical:
        want = vertical_slash_mask(part.vertical, part.slash, S, block_m=64, block_n=64)
        assert torch.equal(mask[:, list(part.heads)], want.bool())
    # The block-rounded head 4 and the A-shape head 1 are the same as in a plan without them.
    alone = plan_layer(q, k, [cfgs[1], cfgs[4]] * 3, None, block=64)
    assert torch.equal(mask[:, [1, 4]], alone.row_mask(rows)[:, [0, 1]])
    out = plan.run(q, k, v, impl=impl)
    gold = masked_attention_reference(q, k, v, mask, scale=D**-0.5, compute_dtype=torch.float64)
    low = masked_attention_reference(q, k, v, mask, scale=D**-0.5, compute_dtype=q.dtype)
    assert_close_budget(out.out, low.out, gold.out, dtype=torch.float32)
    with pytest.raises(NotImplementedError, match="exact_verticals"):
        plan.to_block_mask()
    # Execution-only plan: no slash-tile lists for the exact heads, the same output bit for bit,
    # the other heads' lists unchanged, and the metrics refuse.
    lean = plan_layer(q, k, cfgs, None, block=64, exact_vertical_lists=False)
    exact_heads = [h for p in plan.exact_vertical for h in p.heads]
    assert int(lean.kv_block_counts[:, exact_heads].sum()) == 0
    assert int(plan.kv_block_counts[:, exact_heads].sum()) > 0
    w = lean.kv_block_indices.shape[-1]
    assert torch.equal(lean.kv_block_counts[:, [1, 4]], plan.kv_block_counts[:, [1, 4]])
    assert torch.equal(lean.kv_block_indices[:, [1, 4]], plan.kv_block_indices[:, [1, 4], :, :w])
    assert torch.equal(lean.run(q, k, v, impl=impl).out, out.out)
    for metric in (lambda p: p.computed_blocks, lambda p: p.density(), lambda p: p.row_mask(rows)):
        with pytest.raises(ValueError, match="exact_vertical_lists=False"):
            metric(lean)


def test_exact_vertical_heads_need_block_64_or_128():
    q, k = torch.randn(1, 2, 100, 16), torch.randn(1, 1, 100, 16)
    with pytest.raises(ValueError, match="block 64 or 128"):
        plan_layer(
            q, k, VerticalSlash(n_vertical=4, n_slash=4, exact_verticals=True), None, block=32
        )


def test_exact_vertical_heads_reject_q_boundary():
    from sparse_patterns import QBoundary

    q, k = torch.randn(1, 2, 128, 16), torch.randn(1, 1, 128, 16)
    hc = HeadConfig(VerticalSlash(n_vertical=4, n_slash=4, exact_verticals=True), QBoundary())
    with pytest.raises(NotImplementedError, match="QBoundary"):
        plan_layer(q, k, hc, None, block=64)


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_exact_a_shape_heads_run_the_triangle_set(impl):
    """AShape(exact=True) heads: grouped by (sink, window) into triangle_attention launches, their
    executed set is exactly sink + window + causal (no block rounding), the other heads are as
    in a plan without them, and the output is attention over row_mask."""
    dev, q, k, v = _six_head_inputs(impl, seed=6)
    B, H, S, D = q.shape
    ex = AShape(sink=5, window=70, exact=True)
    cfgs = [
        HeadConfig(ex),
        HeadConfig(VerticalSlash(n_vertical=10, n_slash=8)),
        HeadConfig(ex),
        HeadConfig(AShape(sink=0, window=33, exact=True)),
        HeadConfig(AShape(sink=5, window=70)),
        HeadConfig(ex),
    ]
    plan = plan_layer(q, k, cfgs, None, block=64)
    assert sorted((p.heads, p.sink, p.window) for p in plan.exact_a_shape) == [
        ((0, 2, 5), 5, 70),
        ((3,), 0, 33),
    ]
    rows = torch.arange(S, device=dev)
    mask = plan.row_mask(rows)
    i, j = rows[:, None], rows[None, :]
    for part in plan.exact_a_shape:
        want = (j <= i) & ((j < part.sink) | (i - j < part.window))
        assert torch.equal(mask[:, list(part.heads)], want.expand(B, len(part.heads), S, S))
    # The block-rounded A-shape head 4 is a strict superset of the exact head 0's set.
    assert bool((mask[:, 4] >= mask[:, 0]).all()) and bool((mask[:, 4] > mask[:, 0]).any())
    alone = plan_layer(q[:, [1, 4]], k, [cfgs[1], cfgs[4]], None, block=64)  # same KV heads
    assert torch.equal(mask[:, [1, 4]], alone.row_mask(rows))
    out = plan.run(q, k, v, impl=impl)
    gold = masked_attention_reference(q, k, v, mask, scale=D**-0.5, compute_dtype=torch.float64)
    low = masked_attention_reference(q, k, v, mask, scale=D**-0.5, compute_dtype=q.dtype)
    assert_close_budget(out.out, low.out, gold.out, dtype=torch.float32)
    with pytest.raises(NotImplementedError, match="exact=True"):
        plan.to_block_mask()
    lean = plan_layer(q, k, cfgs, None, block=64, exact_vertical_lists=False)
    exact_heads = [h for p in plan.exact_a_shape for h in p.heads]
    assert int(lean.kv_block_counts[:, exact_heads].sum()) == 0
    assert torch.equal(lean.run(q, k, v, impl=impl).out, out.out)
    with pytest.raises(ValueError, match="exact_vertical_lists=False"):
        lean.row_mask(rows)
    # A layer of exact heads only: no block-sparse launch, every row written.
    only = plan_layer(q, k, [cfgs[0], cfgs[3]] * 3, None, block=64, exact_vertical_lists=False)
    got = only.run(q, k, v, impl=impl)
    # heads 0, 2 (sink 5, window 70) and 3 (sink 0, window 33) are configured as in ``plan``
    torch.testing.assert_close(got.out[:, [0, 2, 3]], out.out[:, [0, 2, 3]])
    assert torch.isfinite(got.out).all() and torch.isfinite(got.lse).all()


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_all_heads_one_exact_a_shape_is_one_triangle_launch(impl, monkeypatch):
    """Every head the same exact A-shape (what the search gives on near-uniform attention): the
    layer's output is the one triangle_attention call's, not copied head by head into a buffer."""
    import sparse_kernels

    dev, q, k, v = _six_head_inputs(impl, seed=7)
    plan = plan_layer(q, k, [HeadConfig(AShape(sink=5, window=70, exact=True))] * q.shape[1],
                      None, block=64, exact_vertical_lists=False)  # fmt: skip
    calls = []
    real = sparse_kernels.triangle_attention

    def spy(*a, **kw):
        calls.append(kw)
        res = real(*a, **kw)
        calls[-1]["res"] = res
        return res

    monkeypatch.setattr(sparse_kernels, "triangle_attention", spy)
    got = plan.run(q, k, v, impl=impl)
    assert len(calls) == 1 and calls[0]["res"] is got
    assert (calls[0]["sink"], calls[0]["window"], calls[0]["last"]) == (5, 70, 0)
    want = real(q, k, v, sink=5, window=70, last=0, impl=impl)
    assert torch.equal(got.out, want.out) and torch.equal(got.lse, want.lse)


def test_exact_a_shape_heads_reject_boundaries():
    from sparse_patterns import QBoundary

    q, k = torch.randn(1, 2, 128, 16), torch.randn(1, 1, 128, 16)
    hc = HeadConfig(AShape(sink=4, window=32, exact=True), QBoundary())
    with pytest.raises(NotImplementedError, match="exact=False"):
        plan_layer(q, k, hc, None, block=64)
    with pytest.raises(TypeError, match="AShape.exact: expected a bool"):
        AShape(exact=1)


def _spy_estimation_kernels(monkeypatch) -> list:
    """``(name, impl)`` of every call of sparse_kernels' line-score and line-fold ops."""
    import sparse_kernels

    calls = []
    for name in ("line_scores", "line_folds"):
        real = getattr(sparse_kernels, name)
        monkeypatch.setattr(
            sparse_kernels,
            name,
            lambda *a, _r=real, _n=name, **kw: calls.append((_n, kw.get("impl"))) or _r(*a, **kw),
        )
    return calls


def test_planner_impl_selects_the_estimation_engine(monkeypatch):
    """``impl="triton"`` estimates with the Triton line-score kernel even where ``"auto"`` picks
    PyTorch (the CPU, under the interpreter); ``impl="reference"`` runs none of them; the
    plans agree on every head whose estimate is a sort of exactly-tied sums only (the static
    ones, and the permutations). On a GPU machine the inputs are on the GPU (Triton there
    runs no CPU tensors)."""
    from sparse_patterns import MMInferencePlanner

    lay, q, k, _ = _layer_inputs(seed=9, D=32)
    if torch.cuda.is_available():
        q, k = q.cuda(), k.cuda()
        lay = TokenLayout(lay.modality.cuda(), tokens_per_frame=lay.tokens_per_frame)
    calls = _spy_estimation_kernels(monkeypatch)
    tri = MMInferencePlanner(block=32, impl="triton").plan(q, k, HEADS, lay)
    assert calls and all(impl == "triton" for _, impl in calls), calls
    n = len(calls)
    calls.clear()
    # the functions plan with the planner they are given
    planner = MMInferencePlanner(block=32, impl="triton")
    tri2 = plan_layer(q, k, HEADS, lay, planner=planner)
    assert len(calls) == n and all(impl == "triton" for _, impl in calls), calls
    assert torch.equal(tri2.kv_block_indices, tri.kv_block_indices)
    calls.clear()
    ref = MMInferencePlanner(block=32, impl="reference").plan(q, k, HEADS, lay)
    assert calls == []
    for h in (2, 3, 5):  # AShape, TriShape, SFStrided
        assert torch.equal(tri.kv_block_counts[:, h], ref.kv_block_counts[:, h])
    assert torch.equal(tri.q_perm[:, 6:], ref.q_perm[:, 6:])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_planner_reference_runs_no_triton_estimation_on_cuda(monkeypatch):
    """On CUDA ``impl="reference"`` estimates in PyTorch (``"auto"`` there runs Triton)."""
    from sparse_patterns import MMInferencePlanner

    lay, q, k, v = _layer_inputs(seed=10, D=64)
    q, k, v = (t.cuda() for t in (q, k, v))
    lay = TokenLayout(lay.modality.cuda(), tokens_per_frame=lay.tokens_per_frame)
    calls = _spy_estimation_kernels(monkeypatch)
    MMInferencePlanner(block=32).attention(q, k, v, HEADS, lay)
    assert calls  # "auto" on CUDA: the Triton line scores
    calls.clear()
    out = MMInferencePlanner(block=32, impl="reference").attention(q, k, v, HEADS, lay)
    assert calls == [] and torch.isfinite(out.out).all()


def test_a_held_planner_plans_like_the_function():
    """One planner across calls (layers) gives each call the plan ``plan_layer`` gives."""
    from sparse_patterns import MMInferencePlanner

    planner = MMInferencePlanner(block=32)
    for seed in (11, 12):
        lay, q, k, _ = _layer_inputs(seed=seed, D=32)
        a, b = planner.plan(q, k, HEADS, lay), plan_layer(q, k, HEADS, lay, block=32)
        assert torch.equal(a.kv_block_indices, b.kv_block_indices)
        assert torch.equal(a.kv_block_counts, b.kv_block_counts)
        assert torch.equal(a.q_perm, b.q_perm) and torch.equal(a.kv_perm, b.kv_perm)


@pytest.mark.parametrize("boundary", [QBoundary(), TwoDBoundary(cross_vertical=3)], ids=["q", "2d"])
def test_boundary_heads_take_the_layouts_permutation(boundary, monkeypatch):
    """Boundary heads order rows (and 2D keys) by the layout's own permutation to modality
    order (``TokenLayoutLike.perm`` / ``inv_perm``, as ``modality_index.ModalityLayout``
    carries them): the plan sorts nothing, and equals the plan of the ``TokenLayout``."""
    from types import SimpleNamespace

    q, k, _, lay = planted_boundary_qkv([(0, 40), (2, 150), (0, 30), (2, 70)])
    heads = [HeadConfig(p, boundary) for p in (AShape(sink=4, window=24), Dense())]
    heads = (heads * q.shape[1])[: q.shape[1]]
    want = plan_layer(q, k, heads, lay, block=32)
    like = SimpleNamespace(
        modality=lay.modality, tokens_per_frame=lay.tokens_per_frame, perm=lay.perm,
        inv_perm=lay.inv_perm,
    )  # fmt: skip
    sorts = []
    real = torch.sort
    monkeypatch.setattr(torch, "sort", lambda *a, **kw: sorts.append(1) or real(*a, **kw))
    got = plan_layer(q, k, heads, like, block=32)
    assert sorts == []
    assert torch.equal(got.q_perm, want.q_perm)
    assert torch.equal(got.kv_block_indices, want.kv_block_indices)
    assert torch.equal(got.kv_block_counts, want.kv_block_counts)
