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
