"""Two same-process measurements of the FA4 engine's helpers on one H100 (bf16, H=28, H_KV=4, D=128).

1. Vertical-slash at 128K, 128x128 tiles, 1000 verticals + 6096 slashes (local, random and
   clustered slashes, the indices of ``bench_vertical_slash.py``): the parts of
   ``vertical_slash_attention(impl="fa4")`` timed apart (index build, block lists, FA4's
   block-sparse kernel, the column merge under each of its four launch configs, the looked-up one),
   and the whole op under ``auto`` and ``triton`` (128x128 and 64x64 tiles). The merge times include
   a clone of ``out`` and ``lse`` (``clone_out_lse``), so that each call starts from FA4's result.
2. The sink-merge launcher's config against 128-row / 8-warp tiles, as ``triangle_attention``
   (FA4 engine) sees it: both swapped in turn into the module, interleaved, 15 rounds, medians.

    python scripts/fa4_parts.py   # writes $OUT/vs_prof.json (default: the current folder)
"""

import json
import os
import statistics

import sparse_kernels.triangle.sink_merge_triton as smt
import torch
import triton
from sparse_kernels import build_vertical_slash_index, triangle_attention, vertical_slash_attention
from sparse_kernels.benchmark_providers import qwen_inputs
from sparse_kernels.benchmarking import clustered_vertical_slash_indices, cuda_time_ms
from sparse_kernels.fa4.engine import block_sparse
from sparse_kernels.tuning import LaunchConfig
from sparse_kernels.vertical_slash.lists_triton import _launch_range_lists
from sparse_kernels.vertical_slash.triton import _launch_vertical_slash_fwd

S = 131072
B, H, D = 1, 28, 128
NV, NS, LOCAL = 1000, 6096, 64
res = {}
q, k, v = qwen_inputs(S)
scale = D**-0.5
vert, clustered = clustered_vertical_slash_indices(
    B, H, S, NV, NS, local=LOCAL, run=64, seed=1, device="cuda"
)
g = torch.Generator().manual_seed(2)
far = [torch.randperm(S - LOCAL, generator=g)[: NS - LOCAL].sort().values for _ in range(B * H)]
rnd = (
    torch.stack([torch.cat([torch.arange(LOCAL), LOCAL + r]) for r in far])
    .to("cuda", torch.int32)
    .reshape(B, H, NS)
)
local = torch.arange(NS, device="cuda", dtype=torch.int32).repeat(B, H, 1)
for kind, sl in (("local", local), ("random", rnd), ("clustered", clustered)):
    r = {}
    build = lambda: build_vertical_slash_index(vert, sl, seq_len=S, block_m=128, block_n=128)
    r["build"] = cuda_time_ms(build, warmup=2, rep=10)
    r["build_nocheck"] = cuda_time_ms(
        lambda: build_vertical_slash_index(
            vert, sl, seq_len=S, block_m=128, block_n=128, check_contents=False
        ),
        warmup=2,
        rep=10,
    )
    idx = build()
    r["lists"] = cuda_time_ms(lambda: _launch_range_lists(idx), warmup=2, rep=10)
    num, bi = _launch_range_lists(idx)
    fa = lambda: block_sparse(
        q, k, v, (num, bi, None, None), block_size=(128, 128), causal=True, scale=scale
    )
    r["fa4"] = cuda_time_ms(fa, warmup=3, rep=10)
    out, lse = fa()
    r["max_columns"] = int(idx.column_count.max())
    r["mean_columns"] = float(idx.column_count.float().mean())
    for w in (4, 8):
        for st in (2, 3):
            cfg = LaunchConfig.of(num_warps=w, num_stages=st)
            r[f"merge w{w} st{st}"] = cuda_time_ms(
                lambda: _launch_vertical_slash_fwd(
                    q, k, v, idx, scale=scale, merge_into=(out.clone(), lse.clone()), config=cfg
                ),
                warmup=2,
                rep=10,
            )
    r["clone_out_lse"] = cuda_time_ms(lambda: (out.clone(), lse.clone()), warmup=2, rep=10)
    r["merge looked-up"] = cuda_time_ms(
        lambda: _launch_vertical_slash_fwd(
            q, k, v, idx, scale=scale, merge_into=(out.clone(), lse.clone())
        ),
        warmup=2,
        rep=10,
    )
    r["op auto 128"] = cuda_time_ms(
        lambda: vertical_slash_attention(q, k, v, vert, sl, block_m=128, block_n=128, scale=scale),
        warmup=3,
        rep=10,
    )
    r["op triton 128"] = cuda_time_ms(
        lambda: vertical_slash_attention(
            q, k, v, vert, sl, block_m=128, block_n=128, scale=scale, impl="triton"
        ),
        warmup=2,
        rep=5,
    )
    r["op triton 64"] = cuda_time_ms(
        lambda: vertical_slash_attention(
            q, k, v, vert, sl, block_m=64, block_n=64, scale=scale, impl="triton"
        ),
        warmup=2,
        rep=5,
    )
    res[kind] = r
    print(kind, {a: (round(b, 3) if isinstance(b, float) else b) for a, b in r.items()}, flush=True)

# sink-merge A/B at the op level: the launcher's config vs 128-row / 8-warp tiles, interleaved
new_launch = smt._launch_sink_merge_fwd


def old_launch(out, lse, q, k, v, *, sink, window, row_lo, row_hi, scale):
    if row_hi <= row_lo or sink == 0:
        return
    Bq, Hq, S_Q, Dq = q.shape
    H_KV, S_KV = k.shape[1], k.shape[2]
    bm, bn, w = 128, 32 if sink <= 32 else 64, 8
    grid = (triton.cdiv(row_hi - row_lo, bm), Bq * Hq)
    smt._sink_merge_fwd_kernel[grid](
        q,
        k,
        v,
        out,
        lse,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *out.stride(),
        *lse.stride(),
        Hq,
        Hq // H_KV,
        S_Q,
        S_KV,
        row_lo,
        row_hi,
        sink,
        window,
        scale,
        D=Dq,
        BLOCK_D=smt.block_d(Dq),
        IEEE=False,
        BLOCK_M=bm,
        BLOCK_N=bn,
        num_warps=w,
    )


for S2 in (32768, 131072):
    q2, k2, v2 = q[:, :, :S2], k[:, :, :S2], v[:, :, :S2]
    for sink, window in ((8, 512), (128, 4096)):
        for last in (0, 128):
            times = {"old": [], "new": []}
            for rnd_ in range(15):
                for name, fn in (("old", old_launch), ("new", new_launch)):
                    smt._launch_sink_merge_fwd = fn
                    times[name].append(
                        cuda_time_ms(
                            lambda: triangle_attention(
                                q2, k2, v2, sink=sink, window=window, last=last, scale=scale
                            ),
                            warmup=2 if rnd_ == 0 else 1,
                            rep=5,
                        )
                    )
            smt._launch_sink_merge_fwd = new_launch
            o, n = statistics.median(times["old"]), statistics.median(times["new"])
            key = f"ab {S2} s{sink} w{window} l{last}"
            res[key] = {"old_ms": o, "new_ms": n, "old_over_new": o / n}
            print(key, round(o, 3), round(n, 3), round(o / n, 3), flush=True)
res["env"] = {
    "gpu": torch.cuda.get_device_name(),
    "torch": torch.__version__,
    "triton": triton.__version__,
}
with open(os.path.join(os.environ.get("OUT", "."), "vs_prof.json"), "w") as f:
    json.dump(res, f, indent=1)
