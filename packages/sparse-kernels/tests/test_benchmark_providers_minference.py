"""The MInference 0.1.6 providers: the attended set of its vertical-slash op against hand-derived
rows (CPU) and against its own CUDA index conversion and kernel (GPU, where the package built by
scripts/minference_env.sh imports)."""

from __future__ import annotations

import pytest
import torch
from sparse_kernels.attention import masked_attention_reference
from sparse_kernels.benchmark_providers import (
    ORACLE_HEADS,
    ORACLE_ROWS,
    REL_TOL,
    minference_streaming_call,
    minference_vertical_slash_call,
    minference_vertical_slash_rows,
    rows_error,
)
from sparse_kernels.triangle.reference import triangle_mask

S = 512  # two oracle row blocks of 64 before the last four


def _indices(vert, slash):
    """One index list per head, the same for both oracle heads, as ``[1, H, n]`` int32."""
    v = torch.tensor(vert, dtype=torch.int32).repeat(1, ORACLE_HEADS, 1)
    s = torch.tensor(slash, dtype=torch.int32).repeat(1, ORACLE_HEADS, 1)
    return v, s


def _row(mask, i):
    """Attended keys of absolute row ``i`` of head 1 as a sorted list."""
    return torch.nonzero(mask[1, i - (S - ORACLE_ROWS)]).flatten().tolist()


def test_rows_local_band_is_one_range_from_the_farthest_band():
    # offsets 0..63: the farthest band of the block ending at e starts at e - 127; the next one
    # starts inside it, so the range grows by 64 and covers the rest; the sink column is apart.
    v, s = _indices([0], list(range(64)))
    mask = minference_vertical_slash_rows(v, s, S)
    assert mask.shape == (ORACLE_HEADS, ORACLE_ROWS, S)
    for i in (S - ORACLE_ROWS, 300, S - 1):
        start = i - i % 64
        assert _row(mask, i) == [0, *range(start - 63, i + 1)]


def test_rows_far_slash_is_an_unaligned_band():
    # offset 100 in the block ending at 512 covers keys [348, 412): not the 64-aligned tiles
    # [320, 448) it crosses, which is what our index attends.
    v, s = _indices([5, 350, 470], [100, 0])
    mask = minference_vertical_slash_rows(v, s, S)
    # column 5 is apart; 350 lies in the band; 470 is in the diagonal's block, causal there
    assert _row(mask, 511) == [5, *range(348, 412), *range(448, 512)]
    assert _row(mask, 460) == [5, *range(348, 412), *range(448, 461)]


def test_rows_slash_offsets_need_zero():
    v, s = _indices([0], [1, 2, 3])
    with pytest.raises(ValueError, match="must include 0"):
        minference_vertical_slash_rows(v, s, S)


def test_vertical_slash_call_rejects_missing_diagonal_before_importing():
    q = torch.zeros(1, ORACLE_HEADS, S, 64)
    v, s = _indices([0], [1, 2, 3])
    with pytest.raises(ValueError, match="must include 0"):
        minference_vertical_slash_call(q, q, q, v, s)
    with pytest.raises(ValueError, match=r"\(B, H\) = \(1, 2\)"):
        minference_vertical_slash_call(q, q, q, v[:, :1], s)


def _minference():
    if not torch.cuda.is_available():
        pytest.skip("MInference's ops need a CUDA GPU")
    return pytest.importorskip("minference", reason="source scripts/minference_env.sh first")


def _gpu_indices(S_, nv, ns, seed):
    g = torch.Generator().manual_seed(seed)
    vert = torch.randperm(S_, generator=g)[:nv].sort().values
    far = torch.randperm(S_ - 8, generator=g)[: ns - 8] + 8
    slash = torch.cat([torch.arange(8), far]).sort().values
    B, H = 1, 4
    return (
        vert.to(torch.int32).repeat(B, H, 1).cuda(),
        slash.to(torch.int32).repeat(B, H, 1).cuda(),
    )


@pytest.mark.gpu
@pytest.mark.parametrize("seed", [0, 1])
def test_rows_match_minference_index_conversion(seed):
    _minference()
    from minference.cuda import convert_vertical_slash_indexes

    S_ = 2048
    vert, slash = _gpu_indices(S_, 40, 60, seed)
    seqlens = torch.tensor([S_], dtype=torch.int32, device="cuda")
    # the call's own preparation (pit_sparse_flash_attention_v2.py): verticals ascending,
    # slashes descending
    counts, offsets, ccounts, cols = convert_vertical_slash_indexes(
        seqlens, vert, slash.sort(-1, descending=True).values, S_, 64, 64
    )
    got = torch.zeros(ORACLE_HEADS, ORACLE_ROWS, S_, dtype=torch.bool)
    for h in range(ORACLE_HEADS):
        for r in range(ORACLE_ROWS // 64):
            blk = S_ // 64 - ORACLE_ROWS // 64 + r
            rows = slice(r * 64, r * 64 + 64)
            for o in offsets[0, h, blk, : counts[0, h, blk]].tolist():
                got[h, rows, o : o + 64] = True
            got[h, rows, cols[0, h, blk, : ccounts[0, h, blk]].long().cpu()] = True
    i = torch.arange(S_ - ORACLE_ROWS, S_)[:, None]
    got &= torch.arange(S_)[None, :] <= i
    assert torch.equal(got, minference_vertical_slash_rows(vert.cpu(), slash.cpu(), S_))


@pytest.mark.gpu
def test_vertical_slash_call_matches_its_rows():
    _minference()
    torch.manual_seed(0)
    S_ = 2048
    q = torch.randn(1, 4, S_, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, S_, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    vert, slash = _gpu_indices(S_, 40, 60, 0)
    out = minference_vertical_slash_call(q, k, v, vert, slash)()
    rows = minference_vertical_slash_rows(vert.cpu(), slash.cpu(), S_).cuda()
    assert rows_error(out, q, k, v, rows) < REL_TOL


@pytest.mark.gpu
@pytest.mark.parametrize(("sink", "window"), [(8, 512), (128, 1024)])
def test_streaming_call_is_the_a_shape(sink, window):
    _minference()
    torch.manual_seed(0)
    S_ = 4096
    q = torch.randn(1, 4, S_, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, S_, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = minference_streaming_call(q, k, v, sink=sink, window=window)()
    mask = triangle_mask(S_, S_, sink=sink, window=window, last=0, device="cuda")
    ref = masked_attention_reference(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), mask, scale=128**-0.5
    ).out
    err = float((out.float() - ref.float()).norm() / ref.float().norm())
    assert err < REL_TOL
