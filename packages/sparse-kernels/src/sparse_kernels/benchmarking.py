"""Helpers for the pytest-benchmark suites: GPU timing, environment facts, FLOP counts and
rates. The peer providers the attention suites compare against live in
:mod:`sparse_kernels.benchmark_providers`."""

from __future__ import annotations

import dataclasses
import datetime
import math
import platform
import time
from collections.abc import Callable
from importlib import metadata
from types import MappingProxyType

import torch

from .kernel_profile import kernel_times_ms, top_kernels

# Distributions whose versions sit beside every figure ("not installed" is recorded as None).
VERSIONED = ("sparse-kernels", "flash-attn-4", "nvidia-cutlass-dsl", "minference")
SEQ_LENGTHS = MappingProxyType({"32K": 32768, "128K": 131072, "512K": 524288, "1M": 1048576})
DEFAULT_SEQS = "32K,128K"


def env_info() -> dict[str, str | None]:
    """The facts a benchmark figure needs beside it: GPU, versions, date."""
    import triton

    info: dict[str, str | None] = {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
    }
    for dist in VERSIONED:
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = str(torch.version.cuda)
    return info


def bench_seqs(names: str | None) -> dict[str, int]:
    """The lengths a suite runs, from ``SPARSE_KERNELS_BENCH_SEQS`` (e.g. ``"32K,128K,1M"``;
    ``None`` or empty gives 32K and 128K)."""
    picked = {}
    for name in (names or DEFAULT_SEQS).split(","):
        if name.strip() not in SEQ_LENGTHS:
            raise ValueError(
                f"SPARSE_KERNELS_BENCH_SEQS: each name must be one of {list(SEQ_LENGTHS)}, "
                f"got {name!r} in {names!r}"
            )
        picked[name.strip()] = SEQ_LENGTHS[name.strip()]
    return picked


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


