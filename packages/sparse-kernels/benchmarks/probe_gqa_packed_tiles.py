"""GQA-packed A-shape tiles (``triangle.packed_triton``, config key ``PACK=1``) against the table's
config of the triangle kernel, on one GPU: GPU time (``do_bench``) at 32K and 128K for the
narrow A-shape and triangle and the wide A-shape, each packed candidate's output checked
against the table config's.

    python packages/sparse-kernels/benchmarks/probe_gqa_packed_tiles.py  # writes $OUT/packprobe.json
"""

from __future__ import annotations

import itertools
import json
import os

import torch
from sparse_kernels.benchmark_providers import qwen_inputs
from sparse_kernels.triangle.triton import _launch_triangle_fwd
from sparse_kernels.tuning import LaunchConfig
from triton.runtime.errors import OutOfResources
from triton.testing import do_bench

SHAPES = [(8, 512, 0), (8, 512, 128), (128, 4096, 0)]  # (sink, window, last)


def candidates() -> list[LaunchConfig]:
    out = []
    for bm, bn, w, st, tma in itertools.product((64, 128), (32, 64), (4, 8), (2, 3), (0, 1)):
        if bm == 64 and w == 8:
            continue
        kw = dict(BLOCK_M=bm, BLOCK_N=bn, PACK=1, **({"TMA": 1} if tma else {}))
        out.append(LaunchConfig.of(num_warps=w, num_stages=st, **kw))
    return out


def main() -> None:
    res = {"gpu": torch.cuda.get_device_name()}
    scale = 128**-0.5
    for S in (32768, 131072):
        q, k, v = qwen_inputs(S)
        for sink, window, last in SHAPES:

            def f(cfg=None, q=q, k=k, v=v, sink=sink, window=window, last=last):
                return _launch_triangle_fwd(
                    q, k, v, sink=sink, window=window, last=last, scale=scale, config=cfg
                )

            base = f()[0]
            r = {"table": do_bench(f, warmup=25, rep=200)}
            for cfg in candidates():
                try:
                    out = f(cfg)[0]
                except OutOfResources:
                    r[str(cfg)] = None
                    continue
                assert (out.float() - base.float()).abs().max().item() < 0.05, cfg
                r[str(cfg)] = do_bench(lambda cfg=cfg: f(cfg), warmup=25, rep=200)
            r["table_again"] = do_bench(f, warmup=25, rep=200)
            res[f"{S // 1024}K ({sink},{window},{last})"] = r
            print(f"{S // 1024}K ({sink},{window},{last})", r, flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "packprobe.json"), "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
