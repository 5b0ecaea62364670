"""A layer's plan (``MMInferencePlanner.plan``) without host-device synchronisations: recorded
on the CPU by :class:`~sparse_patterns.testing.SyncRecorder`, counted on CUDA by the sync debug
mode.

The only reads left are ``sparse_kernels.permuted.perms.host_ints``: the widths of block lists,
sizes of outputs that depend on the data (a Grid layer without horizontal lines reads one: the
widths of its candidate ranges, which are also its lists' width; block-mask planners one per chunk
of query blocks)."""

import os
import warnings

import pytest
import torch
from sparse_patterns import (
    AShape,
    Grid,
    HeadConfig,
    MMInferencePlanner,
    TokenLayout,
    VerticalSlash,
)
from sparse_patterns.testing import SyncRecorder

GRID = Grid(use_hline=False, use_vline=True, use_slash=True)


def _qk(S: int, H: int = 4, H_KV: int = 2, D: int = 32, device="cpu"):
    g = torch.Generator().manual_seed(S)
    q = torch.randn(1, H, S, D, generator=g)
    k = torch.randn(1, H_KV, S, D, generator=g)
    return q.to(device), k.to(device)


def _syncs(fn) -> tuple[list, list]:
    """(unexpected events, host_ints reads) of one call of ``fn``."""
    with SyncRecorder() as rec:
        fn()
    reads = [e for e in rec.events if "(host_ints)" in e[1]]
    return [e for e in rec.events if "(host_ints)" not in e[1]], reads


@pytest.mark.parametrize(
    "heads, tpf, n_reads",
    [
        pytest.param([GRID] * 4, 16, 1, id="grid-searched-tpf16"),
        pytest.param([GRID] * 4, None, 1, id="grid-searched-no-layout"),
        pytest.param([Grid(stride=7)] * 4, None, 1, id="grid-fixed-stride"),
        pytest.param(
            [Grid(stride=5), GRID, Grid(max_stride=12, use_vline=False), Grid(use_slash=False)],
            16,
            1,
            id="grid-mixed-stride-spaces",
        ),
        pytest.param([Grid(use_hline=True)] * 4, 16, 1, id="grid-hline-one-chunk"),
        pytest.param([VerticalSlash(n_vertical=40, n_slash=60)] * 4, 16, 1, id="vs-one-chunk"),
        pytest.param([AShape(sink=16, window=64)] * 4, None, 0, id="ashape-lines-host-width"),
        pytest.param([AShape()] * 4, None, 1, id="ashape-mask-one-chunk"),
        pytest.param(
            [GRID, VerticalSlash(n_vertical=40, n_slash=60), GRID, AShape()],
            16,
            3,
            id="grid-vs-ashape-mixed-heads",
        ),
    ],
)
def test_plan_layer_reads_back_only_list_widths(heads, tpf, n_reads):
    """At most one read per group of heads, of its lists' width; none for A-shape heads on the
    line path (their width is known on the host). ``AShape()`` at 17 blocks takes the mask
    path."""
    torch.manual_seed(0)
    S = 1025
    q, k = _qk(S)
    lay = TokenLayout(torch.full((S,), 2), tokens_per_frame=tpf) if tpf else None
    cfgs = [HeadConfig(h) for h in heads]
    planner = MMInferencePlanner(block=64)
    planner.plan(q, k, cfgs, lay)  # warm the caches (fold matrices, the lists width)
    unexpected, reads = _syncs(lambda: planner.plan(q, k, cfgs, lay))
    assert unexpected == []
    assert len(reads) == n_reads


