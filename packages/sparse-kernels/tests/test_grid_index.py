"""The Grid index op: Triton against the PyTorch reference (strides, phases, permutations, block
lists and run splits compare exactly), the reference against the dense block mask, the
per-shape state of :class:`GridIndexer`, and bad input."""

import pytest
import torch
from sparse_kernels import grid_permutation
from sparse_kernels.grid_index import (
    GridIndex,
    GridIndexer,
    GridIndexSettings,
    grid_block_mask,
    grid_block_runs,
    grid_index,
    grid_lists,
)
from sparse_kernels.permuted import grid_line_offsets, inverse_permutation, kv_block_runs
from sparse_kernels.testing import default_device, make_qkv

DEV = default_device()
FIELDS = ("stride", "phase", "perm", "kv_runs", "block_indices", "block_counts")


def _planted(B, H, H_KV, S, D, stride, phase, dtype=torch.float32, seed=0):
    """q, k whose keys on the lines ``j = phase (mod stride)`` get a large logit (heads of odd
    index a second, weaker grid, so heads differ)."""
    q, k, _ = make_qkv(B, H, H_KV, S, S, D, dtype=torch.float32, device=DEV, seed=seed)
    q[..., 0] = 2.0
    k[..., phase::stride, 0] = 4.0
    return q.to(dtype), k.to(dtype)


def _assert_same(a: GridIndex, b: GridIndex) -> None:
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and x.shape == y.shape, (f, x.dtype, y.dtype, x.shape, y.shape)
        assert torch.equal(x, y), f
    assert (a.run_split is None) == (b.run_split is None)
    if a.run_split is not None:
        for name, x, y in zip(a.run_split._fields, a.run_split, b.run_split):
            assert torch.equal(x, y), name


# (B, H, H_KV, S, D, last_q, block, strides, planted stride, phase, use_vline, use_slash, dtype)
CASES = [
    pytest.param(1, 4, 2, 600, 32, 16, 16, (2, 4, 8, 16), 8, 3, True, True, torch.float32,
                 id="H4-HKV2-S600-blk16-P16-stride8"),
    pytest.param(2, 2, 1, 389, 16, 20, 32, (3, 6, 12), 6, 5, (True, False), (False, True),
                 torch.float16, id="B2-S389-ragged-blk32-L20-per-head-lines"),
    pytest.param(1, 2, 2, 257, 16, 8, 48, (48,), 48, 40, True, False, torch.float32,
                 id="one-stride-blk48-no-slash"),
]  # fmt: skip


