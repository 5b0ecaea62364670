"""A-shape heads, A/B in one process: block-rounded (``AShape``, the layer's block-sparse launch)
against exact (``AShape(exact=True)``, ``sparse_kernels.triangle_attention`` with ``last=0``).

One layer of the Qwen2.5-VL-7B attention shape (H=28, H_KV=4, D=128, bf16, random q/k/v), every
head the same A-shape; per (length, sink, window): the plan (``plan_layer``) and the kernel
(``BlockPlan.run``) timed apart, CUDA events, median of ``--repeat`` calls after one warm-up
(which looks its launch config up), and cuDNN dense causal SDPA on the same tensors as the roof. The two outputs
are compared against each other on the last 256 rows (they attend different key sets: the
rounded one a superset, so only a loose agreement is expected; the kernels' own correctness is
in the tests).

    python packages/sparse-patterns/benchmarks/exact_a_shape.py --lengths 128K --out exact.json

CUDA only.
"""

from __future__ import annotations

import argparse
import json

import torch
from sparse_kernels.benchmarking import cuda_time_ms, cudnn_causal, env_info
from sparse_patterns import AShape, HeadConfig, plan_layer

LENGTHS = {"32K": 32768, "128K": 131072, "512K": 524288}
SHAPES = ((168, 5390), (128, 4096))  # the 128K searched config's; the fixed mix's


def _time(fn, repeat: int) -> float:
    return cuda_time_ms(fn, warmup=1, rep=repeat)


def _length_rows(name: str, repeat: int) -> list[dict]:
    S = LENGTHS[name]
    g = torch.Generator("cuda").manual_seed(S)
    q = torch.randn(1, 28, S, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, 4, S, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, 4, S, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    dense_ms = _time(cudnn_causal(q, k, v), repeat)
    rows = []
    for sink, window in SHAPES:
        row = {"length": name, "S": S, "sink": sink, "window": window, "dense_ms": dense_ms}
        outs = {}
        for exact in (False, True):
            hc = HeadConfig(AShape(sink=sink, window=window, exact=exact))
            key = "exact" if exact else "rounded"

            def plan(hc=hc):
                return plan_layer(q, k, hc, None, exact_vertical_lists=False)

            p = plan()
            row[f"{key}_plan_ms"] = _time(plan, repeat)
            row[f"{key}_run_ms"] = _time(lambda p=p: p.run(q, k, v), repeat)
            outs[key] = p.run(q, k, v).out[:, :, -256:].float()
        a, b = outs["rounded"], outs["exact"]
        row["last_rows_rel_diff"] = float((a - b).norm() / b.norm())
        row["run_speedup_exact_vs_rounded"] = row["rounded_run_ms"] / row["exact_run_ms"]
        row["exact_vs_dense"] = dense_ms / (row["exact_plan_ms"] + row["exact_run_ms"])
        row["rounded_vs_dense"] = dense_ms / (row["rounded_plan_ms"] + row["rounded_run_ms"])
        print(
            f"{name} A-shape({sink}, {window}): rounded {row['rounded_run_ms']:.2f} ms "
            f"(+ plan {row['rounded_plan_ms']:.2f}), exact {row['exact_run_ms']:.2f} ms "
            f"(+ plan {row['exact_plan_ms']:.2f}), dense {dense_ms:.2f} ms; exact "
            f"{row['run_speedup_exact_vs_rounded']:.2f}x the rounded kernel",
            flush=True,
        )
        rows.append(row)
    return rows


def run(lengths: list[str], repeat: int) -> list[dict]:
    rows = []
    for name in lengths:
        rows += _length_rows(name, repeat)
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="32K,128K", help=f"of {', '.join(LENGTHS)}")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--out", default="exact_a_shape.json")
    a = p.parse_args(argv)
    bad = [x for x in a.lengths.split(",") if x not in LENGTHS]
    if bad:
        p.error(f"--lengths: expected some of {', '.join(LENGTHS)}, got {bad}")
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    rows = run(a.lengths.split(","), a.repeat)
    with open(a.out, "w") as f:
        json.dump({"env": env_info(), "rows": rows}, f, indent=1)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