def _clamped_prefix_sum(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``sum(min(t, w) for t in 1..x)`` elementwise (0 where ``x <= 0``), int64."""
    x = x.clamp_min(0)
    return torch.where(x <= w, x * (x + 1) // 2, w * (w + 1) // 2 + (x - w) * w)


def causal_block_pairs(
    row0: torch.Tensor, row1: torch.Tensor, col0: torch.Tensor, col1: torch.Tensor, offset: int
) -> torch.Tensor:
    """Pairs ``(i, j)`` with ``row0 <= i < row1``, ``col0 <= j < col1`` and ``j <= i + offset``
    (the causal rule of DESIGN.md with ``offset = S_KV - S_Q``), elementwise over broadcast
    int tensors, in closed form: nothing of size rows x keys is built."""
    row0, row1, col0, col1 = (torch.as_tensor(t).to(torch.int64) for t in (row0, row1, col0, col1))
    w = (col1 - col0).clamp_min(0)
    # row i sees clamp(i + offset + 1 - col0, 0, w) keys of the tile
    return _clamped_prefix_sum(row1 + offset - col0, w) - _clamped_prefix_sum(
        row0 + offset - col0, w
    )


def block_list_pairs(
    num_blocks: torch.Tensor,
    indices: torch.Tensor,
    *,
    seq_len_q: int,
    seq_len_kv: int,
    block_m: int,
    block_n: int,
    causal: bool,
) -> int:
    """(query, key) pairs computed over the tiles of one block list, FlexAttention's layout
    (``num_blocks [B', H', NQB]``, ``indices [B', H', NQB, W]``, the first ``num_blocks`` entries
    of a row valid), summed over ``B'`` and ``H'``; tiles are cut at the sequence ends and, when
    ``causal``, only pairs with ``j <= i + S_KV - S_Q`` count. Call it once for a BlockMask's
    partial list and once for its full list. Heads are counted one at a time, so a 1M-token
    list costs one head's ``[NQB, W]`` of int64 at a time."""
    if num_blocks.shape != indices.shape[:-1] or indices.dim() != 4:
        raise ValueError(
            f"block_list_pairs: num_blocks [B, H, NQB] and indices [B, H, NQB, W] must agree, "
            f"got {tuple(num_blocks.shape)} and {tuple(indices.shape)}"
        )
    nqb, W = indices.shape[-2], indices.shape[-1]
    dev = indices.device
    row0 = (torch.arange(nqb, device=dev) * block_m)[:, None]
    row1 = torch.clamp(row0 + block_m, max=seq_len_q)
    valid_slot = torch.arange(W, device=dev)
    total = 0
    for b in range(indices.shape[0]):
        for h in range(indices.shape[1]):
            col0 = indices[b, h].to(torch.int64) * block_n
            col1 = torch.clamp(col0 + block_n, max=seq_len_kv)
            if causal:
                pairs = causal_block_pairs(row0, row1, col0, col1, seq_len_kv - seq_len_q)
            else:
                pairs = (row1 - row0) * (col1 - col0).clamp_min(0)
            valid = valid_slot < num_blocks[b, h, :, None]
            total += int((pairs * valid).sum())
    return total


def triangle_pairs(S: int, *, sink: int, window: int, last: int) -> int:
    """Pairs of one head of ``triangle_attention`` (``S_Q == S_KV == S``): row ``i`` attends
    ``j <= i`` with ``j < sink`` or ``i - j < window``, and the last ``last`` rows attend every
    ``j <= i``. ``last=0`` is the A-shape."""
    a_rows = max(0, S - last)
    t = torch.tensor
    # A-shape rows: min(i + 1, window) keys in the window, plus the sink keys left of it
    # (min(sink, i - window + 1) of them once i >= window)
    local = _clamped_prefix_sum(t(a_rows), t(window))
    sinks = _clamped_prefix_sum(t(a_rows - window), t(sink))
    return int(local + sinks) + causal_pairs(S, S) - causal_pairs(a_rows, a_rows)


def tflops(flops: float, seconds: float) -> float:
    """TFLOP/s of ``flops`` done in ``seconds``."""
    if not seconds > 0:
        raise ValueError(f"tflops: seconds must be positive, got {seconds}")
    return flops / seconds / 1e12


def rate_ratio(rate: float, anchor: float | None) -> float | None:
    """``rate / anchor`` (e.g. useful TFLOP/s over FA4's dense rate); ``None`` without an
    anchor (its package missing)."""
    if anchor is None:
        return None
    if not anchor > 0:
        raise ValueError(f"rate_ratio: the anchor rate must be positive, got {anchor}")
    return rate / anchor


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


# Seconds of warm-up calls before any timed one. On an H100 the first provider of each 128K case
# of bench_triangle.py, a 3-4 ms call after 3 warm-up calls, timed 6-15% slower than the same
# kernel timed next; a few calls of a short op are no warm-up for a GPU that sat idle during the
# case's setup (inputs, index build, oracle check).
WARMUP_S = 0.5


def warm_up(call: Callable[[], object], rounds: int, seconds: float) -> int:
    """Call ``call`` at least ``rounds`` times and until ``seconds`` have passed; return the
    number of calls."""
    n, start = 0, time.perf_counter()
    while n < rounds or time.perf_counter() - start < seconds:
        call()
        n += 1
    return n


def run_benchmark(
    benchmark,
    fn: Callable[[], object],
    *,
    rounds: int = 10,
    warmup_rounds: int = 2,
    warmup_s: float = WARMUP_S,
):
    """Time ``fn`` with pytest-benchmark, the GPU synchronised inside the timed call, after a
    warm-up of at least ``warmup_rounds`` calls and ``warmup_s`` seconds (:func:`warm_up`)."""

    def call():
        fn()
        torch.cuda.synchronize()

    warm_up(call, warmup_rounds, warmup_s)
    return benchmark.pedantic(call, rounds=rounds, iterations=1)


def run_length_benchmark(benchmark, fn: Callable[[], object], S: int, *, profile: bool = False):
    """:func:`run_benchmark` with :func:`bench_rounds` for length ``S``, the peak-memory counter
    reset first (``record`` reads it). ``profile``: then one more call under the profiler, its
    longest kernels stored as ``extra_info["kernels_ms"]``
    (:func:`~sparse_kernels.kernel_profile.kernel_times_ms`)."""
    torch.cuda.reset_peak_memory_stats()
    result = run_benchmark(benchmark, fn, **bench_rounds(S))
    if profile:
        benchmark.extra_info["kernels_ms"] = top_kernels(kernel_times_ms(fn))
    return result


def cudnn_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The dense baseline: causal SDPA forced onto cuDNN, K/V repeated for GQA once, outside the
    timed call."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kk, vv = _repeat_kv(q, k, v)

    def run():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, kk, vv, is_causal=True)

    return run


