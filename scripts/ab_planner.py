"""Same-process A/B of the MMInference planner: this tree's packages against an older copy.

The two copies share import names (``sparse_kernels``, ``sparse_patterns``, ``modality_index``)
and import each other by absolute name, some of them lazily inside functions. So each copy is a
:class:`Tree`: the module objects it imported, keyed as in ``sys.modules``. This tree is imported
the ordinary way (PYTHONPATH); the old one is imported from its folder with the current entries
taken out of ``sys.modules`` and its ``src`` folders first on ``sys.path``, then put aside. Every
call into a tree runs inside ``tree.active()``, which puts that tree's modules into
``sys.modules`` (so an import inside one of its functions finds its own copy) and restores what
was there on exit. The swap happens outside the timed region.

Set-up (the old tree unpacked with its repository layout; ``.ab/`` is git-ignored)::

    mkdir -p .ab/base && git archive 106c160 packages | tar -x -C .ab/base

Run (H100), this tree on PYTHONPATH::

    PYTHONPATH=$(ls -d $PWD/packages/*/src | paste -sd:) python scripts/ab_planner.py \\
        --lengths 128K,512K,1M --cases grid,vs,boundary --base-rev 106c160 --json ab.json

CPU dry run (Triton interpreter, tiny sizes; a check of the logic, not a figure)::

    TRITON_INTERPRET=1 python scripts/ab_planner.py --device cpu --dtype float32 --lengths 2K \\
        --reps 1 --warmup 0 --heads 4 --kv-heads 2 --head-dim 32 --tokens-per-frame 32 --block 32

One layer per case, called as a model calls it (plan + run): the old tree through
``mminference_attention``; a tree that has ``MMInferencePlanner`` through one planner object
held across the calls of a case (``--new-api functions``: its thin functions instead). Cases,
at the Qwen2.5-VL-7B attention shape by default:

* ``grid``: every head ``Grid`` (stride searched, vertical and slash lines) on an all-video
  layout with ``--tokens-per-frame`` tokens per frame;
* ``vs``: every head ``VerticalSlash()`` (1000 columns, 1024 diagonals) on the same layout;
* ``boundary``: heads ``[0, H/2)`` ``VerticalSlash`` + ``QBoundary``, the rest ``VerticalSlash``
  + ``TwoDBoundary``, on text (S/8) + video + text.

q, k and v are seeded, with a planted grid (period = tokens per frame): key columns at one phase
per KV head and keys at the query's position inside a frame score high, as in a video.

Before timing, the outputs are compared (max |old - new| within 2 bf16 rounding steps of the
largest output) and so are the plans' block lists (per query block, as sets), permutations,
strides and phases wherever both plans expose them. Timing: ``--warmup`` calls per side, then
``--reps`` rounds alternating which side goes first; the median of each side (CUDA events on a
GPU, wall clock on the CPU). ``--json`` is rewritten after every case. Exit status: 0; 1 when a
check failed or a case raised (the error is printed and recorded, the other cases still run);
2 for bad arguments.

Size: one script, in sections (the two trees, inputs, one layer's call, checks, timing, command
line); the module swap is used by nothing else.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import inspect
import json
import math
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("modality_index", "sparse_kernels", "sparse_patterns")
CASES = ("grid", "vs", "boundary")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# Outputs agree within this many bf16 rounding steps of the largest output value.
ULPS = 2


# ---- two copies of the packages in one process ----------------------------------------------


def _top(name: str) -> str:
    return name.partition(".")[0]


@dataclass
class Tree:
    """One copy of ``packages``: its module objects by ``sys.modules`` name (a module that one of
    its functions imports later is added on the way out of :meth:`active`), and the folders put
    first on ``sys.path`` while it is active."""

    label: str
    packages: tuple[str, ...]
    modules: dict[str, ModuleType]
    paths: tuple[str, ...] = ()

    def __getitem__(self, name: str) -> ModuleType:
        return self.modules[name]

    @contextlib.contextmanager
    def active(self) -> Iterator[Tree]:
        """``sys.modules`` (and ``sys.path``) as this tree needs them inside the block; on exit
        the entries of ``packages`` go back to what they were, and modules first imported inside
        the block are kept as this tree's."""
        saved = {n: sys.modules.pop(n) for n in list(sys.modules) if _top(n) in self.packages}
        sys.modules.update(self.modules)
        sys.path[:0] = self.paths
        try:
            yield self
        finally:
            for p in self.paths:
                sys.path.remove(p)
            for n in [n for n in sys.modules if _top(n) in self.packages]:
                self.modules[n] = sys.modules.pop(n)
            sys.modules.update(saved)


