"""Planning cost of Q- and 2D-Boundary heads: block-level row runs against the element path.

One layer of the Qwen2.5-VL-7B attention shape (H=28, H_KV=4, D=128, bf16, random q/k/v) on an
MM-NIAH-like layout (text 1024 / video 3072 repeated, 512 text tokens at the end: 25% text),
every head the same pattern with ``QBoundary()`` or ``TwoDBoundary(cross_vertical=256)``:
``AShape(168, 5390)`` and ``VerticalSlash(1000, 2048)``. Per (length, pattern): the plan with
the block-level lists (``MMInferencePlanner(boundary_lists="runs")``) and, up to
``--element-max`` tokens, with the element path (``boundary_lists="reference"``); wall time with
a device sync, median of ``--repeat`` after one warm-up; whether the two plans' lists are equal;
and the kernel (``BlockPlan.run``) and cuDNN dense causal for scale.

    python packages/sparse-patterns/benchmarks/q_boundary_plan.py --lengths 32K,128K --out qb.json

CUDA only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from sparse_kernels.benchmarking import cuda_time_ms, cudnn_causal, env_info
from sparse_patterns import (
    AShape,
    HeadConfig,
    MMInferencePlanner,
    QBoundary,
    TokenLayout,
    TwoDBoundary,
    VerticalSlash,
)

LENGTHS = {"32K": 32768, "128K": 131072, "512K": 524288}
PATTERNS = {
    "a_shape(168,5390)": AShape(sink=168, window=5390),
    "vertical_slash(1000,2048)": VerticalSlash(n_vertical=1000, n_slash=2048),
}
BOUNDARIES = {"q": QBoundary(), "2d": TwoDBoundary(cross_vertical=256)}


def mm_niah_layout(S: int, device="cpu") -> TokenLayout:
    """Text (modality 0) 1024, video (2) 3072, repeated; the last 512 tokens text."""
    mod = torch.where(torch.arange(S) % 4096 < 1024, 0, 2)
    mod[-512:] = 0
    return TokenLayout(mod.to(device), tokens_per_frame=256)


def _wall_ms(fn, repeat: int) -> tuple[float, object]:
    out = fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), out


def _pattern_row(name: str, q, k, v, lay, pname: str, pat, bname: str, dense_ms: float, a):
    S = q.shape[2]
    heads = [HeadConfig(pat, BOUNDARIES[bname])] * q.shape[1]

    def planner_of(boundary_lists: str):
        planner = MMInferencePlanner(block=64, boundary_lists=boundary_lists)
        return lambda: planner.plan(q, k, heads, lay)

    block_ms, bp = _wall_ms(planner_of("runs"), a.repeat)
    row = {
        "length": name, "S": S, "pattern": pname, "boundary": bname, "block_plan_ms": block_ms,
        "kernel_ms": cuda_time_ms(lambda: bp.run(q, k, v), warmup=1, rep=a.repeat),
        "dense_ms": dense_ms,
        "density": float(bp.kv_block_counts.sum()) / (q.shape[1] * (S // 64) ** 2 / 2),
    }  # fmt: skip
    if a.element_max >= S:
        row["element_plan_ms"], ep = _wall_ms(planner_of("reference"), max(1, a.repeat // 3))
        row["lists_equal"] = bool(
            torch.equal(ep.kv_block_counts, bp.kv_block_counts)
            and torch.equal(ep.kv_block_indices, bp.kv_block_indices)
        )
        row["plan_speedup"] = row["element_plan_ms"] / block_ms
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="32K,128K")
    p.add_argument(
        "--element-max", type=int, default=32768, help="longest length for the element path"
    )
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default="q_boundary_plan.json")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    rows = []
    for name in a.lengths.split(","):
        S = LENGTHS[name]
        g = torch.Generator("cuda").manual_seed(S)
        q = torch.randn(1, 28, S, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(1, 4, S, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(1, 4, S, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        lay = mm_niah_layout(S, "cuda")
        dense_ms = cuda_time_ms(cudnn_causal(q, k, v), warmup=1, rep=a.repeat)
        for bname in BOUNDARIES:
            for pname, pat in PATTERNS.items():
                rows.append(_pattern_row(name, q, k, v, lay, pname, pat, bname, dense_ms, a))
                print(json.dumps(rows[-1]), flush=True)
    with open(a.out, "w") as f:
        json.dump({"env": env_info(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
