"""Time the sink-merge kernel (``triangle.sink_merge_triton``) over launch configs on one GPU.

The kernel adds the sink keys to a windowed attention's ``(out, lse)`` in place: FA4's triangle
and A-shape engine runs it after FA4's sliding window. This times it alone at the Qwen2.5-VL-7B
attention shape (H=28, H_KV=4, D=128, bf16, ``out`` in FA4's ``[B, S, H, D]`` layout), rows
``[window, S)``, for the sinks and windows of TriangleMix's two shapes: the launcher's own config
(``launcher``), then every (BLOCK_M, BLOCK_N, warps, stages) candidate, each in one process.
``copy_out_ms`` (a clone of ``out``) is the memory floor's yardstick.

    S=131072 python packages/sparse-kernels/benchmarks/sweep_sink_merge.py --json sweep-128K.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

import torch
import triton
from sparse_kernels._triton.config import block_d
from sparse_kernels.triangle.sink_merge_triton import _launch_sink_merge_fwd, _sink_merge_fwd_kernel
from triton.testing import do_bench

H, H_KV, D = 28, 4, 128
SHAPES = ((8, 512), (128, 4096))  # (sink, window)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default=None, help="write the times (ms) here")
    a = p.parse_args()
    S = int(os.environ.get("S", 131072))
    torch.manual_seed(0)
    q = torch.randn(1, H, S, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, H_KV, S, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, H_KV, S, D, device="cuda", dtype=torch.bfloat16)
    out_bshd = torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16)
    out = out_bshd.transpose(1, 2)
    lse = torch.randn(1, H, S, device="cuda", dtype=torch.float32) + 10
    scale = D**-0.5
    res = {"seq_len": S, "gpu": torch.cuda.get_device_name(), "triton": triton.__version__}
    res["copy_out_ms"] = do_bench(lambda: out_bshd.clone(), warmup=20, rep=200)
    for sink, window in SHAPES:
        lo, hi = window, S

        def launcher(sink=sink, window=window, lo=lo, hi=hi):
            _launch_sink_merge_fwd(
                out, lse, q, k, v, sink=sink, window=window, row_lo=lo, row_hi=hi, scale=scale
            )

        res[f"sink{sink} launcher"] = do_bench(launcher, warmup=20, rep=200)
        widths = [n for n in (16, 32, 64, 128) if n <= max(32, 2 * sink)]
        for bm, bn, warps, stages in itertools.product((64, 128), widths, (4, 8), (1, 2, 3)):
            grid = (triton.cdiv(hi - lo, bm), H)

            def run(bm=bm, bn=bn, warps=warps, stages=stages, grid=grid, sink=sink, window=window):
                _sink_merge_fwd_kernel[grid](
                    q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
                    *lse.stride(), H, H // H_KV, S, S, window, S, sink, window, scale,
                    D=D, BLOCK_D=block_d(D), IEEE=False, BLOCK_M=bm, BLOCK_N=bn,
                    num_warps=warps, num_stages=stages,
                )  # fmt: skip

            res[f"sink{sink} bm{bm} bn{bn} w{warps} st{stages}"] = do_bench(run, warmup=10, rep=100)
    for name, ms in res.items():
        print(f"{name:32s} {ms if isinstance(ms, str) else round(ms, 4)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
