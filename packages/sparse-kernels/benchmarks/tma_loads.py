"""K/V tiles through the copy engine (TMA) against index loads, in our Triton kernels.

The launchers take ``tma=`` (``None`` picks the copy engine on compute capability 9.0 and later);
this script runs each kernel both ways on one GPU, in one process, on the same inputs and the same
launch config: the two outputs are compared (max abs difference, which should be 0 or a few
bf16 ulps), then both are timed, interleaved, three times (CUDA-event medians in ms). Cases, on
the Qwen2.5-VL-7B shape (H=28, H_KV=4, D=128, bf16) at 32K and 128K: dense causal attention;
block-sparse attention (10% and 30% of the causal 128x128 blocks, random per head, like
``bench_block_sparse.py``); the vertical-slash kernel with 64x64 tiles on the indices of
``bench_vertical_slash.py`` (1000 verticals, 6096 local / random / clustered slashes); the
triangle kernel on ``bench_triangle.py``'s (sink, window, last) cases, triangle and A-shape.
``--all-configs`` also runs every tuning candidate of the dense and block-sparse kernels at 32K
and every tile config of the triangle's candidates (their ``TMA`` key set aside: both ways are
run) at both lengths, beside each kernel's looked-up config; ``--ops`` picks the kernels.

    python packages/sparse-kernels/benchmarks/tma_loads.py --json tma.json
"""

from __future__ import annotations

import argparse
import json

import torch
from sparse_kernels.attention import triton as dense_triton
from sparse_kernels.benchmark_providers import qwen_inputs
from sparse_kernels.benchmarking import cuda_time_ms, env_info, vertical_slash_suite_indices
from sparse_kernels.block_sparse import triton as bs_triton
from sparse_kernels.triangle import triton as tri_triton
from sparse_kernels.tuning import LaunchConfig
from sparse_kernels.vertical_slash import build_vertical_slash_index
from sparse_kernels.vertical_slash.triton import _launch_vertical_slash_fwd

BLOCK = 128
SEQS = (32768, 131072)
DENSITIES = (0.1, 0.3)
OPS = ("dense", "block_sparse", "vertical_slash", "triangle")
TRIANGLE_CASES = ((8, 512, 128), (8, 512, 0), (128, 4096, 128), (128, 4096, 0))


def block_lists(S: int, H: int, density: float):
    """``(partial num, partial idx, full num, full idx)``: the diagonal block as the partial
    list, a random ``density`` fraction of the causal blocks (diagonal included) as full ones."""
    nb = S // BLOCK
    g = torch.Generator(device="cuda").manual_seed(int(density * 100))
    m = torch.arange(nb, device="cuda")
    p = (density * nb * (nb + 1) / 2 - nb) / (nb * (nb - 1) / 2)
    sel = (torch.rand(1, H, nb, nb, device="cuda", generator=g) < p) & (m[:, None] > m[None, :])
    full_num = sel.sum(-1, dtype=torch.int32)
    full_idx = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    part_num = torch.ones(1, H, nb, dtype=torch.int32, device="cuda")
    part_idx = m.int().reshape(1, 1, nb, 1).expand(1, H, nb, 1).contiguous()
    return part_num, part_idx, full_num, full_idx


def ab(call, rep: int) -> dict:
    """Both ways, checked against each other, then timed interleaved."""
    off, on = call(False), call(True)
    r = {"max_abs_diff": (off[0].float() - on[0].float()).abs().max().item()}
    for _ in range(3):
        r.setdefault("index_ms", []).append(cuda_time_ms(lambda: call(False), warmup=2, rep=rep))
        r.setdefault("tma_ms", []).append(cuda_time_ms(lambda: call(True), warmup=2, rep=rep))
    r["speedup"] = min(r["index_ms"]) / min(r["tma_ms"])
    return r


def triangle_tiles() -> list[LaunchConfig]:
    """The triangle candidates' distinct tile configs, without their ``TMA`` key."""
    out = []
    for c in tri_triton.SPEC.candidates:
        tiles = {k: v for k, v in c.tiles if k != "TMA"}
        bare = LaunchConfig.of(num_warps=c.num_warps, num_stages=c.num_stages, **tiles)
        if bare not in out:
            out.append(bare)
    return out


def run_length(S: int, all_configs: bool, ops: list[str], res: dict) -> None:
    """Every case of ``ops`` at length ``S`` into ``res``."""
    q, k, v = qwen_inputs(S)
    scale = q.shape[-1] ** -0.5
    rep = 20 if S <= 32768 else 5
    tune = all_configs and S <= 32768

    def dense(cfg):
        return lambda tma: dense_triton._launch_attention_fwd(
            q, k, v, causal=True, scale=scale, config=cfg, tma=tma
        )

    def sparse(lists, cfg):
        return lambda tma: bs_triton._launch_block_sparse_fwd(
            q, k, v, *lists, block_m=BLOCK, block_n=BLOCK, causal=True, scale=scale,
            config=cfg, tma=tma,
        )  # fmt: skip

    def vertical_slash(index):
        return lambda tma: _launch_vertical_slash_fwd(q, k, v, index, scale=scale, tma=tma)

    def triangle(case, cfg):
        sink, window, last = case
        return lambda tma: tri_triton._launch_triangle_fwd(
            q, k, v, sink=sink, window=window, last=last, scale=scale, config=cfg, tma=tma
        )

    for case in TRIANGLE_CASES if "triangle" in ops else ():
        for cfg in [None, *(triangle_tiles() if all_configs else ())]:
            key = f"triangle-{S // 1024}K-{case}-{cfg or 'table'}"
            res[key] = ab(triangle(case, cfg), rep)
            print(key, res[key], flush=True)
    if "vertical_slash" in ops:
        vert, kinds = vertical_slash_suite_indices(1, q.shape[1], S, 1000, 6096, device="cuda")
        for kind, sl in kinds.items():
            index = build_vertical_slash_index(vert, sl, seq_len=S, block_m=64, block_n=64)
            key = f"vertical_slash-{S // 1024}K-{kind}-64x64"
            res[key] = ab(vertical_slash(index), rep)
            print(key, res[key], flush=True)
    for cfg in [None, *(dense_triton.SPEC.candidates if tune else ())] if "dense" in ops else ():
        key = f"dense-{S // 1024}K-{cfg or 'table'}"
        res[key] = ab(dense(cfg), rep)
        print(key, res[key], flush=True)
    fitting = [c for c in bs_triton.SPEC.candidates if BLOCK % c["TILE_N"] == 0]
    for density in DENSITIES if "block_sparse" in ops else ():
        lists = block_lists(S, q.shape[1], density)
        for cfg in [None, *(fitting if tune else ())]:
            key = f"block_sparse-{S // 1024}K-{density}-{cfg or 'table'}"
            res[key] = ab(sparse(lists, cfg), rep)
            print(key, res[key], flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default="tma_loads.json")
    p.add_argument("--all-configs", action="store_true")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of {OPS}")
    args = p.parse_args(argv)
    ops = args.ops.split(",")
    if not set(ops) <= set(OPS):
        p.error(f"--ops: expected names from {OPS}, got {ops}")
    res = {"env": env_info()}
    for S in SEQS:
        run_length(S, args.all_configs, ops, res)
        torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
