"""How fast can any engine run the Grid head's tiles? The permuted kernel against block-sparse
engines on the same tile lists without the permutation.

The Grid head's plan (``bench_grid.py``'s planted video, Qwen2.5-VL-7B shape, 128x128 blocks)
lists about 1% of the causal blocks, in permuted order: the permuted kernel gathers its q rows
and k/v rows through the permutations and masks by original position. Here the plan's own lists
(``kv_block_counts``, ``kv_block_indices``: the same number of tiles per query block) also run
through ``block_sparse_attention`` on the unpermuted q, k, v, non-causal, with our Triton engine
and with FA4: the same tile counts and list shape without gathers or position masks. Their rate
per computed tile, over FA4's dense causal rate in the same process, bounds what the permuted
kernel could reach with free permutations (issue 31's target for the Grid head: 0.9).

Rate per tile: ``(FA4 dense ms) * (listed tiles / causal tiles) / (ms)``; causal tiles are
``H * nb * (nb + 1) / 2``. Medians of CUDA-event timings, one process.

    python packages/sparse-patterns/benchmarks/grid_engine_bound.py --json bound.json

``--profile`` runs each kernel a few times at the first length and nothing else, for a profiler
(``ncu --kernel-name regex:'permuted|block_sparse' ...``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from sparse_kernels import block_sparse_attention
from sparse_kernels.benchmark_providers import fa4_dense_anchor
from sparse_kernels.benchmarking import cuda_time_ms, env_info
from sparse_patterns import plan_layer
from torch.nn.attention.flex_attention import BlockMask

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_grid as bg  # noqa: E402 (the suite's inputs and plan, from beside this file)


def bound(S: int, rep: int, profile: bool = False) -> dict:
    q, k, v = (t.to(torch.bfloat16) for t in bg.planted_video_qkv(
        S, heads=bg.H, kv_heads=bg.H_KV, dim=bg.D, tpf=bg.TPF, device=bg.DEV
    ))  # fmt: skip
    plan = plan_layer(q, k, [bg.GRID] * bg.H, bg._layout(S), block=bg.BLOCK)
    counts, idx = plan.kv_block_counts, plan.kv_block_indices
    nb = S // bg.BLOCK
    tiles = int(counts.sum())
    frac = tiles / (bg.H * nb * (nb + 1) / 2)
    mask = BlockMask.from_kv_blocks(
        counts.int(), idx.int(), BLOCK_SIZE=bg.BLOCK, seq_lengths=(S, S), compute_q_blocks=False
    )
    r: dict = {"S": S, "listed_tile_fraction": frac, "tiles_per_query_block": tiles / (bg.H * nb)}
    calls = {"permuted (plan.run)": lambda: plan.run(q, k, v)}
    for impl in ("triton", "fa4"):
        calls[f"block_sparse {impl}, same lists, unpermuted"] = lambda impl=impl: (
            block_sparse_attention(q, k, v, mask, causal=False, impl=impl, check_indices=False)
        )
    if profile:
        for _ in range(3):
            calls["permuted (plan.run)"]()
            calls["block_sparse triton, same lists, unpermuted"]()
        torch.cuda.synchronize()
        return r
    anchor = fa4_dense_anchor(q, k, v, rep=rep)
    r["fa4_dense_ms"] = anchor.median_ms
    for name, fn in calls.items():
        try:
            fn()
            ms = cuda_time_ms(fn, warmup=3, rep=30)
        except Exception as e:  # noqa: BLE001 - an engine missing here is recorded, not fatal
            r[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
            continue
        rate = anchor.median_ms * frac / ms if anchor.median_ms else None
        r[name] = {"ms": ms, "rate_per_tile_over_fa4_dense": rate}
    return r


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default="grid_engine_bound.json")
    p.add_argument("--seqs", default="131072,524288")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args(argv)
    if args.profile:
        bound(int(args.seqs.split(",")[0]), rep=0, profile=True)
        return
    res = {"env": env_info()}
    for S in map(int, args.seqs.split(",")):
        res[str(S)] = bound(S, rep=3 if S > 131072 else 5)
        print(json.dumps(res[str(S)]), flush=True)
        torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
