"""The autotune helpers: length buckets and the per-config timing used by every tuned kernel."""

import pytest
from sparse_kernels._triton import config as C


def test_seq_bucket_is_one_bucket_per_factor_of_four():
    assert [C.seq_bucket(n) for n in (8193, 32768, 32769, 131072, 131073, 524288, 1048576)] == [
        7, 7, 8, 8, 9, 9, 10,
    ]  # fmt: skip
    assert C.seq_bucket(0) == C.seq_bucket(1) == 0


@pytest.mark.parametrize(
    "one_call_ms, quantiles, calls, want",
    [
        (16000.0, (0.5, 0.2, 0.8), 2, [16000.0] * 3),  # a 1M-token call: timed once, not 8 times
        (25.0, None, 2, 25.0),
        (0.5, (0.5, 0.2, 0.8), 2 + 8, [0.4, 0.3, 0.6]),  # short: Triton's repeated benchmark
    ],
)
def test_bench_config_times_long_configs_once(monkeypatch, one_call_ms, quantiles, calls, want):
    n = {"calls": 0}

    def kernel_call():
        n["calls"] += 1

    def time_one(fn):
        fn()
        return one_call_ms

    def triton_bench(fn, q):
        for _ in range(8):  # what triton.testing.do_bench does at the least
            fn()
        return [0.4, 0.3, 0.6]

    monkeypatch.setattr(C, "_time_one_call", time_one)
    monkeypatch.setattr(C, "_triton_bench", triton_bench)
    assert C.bench_config(kernel_call, quantiles) == want
    assert n["calls"] == calls


def test_single_quantile_is_a_float_like_triton(monkeypatch):
    monkeypatch.setattr(C, "_time_one_call", lambda fn: 50.0)
    assert C.bench_config(lambda: None, (0.5,)) == 50.0


def test_every_autotuned_kernel_times_with_bench_config():
    """Each module's autotuned kernels (found by type, so a new one is covered) use bench_config;
    reads Triton's Autotuner._do_bench, present in triton 3.6 and 3.9."""
    import importlib

    found = []
    for mod in ("attention", "block_sparse", "estimate", "permuted", "triangle", "vertical_slash"):
        m = importlib.import_module(f"sparse_kernels.{mod}.triton")
        for name, obj in vars(m).items():
            if type(obj).__name__ == "Autotuner":
                found.append(name)
                assert obj._do_bench is C.bench_config, f"{mod}.{name} does not use bench_config"
    assert len(found) >= 6, found


def test_attention_kernels_tune_per_sequence_bucket():
    """The attention kernels' autotune keys hold the length bucket, so a config tuned at one
    length is not reused at another (block-sparse at 128K: 34.77 ms tuned at 32K, 31.17 ms at
    128K on an H100). Reads Triton's Autotuner.keys, present in triton 3.6 and 3.9."""
    import importlib

    for mod in ("attention", "block_sparse", "permuted", "triangle", "vertical_slash"):
        m = importlib.import_module(f"sparse_kernels.{mod}.triton")
        tuners = [o for o in vars(m).values() if type(o).__name__ == "Autotuner"]
        assert tuners, mod
        for t in tuners:
            assert "SEQ_BUCKET" in t.keys, f"{mod}: autotune key {t.keys} lacks SEQ_BUCKET"


def _triton_runs() -> bool:
    import torch
    from sparse_kernels._validate import interpreter_enabled

    return interpreter_enabled() or torch.cuda.is_available()


@pytest.mark.skipif(not _triton_runs(), reason="needs the Triton interpreter or a CUDA GPU")
def test_launchers_pass_the_key_length_bucket(monkeypatch):
    """Each attention launcher hands its kernel ``seq_bucket(S_KV)``: a spy on every module's
    ``seq_bucket`` records the lengths asked for while each op runs once through Triton."""
    import importlib

    import torch
    from sparse_kernels import (
        attention,
        block_sparse_attention,
        permuted_block_sparse_attention,
        triangle_attention,
        vertical_slash_attention,
    )
    from sparse_kernels.testing import default_device, make_qkv
    from torch.nn.attention.flex_attention import create_block_mask

    dev = default_device()
    S = 192
    dtype = torch.float32 if dev.type == "cpu" else torch.float16
    q, k, v = make_qkv(1, 2, 1, S, S, 32, dtype=dtype, device=dev, seed=3)
    nb = S // 64
    idx = torch.arange(nb, dtype=torch.int32, device=dev).expand(1, 2, nb, nb).contiguous()
    cnt = torch.arange(1, nb + 1, dtype=torch.int32, device=dev).expand(1, 2, nb).contiguous()
    bm = create_block_mask(lambda b, h, i, j: i >= j, None, None, S, S, device=dev.type)
    one = torch.tensor([[[0]]], dtype=torch.int32, device=dev).expand(1, 2, 1).contiguous()
    calls = {
        "attention": lambda: attention(q, k, v, impl="triton"),
        "triangle": lambda: triangle_attention(q, k, v, sink=4, window=16, last=8, impl="triton"),
        "block_sparse": lambda: block_sparse_attention(q, k, v, bm, impl="triton"),
        "permuted": lambda: permuted_block_sparse_attention(
            q, k, v, kv_block_indices=idx, kv_block_counts=cnt, impl="triton"
        ),
        "vertical_slash": lambda: vertical_slash_attention(q, k, v, one, one, impl="triton"),
    }
    for mod_name, call in calls.items():
        mod = importlib.import_module(f"sparse_kernels.{mod_name}.triton")
        seen = []
        real = mod.seq_bucket
        monkeypatch.setattr(
            mod, "seq_bucket", lambda n, real=real, seen=seen: seen.append(n) or real(n)
        )
        call()
        assert seen == [S], f"{mod_name}: seq_bucket called with {seen}, expected [{S}]"
