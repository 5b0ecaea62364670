import pytest
import torch
from sparse_kernels import a_shape_attention, triangle_attention
from sparse_kernels.attention import masked_attention_reference
from sparse_kernels.testing import (
    assert_close_budget,
    default_device,
    kernel_dtypes,
    make_qkv,
    poison_,
)
from sparse_kernels.triangle import triangle_attention_reference, triangle_mask
from sparse_kernels.triangle.triton import _launch_triangle_fwd

DEV = default_device()

# (B, H, H_KV, S_Q, S_KV, D, sink, window, last)
CASES = [
    pytest.param(1, 2, 2, 1, 1, 64, 4, 16, 8, id="S1"),
    pytest.param(2, 4, 1, 97, 97, 64, 4, 16, 8, id="S97-gqa4-sink4-win16-last8"),
    pytest.param(1, 7, 1, 300, 300, 80, 8, 64, 40, id="S300-gqa7-D80-last40"),
    pytest.param(1, 2, 2, 1025, 1025, 64, 8, 100, 128, id="S1025-sink8-win100-last128"),
    pytest.param(1, 4, 2, 300, 300, 96, 0, 33, 0, id="S300-ashape-nosink"),
    pytest.param(1, 2, 1, 200, 200, 128, 3, 500, 0, id="S200-window-covers-all"),
    pytest.param(1, 2, 2, 97, 97, 64, 5, 7, 200, id="S97-last-covers-all"),
    pytest.param(1, 2, 2, 70, 250, 64, 8, 32, 16, id="SQ70-SKV250"),
    pytest.param(1, 2, 2, 150, 70, 64, 8, 32, 16, id="SQ150-SKV70-emptyrows"),
    # Sink tiles of 64 and 128 keys (sink_end 64 / 256, wider than a key block), narrow windows.
    pytest.param(1, 2, 2, 600, 600, 64, 40, 64, 16, id="S600-sink40-win64"),
    pytest.param(1, 2, 1, 700, 700, 64, 130, 96, 32, id="S700-sink130-win96"),
]
GPU_CASES = [
    pytest.param(
        1, 28, 4, 8192, 8192, 128, 8, 512, 128, id="S8192-qwen-shape", marks=pytest.mark.gpu
    ),
    pytest.param(
        1, 32, 8, 16384, 16384, 128, 8, 512, 128, id="S16384-llama-shape", marks=pytest.mark.gpu
    ),
    pytest.param(
        2, 8, 8, 3000, 5000, 64, 4, 300, 77, id="B2-SQ3000-SKV5000-D64", marks=pytest.mark.gpu
    ),
    # vlm-accel's TriangleMix layers: sink 128 with D=128 (several sink tiles).
    pytest.param(
        1, 28, 4, 8192, 8192, 128, 128, 4096, 128, id="S8192-sink128-D128", marks=pytest.mark.gpu
    ),
]


def _check(B, H, H_KV, S_Q, S_KV, D, sink, window, last, dtype, chunk=None):
    q, k, v = make_qkv(B, H, H_KV, S_Q, S_KV, D, dtype=dtype, device=DEV, seed=S_Q + window)
    out, lse = _launch_triangle_fwd(
        q, k, v, sink=sink, window=window, last=last, scale=D**-0.5, chunk=chunk
    )
    gold = triangle_attention_reference(
        q, k, v, sink=sink, window=window, last=last, compute_dtype=torch.float64
    )
    low = triangle_attention_reference(
        q, k, v, sink=sink, window=window, last=last, compute_dtype=q.dtype
    )
    assert_close_budget(out, low.out, gold.out, dtype=dtype)
    assert_close_budget(lse, low.lse, gold.lse, dtype=torch.float32, floor=1e-3, name="lse")


@pytest.mark.parametrize("dtype", kernel_dtypes(), ids=str)
@pytest.mark.parametrize("B,H,H_KV,S_Q,S_KV,D,sink,window,last", CASES + GPU_CASES)
def test_triangle_matches_reference(B, H, H_KV, S_Q, S_KV, D, sink, window, last, dtype):
    _check(B, H, H_KV, S_Q, S_KV, D, sink, window, last, dtype)


@pytest.mark.parametrize("chunk", [128, 256, 1024])
def test_last_rows_split_into_many_chunks(chunk):
    # S_KV = 1025 keys in chunks of 128 -> 9 partial results per last row, merged by LSE.
    _check(1, 4, 2, 1025, 1025, 64, 8, 100, 130, torch.float32, chunk=chunk)


