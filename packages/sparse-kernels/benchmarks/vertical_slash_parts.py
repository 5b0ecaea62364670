"""Where ``vertical_slash_attention(impl="fa4")`` spends its time, on one GPU with FA4 installed.

At 128K tokens, 128x128 tiles, the Qwen2.5-VL-7B attention shape (bf16, H=28, H_KV=4, D=128) and
1000 verticals + 6096 slashes per head (local, random and clustered slashes: the indices of
``packages/sparse-kernels/benchmarks/bench_vertical_slash.py``), it times apart: the index build
(with and without the content checks), the block lists, FA4's block-sparse kernel, the column
merge under each of its four launch configs and under the looked-up one, and the whole op under
``auto`` and ``triton`` (128x128 and 64x64 tiles). Each merge call starts from a clone of FA4's
``out`` and ``lse``, timed apart as ``clone_out_lse``. CUDA-event medians in ms.

    python packages/sparse-kernels/benchmarks/vertical_slash_parts.py --json parts.json
"""

from __future__ import annotations

import argparse
import json

import torch
from sparse_kernels import build_vertical_slash_index, vertical_slash_attention
from sparse_kernels.benchmark_providers import qwen_inputs
from sparse_kernels.benchmarking import cuda_time_ms, vertical_slash_suite_indices
from sparse_kernels.fa4.engine import block_sparse
from sparse_kernels.tuning import LaunchConfig
from sparse_kernels.vertical_slash.lists_triton import _launch_range_lists
from sparse_kernels.vertical_slash.triton import _launch_vertical_slash_fwd

S = 131072
B, H, D = 1, 28, 128
NV, NS, LOCAL = 1000, 6096, 64


def _slashes():
    """(verticals, {kind: slashes}) as ``bench_vertical_slash.py`` builds them."""
    return vertical_slash_suite_indices(B, H, S, NV, NS, local=LOCAL, device="cuda")


def parts(q, k, v, vert, sl, scale: float) -> dict:
    def build(check: bool = True):
        return build_vertical_slash_index(
            vert, sl, seq_len=S, block_m=128, block_n=128, check_contents=check
        )

    def op(bm: int, impl: str):
        return vertical_slash_attention(
            q, k, v, vert, sl, block_m=bm, block_n=bm, scale=scale, impl=impl
        )

    r = {
        "build": cuda_time_ms(build, warmup=2, rep=10),
        "build_nocheck": cuda_time_ms(lambda: build(False), warmup=2, rep=10),
    }
    idx = build()
    r["lists"] = cuda_time_ms(lambda: _launch_range_lists(idx), warmup=2, rep=10)
    lists = (*_launch_range_lists(idx), None, None)

    def fa4():
        return block_sparse(q, k, v, lists, block_size=(128, 128), causal=True, scale=scale)

    r["fa4"] = cuda_time_ms(fa4, warmup=3, rep=10)
    out, lse = fa4()
    r["max_columns"] = int(idx.column_count.max())
    r["mean_columns"] = float(idx.column_count.float().mean())

    def merge(config=None):
        into = (out.clone(), lse.clone())
        _launch_vertical_slash_fwd(q, k, v, idx, scale=scale, merge_into=into, config=config)

    for w in (4, 8):
        for st in (2, 3):
            cfg = LaunchConfig.of(num_warps=w, num_stages=st)
            r[f"merge w{w} st{st}"] = cuda_time_ms(lambda cfg=cfg: merge(cfg), warmup=2, rep=10)
    r["clone_out_lse"] = cuda_time_ms(lambda: (out.clone(), lse.clone()), warmup=2, rep=10)
    r["merge looked-up"] = cuda_time_ms(merge, warmup=2, rep=10)
    r["op auto 128"] = cuda_time_ms(lambda: op(128, "auto"), warmup=3, rep=10)
    r["op triton 128"] = cuda_time_ms(lambda: op(128, "triton"), warmup=2, rep=5)
    r["op triton 64"] = cuda_time_ms(lambda: op(64, "triton"), warmup=2, rep=5)
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default=None, help="write the times (ms) here")
    a = p.parse_args()
    q, k, v = qwen_inputs(S)
    vert, kinds = _slashes()
    res = {}
    for kind, sl in kinds.items():
        res[kind] = parts(q, k, v, vert, sl, D**-0.5)
        print(kind, {n: round(t, 3) if isinstance(t, float) else t for n, t in res[kind].items()})
    res["env"] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
    }
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
