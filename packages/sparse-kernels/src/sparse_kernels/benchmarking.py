"""Helpers for the pytest-benchmark suites: GPU timing, environment facts and FLOP counts."""

from __future__ import annotations

import datetime
import math
import platform
from collections.abc import Callable

import torch


def env_info() -> dict[str, str]:
    """The facts a benchmark figure needs beside it: GPU, versions, date."""
    import triton

    info = {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = str(torch.version.cuda)
    return info


def causal_pairs(S_Q: int, S_KV: int) -> int:
    """Number of (query, key) pairs of causal attention with the DESIGN.md alignment."""
    off = S_KV - S_Q
    total = 0
    # rows with position p = i + off see min(p + 1, S_KV) keys (0 if p < 0)
    lo = max(0, -off)
    n = S_Q - lo
    first = lo + off + 1
    last = S_Q - 1 + off + 1
    total = (first + last) * n // 2 if n > 0 else 0
    return total


def attention_flops(B: int, H: int, pairs: int, D: int) -> float:
    """Two matmuls (QK^T and PV) of 2 FLOPs per multiply-add over the attended pairs."""
    return 4.0 * B * H * pairs * D


def cuda_time_ms(fn: Callable[[], object], *, warmup: int = 3, rep: int = 10) -> float:
    """Median wall time of ``fn`` on the GPU in ms, measured with CUDA events."""
    times = cuda_times_ms(fn, warmup=warmup, rep=rep)
    return times[len(times) // 2]


def cuda_times_ms(fn: Callable[[], object], *, warmup: int = 3, rep: int = 10) -> list[float]:
    """The ``rep`` wall times of ``fn`` on the GPU in ms (CUDA events, the GPU idle at each
    start), sorted."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rep):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)


def run_benchmark(benchmark, fn: Callable[[], object], *, rounds: int = 10, warmup_rounds: int = 2):
    """Time ``fn`` with pytest-benchmark, the GPU synchronised inside the timed call."""

    def call():
        fn()
        torch.cuda.synchronize()

    return benchmark.pedantic(call, rounds=rounds, warmup_rounds=warmup_rounds, iterations=1)


def cudnn_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The dense baseline: causal SDPA forced onto cuDNN, K/V repeated for GQA once, outside the
    timed call."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rep = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)

    def run():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, kk, vv, is_causal=True)

    return run


def bench_rounds(S: int) -> dict[str, int]:
    """Rounds for ``run_benchmark`` by sequence length: fewer where one call takes seconds."""
    if S >= 524288:
        return dict(rounds=2, warmup_rounds=1)
    return dict(rounds=5 if S >= 131072 else 10, warmup_rounds=2)


def record(benchmark, *, flops_dense: float, flops_useful: float, **extra) -> None:
    """Store TFLOP/s (from the median) and the environment in ``benchmark.extra_info``."""
    med = benchmark.stats.stats.median
    benchmark.extra_info.update(env_info())
    benchmark.extra_info["median_ms"] = med * 1e3
    benchmark.extra_info["dense_equiv_tflops"] = flops_dense / med / 1e12
    benchmark.extra_info["useful_tflops"] = flops_useful / med / 1e12
    if torch.cuda.is_available():
        benchmark.extra_info["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    benchmark.extra_info.update(extra)


def clustered_vertical_slash_indices(
    B: int,
    H: int,
    S: int,
    n_vertical: int,
    n_slash: int,
    *,
    local: int = 64,
    run: int = 64,
    seed: int = 1,
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic MInference-like Vertical-Slash indices (int32, sorted): ``n_vertical`` columns
    uniform over ``[0, S)``; slashes = the ``local`` offsets ``0..local-1`` plus runs of ``run``
    adjacent offsets starting at log-uniform points of ``[local, S)`` (estimated slashes
    cluster; single slashes spread over ``[0, S)`` would each cost a band of keys per row after
    block rounding and make the pattern nearly dense). Returns ``[B, H, NV]``, ``[B, H, NS]``."""
    g = torch.Generator().manual_seed(seed)
    vert = torch.rand(B * H, S, generator=g).topk(n_vertical, dim=-1).indices
    vert = vert.sort(-1).values.to(torch.int32).reshape(B, H, n_vertical)
    rows = []
    for _ in range(B * H):
        chosen = dict.fromkeys(range(min(local, n_slash)))
        while len(chosen) < n_slash:
            u = float(torch.rand((), generator=g))
            c = int(math.exp(math.log(local) + u * math.log(S / local)))
            for o in range(c, min(c + run, S)):
                if len(chosen) < n_slash:
                    chosen.setdefault(o)
        rows.append(torch.tensor(sorted(chosen)))
    slash = torch.stack(rows).to(torch.int32).reshape(B, H, n_slash)
    return vert.to(device), slash.to(device)
