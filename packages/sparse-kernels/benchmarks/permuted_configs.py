"""The permuted kernel's launch configs on a Grid head's plan, per block size.

The tuner times the permuted kernel on a Grid head's plan (``tuning.cases.grid_plan``: grid
stride 256, runs split from the lists, as the planner launches it). This script runs the same
plan at 64x64 and 128x128 blocks on the Qwen2.5-VL-7B shape (H=28, H_KV=4, D=128, bf16) and
times every candidate of ``permuted.triton.SPEC`` whose tiles divide the blocks, plus the config
the tables choose, in one process (CUDA-event medians in ms); every output is compared with the
chosen config's (max abs difference).

    python packages/sparse-kernels/benchmarks/permuted_configs.py --json permuted.json
"""

from __future__ import annotations

import argparse
import json

import torch
from sparse_kernels.benchmark_providers import qwen_inputs
from sparse_kernels.benchmarking import cuda_time_ms, env_info
from sparse_kernels.permuted import triton as pt
from sparse_kernels.sparse_plan import SparsePlan
from sparse_kernels.tuning import choose_config
from sparse_kernels.tuning.cases import grid_plan

STRIDE = 256


def sweep(S: int, block: int, rep: int) -> dict:
    q, k, v = qwen_inputs(S)
    H = q.shape[1]
    perm, idx, cnt, rs, rc = grid_plan(H, S, block, STRIDE, "cuda")
    step = torch.full((1, H), STRIDE, dtype=torch.int64, device="cuda")
    plan = SparsePlan(
        kv_indices=idx, kv_num_blocks=cnt, seq_lengths=(S, S), block_size=block, q_perm=perm,
        kv_perm=perm, kv_run_starts=rs, kv_run_counts=rc, kv_run_step=step, check_contents=False,
    )  # fmt: skip
    scale = q.shape[-1] ** -0.5
    chosen = choose_config(
        pt.SPEC, device=q.device, head_dim=q.shape[-1], dtype=q.dtype, group=H // k.shape[1],
        seq_len=S, variant="causal", blocks=(block, block),
    )  # fmt: skip
    ref = pt._launch_permuted_fwd(q, k, v, plan, scale=scale)[0]
    res = {"chosen": str(chosen), "listed_blocks": int(cnt.sum()) + int(rc.sum())}
    configs = [c for c in pt.SPEC.candidates if pt._tiles_divide_blocks(c, (block, block))]
    for cfg in configs:
        try:
            out = pt._launch_permuted_fwd(q, k, v, plan, scale=scale, config=cfg)[0]
            diff = (out.float() - ref.float()).abs().max().item()
            ms = cuda_time_ms(
                lambda cfg=cfg: pt._launch_permuted_fwd(q, k, v, plan, scale=scale, config=cfg),
                warmup=2, rep=rep,
            )  # fmt: skip
            res[str(cfg)] = {"ms": ms, "max_abs_diff_vs_chosen": diff}
        except Exception as e:  # noqa: BLE001 - a config that fails to compile is recorded
            res[str(cfg)] = {"error": f"{type(e).__name__}: {e}"[:300]}
        print(S, block, cfg, res[str(cfg)], flush=True)
    return res


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default="permuted_configs.json")
    p.add_argument("--seqs", default="32768,131072")
    args = p.parse_args(argv)
    res = {"env": env_info()}
    for S in map(int, args.seqs.split(",")):
        for block in (64, 128):
            res[f"{S // 1024}K-{block}x{block}"] = sweep(S, block, rep=20 if S <= 32768 else 10)
            torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
