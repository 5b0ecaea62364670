"""Block-list builders, A/B in one process: the ``NQB x NKB`` mask path against the line path.

For patterns made of columns and diagonals (Vertical-Slash, A-shape) the planner used to build
a bool block mask of every (query block, key block) pair in chunks and compact it
(``lists_from_chunks``); it now merges the column blocks and the diagonal distances by ranks
(``vertical_slash_lists``, ``a_shape_lists``). Both give identical lists (tests); this times
them, and ``plan_layer`` with each, on the head mix of ``apps/vlm-accel/benchmarks/bench_ttft.py``
(per KV group of 7: 4 Grid, 2 Vertical-Slash with exact columns, 1 A-shape; Qwen2.5-VL-7B
heads, random q/k).

    python packages/sparse-patterns/benchmarks/list_builders.py --lengths 128K,1M --out lists.json

CUDA only (CUDA events, median of ``--repeat`` calls after one warm-up).
"""

from __future__ import annotations

import argparse
import json
import statistics
from contextlib import contextmanager

import sparse_patterns.planner.static as static_planner
import sparse_patterns.planner.vertical_slash as vs_planner
import torch
from sparse_patterns import AShape, Grid, HeadConfig, TokenLayout, VerticalSlash, plan_layer
from sparse_patterns.block_lists import a_shape_lists, vertical_slash_lists

LENGTHS = {"128K": 131072, "256K": 262144, "512K": 524288, "1M": 1048576}
BLK = 64


def _time(fn, repeat: int) -> float:
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def _mask_vs(vert, sl, S, blk):
    return vertical_slash_lists(vert, sl, S, blk, path="mask")


def _lines_vs(vert, sl, S, blk):
    return vertical_slash_lists(vert, sl, S, blk, path="lines")


def _mask_ashape(sink, window, S, blk, device):
    return a_shape_lists(sink, window, S, blk, device, path="mask")


def _lines_ashape(sink, window, S, blk, device):
    return a_shape_lists(sink, window, S, blk, device, path="lines")


@contextmanager
def _forced(vs, ashape):
    """plan_layer with one builder forced (``path="auto"`` otherwise)."""
    saved = vs_planner.vertical_slash_lists, static_planner.a_shape_lists
    vs_planner.vertical_slash_lists, static_planner.a_shape_lists = vs, ashape
    try:
        yield
    finally:
        vs_planner.vertical_slash_lists, static_planner.a_shape_lists = saved


def _mix(heads: int = 28, kv_heads: int = 4, tpf: int = 256):
    group = heads // kv_heads
    out = []
    for h in range(heads):
        j = h % group
        if j < 4:
            out.append(HeadConfig(Grid(stride=tpf)))
        elif j < group - 1:
            out.append(HeadConfig(VerticalSlash(1000, 1024, exact_verticals=True)))
        else:
            out.append(HeadConfig(AShape(sink=128, window=4096)))
    return out


def run(S: int, repeat: int) -> dict:
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(S)
    row: dict = {"tokens": S}
    sl = torch.randint(0, S, (8, 1024), device=dev, generator=g)
    none = torch.full((8, 1), -1, device=dev)
    vert = torch.randint(0, S, (8, 1000), device=dev, generator=g)
    for name, args in (("vs_slash_only_8h", (none, sl)), ("vs_1000v_1024s_8h", (vert, sl))):
        a, b = _mask_vs(*args, S, BLK), _lines_vs(*args, S, BLK)
        same = torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        row[name] = {
            "mask_ms": _time(lambda x=args: _mask_vs(*x, S, BLK), repeat),
            "lines_ms": _time(lambda x=args: _lines_vs(*x, S, BLK), repeat),
            "identical": same,
        }
    sink, win = [128] * 4, [4096] * 4
    a, b = _mask_ashape(sink, win, S, BLK, dev), _lines_ashape(sink, win, S, BLK, dev)
    row["a_shape_4h"] = {
        "mask_ms": _time(lambda: _mask_ashape(sink, win, S, BLK, dev), repeat),
        "lines_ms": _time(lambda: _lines_ashape(sink, win, S, BLK, dev), repeat),
        "identical": torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]),
    }
    q = torch.randn(1, 28, S, 128, device=dev, dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, 4, S, 128, device=dev, dtype=torch.bfloat16, generator=g)
    mod = torch.full((S,), 2, dtype=torch.long, device=dev)
    mod[:64] = 0
    mod[-64:] = 0
    lay = TokenLayout(mod, tokens_per_frame=256)
    heads = _mix()
    row["plan_layer_ttft_mix"] = {}
    for name, vs, ashape in (
        ("mask_ms", _mask_vs, _mask_ashape),
        ("lines_ms", _lines_vs, _lines_ashape),
        ("auto_ms", vertical_slash_lists, a_shape_lists),
    ):
        with _forced(vs, ashape):
            t = _time(lambda: plan_layer(q, k, heads, lay, scale=128**-0.5), repeat)
        row["plan_layer_ttft_mix"][name] = t
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="128K,1M")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("list_builders.py: needs a CUDA GPU (times with CUDA events)")
    rows = []
    for name in a.lengths.split(","):
        rows.append(run(LENGTHS[name], a.repeat))
        print(json.dumps(rows[-1]), flush=True)
    env = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
    }
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
