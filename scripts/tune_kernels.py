"""Time kernel variants one config at a time (GPU), to choose autotune lists from measurements.

For the triangle kernel (tri-shape, sink 8, window 512, last 128) and the block-sparse kernel
(random per-head causal block masks of ``bench_block_sparse.py``), each candidate config (tile
sizes, warps, stages; kernel variants can be added as constexpr switches) is forced as the only
autotune config, compared with the first candidate's output, and timed with CUDA events. FlexAttention
and cuDNN dense are timed in the same process as baselines. Prints a table; ``--json`` writes it.

    python3 scripts/tune_kernels.py --seq 131072 --json tune.json
    python3 scripts/tune_kernels.py --smoke      # tiny sizes, runs under TRITON_INTERPRET=1
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch
import triton
from _load import load_repo_module
from sparse_kernels import block_sparse_attention, triangle_attention
from sparse_kernels.benchmarking import cuda_time_ms, env_info
from sparse_kernels.block_sparse import triton as bs_triton
from sparse_kernels.triangle import triton as tri_triton
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

TRI_CANDIDATES = [
    dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st)
    for (bm, bn, w, st) in [(128, 64, 8, 3), (64, 32, 4, 3), (128, 32, 8, 3), (128, 64, 8, 2)]
]
BS_CANDIDATES = [
    dict(TILE_M=tm, TILE_N=tn, num_warps=w, num_stages=st)
    for (tm, tn, w, st) in [(128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (64, 64, 4, 3)]
]
SMOKE_TRI = [dict(BLOCK_M=64, BLOCK_N=32), dict(BLOCK_M=64, BLOCK_N=16)]
SMOKE_BS = [dict(TILE_M=64, TILE_N=64), dict(TILE_M=64, TILE_N=32)]


def _force(kernel, cfg: dict) -> None:
    """Make ``cfg`` the autotuner's only config (Triton then skips tuning and pruning)."""
    c = dict(cfg)
    w, st = c.pop("num_warps", 4), c.pop("num_stages", 1)
    kernel.configs = [triton.Config(c, num_warps=w, num_stages=st)]
    kernel.cache = {}


def _time(fn, smoke: bool) -> float:
    if smoke:
        fn()
        return float("nan")
    return cuda_time_ms(fn, warmup=3, rep=10)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


# bf16 outputs of two correct configs differ by rounding only (about 1e-3 here).
MAX_REL_ERR = 2e-2


def _check_flex(name: str, rel: float) -> None:
    """The kernel as shipped (its own autotuning) must agree with FlexAttention on the same mask;
    every forced config was compared with the first one before it was timed."""
    if rel > MAX_REL_ERR:
        raise SystemExit(f"{name}: ours vs FlexAttention relative error {rel:.2e} > {MAX_REL_ERR}")


def _run_candidates(kernel, candidates, call, smoke, name, extra):
    saved = list(kernel.configs)
    rows = []
    ref = None
    try:
        for cfg in candidates:
            _force(kernel, cfg)
            try:
                out = call()
            except (OutOfResources, CompilationError) as e:  # reported, not fatal
                rows.append(
                    dict(op=name, **extra, config=cfg, error=f"{type(e).__name__}: {e}"[:200])
                )
                continue
            ref = out if ref is None else ref
            err = _rel(out, ref)
            if err > MAX_REL_ERR:
                # A config that computes something else is reported, not timed.
                rows.append(
                    dict(op=name, **extra, config=cfg, rel_err_vs_first=err, error="mismatch")
                )
                print(f"{name} {extra} {cfg}: MISMATCH (rel err vs first {err:.1e})", flush=True)
                continue
            ms = _time(call, smoke)
            rows.append(dict(op=name, **extra, config=cfg, ms=ms, rel_err_vs_first=err))
            print(f"{name} {extra} {cfg}: {ms:.3f} ms (rel err vs first {err:.1e})", flush=True)
    finally:
        kernel.configs = saved
        kernel.cache = {}
    return rows


def _bench_module():
    return load_repo_module(
        "bench_block_sparse", "packages/sparse-kernels/benchmarks/bench_block_sparse.py"
    )


