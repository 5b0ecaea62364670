"""Where the host time of the fused Grid planner goes (GPU): per-stage host times of
``plan_layer`` + run split at one length (medians, the GPU idle at each start), a cProfile of
the same call, and the host cost of a Triton launch by argument count and launch path, of a
CUDA allocation, a split and a view. Qwen2.5-VL-7B attention shape, the planted video of
``bench_grid.py``.

    python3 scripts/grid_host_profile.py --seq 131072
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch
import triton
import triton.language as tl
from _load import load_repo_module
from sparse_patterns import Grid, HeadConfig, plan_layer


def _stages(fn, targets: list[tuple[object, str]], n: int) -> dict:
    """Median inclusive host time (ms) of each wrapped function per call of ``fn``."""
    acc: dict[str, list[float]] = {}
    per: dict[str, float] = {}
    saved = []
    for mod, name in targets:
        real = getattr(mod, name)
        if isinstance(real, triton.runtime.jit.JITFunction):  # time its launches
            mod, name, real = real, "run", real.run
        saved.append((mod, name, real))

        key = f"{getattr(mod, '__name__', mod)}.{name}"

        def wrap(*a, _real=real, _key=key, **kw):
            t = time.perf_counter()
            try:
                return _real(*a, **kw)
            finally:
                per[_key] = per.get(_key, 0.0) + time.perf_counter() - t

        setattr(mod, name, wrap)
    try:
        for _ in range(n):
            torch.cuda.synchronize()
            per.clear()
            t0 = time.perf_counter()
            fn()
            per["total"] = time.perf_counter() - t0
            torch.cuda.synchronize()
            for key, v in per.items():
                acc.setdefault(key, []).append(v)
    finally:
        for mod, name, real in saved:
            setattr(mod, name, real)
    return {key: round(statistics.median(v) * 1e3, 4) for key, v in acc.items()}


@triton.jit
def _one(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n, other=0.0), mask=i < n)


@triton.jit
def _many(
    a, b, c, d, e, f, g, h, n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, n12, n13, x,
    BLOCK: tl.constexpr, FLAG: tl.constexpr,
):  # fmt: skip
    i = tl.arange(0, BLOCK)
    s = n0 + n1 + n2 + n3 + n4 + n5 + n6 + n7 + n8 + n9 + n10 + n11 + n12 + n13
    tl.store(a + i, tl.load(b + i) + x + s)


def _per_call_us(fn, n: int = 2000) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return round(dt / n * 1e6, 2)


def _launch_costs() -> dict:
    x = torch.zeros(1024, device="cuda")
    bufs = [torch.zeros(1024, device="cuda") for _ in range(8)]
    out = {}
    out["triton_1ptr_1int"] = _per_call_us(lambda: _one[(1,)](x, 16, BLOCK=16))
    ints = list(range(3, 17))
    out["triton_8ptr_14int_1float"] = _per_call_us(
        lambda: _many[(1,)](*bufs, *ints, 0.5, BLOCK=16, FLAG=True)
    )
    k = _many[(1,)](*bufs, *ints, 0.5, BLOCK=16, FLAG=True)
    try:
        from triton import knobs

        enter, exit_ = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        stream = torch.cuda.current_stream().cuda_stream
        args = (*bufs, *ints, 0.5, 16, True)

        def direct():
            k.run(1, 1, 1, stream, k.function, k.packed_metadata, None, enter, exit_, *args)

        out["triton_direct_8ptr_14int_1float"] = _per_call_us(direct)
        out["triton_runner_8ptr_14int_1float"] = _per_call_us(lambda: k[(1, 1, 1)](*args))
        ref = bufs[1] + 0.5 + sum(ints)
        bufs[0].zero_()
        direct()
        torch.cuda.synchronize()
        out["triton_direct_correct"] = bool(torch.equal(bufs[0][:16], ref[:16]))
    except Exception as err:  # report, do not stop: the direct path is private API
        out["triton_direct_error"] = repr(err)
    out["torch_empty_cuda"] = _per_call_us(lambda: torch.empty(4096, device="cuda"))
    big = torch.empty(1 << 20, device="cuda")
    out["torch_split_9"] = _per_call_us(lambda: big[:9000].split([1000] * 9))
    out["torch_view"] = _per_call_us(lambda: big.view(1024, 1024))
    q = torch.empty(1, 28, 4096, 128, device="cuda")
    out["torch_slice_4d"] = _per_call_us(lambda: q[:, :, 4000:])
    out["torch_zeros_cuda"] = _per_call_us(lambda: torch.zeros(4096, device="cuda"))
    out["cuda_event_record"] = _per_call_us(lambda: torch.cuda.Event().record())
    return out


def _timeline(fn) -> list[str]:
    """The GPU kernels and the host's launch and synchronisation calls of one ``fn()`` (the
    third of three profiled calls), in time order, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(3):
            torch.cuda.synchronize()
            with record_function(f"call{i}"):
                fn()
            torch.cuda.synchronize()
    events = [e for e in prof.events() if e.name == "call2"]
    t0, t1 = events[0].time_range.start, events[0].time_range.end
    rows = []
    for e in prof.events():
        start = e.time_range.start
        on_gpu = e.device_type == torch.autograd.DeviceType.CUDA
        host_api = e.name.startswith(("cuLaunch", "cudaLaunch", "cudaMemcpy", "cudaStreamSync"))
        if (on_gpu or host_api) and t0 <= start <= t1 + 2000:
            where = "gpu " if on_gpu else "host"
            rows.append(
                (
                    start,
                    f"{where} {start - t0:8.1f} +{e.time_range.elapsed_us():7.1f}  {e.name[:60]}",
                )
            )
    rows.append((t1, f"host {t1 - t0:8.1f}  end of the call"))
    return [r for _, r in sorted(rows)]


