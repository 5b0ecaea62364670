"""How fast could Grid estimation be without host launches? A measurement, not product code.

The whole estimation of a Grid layer (``plan_layer`` and the run split ``BlockPlan.run`` makes),
captured once in a CUDA graph and replayed, against the same call run eagerly, in one process.
The replay's time is the GPU work alone (no Python, no launch latency): the floor that a planner
with few host launches could reach. For the capture only:
- the one host read (the Grid lists' widths) returns the widths of an eager run (replays are
  checked to give the eager plan's lists, so the widths were right);
- host data copied to the GPU inside the planner is made once and reused (the capture would
  otherwise keep pointers to freed pinned buffers).
q and k are the graph's static inputs here; a product planner would launch the fold kernel on
each call's q/k and replay the rest.

    python3 scripts/grid_estimation_floor.py --seqs 131072 524288 --json floor.json
"""

from __future__ import annotations

import argparse
import json

import torch
from _load import load_repo_module
from sparse_kernels.benchmarking import cuda_time_ms, env_info
from sparse_patterns import Grid, HeadConfig, plan_layer
from sparse_patterns import mminference as MM
from sparse_patterns import plan as PL


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, nargs="+", default=[131072])
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    bg = load_repo_module("bench_grid", "packages/sparse-patterns/benchmarks/bench_grid.py")
    cfgs = [HeadConfig(Grid(use_hline=False, use_vline=True, use_slash=True))] * bg.H
    res = {"env": env_info(), "rows": []}
    copies: dict = {}
    real_to_device = MM.to_device

    def cached_to_device(t, device):
        key = (t.dtype, tuple(t.shape), tuple(t.flatten().tolist()), str(device))
        if key not in copies:
            copies[key] = real_to_device(t, device)
        return copies[key]

    MM.to_device = cached_to_device
    PL.to_device = cached_to_device
    for S in a.seqs:
        q, k, v = bg._video_qkv(S)
        lay = bg._layout(S)

        def estimate():
            p = plan_layer(q, k, cfgs, lay, block=bg.BLOCK)
            return p, p._launch_lists

        row = {"S": S}
        for name, maxp in (("fold", 4096), ("lines", 0)):
            MM.FOLD_MAX_PERIOD = maxp
            widths = []
            real_host_ints = PL.host_ints

            def recording(*xs, _real=real_host_ints, _w=widths):
                out = _real(*xs)
                _w.append(out)
                return out

            PL.host_ints = recording
            eager_plan, eager_lists = estimate()
            PL.host_ints = real_host_ints
            row[f"eager_ms_{name}"] = cuda_time_ms(estimate, warmup=3, rep=a.rep)
            replay_widths = iter(widths * 1000)
            PL.host_ints = lambda *xs, _it=replay_widths: next(_it)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    estimate()
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                gp, gl = estimate()
            PL.host_ints = real_host_ints
            g.replay()
            torch.cuda.synchronize()
            row[f"replay_equal_{name}"] = bool(
                torch.equal(gp.kv_block_indices, eager_plan.kv_block_indices)
                and torch.equal(gp.kv_block_counts, eager_plan.kv_block_counts)
                and torch.equal(gp.kv_perm, eager_plan.kv_perm)
                and all(torch.equal(x, y) for x, y in zip(gl[:2], eager_lists[:2]))
            )
            row[f"graph_ms_{name}"] = cuda_time_ms(g.replay, warmup=3, rep=a.rep)
            del g, gp, gl
        MM.FOLD_MAX_PERIOD = 4096
        plan = plan_layer(q, k, cfgs, lay, block=bg.BLOCK)
        _ = plan._launch_lists
        row["kernel_ms"] = cuda_time_ms(lambda: plan.run(q, k, v), warmup=3, rep=10)
        for name in ("fold", "lines"):
            row[f"graph_over_kernel_{name}"] = row[f"graph_ms_{name}"] / row["kernel_ms"]
            row[f"eager_over_kernel_{name}"] = row[f"eager_ms_{name}"] / row["kernel_ms"]
        print(json.dumps(row), flush=True)
        res["rows"].append(row)
        bg._video_qkv.cache_clear()
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