def bench_rounds(S: int) -> dict[str, int]:
    """Rounds for ``run_benchmark`` by sequence length: fewer where one call takes seconds. Its
    warm-up also lasts at least :data:`WARMUP_S` seconds, whatever the calls' length."""
    if S >= 524288:
        return dict(rounds=2, warmup_rounds=1)
    if S >= 131072:
        return dict(rounds=5, warmup_rounds=3)
    return dict(rounds=10, warmup_rounds=10)


@dataclasses.dataclass(frozen=True)
class Anchor:
    """FA4's dense causal rate on a suite's inputs, measured in the same process: what every
    provider's useful TFLOP/s is divided by. ``tflops`` is ``None`` when FA4 cannot run here,
    and ``reason`` says why."""

    tflops: float | None
    median_ms: float | None
    reason: str | None = None


def record(
    benchmark, *, flops_dense: float, flops_useful: float, anchor: Anchor | None = None, **extra
) -> None:
    """Store the median and interquartile range in ms, TFLOP/s (from the median), the ratio of the
    useful rate to ``anchor``'s (when given) and the environment in ``benchmark.extra_info``."""
    med = benchmark.stats.stats.median
    info = benchmark.extra_info
    info.update(env_info())
    info["median_ms"] = med * 1e3
    info["iqr_ms"] = benchmark.stats.stats.iqr * 1e3
    info["dense_equiv_tflops"] = tflops(flops_dense, med)
    info["useful_tflops"] = tflops(flops_useful, med)
    if anchor is not None:
        info["fa4_dense_tflops"] = anchor.tflops
        info["fa4_dense_ms"] = anchor.median_ms
        info["ratio_to_fa4_dense"] = rate_ratio(info["useful_tflops"], anchor.tflops)
        info["fa4_dense_missing"] = anchor.reason
    if torch.cuda.is_available():
        info["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    info.update(extra)


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


def vertical_slash_suite_indices(
    B: int,
    H: int,
    S: int,
    n_vertical: int,
    n_slash: int,
    *,
    local: int = 64,
    run: int = 64,
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The vertical-slash suite's indices (int32, sorted): the verticals of
    :func:`clustered_vertical_slash_indices` (seed 1) and three slash sets, ``[B, H, n_slash]``
    each: ``"local"`` (offsets ``0 .. n_slash - 1``), ``"random"`` (``0 .. local - 1`` plus
    distinct offsets uniform over ``[local, S)``, seed 2) and ``"clustered"`` (that function's)."""
    vert, clustered = clustered_vertical_slash_indices(
        B, H, S, n_vertical, n_slash, local=local, run=run, seed=1, device=device
    )
    g = torch.Generator().manual_seed(2)
    far = [
        torch.randperm(S - local, generator=g)[: n_slash - local].sort().values
        for _ in range(B * H)
    ]
    rnd = torch.stack([torch.cat([torch.arange(local), local + r]) for r in far])
    slashes = {
        "local": torch.arange(n_slash, device=device, dtype=torch.int32).repeat(B, H, 1),
        "random": rnd.to(device, torch.int32).reshape(B, H, n_slash),
        "clustered": clustered,
    }
    return vert, slashes


def _repeat_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """K/V repeated to q's head count, for peers without GQA (done once, outside timed calls)."""
    rep = q.shape[1] // k.shape[1]
    return k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