def test_public_op_and_a_shape_alias():
    q, k, v = make_qkv(1, 2, 2, 97, 97, 64, dtype=torch.float32, device=DEV)
    a = a_shape_attention(q, k, v, sink=4, window=16, impl="triton")
    t = triangle_attention(q, k, v, sink=4, window=16, last=0, impl="triton")
    assert torch.equal(a.out, t.out) and torch.equal(a.lse, t.lse)
    r = triangle_attention(q, k, v, sink=4, window=16, last=0, impl="reference")
    torch.testing.assert_close(t.out, r.out, atol=1e-5, rtol=1e-5)


def test_mask_matches_independent_construction():
    S_Q, S_KV, sink, window, last = 37, 50, 3, 6, 5
    m = triangle_mask(S_Q, S_KV, sink=sink, window=window, last=last)
    want = torch.zeros(S_Q, S_KV, dtype=torch.bool)
    for i in range(S_Q):
        p = i + S_KV - S_Q
        for j in range(S_KV):
            if j <= p and (j < sink or p - j < window or i >= S_Q - last):
                want[i, j] = True
    assert torch.equal(m, want)


def test_reference_row_chunking_is_exact():
    q, k, v = make_qkv(1, 2, 1, 300, 300, 32, dtype=torch.float64, device="cpu")
    a = triangle_attention_reference(q, k, v, sink=4, window=20, last=10, row_chunk=64)
    mask = triangle_mask(300, 300, sink=4, window=20, last=10)
    b = masked_attention_reference(q, k, v, mask, scale=32**-0.5)
    torch.testing.assert_close(a.out, b.out, atol=1e-12, rtol=0)
    torch.testing.assert_close(a.lse, b.lse, atol=1e-12, rtol=0)


def test_reference_default_chunk_follows_the_score_budget(monkeypatch):
    from sparse_kernels.triangle import reference as ref

    q, k, v = make_qkv(1, 2, 1, 300, 300, 32, dtype=torch.float64, device="cpu")
    seen = []
    real = ref.masked_attention_reference

    def spy(q_, k_, v_, mask, **kw):
        seen.append(q_.shape[2])
        return real(q_, k_, v_, mask, **kw)

    monkeypatch.setattr(ref, "masked_attention_reference", spy)
    budget = 2 * 300 * 50  # 50 rows of 2 heads x 300 keys
    a = ref.triangle_attention_reference(q, k, v, sink=4, window=20, last=10, score_budget=budget)
    assert seen == [50] * 6
    b = ref.triangle_attention_reference(q, k, v, sink=4, window=20, last=10, row_chunk=300)
    torch.testing.assert_close(a.out, b.out, atol=1e-12, rtol=0)
    torch.testing.assert_close(a.lse, b.lse, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="row_chunk: expected a positive row count, got 0"):
        ref.triangle_attention_reference(q, k, v, sink=4, window=20, row_chunk=0)
    with pytest.raises(ValueError, match="score_budget: expected a positive element count, got 0"):
        ref.triangle_attention_reference(q, k, v, sink=4, window=20, score_budget=0)


@pytest.mark.parametrize(
    "kw,exc,match",
    [
        pytest.param(dict(sink=-1, window=4, last=0), ValueError, "sink", id="neg-sink"),
        pytest.param(dict(sink=0, window=0, last=0), ValueError, "window", id="zero-window"),
        pytest.param(dict(sink=0, window=4, last=-2), ValueError, "last", id="neg-last"),
        pytest.param(dict(sink=1.5, window=4, last=0), TypeError, "sink", id="float-sink"),
    ],
)
def test_bad_parameters(kw, exc, match):
    q, k, v = make_qkv(1, 2, 2, 16, 16, 64, dtype=torch.float32, device=DEV)
    with pytest.raises(exc, match=match):
        triangle_attention(q, k, v, **kw)


