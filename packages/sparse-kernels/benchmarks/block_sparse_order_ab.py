"""A/B of the block-sparse and permuted kernels of this tree against another revision's copy, on
the order probe's lists (block-sparse, 32K and 128K) and the tuner's Grid plans (permuted, 128K and
512K, 64x64 and 128x128 blocks). Outputs are compared, then old and new are timed interleaved,
three times each (CUDA-event medians, ms).

Make the other copy importable as ``sparse_kernels_old`` (imports inside the package are relative):

    git archive REV packages/sparse-kernels/src/sparse_kernels | tar -x -C /tmp/ab
    mv /tmp/ab/packages/sparse-kernels/src/sparse_kernels /tmp/ab/sparse_kernels_old
    PYTHONPATH=/tmp/ab:$PYTHONPATH python packages/sparse-kernels/benchmarks/block_sparse_order_ab.py ab.json
"""

import json
import os
import sys

import sparse_kernels as new
import sparse_kernels_old as old
import torch
from sparse_kernels.benchmark_providers import qwen_inputs
from sparse_kernels.benchmarking import cuda_time_ms, env_info
from sparse_kernels.block_sparse import triton as bs_new
from sparse_kernels.permuted import triton as pt_new
from sparse_kernels.tuning.cases import grid_plan
from sparse_kernels_old.block_sparse import triton as bs_old
from sparse_kernels_old.permuted import triton as pt_old

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from block_sparse_order_probe import lists  # noqa: E402 (the probe's lists, from beside this file)

H = 28


def ab(res: dict, key: str, f_old, f_new, rep: int) -> None:
    a, b = f_old(), f_new()
    r = {
        "max_abs_diff": (a[0].float() - b[0].float()).abs().max().item(),
        "lse_equal": bool(torch.equal(a[1], b[1])),
    }
    for _ in range(3):
        r.setdefault("old_ms", []).append(cuda_time_ms(f_old, warmup=2, rep=rep))
        r.setdefault("new_ms", []).append(cuda_time_ms(f_new, warmup=2, rep=rep))
    r["speedup_min"] = min(r["old_ms"]) / min(r["new_ms"])
    r["speedup_median_of_runs"] = sorted(r["old_ms"])[1] / sorted(r["new_ms"])[1]
    res[key] = r
    print(key, json.dumps(r), flush=True)


def run_length(res: dict, S: int) -> None:
    q, k, v = qwen_inputs(S)
    sc = 128**-0.5
    rep = 20 if S <= 32768 else (6 if S <= 131072 else 3)
    if S <= 131072:
        g = torch.Generator().manual_seed(1)
        cases = {
            "10%": torch.full((H,), 0.1),
            "30%": torch.full((H,), 0.3),
            "uneven 2-60%": torch.linspace(0.02, 0.6, H)[torch.randperm(H, generator=g)],
        }
        kw = dict(block_m=128, block_n=128, causal=True, scale=sc)
        for name, dens in cases.items():
            L = lists(S, H, dens.cuda())
            ab(
                res, f"block_sparse {S // 1024}K {name}",
                lambda L=L: bs_old._launch_block_sparse_fwd(q, k, v, *L, **kw),
                lambda L=L: bs_new._launch_block_sparse_fwd(q, k, v, *L, **kw), rep,
            )  # fmt: skip
    if S >= 131072:
        for block in (64, 128):
            perm, idx, cnt, rs, rc = grid_plan(H, S, block, 256, "cuda")
            step = torch.full((1, H), 256, dtype=torch.int64, device="cuda")
            kw = dict(
                kv_indices=idx, kv_num_blocks=cnt, seq_lengths=(S, S), block_size=block,
                q_perm=perm, kv_perm=perm, kv_run_starts=rs, kv_run_counts=rc, kv_run_step=step,
                check_contents=False,
            )  # fmt: skip
            p_new, p_old = new.SparsePlan(**kw), old.SparsePlan(**kw)
            ab(
                res, f"permuted {S // 1024}K {block}x{block}",
                lambda p_old=p_old: pt_old._launch_permuted_fwd(q, k, v, p_old, scale=sc),
                lambda p_new=p_new: pt_new._launch_permuted_fwd(q, k, v, p_new, scale=sc), rep,
            )  # fmt: skip


def main() -> None:
    res = {"env": env_info()}
    for S in (32768, 131072, 524288):
        run_length(res, S)
        torch.cuda.empty_cache()
    with open(sys.argv[1], "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