def _graph_path(fn, MM, n: int) -> dict:
    """Host time from the call's start to the graph's replay, to the return of the widths
    read, and from there to the call's end (the GPU idle at each start): with the graph, the
    host parts before the replay and after the read are what the estimation adds to its GPU
    chain."""
    marks: dict[str, float] = {}
    replay, read = torch.cuda.CUDAGraph.replay, MM.OffsetGraph.read

    def timed_replay(self):
        marks["replay"] = time.perf_counter()
        return replay(self)

    def timed_read(self):
        try:
            return read(self)
        finally:
            marks["read"] = time.perf_counter()

    torch.cuda.CUDAGraph.replay, MM.OffsetGraph.read = timed_replay, timed_read
    acc: dict[str, list[float]] = {}
    try:
        for _ in range(n):
            torch.cuda.synchronize()
            marks.clear()
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            if len(marks) == 2:
                for key, v in (
                    ("to_replay", marks["replay"] - t0),
                    ("to_read_return", marks["read"] - t0),
                    ("after_read", t1 - marks["read"]),
                    ("total", t1 - t0),
                ):
                    acc.setdefault(key, []).append(v * 1e6)
    finally:
        torch.cuda.CUDAGraph.replay, MM.OffsetGraph.read = replay, read
    return {key: round(statistics.median(v), 1) for key, v in acc.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=131072)
    ap.add_argument("--rep", type=int, default=30)
    a = ap.parse_args()
    bg = load_repo_module("bench_grid", "packages/sparse-patterns/benchmarks/bench_grid.py")
    from sparse_kernels.estimate import triton as est
    from sparse_kernels.permuted import grid_triton, lists_triton
    from sparse_patterns import mminference as MM

    S = a.seq
    q, k, _ = bg._video_qkv(S)
    lay = bg._layout(S)
    cfgs = [HeadConfig(Grid(use_hline=False, use_vline=True, use_slash=True))] * bg.H

    def fn():
        return plan_layer(q, k, cfgs, lay, block=bg.BLOCK)._launch_lists

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    targets = [
        (MM, "_fold_partials"),
        (MM, "_search_partials"),
        (MM, "grid_blocks_triton"),
        (MM, "launch_grid_lists"),
        (MM, "host_ints"),
        (MM, "_plan_grid_fused"),
        (MM, "_grid_fused_launch"),
        (MM.OffsetGraph, "__call__"),
        *(
            (m, n)
            for m in (est, grid_triton, lists_triton)
            for n in dir(m)
            if n.endswith("_kernel")
        ),
        (est, "_fold_plan"),
        (est, "_interior"),
        (est, "_chunks"),
        (MM, "_plan_grid"),
        (MM, "as_token_layout"),
        (MM, "normalize_head_configs"),
        (MM, "_Ctx"),
        (MM, "BlockPlan"),
    ]
    print("stages (ms, inclusive, median):", _stages(fn, targets, a.rep))
    print("graph critical path (us, median):", _graph_path(fn, MM, a.rep))
    # The estimation as bench_grid.py times it (CUDA events around plan_layer + run split): the
    # launches replayed as a CUDA graph (MM.GRID_GRAPHS) or launched, through the direct launch
    # path or not (launch.DIRECT = False), in this process.
    from sparse_kernels._triton import launch as launch_mod
    from sparse_kernels.benchmarking import cuda_time_ms

    est = {}
    for graphs, direct in (("auto", True), ("off", True), ("off", False), ("auto", True)):
        MM.GRID_GRAPHS, launch_mod.DIRECT = graphs, direct
        est.setdefault(f"graphs={graphs} direct={direct}", []).append(
            round(cuda_time_ms(fn, warmup=3, rep=30), 4)
        )
    print("estimation ms (CUDA events, median of 30):", est)
    print("one call on the timeline (us from its start; host: launches and syncs):")
    for line in _timeline(fn):
        print("  ", line)
    pr = cProfile.Profile()
    torch.cuda.synchronize()
    pr.enable()
    for _ in range(a.rep):
        fn()
        torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(45)
    print(s.getvalue())
    print("launch and torch costs (us per call):", _launch_costs())


if __name__ == "__main__":
    main()