def test_unfused_grid_plan_leaves_its_read_to_the_lists_call():
    """The unfused Grid planner queues its search, permutation, runs and list ranges without a
    read; ``GroupPlan.lists``, which the layer calls after its other groups, reads the width."""
    from sparse_patterns.planner.context import LayerContext
    from sparse_patterns.planner.grid import GridHeads

    S = 1025
    q, k = _qk(S)
    lay = TokenLayout(torch.full((S,), 2), tokens_per_frame=16)
    grid = GridHeads(fused="off")
    cfgs = [HeadConfig(GRID)] * 4

    def plan():  # a fresh layer each time, as the planner makes one per layer
        return grid.plan(LayerContext(q, k, lay, 64, 32**-0.5), [0, 1, 2, 3], cfgs)

    plan()  # warm the caches (fold matrices)
    unexpected, reads = _syncs(plan)
    assert unexpected == [] and reads == []
    g = plan()
    got = {}
    unexpected, reads = _syncs(lambda: got.update(lists=g.lists()))
    assert unexpected == [] and len(reads) == 1
    idx, cnt, split = got["lists"]
    assert split is None and idx.shape[:2] == cnt.shape == (4, 17)


@pytest.mark.parametrize(
    "exact_lists, n_reads",
    [pytest.param(True, 2, id="with-lists"), pytest.param(False, 1, id="execution-only")],
)
def test_exact_vertical_slash_heads_read_back_only_list_widths(exact_lists, n_reads):
    """Exact Vertical-Slash heads keep every selected column and diagonal, so their counts
    (which group them into launches) come from the configs, not from the device. Here two
    count groups, one of them not consecutive, beside a Grid head; without the exact heads'
    block lists only the Grid's width is read."""
    torch.manual_seed(0)
    S = 1025
    q, k = _qk(S)
    lay = TokenLayout(torch.full((S,), 2), tokens_per_frame=16)
    vs = [VerticalSlash(n_vertical=n, n_slash=60, exact_verticals=True) for n in (40, 24, 40)]
    cfgs = [HeadConfig(h) for h in (vs[0], vs[1], GRID, vs[2])]
    planner = MMInferencePlanner(block=64)
    plan = planner.plan(q, k, cfgs, lay, exact_vertical_lists=exact_lists)
    assert sorted(e.heads for e in plan.exact_vertical) == [(0, 3), (1,)]
    assert {e.heads: e.vertical.shape[-1] for e in plan.exact_vertical} == {(0, 3): 40, (1,): 24}
    unexpected, reads = _syncs(
        lambda: planner.plan(q, k, cfgs, lay, exact_vertical_lists=exact_lists)
    )
    assert unexpected == []
    assert len(reads) == n_reads


def test_exact_vertical_slash_counts_are_clipped_to_the_length():
    """Counts larger than the sequence, and none at all: each head's widths are its config's
    clipped to ``S``, every listed index a real key or offset, with nothing read back."""
    torch.manual_seed(0)
    S = 40
    q, k = _qk(S)
    cfgs = [
        HeadConfig(VerticalSlash(n_vertical=n, n_slash=m, last_q=8, exact_verticals=True))
        for n, m in ((100, 8), (0, 60), (100, 8), (5, 3))
    ]
    planner = MMInferencePlanner(block=64)
    plan = planner.plan(q, k, cfgs, None, exact_vertical_lists=False)
    widths = {e.heads: (e.vertical.shape[-1], e.slash.shape[-1]) for e in plan.exact_vertical}
    assert widths == {(0, 2): (40, 8), (1,): (0, 40), (3,): (5, 3)}
    for e in plan.exact_vertical:
        assert bool(((e.vertical >= 0) & (e.vertical < S)).all())
        assert bool(((e.slash >= 0) & (e.slash < S)).all())
    unexpected, reads = _syncs(lambda: planner.plan(q, k, cfgs, None, exact_vertical_lists=False))
    assert unexpected == [] and reads == []


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
    reason="the Triton lists kernel on CPU needs TRITON_INTERPRET=1",
)
def test_grid_lists_kernel_reads_back_only_its_widths():
    """The unfused Grid path (Grid heads beside other kinds) builds its lists with the Triton
    kernel on CUDA: one read of the candidate widths, and the widths go back without a wait."""
    from sparse_kernels.grid_index import grid_lists
    from sparse_kernels.permuted import grid_line_offsets, grid_permutation

    S, blk = 517, 16
    st, ph = torch.tensor([12, 12]), torch.tensor([4, 9])
    perm, _ = grid_permutation(S, st, ph)
    offs = grid_line_offsets(S, st, ph)
    yes = torch.tensor([True, True])
    unexpected, reads = _syncs(lambda: grid_lists(perm, offs, yes, yes, S, blk, impl="triton"))
    assert unexpected == []
    assert len(reads) == 1


