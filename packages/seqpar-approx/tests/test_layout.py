import pytest
import torch
from seqpar_approx import SpavaConfig, build_layout, even_split, ring_layout, split_frames


@pytest.mark.parametrize(
    "n,nq,H,la,zigzag",
    [
        pytest.param(103, 7, 2, 5, True, id="n103-q7-H2-la5-zigzag"),
        pytest.param(97, 1, 4, 0, True, id="n97-q1-H4-la0-zigzag"),
        pytest.param(1025, 33, 3, 16, False, id="n1025-q33-H3-la16-contiguous"),
        pytest.param(64, 3, 1, 2, True, id="n64-q3-H1"),
    ],
)
def test_layout_covers_sequence_once(n, nq, H, la, zigzag):
    cfg = SpavaConfig(num_hosts=H, anchor_len=la, passing_len=2, zigzag=zigzag)
    L = build_layout(n, query_len=nq, config=cfg)
    assert L.num_virtual == (2 * H if zigzag else H)
    lens = [L.block_len(v) for v in range(L.num_virtual)]
    assert lens == even_split(n - nq - la, L.num_virtual)
    # the context blocks of all hosts partition [la, n - nq) exactly once
    ctx = torch.cat([torch.arange(*L.block(v)) for h in range(H) for v in L.virtual_of_host(h)])
    assert torch.equal(ctx.sort().values, torch.arange(la, n - nq))
    for h in range(H):
        idx = L.local_indices(h)
        assert torch.equal(idx[:la], torch.arange(la))
        assert torch.equal(idx[idx.numel() - nq :], torch.arange(n - nq, n))
        for v in L.virtual_of_host(h):
            assert L.host_of_virtual(v) == h
    # shard / unshard is the identity
    x = torch.randn(2, n, 3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(L.unshard([L.shard(x, h, dim=1) for h in range(H)], dim=1), x)
    # anchor slices partition the anchor
    assert L.anchor_bounds[0] == 0 and L.anchor_bounds[-1] == la


def test_zigzag_mapping_h4():
    L = build_layout(200, query_len=8, config=SpavaConfig(num_hosts=4, anchor_len=8))
    assert [L.virtual_of_host(h) for h in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]


def test_defaults_are_paper_fractions():
    L = build_layout(1024, query_len=10, config=SpavaConfig(num_hosts=2))
    assert (L.anchor_len, L.passing_len) == (16, 8)


def test_ring_layout_has_no_anchor_or_query():
    L = ring_layout(101, num_hosts=2)
    assert L.anchor_len == 0 and L.query_len == 0 and L.num_virtual == 4
    assert torch.equal(L.local_indices(0), torch.cat([torch.arange(0, 26), torch.arange(76, 101)]))


def test_too_short_for_hosts_is_a_clear_error():
    with pytest.raises(ValueError, match="too short for 4 hosts.*has 5 tokens, need at least 8"):
        build_layout(20, query_len=5, config=SpavaConfig(num_hosts=4, anchor_len=10))


def test_bad_config_types():
    with pytest.raises(TypeError, match="num_hosts: expected an int"):
        SpavaConfig(num_hosts=2.0)
    with pytest.raises(ValueError, match="passing_len: expected >= 0"):
        SpavaConfig(num_hosts=2, passing_len=-1)
    with pytest.raises(ValueError, match="query_len"):
        build_layout(10, query_len=10, config=SpavaConfig(num_hosts=1))


@pytest.mark.parametrize(
    "F,H,expected",
    [
        pytest.param(10, 4, [3, 3, 2, 2], id="F10-H4"),
        pytest.param(3, 4, [1, 1, 1, 0], id="F3-H4-fewer-frames"),
        pytest.param(8, 2, [4, 4], id="F8-H2"),
    ],
)
def test_split_frames_eq6(F, H, expected):
    parts = split_frames(F, H)
    assert [len(r) for r in parts] == expected
    assert [i for r in parts for i in r] == list(range(F))
