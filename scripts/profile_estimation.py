"""Where the online estimation time goes (GPU): torch.profiler over ``plan_layer`` for a layer of
Grid heads and a layer of Vertical-Slash heads (Qwen2.5-VL-7B attention shape, the planted video
of ``bench_grid.py``), plus CUDA-event times of each estimation step on its own.

    python3 scripts/profile_estimation.py --seq 131072
"""

from __future__ import annotations

import argparse

import torch
from _load import load_repo_module
from sparse_kernels.benchmarking import cuda_time_ms
from sparse_patterns import Grid, HeadConfig, VerticalSlash, plan_layer
from sparse_patterns import estimate as E


def _bench_grid():
    return load_repo_module("bench_grid", "packages/sparse-patterns/benchmarks/bench_grid.py")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=131072)
    ap.add_argument("--rows", type=int, default=30)
    a = ap.parse_args()
    bg = _bench_grid()
    S, H = a.seq, bg.H
    q, k, _ = bg._video_qkv(S)
    lay = bg._layout(S)
    heads = {
        "grid": [HeadConfig(Grid(use_hline=False, use_vline=True, use_slash=True))] * H,
        "vertical-slash": [HeadConfig(VerticalSlash(n_vertical=1000, n_slash=6096))] * H,
    }
    for name, cfgs in heads.items():
        fn = lambda: plan_layer(q, k, cfgs, lay, block=bg.BLOCK)  # noqa: E731
        ms = cuda_time_ms(fn, warmup=2, rep=5)
        print(f"== {name} S={S}: plan_layer {ms:.2f} ms")
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        ) as prof:
            fn()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=a.rows))
        print(
            prof.key_averages(group_by_stack_n=0).table(
                sort_by="self_cpu_time_total", row_limit=a.rows
            )
        )
    rows = torch.arange(S - 64, S, device=q.device)
    p = E.approx_scores(q, k, rows, scale=bg.D**-0.5)
    steps = {
        "approx_scores": lambda: E.approx_scores(q, k, rows, scale=bg.D**-0.5),
        "vertical_scores": lambda: E.vertical_scores(p),
        "slash_scores": lambda: E.slash_scores(p, rows),
        "search_grid": lambda: E.search_grid(p, rows, E.stride_space(bg.TPF, max_stride=4096, S=S)),
    }
    for name, fn in steps.items():
        print(f"step {name}: {cuda_time_ms(fn, warmup=1, rep=5):.2f} ms")


if __name__ == "__main__":
    main()