def _set_heads(x: torch.Tensor, hs: list[int]) -> None:
    x[hs] = 0


def test_sync_recorder_sees_each_kind_of_sync():
    """The recorder must be able to fail: one case of every operation it looks for."""
    torch.manual_seed(0)
    x = torch.arange(6)
    cases = {
        "item": lambda: x.sum().item(),
        "int": lambda: int(x.max()),
        "bool": lambda: bool((x > 2).any()),
        "range": lambda: range(x[2]),
        "tolist": lambda: x.tolist(),
        "cpu": lambda: x.cpu(),
        "nonzero": lambda: torch.nonzero(x),
        "unique": lambda: torch.unique(x),
        "masked_select": lambda: x.masked_select(x > 2),
        "bool-index": lambda: x[x > 2],
        "list-index": lambda: x[[0, 2]],
        "list-index-set": lambda: _set_heads(x.clone(), [1, 2]),
        "repeat_interleave": lambda: x.repeat_interleave(torch.full((6,), 2)),
        "tensor-on-device": lambda: torch.tensor([1, 2], device="cpu"),
        "blocking-copy-across-devices": lambda: x.to("meta"),
    }
    for name, fn in cases.items():
        with SyncRecorder() as rec:
            fn()
        assert rec.events, name
    with SyncRecorder() as rec:
        x.repeat_interleave(torch.full((6,), 2), output_size=12)
        torch.tensor([1, 2])
        x[1:3] + x[torch.tensor([0, 2])]
        x.to("meta", non_blocking=True)
    assert rec.events == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "heads, n_reads",
    [
        pytest.param([GRID] * 4, 1, id="grid"),
        pytest.param([VerticalSlash(n_vertical=40, n_slash=60)] * 4, 1, id="vs"),
        pytest.param([AShape(sink=16, window=64)] * 4, 0, id="ashape"),
        pytest.param(
            [VerticalSlash(n_vertical=40, n_slash=60, exact_verticals=True), GRID] * 2,
            2,  # the Grid lists' width and the exact heads' lists' (their counts: no read)
            id="exact-vs-and-grid",
        ),
    ],
)
def test_plan_layer_cuda_synchronisations(monkeypatch, heads, n_reads):
    """On CUDA: the same count, seen by the sync debug mode (which also sees blocking copies)
    and, for the fused Grid planner's CUDA graph (its read is an event wait, which the debug
    mode does not see), by counting event waits."""
    torch.manual_seed(0)
    S = 4097
    q, k = _qk(S, device="cuda")
    lay = TokenLayout(torch.full((S,), 2, device="cuda"), tokens_per_frame=16)
    cfgs = [HeadConfig(h) for h in heads]
    planner = MMInferencePlanner(block=64)  # held across calls, as a model holds it
    for _ in range(2):  # compiles, caches and the Grid graph's capture synchronise once
        planner.plan(q, k, cfgs, lay)
    torch.cuda.synchronize()
    waits = []
    real = torch.cuda.Event.synchronize
    monkeypatch.setattr(torch.cuda.Event, "synchronize", lambda e: waits.append(e) or real(e))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            planner.plan(q, k, cfgs, lay)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # (the first use of the debug mode also warns that it is a prototype: not a sync)
    syncs = [w for w in seen if "called a synchronizing CUDA operation" in str(w.message)]
    assert len(syncs) + len(waits) == n_reads
    assert len(waits) == (heads[0] is GRID)  # the Grid layer replays its graph
