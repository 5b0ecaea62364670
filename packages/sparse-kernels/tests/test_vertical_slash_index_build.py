"""The vertical-slash index build, exactly: its leftover columns (``column_count``, ``columns``)
against an oracle, and the Triton build against the torch build, every tensor, padding included.

The oracle below derives the slash-covered tiles from the element-wise mask of
``vertical_slash_mask`` (every diagonal walked element by element, then pooled per tile) and
keeps, per query block, the verticals up to the block's last row outside those tiles: it shares
no code with the index build.
"""

import pytest
import torch
from sparse_kernels import build_vertical_slash_index
from sparse_kernels.testing import default_device
from sparse_kernels.vertical_slash import vertical_slash_mask

DEV = default_device()


def make_indices(B, H, S, NV, slashes, *, seed, ends=False):
    """Sorted distinct verticals (``ends``: 0 and S - 1 among them) and slashes: ``"none"``,
    ``"ends"`` (offsets 0 and S - 1 among random ones), ``"random"``, ``"local"`` (offsets
    ``0 .. S // 8``), ``"runs"`` (a few runs of consecutive offsets) or ``"comb"`` (every 192nd
    offset: about NKB / 3 ranges per query block)."""
    g = torch.Generator().manual_seed(seed)
    edge = torch.tensor(sorted({0, S - 1}))
    inner = torch.arange(1, max(S - 1, 1))

    def pick(n, with_ends):
        if not with_ends:
            return torch.randperm(S, generator=g)[:n].sort().values
        rest = inner[torch.randperm(inner.numel(), generator=g)][: n - edge.numel()]
        return torch.cat([edge, rest]).sort().values

    n_slash = 0 if slashes == "none" else max(2, S // 50)
    vs = [pick(NV, ends) for _ in range(B * H)]
    if slashes == "local":
        ss = [torch.arange(max(S // 8, 1)) for _ in range(B * H)]
    elif slashes == "comb":
        ss = [torch.arange(0, S, 192) for _ in range(B * H)]
    elif slashes == "runs":
        starts = [torch.randperm(S, generator=g)[:6] for _ in range(B * H)]
        ss = [torch.cat([torch.arange(a, min(a + 40, S)) for a in st]).unique() for st in starts]
        ss = [x[: min(len(x) for x in ss)] for x in ss]
    else:
        ss = [pick(n_slash, slashes == "ends") for _ in range(B * H)]
    v = torch.stack(vs).reshape(B, H, -1).to(torch.int32)
    s = torch.stack(ss).reshape(B, H, -1).to(torch.int32)
    return v, s


def columns_reference(v, s, S, BM, BN):
    """``(column_count [B, H, NQB], columns [B, H, NQB, C])`` int32: kept verticals ascending,
    ``C = max(1, max count)``, padded with ``S``; no verticals: zeros of width 1."""
    B, H, NV = v.shape
    nqb, nkb = -(-S // BM), -(-S // BN)
    slash_only = vertical_slash_mask(v[..., :0], s, S, block_m=BM, block_n=BN)
    pad = torch.zeros(B, H, nqb * BM, nkb * BN, dtype=torch.bool)
    pad[..., :S, :S] = slash_only
    tiles = pad.reshape(B, H, nqb, BM, nkb, BN).any(5).any(3)  # [B, H, NQB, NKB]
    kept = {}
    for b in range(B):
        for h in range(H):
            vv = v[b, h].long()
            for m in range(nqb):
                last = min((m + 1) * BM, S) - 1
                kept[b, h, m] = vv[(vv <= last) & ~tiles[b, h, m, vv // BN]]
    count = torch.zeros(B, H, nqb, dtype=torch.int32)
    for (b, h, m), c in kept.items():
        count[b, h, m] = c.numel()
    if NV == 0:
        return count, torch.zeros(B, H, nqb, 1, dtype=torch.int32)
    cols = torch.full((B, H, nqb, max(1, int(count.max()))), S, dtype=torch.int32)
    for (b, h, m), c in kept.items():
        cols[b, h, m, : c.numel()] = c.to(torch.int32)
    return count, cols


CASES = [
    pytest.param(1, 64, 64, 1, "ends", False, id="S1-b64-nv1"),
    pytest.param(300, 64, 64, 0, "random", False, id="S300-b64-nv0"),
    pytest.param(300, 64, 128, 1, "random", False, id="S300-b64x128-nv1"),
    pytest.param(257, 128, 64, 2, "ends", True, id="S257-b128x64-nv2-ends"),
    pytest.param(777, 128, 64, 120, "ends", True, id="S777-b128x64-nv120-ends"),
    pytest.param(1000, 128, 128, 200, "none", True, id="S1000-b128-nv200-noslash"),
    pytest.param(1000, 64, 128, 300, "random", False, id="S1000-b64x128-nv300"),
    pytest.param(513, 64, 64, 70, "ends", True, id="S513-b64-nv70-ends"),
    pytest.param(256, 64, 64, 256, "ends", False, id="S256-b64-every-column"),
    pytest.param(2049, 128, 128, 300, "random", True, id="S2049-b128-nv300"),
]


def _check(S, BM, BN, NV, slashes, ends, device, impl="auto"):
    v, s = make_indices(2, 3, S, NV, slashes, seed=S + NV + BM + 3 * BN, ends=ends)
    want_count, want_cols = columns_reference(v, s, S, BM, BN)
    idx = build_vertical_slash_index(
        v.to(device), s.to(device), seq_len=S, block_m=BM, block_n=BN, impl=impl
    )
    assert idx.column_count.device.type == torch.device(device).type
    assert torch.equal(idx.column_count.cpu(), want_count)
    assert torch.equal(idx.columns.cpu(), want_cols)


@pytest.mark.parametrize("S,BM,BN,NV,slashes,ends", CASES)
def test_columns_match_reference(S, BM, BN, NV, slashes, ends):
    # On CPU under TRITON_INTERPRET=1 and on CUDA: the Triton kernel.
    _check(S, BM, BN, NV, slashes, ends, DEV, impl="triton")


@pytest.mark.parametrize("S,BM,BN,NV,slashes,ends", CASES)
def test_torch_columns_match_reference(S, BM, BN, NV, slashes, ends):
    _check(S, BM, BN, NV, slashes, ends, "cpu", impl="reference")


def test_int64_indices_give_the_same_columns():
    v, s = make_indices(2, 3, 700, 90, "ends", seed=11, ends=True)
    a = build_vertical_slash_index(v.to(DEV), s.to(DEV), seq_len=700, block_m=128, block_n=64)
    b = build_vertical_slash_index(
        v.long().to(DEV), s.long().to(DEV), seq_len=700, block_m=128, block_n=64
    )
    want_count, want_cols = columns_reference(v, s, 700, 128, 64)
    for idx in (a, b):
        assert torch.equal(idx.column_count.cpu(), want_count)
        assert torch.equal(idx.columns.cpu(), want_cols)


@pytest.mark.gpu
@pytest.mark.parametrize("BM,BN", [(64, 64), (64, 128), (128, 64), (128, 128)], ids=str)
def test_gpu_columns_match_reference(BM, BN):
    _check(4096 + 17, BM, BN, 500, "ends", True, "cuda")


BUILD_CASES = [
    *CASES,
    pytest.param(1000, 64, 64, 100, "local", True, id="S1000-b64-local"),
    pytest.param(1500, 64, 128, 100, "runs", False, id="S1500-b64x128-runs"),
    pytest.param(1500, 128, 64, 100, "runs", True, id="S1500-b128x64-runs"),
    pytest.param(2100, 128, 128, 50, "runs", False, id="S2100-b128-runs"),
    pytest.param(2100, 128, 128, 50, "local", False, id="S2100-b128-local"),
    pytest.param(3000, 64, 64, 40, "comb", False, id="S3000-b64-comb"),
    pytest.param(3000, 128, 64, 40, "comb", True, id="S3000-b128x64-comb"),
]


def _both_builds(S, BM, BN, NV, slashes, ends, device, dtype=torch.int32):
    v, s = make_indices(2, 3, S, NV, slashes, seed=S + NV + BM + 3 * BN, ends=ends)
    v, s = v.to(dtype), s.to(dtype)
    kw = dict(seq_len=S, block_m=BM, block_n=BN)
    got = build_vertical_slash_index(v.to(device), s.to(device), **kw, impl="triton")
    want = build_vertical_slash_index(v, s, **kw, impl="reference")
    for name in ("range_count", "range_start", "range_end", "column_count", "columns"):
        assert torch.equal(getattr(got, name).cpu(), getattr(want, name)), name


@pytest.mark.parametrize("S,BM,BN,NV,slashes,ends", BUILD_CASES)
def test_triton_build_equals_torch_build(S, BM, BN, NV, slashes, ends):
    _both_builds(S, BM, BN, NV, slashes, ends, DEV)


@pytest.mark.parametrize(
    "S,BM,BN,NV,slashes,ends",
    [
        pytest.param(777, 128, 64, 120, "ends", True, id="S777-b128x64-nv120-ends"),
        pytest.param(1500, 64, 128, 100, "runs", False, id="S1500-b64x128-runs"),
        pytest.param(2100, 128, 128, 50, "local", False, id="S2100-b128-local"),
    ],
)
def test_triton_build_equals_torch_build_int64(S, BM, BN, NV, slashes, ends):
    _both_builds(S, BM, BN, NV, slashes, ends, DEV, torch.int64)


@pytest.mark.gpu
@pytest.mark.parametrize("BM,BN", [(64, 64), (64, 128), (128, 64), (128, 128)], ids=str)
@pytest.mark.parametrize("slashes", ["local", "runs", "random", "comb"])
def test_gpu_triton_build_equals_torch_build(BM, BN, slashes):
    # 40000 tokens at 64x64 tiles: sequences of about 1250 entries and about 200 ranges per
    # query block with the comb, past one step of the GPU kernels' loops
    _both_builds(40000, BM, BN, 600, slashes, True, "cuda")


def test_impl_and_empty_batch_are_checked():
    v, s = make_indices(1, 2, 300, 5, "random", seed=0)
    kw = dict(seq_len=300, block_m=64, block_n=64)
    with pytest.raises(ValueError, match="impl must be one of"):
        build_vertical_slash_index(v, s, **kw, impl="cuda")
    with pytest.raises(NotImplementedError, match="FlashAttention-4 has no kernel"):
        build_vertical_slash_index(v, s, **kw, impl="fa4")
    with pytest.raises(ValueError, match="expected B\\*H >= 1, got B=0, H=2"):
        build_vertical_slash_index(v[:0], s[:0], **kw)
