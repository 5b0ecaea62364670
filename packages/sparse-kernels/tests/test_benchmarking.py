"""The benchmark suites' helpers: pair counts against brute-force masks, rates and ratios, the
length setting, the provider gates and the row oracle (CPU only)."""

from __future__ import annotations

import types

import pytest
import torch
from sparse_kernels.attention import masked_attention_reference
from sparse_kernels.benchmark_providers import (
    ProviderUnavailable,
    checked_call,
    first_call,
    flex_call,
    ours_impl,
    require_package,
    rows_error,
    summary_lines,
)
from sparse_kernels.benchmarking import (
    Anchor,
    bench_seqs,
    block_list_pairs,
    causal_block_pairs,
    env_info,
    rate_ratio,
    record,
    tflops,
    triangle_pairs,
)
from sparse_kernels.triangle.reference import triangle_mask


def _brute_tile(r0, r1, c0, c1, off):
    return sum(1 for i in range(r0, r1) for j in range(c0, c1) if j <= i + off)


@pytest.mark.parametrize("off", [0, 5, -7, 40])
def test_causal_block_pairs_matches_brute_force(off):
    g = torch.Generator().manual_seed(0)
    r0 = torch.randint(0, 50, (64,), generator=g)
    r1 = r0 + torch.randint(0, 20, (64,), generator=g)
    c0 = torch.randint(0, 60, (64,), generator=g)
    c1 = c0 + torch.randint(-3, 20, (64,), generator=g)  # some empty (c1 <= c0) tiles
    got = causal_block_pairs(r0, r1, c0, c1, off)
    want = [_brute_tile(*map(int, t), off) for t in zip(r0, r1, c0, c1, strict=True)]
    assert got.tolist() == want


def _random_lists(B, H, nqb, nkb, width, seed):
    g = torch.Generator().manual_seed(seed)
    num = torch.randint(0, width + 1, (B, H, nqb), generator=g, dtype=torch.int32)
    idx = torch.stack(
        [torch.randperm(nkb, generator=g)[:width] for _ in range(B * H * nqb)]
    ).reshape(B, H, nqb, width)
    return num, idx.to(torch.int32)


