"""K/V tiles through the copy engine (``tma=True``) give the same result as index loads, and the
launchers choose and refuse descriptors by the layout rule of ``_triton/tma.py``."""

import pytest
import torch
from sparse_kernels._triton.tma import kv_descriptors, tma_default, tma_layout_ok
from sparse_kernels.attention.triton import _launch_attention_fwd
from sparse_kernels.block_sparse.triton import _launch_block_sparse_fwd
from sparse_kernels.testing import default_device, make_qkv
from sparse_kernels.triangle.triton import _launch_triangle_fwd
from sparse_kernels.tuning import LaunchConfig
from sparse_kernels.vertical_slash import build_vertical_slash_index
from sparse_kernels.vertical_slash.triton import _launch_vertical_slash_fwd

DEV = default_device()
needs_tma = pytest.mark.skipif(
    DEV.type == "cuda" and torch.cuda.get_device_capability() < (9, 0),
    reason="the copy engine (TMA) needs compute capability 9.0 or later",
)


def _same(a, b):
    """Equal outputs and LSEs (the same arithmetic on the same tiles; -inf rows equal too)."""
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
    torch.testing.assert_close(a[1], b[1], rtol=0, atol=0)


@needs_tma
@pytest.mark.parametrize(
    "B,H,H_KV,S_Q,S_KV,D,causal,layout",
    [
        pytest.param(1, 4, 2, 97, 97, 64, True, "bhsd", id="S97-GQA-causal"),
        pytest.param(2, 2, 1, 33, 70, 48, True, "bhsd", id="SQ33-SKV70-D48-causal"),
        pytest.param(1, 2, 2, 64, 50, 32, False, "bshd", id="SQ64-SKV50-bshd-full"),
    ],
)
def test_dense_tma_equals_index_loads(B, H, H_KV, S_Q, S_KV, D, causal, layout):
    q, k, v = make_qkv(B, H, H_KV, S_Q, S_KV, D, seed=S_Q, layout=layout)
    run = [
        _launch_attention_fwd(q, k, v, causal=causal, scale=D**-0.5, tma=tma)
        for tma in (False, True)
    ]
    _same(*run)


