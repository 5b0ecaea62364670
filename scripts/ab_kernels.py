"""Same-process A/B of this tree's sparse-kernels against another revision's copy.

Make the other copy importable under another name (all imports inside the package are relative):

    git archive REV packages/sparse-kernels/src/sparse_kernels | tar -x -C /tmp/ab
    mv /tmp/ab/packages/sparse-kernels/src/sparse_kernels /tmp/ab/sparse_kernels_old
    PYTHONPATH=/tmp/ab:$PYTHONPATH python scripts/ab_kernels.py --json out.json

Times dense causal attention, the triangle and A-shape patterns (TriangleMix's two shapes) and
block-sparse attention (checks off on both sides, so the kernels and their launchers are compared)
at the Qwen2.5-VL-7B attention shape, bf16, interleaving old and new calls; prints the median of
each and new / old. Every op runs under ``impl="auto"``: with ``sparse-kernels[hopper]`` on sm90
that is the FlashAttention-4 engine where ``AUTO_FA4`` lists the op.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch


def _time(fn) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def _block_mask(S: int, density: float, device):
    from torch.nn.attention.flex_attention import BlockMask

    n = S // 128
    g = torch.Generator(device="cpu").manual_seed(0)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    keep = (torch.rand(n, n, generator=g) < density) & causal
    keep |= torch.eye(n, dtype=torch.bool)
    counts = keep.sum(-1).to(torch.int32)
    idx = torch.argsort((~keep).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return BlockMask.from_kv_blocks(
        counts[None, None].to(device), idx[None, None].to(device), BLOCK_SIZE=128
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15, help="timed calls per side (default 15)")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    import sparse_kernels as new
    import sparse_kernels_old as old

    dev = "cuda"
    H, H_KV, D = 28, 4, 128
    rows = []
    for S in (32768, 131072):
        g = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(1, H, S, D, device=dev, dtype=torch.bfloat16, generator=g)
        k = torch.randn(1, H_KV, S, D, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn(1, H_KV, S, D, device=dev, dtype=torch.bfloat16, generator=g)
        cases = {
            "dense": lambda m: m.attention(q, k, v, causal=True),
            "triangle(8,512,128)": lambda m: m.triangle_attention(
                q, k, v, sink=8, window=512, last=128
            ),
            "triangle(128,4096,128)": lambda m: m.triangle_attention(
                q, k, v, sink=128, window=4096, last=128
            ),
            "a-shape(8,512)": lambda m: m.triangle_attention(q, k, v, sink=8, window=512, last=0),
            "a-shape(128,4096)": lambda m: m.triangle_attention(
                q, k, v, sink=128, window=4096, last=0
            ),
        }
        for density in (0.1, 0.3):
            bm = _block_mask(S, density, dev)
            cases[f"block-sparse {density:.0%}"] = lambda m, bm=bm: m.block_sparse_attention(
                q, k, v, bm, check_indices=False
            )
        for name, call in cases.items():
            a, b = call(old), call(new)  # compile both, and compare outputs
            same = bool(torch.equal(a.out, b.out))
            t = {"old": [], "new": []}
            for _ in range(args.reps):
                for side, mod in (("old", old), ("new", new)):
                    t[side].append(_time(lambda mod=mod: call(mod)))
            o, n = statistics.median(t["old"]), statistics.median(t["new"])
            row = {"op": name, "S": S, "old_ms": o, "new_ms": n, "new_over_old": n / o,
                   "outputs_equal": same}  # fmt: skip
            rows.append(row)
            print(f"{name:22s} S={S:6d}  old {o:8.3f} ms  new {n:8.3f} ms  new/old {n / o:.3f}  "
                  f"outputs equal: {same}", flush=True)  # fmt: skip
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "reps": args.reps}  # fmt: skip
    print(meta)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