@pytest.mark.gpu
def test_matches_flex_attention_on_gpu():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    S, sink, window, last = 4096, 8, 512, 128
    q, k, v = make_qkv(1, 8, 2, S, S, 128, dtype=torch.bfloat16, device="cuda")

    def mask_mod(b, h, i, j):
        return (j <= i) & ((j < sink) | (i - j < window) | (i >= S - last))

    bm = create_block_mask(mask_mod, None, None, S, S, device="cuda")
    ref = flex_attention(q, k, v, block_mask=bm, enable_gqa=True)
    ours = triangle_attention(q, k, v, sink=sink, window=window, last=last)
    err = ((ours.out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < 1e-2, err


def _run_config(q, k, v, cfg, *, sink, window, L, chunk):
    """One launch of the fused kernel with an explicit config plus the merge, on outputs poisoned
    with NaN; returns (out, lse)."""
    import triton
    from sparse_kernels._triton.config import block_d
    from sparse_kernels.triangle import triton as tri

    cfg = dict(cfg)
    w, st = cfg.pop("num_warps", 4), cfg.pop("num_stages", 1)
    B, H, S_Q, D = q.shape
    H_KV, S_KV = k.shape[1], k.shape[2]
    L = min(L, S_Q)
    n_chunks = triton.cdiv(S_KV, chunk) if L > 0 else 0
    out = poison_(torch.empty_like(q))
    lse = poison_(torch.empty(B, H, S_Q, device=q.device))
    ws_out = torch.empty(B * H, max(n_chunks, 1), max(L, 1), D, device=q.device)
    ws_lse = torch.empty(B * H, max(n_chunks, 1), max(L, 1), device=q.device)
    grid = tri.fwd_grid(B, H, S_Q, L, n_chunks, cfg["BLOCK_M"])
    tri._triangle_fwd_kernel[grid](
        q, k, v, out, lse, ws_out, ws_lse, None, None, *q.stride(), *k.stride(), *v.stride(),
        *out.stride(), B, H, H // H_KV, S_Q, S_KV, D**-0.5, sink, window, L, n_chunks, chunk,
        D=D, BLOCK_D=block_d(D), IEEE=q.dtype == torch.float32, SINK_N=tri.sink_tile(sink),
        TMA=False, num_warps=w, num_stages=st, **cfg,
    )  # fmt: skip
    if L > 0:
        tri._triangle_merge_kernel[(triton.cdiv(L, 32), B * H)](
            ws_out, ws_lse, out, lse, *out.stride(), H, S_Q, L, n_chunks,
            D=D, BLOCK_D=block_d(D), BLOCK_R=32,
        )  # fmt: skip
    return out, lse


@pytest.mark.parametrize("sink,window", [(8, 100), (40, 64), (0, 33), (130, 96)])
def test_explicit_config_is_exact(sink, window):
    # One explicit tile config, one or several sink tiles (16 / 32 keys), on the
    # interpreter config (CPU) or a GPU tile.
    if DEV.type == "cpu":
        cfg = dict(BLOCK_M=64, BLOCK_N=32)
        dtype, S, D = torch.float32, 400, 64
    else:
        cfg = dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
        dtype, S, D = torch.bfloat16, 3000, 128
    q, k, v = make_qkv(1, 4, 2, S, S, D, dtype=dtype, device=DEV, seed=sink + window)
    ref = dict(sink=sink, window=window, last=40)
    gold = triangle_attention_reference(q, k, v, **ref, compute_dtype=torch.float64)
    low = triangle_attention_reference(q, k, v, **ref, compute_dtype=q.dtype)
    out, _ = _run_config(q, k, v, cfg, sink=sink, window=window, L=40, chunk=128)
    assert_close_budget(out, low.out, gold.out, dtype=dtype)


@pytest.mark.gpu
def test_every_candidate_config_is_correct():
    # A tuned table may name any candidate: each one must compute the same function.
    from sparse_kernels.triangle.triton import SPEC
    from triton.runtime.errors import OutOfResources

    S, L = 3000, 130
    ref = dict(sink=8, window=300, last=L)
    q, k, v = make_qkv(1, 8, 2, S, S, 128, dtype=torch.bfloat16, device=DEV, seed=3)
    gold = triangle_attention_reference(q, k, v, **ref, compute_dtype=torch.float64)
    low = triangle_attention_reference(q, k, v, **ref, compute_dtype=q.dtype)
    skipped = []
    for cfg in SPEC.candidates:
        try:
            out, _ = _launch_triangle_fwd(q, k, v, **ref, scale=128**-0.5, chunk=1024, config=cfg)
        except OutOfResources:
            # The tuner skips a candidate that overflows this GPU's shared memory the same way.
            skipped.append(str(cfg))
            continue
        assert_close_budget(out, low.out, gold.out, dtype=torch.bfloat16, name=str(cfg))
    # The config of a GPU without a tuned entry must run.
    assert str(SPEC.safe(())) not in skipped, f"the safe config does not fit this GPU: {skipped}"


def test_launch_config_key_tile_must_divide_the_chunks():
    from sparse_kernels.tuning import LaunchConfig

    q, k, v = make_qkv(1, 2, 1, 128, 128, 64, dtype=torch.float16, device="meta", seed=0)
    wide = LaunchConfig.of(BLOCK_M=64, BLOCK_N=256, num_warps=4, num_stages=3)
    with pytest.raises(ValueError, match=r"BLOCK_N must divide 128, got BLOCK_M=64 BLOCK_N=256"):
        _launch_triangle_fwd(q, k, v, sink=4, window=8, last=0, scale=0.125, config=wide)


# Program order (heads of one KV group side by side, split programs first) on forced tile configs,
# any backend: (B, H, H_KV, S_Q, S_KV, D, sink, window, last).
ORDER_CASES = [
    pytest.param(1, 7, 1, 300, 300, 64, 8, 64, 40, id="gqa7-S300-last40"),
    pytest.param(1, 14, 2, 200, 200, 80, 8, 48, 24, id="H14-HKV2-D80"),
    pytest.param(2, 8, 2, 150, 280, 64, 4, 40, 20, id="B2-gqa4-SQ150-SKV280"),
    pytest.param(1, 3, 3, 200, 200, 64, 8, 50, 30, id="mha-H3"),
    pytest.param(1, 6, 2, 250, 250, 64, 0, 33, 0, id="gqa3-nosink-last0"),
    pytest.param(1, 4, 1, 97, 97, 64, 5, 7, 200, id="gqa4-last-covers-all"),
    pytest.param(1, 4, 2, 300, 300, 64, 40, 16, 16, id="sink40-win16"),
    pytest.param(1, 4, 2, 150, 70, 64, 8, 32, 16, id="SQ150-SKV70-emptyrows"),
    # B > 1, two KV groups, last rows over several row tiles and key chunks (chunk 128).
    pytest.param(2, 8, 2, 200, 300, 64, 8, 40, 70, id="B2-gqa4-last70-3chunks"),
]
ORDER = [
    pytest.param(*case.values, cfg, id=f"{case.id}-{name}")
    for case in ORDER_CASES
    for name, cfg in [
        ("64x32", dict(BLOCK_M=64, BLOCK_N=32)),
        ("32x16", dict(BLOCK_M=32, BLOCK_N=16)),
    ]
]


@pytest.mark.parametrize("B,H,H_KV,S_Q,S_KV,D,sink,window,last,cfg", ORDER)
def test_forced_config_matches_reference(B, H, H_KV, S_Q, S_KV, D, sink, window, last, cfg):
    dtype = torch.float32 if DEV.type == "cpu" else torch.bfloat16
    q, k, v = make_qkv(B, H, H_KV, S_Q, S_KV, D, dtype=dtype, device=DEV, seed=S_Q + H)
    ref = dict(sink=sink, window=window, last=last)
    gold = triangle_attention_reference(q, k, v, **ref, compute_dtype=torch.float64)
    low = triangle_attention_reference(q, k, v, **ref, compute_dtype=q.dtype)
    out, lse = _run_config(q, k, v, cfg, sink=sink, window=window, L=last, chunk=128)
    assert_close_budget(out, low.out, gold.out, dtype=dtype)
    assert_close_budget(lse, low.lse, gold.lse, dtype=torch.float32, floor=1e-3, name="lse")


def test_window_rows_with_very_negative_scores_are_not_emptied():
    """Without a sink, a row's first key tile can be fully outside its window; a later tile whose
    scores are all very negative (here about -100 after scaling) must still set the row's maximum
    (exp2 of them against a maximum of 0 underflows and empties the row)."""
    B, H, S, D = 1, 2, 128, 16
    dtype = torch.float16
    g = torch.Generator().manual_seed(0)
    q = torch.full((B, H, S, D), 8.0, dtype=dtype).to(DEV)
    k = (-8.0 + 0.01 * torch.randn(B, H, S, D, generator=g)).to(dtype).to(DEV)
    v = torch.randn(B, H, S, D, generator=g).to(dtype).to(DEV)
    out = triangle_attention(q, k, v, sink=0, window=16, last=0, impl="triton")
    ref = triangle_attention(q, k, v, sink=0, window=16, last=0, impl="reference")
    assert torch.isfinite(out.lse).all()
    torch.testing.assert_close(out.lse, ref.lse, rtol=0, atol=1e-2)
    torch.testing.assert_close(out.out.float(), ref.out.float(), rtol=0, atol=1e-2)
