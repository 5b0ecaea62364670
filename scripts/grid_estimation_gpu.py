"""Grid estimation at 128K-1M on a GPU: the fold kernel (``line_folds``) against the two-pass
``line_scores``, its launch settings, and ``plan_layer`` + run split against the Grid kernel,
with the three Grid planner paths in the same process: "fused" (``_plan_grid_fused``: fold,
merge, search, block index, lists), "fold" (``GRID_FUSED = "off"``: the folds, then torch) and
"lines" (also ``FOLD_MAX_PERIOD = 0``: the full line scores). Qwen2.5-VL-7B attention shape, the planted video of ``bench_grid.py``.

    python3 scripts/grid_estimation_gpu.py --seqs 131072 524288 --json out.json
"""

from __future__ import annotations

import argparse
import json

import torch
from _load import load_repo_module
from sparse_kernels.benchmarking import cuda_time_ms, env_info
from sparse_kernels.estimate import (
    line_fold_search,
    line_folds,
    line_folds_reference,
    line_scores,
)
from sparse_kernels.estimate.triton import line_folds_triton
from sparse_patterns import Grid, HeadConfig, plan_layer
from sparse_patterns import estimate as E
from sparse_patterns import mminference as MM


def _host_split(fn, n: int = 20) -> dict:
    """Host time of the fused estimation around its one host read, GPU idle at the start
    (medians over ``n`` calls, ms): before the read (launches queued), the read itself (the
    wait for the queued GPU work) and after it (the lists, the plan, the run split)."""
    import statistics
    import time

    from sparse_kernels.permuted import perms

    real = perms.host_ints
    marks: list[float] = []

    def timed(*xs):
        marks.append(time.perf_counter())
        out = real(*xs)
        marks.append(time.perf_counter())
        return out

    perms.host_ints = timed
    pre, wait, post, total = [], [], [], []
    try:
        for _ in range(n):
            torch.cuda.synchronize()
            marks.clear()
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            pre.append(marks[0] - t0)
            wait.append(marks[1] - marks[0])
            post.append(t1 - marks[1])
            total.append(time.perf_counter() - t0)
    finally:
        perms.host_ints = real
    med = lambda x: statistics.median(x) * 1e3  # noqa: E731
    return {
        "host_before_read_ms": med(pre),
        "host_read_wait_ms": med(wait),
        "host_after_read_ms": med(post),
        "host_total_ms": med(total),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, nargs="+", default=[131072])
    ap.add_argument("--variants", action="store_true", help="time fold kernel launch settings")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument(
        "--programs",
        type=int,
        nargs="*",
        default=[],
        help="time line_folds with these program counts",
    )
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    bg = load_repo_module("bench_grid", "packages/sparse-patterns/benchmarks/bench_grid.py")
    res = {"env": env_info(), "rows": []}
    cfgs = [HeadConfig(Grid(use_hline=False, use_vline=True, use_slash=True))] * bg.H
    P = bg.TPF
    for S in a.seqs:
        q, k, v = bg._video_qkv(S)
        lay = bg._layout(S)
        L = 64
        qr = q[:, :, S - L :]
        lo, hi = E.grid_window(P, S)
        sc = bg.D**-0.5
        row = {"S": S}
        # correctness of the folds against the float64 reference on this shape (sampled heads)
        if S <= 131072:
            got = line_folds(qr, k, S - L, period=P, lo=lo, hi=hi, scale=sc)
            gold = line_folds_reference(
                qr[:, :4],
                k[:, :1],
                S - L,
                period=P,
                lo=lo,
                hi=hi,
                scale=sc,
                compute_dtype=torch.float64,
            )
            row["fold_max_abs_err_vs_f64"] = max(
                float((got[i][:, :4].double() - gold[i]).abs().max()) for i in range(2)
            )
        row["line_scores_ms"] = cuda_time_ms(
            lambda: line_scores(qr, k, S - L, scale=sc), warmup=3, rep=a.rep
        )
        row["line_folds_ms"] = cuda_time_ms(
            lambda: line_folds(qr, k, S - L, period=P, lo=lo, hi=hi, scale=sc), warmup=3, rep=a.rep
        )
        strides = E.stride_space(P, max_stride=1024, S=S)
        row["line_fold_search_ms"] = cuda_time_ms(
            lambda: line_fold_search(
                qr, k, S - L, period=P, lo=lo, hi=hi, strides=strides, scale=sc
            ),
            warmup=3,
            rep=a.rep,
        )
        from sparse_kernels.estimate import triton as est_mod

        est_mod._FOLD_INTERIOR = False
        try:
            row["line_folds_no_interior_kernel_ms"] = cuda_time_ms(
                lambda: line_folds(qr, k, S - L, period=P, lo=lo, hi=hi, scale=sc),
                warmup=3,
                rep=a.rep,
            )
        finally:
            est_mod._FOLD_INTERIOR = True
        for n in a.programs:
            from sparse_kernels.estimate import triton as est

            old, est._FOLD_PROGRAMS = est._FOLD_PROGRAMS, n
            short, est._FOLD_SHORT_KEYS = est._FOLD_SHORT_KEYS, 0
            try:
                row[f"line_folds_programs{n}_ms"] = cuda_time_ms(
                    lambda: line_folds(qr, k, S - L, period=P, lo=lo, hi=hi, scale=sc),
                    warmup=3,
                    rep=a.rep,
                )
            finally:
                est._FOLD_PROGRAMS, est._FOLD_SHORT_KEYS = old, short
        if a.variants:
            for bn in (64, 128):
                for w in (4, 8):
                    for st in (2, 3, 4):
                        fn = lambda: line_folds_triton(  # noqa: E731
                            qr,
                            k,
                            S - L,
                            period=P,
                            lo=lo,
                            hi=hi,
                            scale=sc,
                            block_n=bn,
                            num_warps=w,
                            num_stages=st,
                        )
                        try:
                            row[f"folds_bn{bn}_w{w}_s{st}_ms"] = cuda_time_ms(
                                fn, warmup=2, rep=a.rep
                            )
                        except Exception as e:  # noqa: BLE001
                            row[f"folds_bn{bn}_w{w}_s{st}_ms"] = repr(e)[:200]
        plan = plan_layer(q, k, cfgs, lay, block=bg.BLOCK)
        phases = (torch.arange(bg.H, device="cuda") // (bg.H // bg.H_KV) * 37) % P
        row["stride_phase_exact"] = bool(
            torch.equal(plan.meta["stride"][0], torch.full((bg.H,), P, device="cuda"))
            and torch.equal(plan.meta["phase"][0], phases)
        )
        _ = plan._launch_lists
        kern = lambda: plan.run(q, k, v)  # noqa: E731
        row["kernel_ms"] = cuda_time_ms(kern, warmup=3, rep=10)
        for name, maxp, fused in (
            ("fused", 4096, "auto"),
            ("fold", 4096, "off"),
            ("lines", 0, "off"),
        ):
            MM.FOLD_MAX_PERIOD, MM.GRID_FUSED = maxp, fused
            try:
                row[f"plan_ms_{name}"] = cuda_time_ms(
                    lambda: plan_layer(q, k, cfgs, lay, block=bg.BLOCK), warmup=3, rep=a.rep
                )
                row[f"estimation_ms_{name}"] = cuda_time_ms(
                    lambda: plan_layer(q, k, cfgs, lay, block=bg.BLOCK)._launch_lists,
                    warmup=3,
                    rep=a.rep,
                )
                p2 = plan_layer(q, k, cfgs, lay, block=bg.BLOCK)
                row[f"same_lists_{name}"] = bool(
                    torch.equal(p2.kv_block_indices, plan.kv_block_indices)
                    and torch.equal(p2.kv_block_counts, plan.kv_block_counts)
                    and torch.equal(p2.kv_perm, plan.kv_perm)
                    and torch.equal(p2.kv_runs[0], plan.kv_runs[0])
                    and all(
                        torch.equal(x, y)
                        for x, y in zip(p2._launch_lists[:2], plan._launch_lists[:2])
                    )
                )
            finally:
                MM.FOLD_MAX_PERIOD, MM.GRID_FUSED = 4096, "auto"
        row.update(_host_split(lambda: plan_layer(q, k, cfgs, lay, block=bg.BLOCK)._launch_lists))
        for name in ("fused", "fold", "lines"):
            row[f"estimation_over_kernel_{name}"] = row[f"estimation_ms_{name}"] / row["kernel_ms"]
        print(json.dumps(row), flush=True)
        res["rows"].append(row)
        if a.profile:
            fn = lambda: plan_layer(q, k, cfgs, lay, block=bg.BLOCK)._launch_lists  # noqa: E731
            fn()
            torch.cuda.synchronize()
            with torch.profiler.profile(
                activities=[
                    torch.profiler.ProfilerActivity.CPU,
                    torch.profiler.ProfilerActivity.CUDA,
                ]
            ) as prof:
                fn()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
            import cProfile
            import pstats

            pr = cProfile.Profile()
            pr.enable()
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            pr.disable()
            pstats.Stats(pr).sort_stats("cumulative").print_stats(45)
            pstats.Stats(pr).sort_stats("tottime").print_stats(25)
        bg._video_qkv.cache_clear()
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