def imported_tree(label: str, packages: tuple[str, ...]) -> Tree:
    """The copy of ``packages`` that an ordinary import finds (the one left in ``sys.modules``)."""
    for name in packages:
        importlib.import_module(name)
    mods = {n: m for n, m in sys.modules.items() if _top(n) in packages}
    return Tree(label, packages, mods)


def load_tree(label: str, root: pathlib.Path, packages: tuple[str, ...]) -> Tree:
    """``packages`` imported from ``root/packages/*/src`` beside the copy already imported,
    which ``sys.modules`` holds again on return."""
    paths = tuple(str(p) for p in sorted(root.glob("packages/*/src")))
    missing = [n for n in packages if not any((pathlib.Path(p) / n).is_dir() for p in paths)]
    if missing:
        raise FileNotFoundError(
            f"{label} tree: expected packages {list(packages)} under {root}/packages/*/src, "
            f"missing {missing}"
        )
    tree = Tree(label, packages, {}, paths)
    with tree.active():
        for name in packages:
            importlib.import_module(name)
    return tree


# ---- inputs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    heads: int
    kv_heads: int
    head_dim: int
    tokens_per_frame: int
    block: int
    dtype: torch.dtype
    device: torch.device


def planted_qkv(S: int, shape: Shape, seed: int = 0):
    """Seeded ``q [1, H, S, D]``, ``k, v [1, H_KV, S, D]`` of ``shape.dtype`` with a grid of
    period ``P = tokens_per_frame``: feature 0 lifts the keys at ``j = 37 g (mod P)`` of KV head
    ``g`` for every query (vertical lines, logit about 10), features ``1..2F`` carry a Fourier
    code of ``i mod P`` in both q and k (slash lines: ``i = j (mod P)``, logit about 10)."""
    H, H_KV, D, P, dev = (shape.heads, shape.kv_heads, shape.head_dim, shape.tokens_per_frame,
                          shape.device)  # fmt: skip
    g = torch.Generator(device=dev).manual_seed(seed)
    q = torch.randn(1, H, S, D, device=dev, generator=g).mul_(0.4)
    k = torch.randn(1, H_KV, S, D, device=dev, generator=g).mul_(0.4)
    v = torch.randn(1, H_KV, S, D, device=dev, generator=g)
    pos = torch.arange(S, device=dev)
    lift = (10.0 * D**0.5) ** 0.5
    phase = (torch.arange(H_KV, device=dev) * 37) % P
    q[..., 0] += lift
    k[0, :, :, 0] += lift * ((pos[None] - phase[:, None]) % P == 0)
    F = min(32, (D - 1) // 2)
    if F:
        freq = torch.arange(1, F + 1, device=dev, dtype=torch.float32)
        ang = (2 * math.pi / P) * (pos % P).float()[:, None] * freq
        code = torch.cat([ang.cos(), ang.sin()], -1) * (10.0 * D**0.5 / F) ** 0.5
        q[..., 1 : 1 + 2 * F] += code
        k[..., 1 : 1 + 2 * F] += code
    return q.to(shape.dtype), k.to(shape.dtype), v.to(shape.dtype)


def case_inputs(case: str, sp: ModuleType, mi: ModuleType, S: int, shape: Shape):
    """``(head configs, layout)`` of ``case`` built from one tree's ``sparse_patterns`` (``sp``)
    and ``modality_index`` (``mi``): each tree's planner checks types against its own classes."""
    H, P, dev = shape.heads, shape.tokens_per_frame, shape.device
    video = mi.ModalityLayout.from_spans([(mi.Modality.VIDEO, S, P)], device=dev)
    if case == "grid":
        return [sp.HeadConfig(sp.Grid(use_hline=False, use_vline=True, use_slash=True))] * H, video
    if case == "vs":
        return [sp.HeadConfig(sp.VerticalSlash())] * H, video
    text = S // 8
    n_video = (S - 2 * text) // P * P
    layout = mi.ModalityLayout.from_spans(
        [(mi.Modality.TEXT, text), (mi.Modality.VIDEO, n_video, P),
         (mi.Modality.TEXT, S - text - n_video)], device=dev,
    )  # fmt: skip
    q_heads = [sp.HeadConfig(sp.VerticalSlash(), sp.QBoundary())] * (H // 2)
    return q_heads + [sp.HeadConfig(sp.VerticalSlash(), sp.TwoDBoundary())] * (H - H // 2), layout


# ---- one layer's call -----------------------------------------------------------------------


@dataclass(frozen=True)
class Layer:
    """How a tree runs one layer: ``attention(q, k, v)`` (plan + run) and ``plan(q, k)``."""

    api: str
    attention: Callable
    plan: Callable


def layer_of(
    tree: Tree, head_config, layout, shape: Shape, impl: str, functions: bool = False
) -> Layer:
    """The tree's per-layer entry: one ``MMInferencePlanner`` where the tree has that class and
    ``functions`` is False, else ``plan_layer`` / ``mminference_attention``. Call inside
    ``tree.active()``."""
    sp = tree["sparse_patterns"]
    if hasattr(sp, "MMInferencePlanner") and not functions:
        params = inspect.signature(sp.MMInferencePlanner).parameters
        if not {"block", "impl"} <= params.keys():
            raise TypeError(
                f"{tree.label} tree: expected MMInferencePlanner(..., block=, impl=), got "
                f"MMInferencePlanner{inspect.signature(sp.MMInferencePlanner)}"
            )
        planner = sp.MMInferencePlanner(block=shape.block, impl=impl)
        return Layer(
            "MMInferencePlanner",
            lambda q, k, v: planner.attention(q, k, v, head_config, layout),
            lambda q, k: planner.plan(q, k, head_config, layout),
        )
    return Layer(
        "mminference_attention",
        lambda q, k, v: sp.mminference_attention(
            q, k, v, head_config, layout, block=shape.block, impl=impl
        ),
        lambda q, k: sp.plan_layer(q, k, head_config, layout, block=shape.block),
    )


# ---- checks ---------------------------------------------------------------------------------


def _lists(plan) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(kv_block_indices [B, H, NQB, W], kv_block_counts [B, H, NQB])``, None if not shown."""
    idx, cnt = getattr(plan, "kv_block_indices", None), getattr(plan, "kv_block_counts", None)
    ok = isinstance(idx, torch.Tensor) and isinstance(cnt, torch.Tensor)
    return (idx, cnt) if ok else None


def _sorted_listed(idx: torch.Tensor, cnt: torch.Tensor) -> torch.Tensor:
    """Each row's first ``cnt`` entries of ``idx``, sorted, the rows cut to the widest."""
    cnt = cnt.long()
    listed = torch.arange(idx.shape[-1], device=idx.device) < cnt[..., None]
    srt = torch.where(listed, idx.long(), torch.iinfo(torch.int64).max).sort(-1).values
    return srt[..., : int(cnt.max()) if cnt.numel() else 0]


def same_lists(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> bool:
    """The same key blocks listed for every query block and head (their order in a row and the
    padding after them aside); one head at a time, to bound the int64 copies."""
    (ia, ca), (ib, cb) = a, b
    if ca.shape != cb.shape or not torch.equal(ca.long(), cb.long()):
        return False
    return all(
        torch.equal(_sorted_listed(ia[:, h], ca[:, h]), _sorted_listed(ib[:, h], cb[:, h]))
        for h in range(ca.shape[1])
    )


def _field(plan, name: str):
    """A plan's ``name``: an attribute, or an entry of its ``meta`` dict; ``...`` when absent."""
    if hasattr(plan, name):
        return getattr(plan, name)
    meta = getattr(plan, "meta", None)
    return meta.get(name, ...) if isinstance(meta, dict) else ...


def compare_plans(old, new) -> dict[str, bool | str]:
    """Each part both plans expose: True when equal; the parts one of them lacks say so."""
    got: dict[str, bool | str] = {}
    a, b = _lists(old), _lists(new)
    if a is None or b is None:
        got["lists"] = f"not compared: no block lists on the {'old' if a is None else 'new'} plan"
    else:
        got["lists"] = same_lists(a, b)
    for name in ("q_perm", "kv_perm", "stride", "phase"):
        x, y = _field(old, name), _field(new, name)
        if x is ... or y is ...:
            got[name] = f"not compared: absent on the {'old' if x is ... else 'new'} plan"
        elif x is None or y is None:
            got[name] = x is None and y is None
        else:
            got[name] = bool(torch.equal(torch.as_tensor(x).long(), torch.as_tensor(y).long()))
    return got


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """``(max |a - b|, tolerance)`` of ``[B, H, S, D]`` outputs: ``ULPS`` bf16 rounding steps at
    the largest ``|a|``. One head at a time: float32 copies of a 1M-token layer would not fit."""
    diff = amax = 0.0
    for h in range(a.shape[1]):
        x, y = a[:, h].float(), b[:, h].float()
        diff = max(diff, float((x - y).abs().max()))
        amax = max(amax, float(x.abs().max()))
    return diff, ULPS * torch.finfo(torch.bfloat16).eps * max(1.0, amax)


# ---- timing ---------------------------------------------------------------------------------


def time_ms(fn: Callable[[], object], device: torch.device) -> float:
    """One call of ``fn`` in ms: CUDA events with the GPU idle at the start, else wall clock."""
    if device.type != "cuda":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end)


def run_case(case: str, S: int, trees: tuple[Tree, Tree], shape: Shape, args) -> dict:
    q, k, v = planted_qkv(S, shape)
    layers = []
    for tree in trees:
        with tree.active():
            hc, layout = case_inputs(
                case, tree["sparse_patterns"], tree["modality_index"], S, shape
            )
            functions = args.new_api == "functions"
            layers.append(layer_of(tree, hc, layout, shape, args.impl, functions))
    # The plans, then the outputs: at 1M tokens both pairs at once would crowd the GPU.
    plans = []
    for tree, layer in zip(trees, layers):
        with tree.active():
            plans.append(layer.plan(q, k))
    parts = compare_plans(*plans)
    del plans
    outs = []
    for tree, layer in zip(trees, layers):
        with tree.active():
            outs.append(layer.attention(q, k, v).out)
    diff, tol = max_abs_diff(*outs)
    del outs
    times: tuple[list[float], list[float]] = ([], [])
    for r in range(args.warmup + args.reps):
        for i in (0, 1) if r % 2 == 0 else (1, 0):
            with trees[i].active():
                t = time_ms(lambda i=i: layers[i].attention(q, k, v), shape.device)
            if r >= args.warmup:
                times[i].append(t)
    old_ms, new_ms = (statistics.median(t) for t in times)
    return {
        "case": case, "S": S, "old_ms": old_ms, "new_ms": new_ms, "new_over_old": new_ms / old_ms,
        "old_times_ms": times[0], "new_times_ms": times[1],
        "old_api": layers[0].api, "new_api": layers[1].api,
        "max_abs_diff": diff, "tolerance": tol, "outputs_agree": diff <= tol, "plan_parts": parts,
        "plans_equal": all(p is True for p in parts.values() if not isinstance(p, str)),
    }  # fmt: skip


# ---- command line ---------------------------------------------------------------------------


def parse_length(text: str) -> int:
    t = text.strip().upper()
    mult = {"K": 1024, "M": 1024 * 1024}.get(t[-1:], 1)
    try:
        n = int(t[:-1] if mult > 1 else t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a length like 4096, 128K or 1M, got {text!r}"
        ) from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a length >= 1, got {text!r}")
    return n


def _label(S: int) -> str:
    for unit, n in (("M", 1 << 20), ("K", 1 << 10)):
        if S % n == 0:
            return f"{S // n}{unit}"
    return str(S)


def _revision(given: str | None) -> str:
    if given:
        return given
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "packages"],
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git here; pass --new-rev)"
    return head + (" + uncommitted changes in packages/" if dirty else "")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="128K,512K,1M",
                    help="sequence lengths, comma-separated (default 128K,512K,1M)")  # fmt: skip
    ap.add_argument("--cases", default=",".join(CASES), help=f"subset of {','.join(CASES)}")
    ap.add_argument("--reps", type=int, default=15, help="timed calls per side (default 15)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls per side (default 3)")
    ap.add_argument("--json", help="also write env and rows here")
    ap.add_argument("--base", default=str(ROOT / ".ab" / "base"),
                    help="the old tree: a folder holding packages/*/src (default .ab/base)")  # fmt: skip
    ap.add_argument("--base-rev", default="unrecorded", help="the old tree's commit, recorded")
    ap.add_argument("--new-rev", help="this tree's commit, recorded (default: from git)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--dtype", default="bfloat16", choices=tuple(DTYPES))
    ap.add_argument("--impl", default="auto", choices=("auto", "triton", "reference"))
    ap.add_argument("--new-api", default="auto", choices=("auto", "functions"),
                    help="auto: one MMInferencePlanner per case where the new tree has it; "
                         "functions: its plan_layer / mminference_attention")  # fmt: skip
    ap.add_argument("--heads", type=int, default=28)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--tokens-per-frame", type=int, default=256, help="the Grid stride prior")
    ap.add_argument("--block", type=int, default=64, help="the planner's block (default 64)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        lengths = [parse_length(x) for x in args.lengths.split(",")]
    except argparse.ArgumentTypeError as e:
        ap.error(f"--lengths: {e}")
    cases = args.cases.split(",")
    if not set(cases) <= set(CASES) or not cases:
        ap.error(f"--cases: expected a subset of {','.join(CASES)}, got {args.cases!r}")
    for name in ("reps", "heads", "kv_heads", "head_dim", "tokens_per_frame", "block"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: expected >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        ap.error(f"--warmup: expected >= 0, got {args.warmup}")
    if args.heads % args.kv_heads:
        ap.error(f"--heads: expected a multiple of --kv-heads {args.kv_heads}, got {args.heads}")
    P = args.tokens_per_frame
    for S in lengths:
        if S % P:
            ap.error(f"--lengths: expected multiples of --tokens-per-frame {P}, got {S}")
        if "boundary" in cases and S - 2 * (S // 8) < P:
            ap.error(f"--lengths: expected room for one frame ({P} tokens) between the boundary "
                     f"case's two text spans of S/8, got S={S}")  # fmt: skip
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here (use --device cpu with TRITON_INTERPRET=1)")
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        ap.error("--device cpu: expected TRITON_INTERPRET=1 in the environment (Triton reads it "
                 f"at import), got {os.environ.get('TRITON_INTERPRET')!r}")  # fmt: skip
    base = pathlib.Path(args.base).resolve()
    new = imported_tree("new", PACKAGES)
    new_file = pathlib.Path(new["sparse_patterns"].__file__).resolve()
    if not new_file.is_relative_to(ROOT / "packages"):
        ap.error(f"the new tree: expected sparse_patterns from {ROOT / 'packages'} (set "
                 f"PYTHONPATH to packages/*/src), got {new_file}")  # fmt: skip
    try:
        old = load_tree("old", base, PACKAGES)
    except FileNotFoundError as e:
        ap.error(str(e))
    shape = Shape(args.heads, args.kv_heads, args.head_dim, P, args.block, DTYPES[args.dtype],
                  torch.device(args.device))  # fmt: skip
    import triton

    env = {
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "old_rev": args.base_rev, "new_rev": _revision(args.new_rev),
        "old_sparse_patterns": old["sparse_patterns"].__file__, "new_sparse_patterns": str(new_file),
        "shape": {"B": 1, "H": shape.heads, "H_KV": shape.kv_heads, "D": shape.head_dim,
                  "dtype": args.dtype, "tokens_per_frame": P, "block": shape.block},
        "impl": args.impl, "new_api": args.new_api, "reps": args.reps, "warmup": args.warmup,
    }  # fmt: skip
    print(json.dumps(env), flush=True)
    rows, failed = [], []
    for case in cases:
        for S in lengths:
            name = f"{case}@{_label(S)}"
            try:
                row = run_case(case, S, (old, new), shape, args)
            except Exception as e:  # recorded and reported; the other cases still run
                traceback.print_exc()
                row = {"case": case, "S": S, "error": f"{type(e).__name__}: {e}"}
                print(f"{case:8s} S={_label(S):>5s}  ERROR {row['error']}", flush=True)
                failed.append(f"{name} (error)")
            else:
                parts = " ".join(f"{n}={'ok' if p is True else 'DIFFER' if p is False else 'n/a'}"
                                 for n, p in row["plan_parts"].items())  # fmt: skip
                print(f"{case:8s} S={_label(S):>5s}  old {row['old_ms']:9.3f} ms  new "
                      f"{row['new_ms']:9.3f} ms  new/old {row['new_over_old']:.3f}  max|diff| "
                      f"{row['max_abs_diff']:.2e} (tol {row['tolerance']:.1e})  plan: {parts}  "
                      f"[{row['new_api']}]", flush=True)  # fmt: skip
                if not row["outputs_agree"]:
                    failed.append(f"{name} (outputs differ)")
                if not row["plans_equal"]:
                    failed.append(f"{name} (plans differ)")
            rows.append(row)
            if args.json:  # after every case: a run stopped by a time limit keeps what it did
                with open(args.json, "w") as f:
                    json.dump({"env": env, "rows": rows}, f, indent=1)
            if shape.device.type == "cuda":
                torch.cuda.empty_cache()
    if failed:
        print(f"checks failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