@needs_tma
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_block_sparse_tma_equals_index_loads(causal):
    B, H, H_KV, S, D, blk = 1, 4, 2, 200, 64, 64
    q, k, v = make_qkv(B, H, H_KV, S, S, D, seed=3)
    nb = -(-S // blk)
    g = torch.Generator().manual_seed(0)
    sel = torch.rand(B, H, nb, nb, generator=g) < 0.5
    order = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    num = sel.sum(-1, dtype=torch.int32)  # some rows list nothing: empty rows compare too
    lists = (num.to(DEV), order.to(DEV), None, None)
    run = [
        _launch_block_sparse_fwd(
            q, k, v, *lists, block_m=blk, block_n=blk, causal=causal, scale=D**-0.5, tma=tma
        )
        for tma in (False, True)
    ]
    _same(*run)


@needs_tma
@pytest.mark.parametrize(
    "S_Q,S_KV,sink,window,last",
    [
        # the sink tile (16 keys, index loads) beside 32-key window tiles; last rows in 2 chunks
        pytest.param(150, 150, 8, 40, 20, id="S150-s8-w40-l20"),
        # a sink of two 32-key tiles, no last rows
        pytest.param(200, 200, 40, 33, 0, id="S200-s40-w33"),
        # rows after a prefix of keys: the window reaches back into it; 3 key chunks
        pytest.param(70, 300, 4, 90, 9, id="SQ70-SKV300-s4-w90-l9"),
    ],
)
def test_triangle_tma_equals_index_loads(S_Q, S_KV, sink, window, last):
    q, k, v = make_qkv(1, 4, 2, S_Q, S_KV, 64, seed=S_KV)
    config = LaunchConfig.of(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
    run = [
        _launch_triangle_fwd(
            q,
            k,
            v,
            sink=sink,
            window=window,
            last=last,
            scale=0.125,
            chunk=128,
            config=config,
            tma=tma,
        )  # fmt: skip
        for tma in (False, True)
    ]
    _same(*run)


@pytest.mark.parametrize("tma_key", [False, True], ids=["index-config", "tma-config"])
def test_triangle_config_names_its_loads(monkeypatch, tma_key):
    """A triangle config without ``TMA`` runs index loads; one with ``TMA=1`` leaves the choice
    to the GPU and layout rule (``tma=None``); an explicit ``tma`` wins over both."""
    asked = []

    def spy(k, v, *, block_n, block_d, tma, op):
        asked.append(tma)
        return kv_descriptors(k, v, block_n=block_n, block_d=block_d, tma=tma, op=op)

    monkeypatch.setattr("sparse_kernels.triangle.triton.kv_descriptors", spy)
    tiles = dict(BLOCK_M=64, BLOCK_N=32, **({"TMA": 1} if tma_key else {}))
    config = LaunchConfig.of(num_warps=4, num_stages=2, **tiles)
    q, k, v = make_qkv(1, 2, 1, 80, 80, 32, seed=1)
    run = dict(sink=4, window=20, last=8, scale=0.125, config=config)
    for tma in (None, True, False):
        _launch_triangle_fwd(q, k, v, tma=tma, **run)
    assert asked == [None if tma_key else False, True, False]


def test_triangle_config_tma_must_be_1():
    q, k, v = make_qkv(1, 2, 1, 40, 40, 32, seed=2)
    config = LaunchConfig.of(BLOCK_M=64, BLOCK_N=32, TMA=2, num_warps=4, num_stages=2)
    with pytest.raises(ValueError, match=r"TMA: expected 1 or no TMA key, got 2 in BLOCK_M=64"):
        _launch_triangle_fwd(q, k, v, sink=4, window=20, last=8, scale=0.125, config=config)


def test_layout_rule():
    t = torch.zeros(1, 2, 16, 64, dtype=torch.float16)
    assert tma_layout_ok(t)
    assert tma_layout_ok(t.transpose(1, 2).contiguous().transpose(1, 2))  # [B, S, H, D] storage
    # a size-1 dim's stride is never used: an odd one does not matter
    assert tma_layout_ok(
        torch.zeros(16, 64, dtype=torch.float16).as_strided((1, 16, 64), (3, 64, 1))
    )
    assert not tma_layout_ok(torch.zeros(2, 16, 12, dtype=torch.float16)[..., :10])  # 20-byte rows
    assert not tma_layout_ok(torch.zeros(2, 64, dtype=torch.float16).t())  # last stride 2
    assert not tma_layout_ok(torch.zeros(2, 64, dtype=torch.float16)[:, 1:])  # 2-byte offset
    assert not tma_layout_ok(torch.zeros(1, 64, dtype=torch.float16).expand(4, 64))  # stride 0
    assert not tma_default(t)  # CPU tensors: index loads


def test_tma_true_refuses_a_layout_it_cannot_load():
    k = torch.zeros(1, 1, 16, 12, dtype=torch.float16)[..., :10]
    with pytest.raises(ValueError, match=r"tma=True needs k .* got strides \(192, 192, 12, 1\)"):
        kv_descriptors(k, k, block_n=16, block_d=16, tma=True, op="attention")
    assert kv_descriptors(k, k, block_n=16, block_d=16, tma=False, op="attention") == (None, None)


@needs_tma
@pytest.mark.parametrize("blocks", [(64, 64), (128, 64)], ids=["b64", "b128x64"])
def test_vertical_slash_tma_equals_index_loads(blocks):
    S = 300
    q, k, v = make_qkv(1, 4, 2, S, S, 64, seed=7)
    g = torch.Generator().manual_seed(1)
    vert = torch.sort(torch.randperm(S, generator=g)[:12]).values.expand(1, 4, 12).contiguous()
    offs = torch.cat([torch.arange(3), 3 + torch.randperm(S - 3, generator=g)[:6]])
    slash = torch.sort(offs).values.expand(1, 4, 9).contiguous()
    index = build_vertical_slash_index(
        vert.to(DEV), slash.to(DEV), seq_len=S, block_m=blocks[0], block_n=blocks[1]
    )
    run = [
        _launch_vertical_slash_fwd(q, k, v, index, scale=0.125, tma=tma) for tma in (False, True)
    ]
    _same(*run)