def tune_triangle(S: int, smoke: bool) -> list[dict]:
    dev = "cpu" if smoke else "cuda"
    dt = torch.float16 if smoke else torch.bfloat16
    H, H_KV, D = (2, 1, 64) if smoke else (28, 4, 128)
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(1, H, S, D, device=dev, dtype=dt, generator=g)
    k = torch.randn(1, H_KV, S, D, device=dev, dtype=dt, generator=g)
    v = torch.randn(1, H_KV, S, D, device=dev, dtype=dt, generator=g)
    sink, window, last = (8, 512, 128) if not smoke else (8, 40, 16)

    def call():
        return triangle_attention(q, k, v, sink=sink, window=window, last=last, impl="triton").out

    cands = SMOKE_TRI if smoke else TRI_CANDIDATES
    rows = _run_candidates(
        tri_triton._triangle_fwd_kernel, cands, call, smoke, "triangle", dict(S=S)
    )
    if not smoke:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def mask_mod(b, h, qi, kj):
            return (qi >= kj) & ((kj < sink) | (qi - kj < window) | (qi >= S - last))

        bm = create_block_mask(mask_mod, None, None, S, S, device="cuda", _compile=True)
        flex = torch.compile(flex_attention, dynamic=False)
        fo = flex(q, k, v, block_mask=bm, enable_gqa=True)
        rel = _rel(fo, call())
        _check_flex("triangle", rel)
        rows.append(dict(op="triangle", S=S, config="flex", ms=_time(lambda: flex(q, k, v, block_mask=bm, enable_gqa=True), smoke), rel_err_vs_first=rel))  # fmt: skip
        print(f"triangle S={S} flex: {rows[-1]['ms']:.3f} ms", flush=True)
    return rows


def tune_block_sparse(S: int, density: float, smoke: bool) -> list[dict]:
    if smoke:
        from sparse_kernels.testing import make_qkv
        from torch.nn.attention.flex_attention import create_block_mask

        q, k, v = make_qkv(1, 2, 1, S, S, 64, dtype=torch.float16, device="cpu", seed=0)

        def some_blocks(b, h, qi, kj):
            return (qi >= kj) & ((qi // 64 + kj // 64 + h) % 3 != 1)

        bm = create_block_mask(some_blocks, 1, 2, S, S, device="cpu", BLOCK_SIZE=64)
    else:
        mod = _bench_module()
        q, k, v = mod._inputs(S)
        bm = mod._mask(S, density)[0]

    block_sparse_attention(q, k, v, bm, causal=True, check_indices=True)  # validates the mask

    def call():
        return block_sparse_attention(q, k, v, bm, causal=True, check_indices=False).out

    cands = SMOKE_BS if smoke else BS_CANDIDATES
    rows = _run_candidates(
        bs_triton._block_sparse_fwd_kernel, cands, call, smoke, "block_sparse",
        dict(S=S, density=density),
    )  # fmt: skip
    if not smoke:
        from torch.nn.attention.flex_attention import flex_attention

        flex = torch.compile(flex_attention, dynamic=False)
        fo = flex(q, k, v, block_mask=bm, enable_gqa=True)
        ms = _time(lambda: flex(q, k, v, block_mask=bm, enable_gqa=True), smoke)
        rel = _rel(fo, call())
        _check_flex("block_sparse", rel)
        rows.append(dict(op="block_sparse", S=S, density=density, config="flex", ms=ms, rel_err_vs_first=rel))  # fmt: skip
        print(f"block_sparse S={S} d={density} flex: {ms:.3f} ms", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=131072)
    ap.add_argument("--ops", default="triangle,block_sparse")
    ap.add_argument("--densities", default="0.1,0.3")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    S = 256 if a.smoke else a.seq
    rows: list[dict] = []
    ops = a.ops.split(",")
    if "triangle" in ops:
        rows += tune_triangle(S, a.smoke)
    if "block_sparse" in ops:
        for d in (float(x) for x in a.densities.split(",")):
            rows += tune_block_sparse(S, d, a.smoke)
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(dict(env=env_info(), rows=rows), indent=1))


if __name__ == "__main__":
    main()