@pytest.mark.parametrize(
    "B, H, H_KV, S, D, last_q, block, strides, planted, phase, vline, slash, dtype", CASES
)
def test_grid_index_triton_equals_reference(
    B, H, H_KV, S, D, last_q, block, strides, planted, phase, vline, slash, dtype
):
    q, k = _planted(B, H, H_KV, S, D, planted, phase, dtype, seed=S)
    kw = dict(strides=strides, last_q=last_q, block=block, use_vline=vline, use_slash=slash)
    ref = grid_index(q, k, **kw, impl="reference")
    got = grid_index(q, k, **kw, impl="triton")
    assert torch.equal(ref.stride, torch.full((B, H), planted, device=DEV))
    assert torch.equal(ref.phase, torch.full((B, H), phase % planted, device=DEV))
    _assert_same(ref, got)
    assert ref.block_indices.shape[:3] == (B, H, -(-S // block))


def test_grid_index_reference_lists_are_the_block_mask():
    """The reference lists hold exactly the blocks of the dense block mask of the permuted
    order (the three candidate ranges are the mask's lines), and the inverse is exact."""
    B, H, S, blk = 1, 3, 300, 16
    q, k = _planted(B, H, 1, S, 16, 6, 1, seed=5)
    idx = grid_index(q, k, strides=(2, 3, 6), last_q=8, block=blk, use_vline=(True, False, True),
                     use_slash=(True, True, False), impl="reference")  # fmt: skip
    st, ph = idx.stride.reshape(H), idx.phase.reshape(H)
    offs = grid_line_offsets(S, st, ph, max_stride=6)
    flags = [
        torch.tensor(f, device=DEV) for f in ([False] * 3, [True, False, True], [True, True, False])
    ]
    mask = grid_block_mask(idx.perm.reshape(H, S), offs, *flags, S, blk)(0, -(-S // blk))
    W = idx.block_indices.shape[-1]
    got = torch.zeros_like(mask)
    for h in range(H):
        for m in range(mask.shape[1]):
            c = int(idx.block_counts[0, h, m])
            assert not idx.block_indices[0, h, m, c:W].any()  # zeros past the count
            got[h, m, idx.block_indices[0, h, m, :c].long()] = True
    assert torch.equal(got, mask)
    assert torch.equal(idx.inverse(), inverse_permutation(idx.perm))
    assert torch.equal(
        idx.perm.gather(-1, idx.inverse().long()), torch.arange(S, device=DEV).expand(1, H, S).int()
    )


def test_grid_indexer_launches_lists_early_once_a_width_is_on_record():
    """The first call of a shape reads the width and launches the lists after it; the second
    launches them before (``early``), and its result is that very index; both equal the
    reference. Lists too wide for the kernel (``lists_max_width``) come from torch, unsplit."""
    q, k = _planted(1, 2, 1, 400, 16, 8, 2, seed=3)
    kw = dict(strides=(2, 4, 8), last_q=16, block=16, scale=0.25)
    ref = grid_index(q, k, **kw, impl="reference")
    indexer = GridIndexer(graphs="off", settings=GridIndexSettings(lists_block_w=4))
    first = indexer.start(q, k, **kw)
    assert first.early is None
    _assert_same(first.result(), ref)
    second = indexer.start(q, k, **kw)
    assert second.early is not None
    assert second.result() is second.early
    _assert_same(second.early, ref)
    narrow = GridIndexer(graphs="off", settings=GridIndexSettings(lists_max_width=4))
    wide = narrow.start(q, k, **kw).result()
    assert wide.run_split is None and narrow.start(q, k, **kw).early is None
    for f in FIELDS:
        assert torch.equal(getattr(wide, f), getattr(ref, f)), f


def test_grid_index_repr_names_shapes():
    q, k = _planted(1, 2, 1, 128, 16, 4, 0)
    r = repr(grid_index(q, k, strides=(2, 4), last_q=4, block=32, impl="reference"))
    assert "perm=int32[1, 2, 128]" in r and "block_indices=int32[1, 2, 4, " in r, r


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(strides=()), ValueError, "strides: expected a non-empty sequence"),
        (dict(strides=(2, 0)), ValueError, r"strides: expected ints >= 1, got \[2, 0\]"),
        (dict(strides=(2.0,)), ValueError, "strides: expected ints >= 1"),
        (dict(strides=(32, 48)), ValueError, "2 \\* P <= S=128, got P=96"),
        (dict(last_q=129), ValueError, r"last_q: expected an int in \[1, 128\], got 129"),
        (dict(block=0), ValueError, "block: expected an int >= 1, got 0"),
        (dict(use_vline=(True,)), TypeError, "use_vline: expected a bool or a sequence of H=2"),
        (dict(use_slash="yes"), TypeError, "use_slash: expected a bool"),
        (dict(rel_tol=1.0), ValueError, r"rel_tol: expected a float in \[0, 1\)"),
        (dict(settings={}), TypeError, "settings: expected a GridIndexSettings, got dict"),
        (dict(impl="fast"), ValueError, "impl must be one of"),
        (dict(k=torch.randn(1, 1, 100, 16)), NotImplementedError, "S_Q=128, S_KV=100"),
        (dict(k=torch.randn(1, 1, 128, 8)), ValueError, "head dim mismatch"),
    ],
)
def test_grid_index_bad_input(kwargs, exc, match):
    args = dict(q=torch.randn(1, 2, 128, 16), k=torch.randn(1, 1, 128, 16), strides=(2, 4),
                last_q=8, block=16)  # fmt: skip
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        grid_index(args.pop("q"), args.pop("k"), **args)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(fold_programs=0), ValueError, "fold_programs: expected an int >= 1, got 0"),
        (dict(fold_heads=-1), ValueError, "fold_heads: expected an int >= 0"),
        (dict(fold_interior=1), TypeError, "fold_interior: expected a bool, got int"),
        (dict(lists_block_w=48), ValueError, "lists_block_w: expected a power of two, got 48"),
    ],
)
def test_grid_index_settings_bad_values(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        GridIndexSettings(**kwargs)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(graphs="on"), ValueError, r"graphs: expected one of \('auto', 'off'\), got 'on'"),
        (dict(settings=None), TypeError, "settings: expected a GridIndexSettings, got NoneType"),
        (dict(max_graphs=-1), ValueError, "max_graphs: expected an int >= 0, got -1"),
    ],
)
def test_grid_indexer_bad_settings(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        GridIndexer(**kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_grid_indexer_graph_replays_equal_launches_gpu(dtype):
    """With a width on record the launches are a CUDA graph; its replays on other tensors of the
    shape (other addresses) give what launches give."""
    B, H, H_KV, S, D = 1, 28, 4, 16384, 128
    kw = dict(strides=(2, 4, 8, 16, 32, 64, 128, 256), last_q=64, block=64, scale=D**-0.5)
    graphed = GridIndexer()
    plain = GridIndexer(graphs="off")
    for seed, (stride, phase) in enumerate([(256, 7), (64, 3), (128, 100)]):
        q, k = _planted(B, H, H_KV, S, D, stride, phase, dtype, seed=seed)
        got = graphed.start(q, k, **kw).result()
        _assert_same(got, plain.start(q, k, **kw).result())
    assert graphed._graphs and not plain._graphs


def _lists_of_mask(fn, N: int, nb: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted lists of the block mask of ``fn`` (every query block at once)."""
    mask = fn(0, nb)
    cnt = mask.sum(-1, dtype=torch.int32)
    order = torch.where(mask, torch.arange(nb), 1 << 20).sort(-1).values
    return order, cnt


@pytest.mark.parametrize(
    "S, stride, phase, vline, slash, blk",
    [
        pytest.param(517, 12, 4, True, True, 16, id="S517-s12-p4-b16"),
        pytest.param(1000, 40, 39, True, False, 32, id="S1000-s40-vline-only"),
        pytest.param(777, 7, 0, False, True, 16, id="S777-s7-slash-only"),
        pytest.param(300, 16, 3, False, False, 32, id="diag-only"),
    ],
)
def test_grid_lists_equal_the_block_mask(S, stride, phase, vline, slash, blk):
    """The candidate-range lists hold the blocks of the dense block mask (zeros past each
    count), whatever the line table's width; the kernel's lists are the same tensors."""
    st = torch.tensor([stride, stride])
    ph = torch.tensor([phase, (phase + 5) % stride])
    perm, _ = grid_permutation(S, st, ph)
    offs = grid_line_offsets(S, st, ph)
    f = lambda x: torch.tensor([x, x])  # noqa: E731
    nb = -(-S // blk)
    want, c1 = _lists_of_mask(
        grid_block_mask(perm, offs, f(False), f(vline), f(slash), S, blk), 2, nb
    )
    i2, c2 = grid_lists(perm, offs, f(vline), f(slash), S, blk, impl="reference")
    assert torch.equal(c1, c2)
    valid = torch.arange(i2.shape[-1]) < c2[..., None]
    got = torch.where(valid, i2, 1 << 20).sort(-1).values
    w = int(c1.max())
    assert torch.equal(got[..., :w], want[..., :w])
    assert bool((i2[~valid] == 0).all())
    # A line table as wide as a stride space (no read-back of the strides): the same lists.
    wide = grid_line_offsets(S, st, ph, max_stride=stride + 9)
    i3, c3 = grid_lists(perm, wide, f(vline), f(slash), S, blk, impl="reference")
    assert torch.equal(i3, i2) and torch.equal(c3, c2)
    d = lambda x: x.to(DEV)  # noqa: E731
    i4, c4 = grid_lists(d(perm), d(offs), d(f(vline)), d(f(slash)), S, blk, impl="triton")
    assert torch.equal(i4.cpu(), i2) and torch.equal(c4.cpu(), c2)


@pytest.mark.parametrize(
    "blk, perm_shape, match",
    [
        (0, (1, 64), "blk: expected an int >= 1, got 0"),
        (16.0, (1, 64), "blk: expected an int >= 1, got 16.0"),
        (16, (64,), r"perm: expected shape \[N, S=64\], got \(64,\)"),
        (16, (1, 63), r"perm: expected shape \[N, S=64\], got \(1, 63\)"),
    ],
)
def test_grid_lists_bad_block_or_permutation(blk, perm_shape, match):
    st, ph = torch.tensor([8]), torch.tensor([3])
    offs = grid_line_offsets(64, st, ph)
    t = torch.tensor([True])
    with pytest.raises(ValueError, match=match):
        grid_lists(torch.zeros(perm_shape, dtype=torch.int32), offs, t, t, 64, blk)


def test_grid_lists_rows_wider_than_the_kernel_takes():
    """impl='triton' raises for candidate rows wider than ``lists_max_width``; 'auto' takes
    the torch path for them (same lists)."""
    S, blk = 300, 16
    st, ph = torch.tensor([12], device=DEV), torch.tensor([5], device=DEV)
    perm, _ = grid_permutation(S, st, ph)
    offs = grid_line_offsets(S, st, ph)
    t = torch.tensor([True], device=DEV)
    ref = grid_lists(perm, offs, t, t, S, blk, impl="reference")
    narrow = GridIndexSettings(lists_max_width=4)
    with pytest.raises(NotImplementedError, match="rows of up to 4 candidate blocks"):
        grid_lists(perm, offs, t, t, S, blk, impl="triton", settings=narrow)
    got = grid_lists(perm, offs, t, t, S, blk, impl="auto", settings=narrow)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


@pytest.mark.parametrize(
    "S,stride,blk",
    [(517, 12, 16), (300, 16, 32), (64, 8, 8), (100, 7, 1), (90, 40, 8), (50, 70, 4), (33, 1, 8)],
)
def test_grid_block_runs_equal_kv_block_runs(S, stride, blk):
    """The run map from the line table equals the pass over the permutation, for strides
    below, near and above S / 2 (empty lines), block 1 and stride 1 (identity)."""
    st = torch.tensor([stride, stride, stride])
    ph = torch.tensor([0, 3 % stride, (stride - 1)])
    perm, _ = grid_permutation(S, st, ph)
    for offs in (grid_line_offsets(S, st, ph), grid_line_offsets(S, st, ph, max_stride=stride + 5)):
        got = grid_block_runs(perm, offs, S, blk)
        assert got.dtype == torch.int32
        assert torch.equal(got, kv_block_runs(perm, blk, st))


def test_offset_graph_bad_input():
    from sparse_kernels.grid_index.graphs import OffsetGraph, _check_outputs

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
