"""The fold pass (``_fold_partials``: interior kernel, edge kernel, merge) at the Qwen2.5-VL-7B
attention shape (H=28, H_KV=4, D=128, 64 last rows, period 256) over its launch settings: query
heads per interior program (``_FOLD_HEADS``, the key tile shared across them), tile width,
warps, stages and program count. Each setting's merged partials are compared with those of one
head per program (the kernel before key sharing) in the same process.

    python3 scripts/fold_heads_gpu.py --seqs 131072 1048576 --json out.json
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
from sparse_kernels.benchmarking import cuda_time_ms, env_info
from sparse_kernels.estimate import triton as est
from sparse_patterns import estimate as E


def _time(qr, k, S, L, P, lo, hi, sc, rep, **kw):
    fn = lambda: est._fold_partials(qr, k, S - L, period=P, lo=lo, hi=hi, scale=sc, **kw)  # noqa: E731
    out = fn()
    return cuda_time_ms(fn, warmup=3, rep=rep), out


def _diff(a, b) -> float:
    """Largest absolute difference of the merged sums relative to their largest magnitude."""
    return max(
        float((x.float() - y.float()).abs().max() / y.float().abs().max().clamp_min(1e-30))
        for x, y in zip(a[:2], b[:2])
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, nargs="+", default=[131072])
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="only the settings of the first stage")
    a = ap.parse_args()
    H, H_KV, D, L, P = 28, 4, 128, 64, 256
    out = {"env": env_info(), "shape": dict(H=H, H_KV=H_KV, D=D, L=L, P=P), "rows": []}
    for S in a.seqs:
        g = torch.Generator(device="cuda").manual_seed(S)
        q = torch.randn(1, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(1, H_KV, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        lo, hi = E.grid_window(P, S)
        sc = D**-0.5
        est._FOLD_HEADS = 1
        base_ms, base = _time(q, k, S, L, P, lo, hi, sc, a.rep)
        est._FOLD_HEADS = 0
        def_ms, dflt = _time(q, k, S, L, P, lo, hi, sc, a.rep)
        row = {"S": S, "heads1_default_ms": base_ms, "default_ms": def_ms,
               "default_rel_diff": _diff(dflt, base), "settings": []}  # fmt: skip
        print(f"S={S}: one head per program {base_ms:.4f} ms, default {def_ms:.4f} ms", flush=True)
        stage1 = itertools.product((1, 2, 4, 8), (32, 64, 128), (4, 8))
        results = []
        for hp, bn, w in stage1:
            est._FOLD_HEADS = hp
            try:
                ms, got = _time(q, k, S, L, P, lo, hi, sc, a.rep, block_n=bn, num_warps=w)
                r = dict(heads=hp, block_n=bn, warps=w, stages=2, ms=ms, rel_diff=_diff(got, base))
            except Exception as e:  # out of registers / shared memory: recorded, not fatal
                r = dict(
                    heads=hp, block_n=bn, warps=w, stages=2, error=f"{type(e).__name__}: {e}"[:200]
                )
            print(r, flush=True)
            results.append(r)
        if not a.quick:
            ok = sorted((r for r in results if "ms" in r), key=lambda r: r["ms"])[:3]
            for r0, st, progs in itertools.product(ok, (2, 3, 4), (256, 512, 1024, 2048)):
                est._FOLD_HEADS = r0["heads"]
                old = est._FOLD_PROGRAMS, est._FOLD_SHORT_KEYS
                est._FOLD_PROGRAMS, est._FOLD_SHORT_KEYS = progs, 0
                try:
                    ms, got = _time(q, k, S, L, P, lo, hi, sc, a.rep, block_n=r0["block_n"],
                                    num_warps=r0["warps"], num_stages=st)  # fmt: skip
                    r = dict(heads=r0["heads"], block_n=r0["block_n"], warps=r0["warps"],
                             stages=st, programs=progs, ms=ms, rel_diff=_diff(got, base))  # fmt: skip
                except Exception as e:
                    r = dict(heads=r0["heads"], block_n=r0["block_n"], warps=r0["warps"],
                             stages=st, programs=progs, error=f"{type(e).__name__}: {e}"[:200])  # fmt: skip
                finally:
                    est._FOLD_PROGRAMS, est._FOLD_SHORT_KEYS = old
                print(r, flush=True)
                results.append(r)
        est._FOLD_HEADS = 0
        row["settings"] = results
        out["rows"].append(row)
        del q, k
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
