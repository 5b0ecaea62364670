"""The vertical-slash index build on CUDA: its Triton kernels against its torch-ops build.

``build_vertical_slash_index`` runs Triton kernels wherever Triton runs and torch ops elsewhere
(CPU without the interpreter). Both builds run here on one GPU, in one process, on the indices of
``bench_vertical_slash.py`` (B=1, H=28, 1000 verticals, 6096 local / random / clustered slashes)
at 128K (128x128 and 64x64 tiles) and 1M (64x64 and 128x128): each pair is checked equal
tensor for tensor, then timed twice, interleaved (CUDA-event medians in ms, no content checks);
``public_checked_ms`` is the public function with its content checks.

    python packages/sparse-kernels/benchmarks/vertical_slash_index_build.py --json build.json
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
from sparse_kernels.benchmarking import cuda_time_ms, vertical_slash_suite_indices
from sparse_kernels.vertical_slash import index as ix

B, H, NV, NS, LOCAL = 1, 28, 1000, 6096, 64
CASES = ((131072, (128, 64)), (1048576, (64, 128)))


def slashes(S: int):
    """``(verticals, {kind: slashes})`` as ``bench_vertical_slash.py`` builds them."""
    return vertical_slash_suite_indices(B, H, S, NV, NS, local=LOCAL, device="cuda")


def compare(vert, sl, S: int, blk: int) -> dict:
    v2, s2 = vert.reshape(B * H, -1), sl.reshape(B * H, -1)

    def tri():
        return ix._build_triton(v2, s2, S, blk, blk)

    def tor():
        return ix._build_torch(v2, s2, S, blk, blk)

    def public():
        return ix.build_vertical_slash_index(vert, sl, seq_len=S, block_m=blk, block_n=blk)

    r = {"equal": all(torch.equal(a, b) for a, b in zip(tri(), tor(), strict=True))}
    for _ in range(2):
        r.setdefault("triton_ms", []).append(cuda_time_ms(tri, warmup=3, rep=20))
        r.setdefault("torch_ms", []).append(cuda_time_ms(tor, warmup=3, rep=20))
    r["public_checked_ms"] = cuda_time_ms(public, warmup=3, rep=20)
    return r


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default="vertical_slash_index_build.json")
    args = p.parse_args(argv)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    res["triton"] = triton.__version__
    for S, blocks in CASES:
        vert, kinds = slashes(S)
        for kind, sl in kinds.items():
            for blk in blocks:
                key = f"{S // 1024}K-{kind}-{blk}"
                res[key] = r = compare(vert, sl, S, blk)
                ratio = min(r["torch_ms"]) / min(r["triton_ms"])
                print(key, r, f"torch / triton {ratio:.2f}x", flush=True)
                torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