def _dense_from_lists(num, idx, S_Q, S_KV, bm, bn, causal):
    B, H, nqb, W = idx.shape
    m = torch.zeros(B, H, nqb, -(-S_KV // bn), dtype=torch.bool)
    for b in range(B):
        for h in range(H):
            for r in range(nqb):
                m[b, h, r, idx[b, h, r, : num[b, h, r]].long()] = True
    dense = m.repeat_interleave(bm, 2).repeat_interleave(bn, 3)[..., :S_Q, :S_KV]
    if causal:
        i = torch.arange(S_Q)[:, None] + (S_KV - S_Q)
        dense = dense & (torch.arange(S_KV)[None, :] <= i)
    return int(dense.sum())


@pytest.mark.parametrize(
    "S_Q, S_KV, bm, bn, causal",
    [
        pytest.param(97, 97, 16, 16, True, id="S97-b16-causal"),
        pytest.param(100, 130, 32, 16, True, id="SQ100-SKV130-causal"),
        pytest.param(130, 100, 16, 32, True, id="SQ130-SKV100-causal"),
        pytest.param(97, 97, 16, 16, False, id="S97-b16-noncausal"),
    ],
)
def test_block_list_pairs_matches_the_dense_mask(S_Q, S_KV, bm, bn, causal):
    nqb, nkb = -(-S_Q // bm), -(-S_KV // bn)
    num, idx = _random_lists(2, 3, nqb, nkb, min(4, nkb), seed=S_Q + S_KV)
    got = block_list_pairs(
        num, idx, seq_len_q=S_Q, seq_len_kv=S_KV, block_m=bm, block_n=bn, causal=causal
    )
    assert got == _dense_from_lists(num, idx, S_Q, S_KV, bm, bn, causal)


def test_block_list_pairs_rejects_mismatched_lists():
    with pytest.raises(ValueError, match=r"\[B, H, NQB\]"):
        block_list_pairs(
            torch.zeros(1, 2, 3, dtype=torch.int32), torch.zeros(1, 2, 4, 1, dtype=torch.int32),
            seq_len_q=48, seq_len_kv=48, block_m=16, block_n=16, causal=True,
        )  # fmt: skip


@pytest.mark.parametrize(
    "S, sink, window, last",
    [(300, 8, 64, 16), (300, 8, 64, 0), (50, 8, 64, 16), (300, 128, 40, 400), (97, 4, 1, 1)],
    ids=lambda x: str(x),
)
def test_triangle_pairs_matches_the_mask(S, sink, window, last):
    want = int(triangle_mask(S, S, sink=sink, window=window, last=last).sum())
    assert triangle_pairs(S, sink=sink, window=window, last=last) == want


def test_rates_and_ratios():
    assert tflops(2e12, 0.5) == pytest.approx(4.0)
    assert rate_ratio(300.0, 600.0) == pytest.approx(0.5)
    assert rate_ratio(300.0, None) is None
    with pytest.raises(ValueError, match="positive, got 0"):
        tflops(1.0, 0.0)
    with pytest.raises(ValueError, match="positive, got -1"):
        rate_ratio(1.0, -1.0)


def test_warm_up_lasts_its_rounds_and_its_seconds(monkeypatch):
    import sparse_kernels.benchmarking as bm

    clock = [0.0]
    monkeypatch.setattr(bm.time, "perf_counter", lambda: clock[0])

    def call():  # each call takes 0.1 s on the fake clock
        clock[0] += 0.1

    assert bm.warm_up(call, 2, 0.35) == 4  # the seconds decide: 0.4 s after 4 calls
    assert bm.warm_up(call, 6, 0.35) == 6  # the rounds decide
    assert bm.warm_up(call, 1, 0.0) == 1


def test_bench_seqs_reads_names_and_refuses_unknown_ones():
    assert bench_seqs(None) == {"32K": 32768, "128K": 131072}
    assert bench_seqs("512K,1M") == {"512K": 524288, "1M": 1048576}
    with pytest.raises(ValueError, match=r"one of .*got '64K'"):
        bench_seqs("32K,64K")


def _fake_benchmark(median_s, iqr_s=0.0):
    stats = types.SimpleNamespace(median=median_s, iqr=iqr_s)
    return types.SimpleNamespace(stats=types.SimpleNamespace(stats=stats), extra_info={})


def test_record_stores_the_ratio_to_the_fa4_dense_rate():
    bench = _fake_benchmark(0.01, 0.002)
    record(bench, flops_dense=8e12, flops_useful=4e12, anchor=Anchor(800.0, 10.0), seq="32K")
    info = bench.extra_info
    assert info["median_ms"] == pytest.approx(10.0) and info["iqr_ms"] == pytest.approx(2.0)
    assert info["useful_tflops"] == pytest.approx(400.0)
    assert info["dense_equiv_tflops"] == pytest.approx(800.0)
    assert info["ratio_to_fa4_dense"] == pytest.approx(0.5)
    assert info["fa4_dense_missing"] is None and info["seq"] == "32K"
    missing = _fake_benchmark(0.01)
    record(missing, flops_dense=1e12, flops_useful=1e12, anchor=Anchor(None, None, "fa4: gone"))
    assert missing.extra_info["ratio_to_fa4_dense"] is None
    assert missing.extra_info["fa4_dense_missing"] == "fa4: gone"


def test_env_info_names_the_peer_versions():
    from importlib import metadata

    info = env_info()
    assert {"torch", "triton", "date", "flash-attn-4", "minference"} <= set(info)
    try:
        installed = metadata.version("sparse-kernels")
    except metadata.PackageNotFoundError:
        pytest.skip("sparse-kernels runs from a source tree here (not installed): no version")
    assert info["sparse-kernels"] == installed


def test_require_package_names_the_missing_package(monkeypatch):
    import importlib

    def no_such(name):
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(importlib, "import_module", no_such)
    with pytest.raises(ProviderUnavailable, match=r"minference: minference 0\.1\.6 .*not import"):
        require_package("minference")
    with pytest.raises(ProviderUnavailable, match="flex-fa4: flash-attn-4"):
        require_package("flex-fa4")
    require_package("cudnn")  # torch's own: nothing to import
    with pytest.raises(ValueError, match="got 'flex'"):
        require_package("flex")


def test_ours_impl_and_first_call():
    assert ours_impl("ours-fa4") == "fa4"
    with pytest.raises(ValueError, match="got 'fa4'"):
        ours_impl("fa4")

    def cannot():
        raise NotImplementedError("block size 32 is not a multiple of 64")

    with pytest.raises(ProviderUnavailable, match="ours-fa4: block size 32"):
        first_call("ours-fa4", cannot)
    with pytest.raises(NotImplementedError):  # any other provider's error stays an error
        first_call("ours-triton", cannot)
    assert first_call("fa4", lambda: torch.ones(1)).item() == 1.0


def test_flex_call_refuses_an_unknown_provider():
    t = torch.zeros(1, 1, 1, 8)
    with pytest.raises(ValueError, match="got 'flex'"):
        flex_call(t, t, t, None, "flex")


def test_rows_error_is_small_for_the_right_mask_and_large_for_a_wrong_one():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 40, 16, generator=g)
    k, v = torch.randn(2, 1, 2, 40, 16, generator=g)
    full = torch.ones(40, 40, dtype=torch.bool).tril()
    out = masked_attention_reference(q, k, v, full, scale=0.25).out
    rows = full[-8:].expand(2, 8, 40)
    assert rows_error(out, q, k, v, rows) < 1e-6
    assert rows_error(out, q, k, v, rows & (torch.arange(40) >= 20)) > 0.05
    with pytest.raises(ValueError, match="multiple of the GQA group 2"):
        rows_error(out, q, k, v, full[-8:].expand(3, 8, 40))
    fn, err = checked_call("ours-triton", lambda: lambda: out, q, k, v, rows)
    assert fn() is out and err < 1e-6

    def cannot():
        raise NotImplementedError("no vertical-slash op on FA4")

    with pytest.raises(ProviderUnavailable, match="ours-fa4: no vertical-slash"):
        checked_call("ours-fa4", lambda: cannot, q, k, v, rows)


def test_summary_compares_ours_with_the_fastest_peer_of_the_same_op():
    res = {
        ("32K", "ours-auto"): {"median_ms": 2.0, "ratio_to_fa4_dense": 0.9, "same_op": True},
        ("32K", "flex-fa4"): {"median_ms": 3.0, "same_op": True},
        ("32K", "flex-triton"): {"median_ms": 5.0, "same_op": True},
        ("32K", "cudnn"): {"median_ms": 1.0, "same_op": False},  # dense baseline: not a peer
    }
    lines = summary_lines("t", res, ["32K", "128K"])
    assert len(lines) == 3
    assert lines[2].split()[-2:] == ["flex-fa4", "1.50"]
    assert "0.90" in lines[2]
    met = summary_lines("t", res, ["32K"], {"32K": ("flex-fa4", 1.3)})[2]
    assert met.endswith(">= 1.30x flex-fa4: 1.50x, met")
    missed = summary_lines("t", res, ["32K"], {"32K": ("flex-fa4", 2.0)})[2]
    assert missed.endswith(">= 2.00x flex-fa4: 1.50x, missed by 25%")


def test_summary_says_when_a_sample_is_too_spread_for_the_verdict():
    res = {
        ("32K", "ours-auto"): {"median_ms": 2.0, "iqr_ms": 0.1, "same_op": True},
        ("32K", "minference"): {"median_ms": 4.2, "iqr_ms": 0.2, "same_op": True},
    }
    target = {"32K": ("minference", 2.0)}
    assert summary_lines("t", res, ["32K"], target)[2].endswith(": 2.10x, met")
    res[("32K", "ours-auto")]["iqr_ms"] = 0.9  # 45% of the median
    res[("32K", "minference")]["iqr_ms"] = 0.5  # 12%: the wider one is named
    assert summary_lines("t", res, ["32K"], target)[2].endswith(
        ": 2.10x, met; ours-auto's IQR is 45% of its median: not resolved"
    )


def test_summary_judges_the_rate_target_and_profiles_a_miss():
    res = {
        ("32K", "ours-auto"): {
            "median_ms": 2.0, "ratio_to_fa4_dense": 0.72, "same_op": True,
            "kernels_ms": {"fa4_block_sparse": 1.5, "_vertical_slash_fwd": 0.3},
        },
        ("32K", "minference"): {"median_ms": 4.0, "same_op": True},
    }  # fmt: skip
    target = {"32K": ("minference", 1.5)}
    lines = summary_lines("t", res, ["32K"], target, rate_target=0.9)
    assert lines[2].endswith(": 2.00x, met  ours/fa4d >= 0.90: missed by 20%")
    assert lines[3].split() == [
        "ours-auto,", "one", "profiled", "call:", "kernels", "1.80", "of", "2.00", "ms:",
        "fa4_block_sparse", "1.50", "(75%),", "_vertical_slash_fwd", "0.30", "(15%)",
    ]  # fmt: skip
    res[("32K", "ours-auto")]["ratio_to_fa4_dense"] = 0.95
    met = summary_lines("t", res, ["32K"], target, rate_target=0.9)
    assert len(met) == 3 and met[2].endswith("ours/fa4d >= 0.90: met")  # no profile line
    res[("32K", "minference")]["median_ms"] = 2.5  # 1.25x: the peer target is missed
    assert "profiled call" in summary_lines("t", res, ["32K"], target, rate_target=0.9)[3]


def test_vertical_slash_suite_indices_are_valid_and_seeded():
    from sparse_kernels.benchmarking import vertical_slash_suite_indices

    vert, slashes = vertical_slash_suite_indices(1, 3, 4096, 50, 300, local=16)
    assert vert.shape == (1, 3, 50) and set(slashes) == {"local", "random", "clustered"}
    for t in (vert, *slashes.values()):
        assert t.dtype == torch.int32 and bool((t[..., 1:] > t[..., :-1]).all())
        assert int(t.min()) >= 0 and int(t.max()) < 4096
    assert torch.equal(slashes["local"][0, 0], torch.arange(300, dtype=torch.int32))
    assert torch.equal(slashes["random"][..., :16], slashes["local"][..., :16])
    assert slashes["random"].shape == (1, 3, 300) and int(slashes["random"].max()) > 300
    again = vertical_slash_suite_indices(1, 3, 4096, 50, 300, local=16)
    assert torch.equal(again[1]["random"], slashes["random"])
