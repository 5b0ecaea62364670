"""`python -m sparse_kernels`: run the dense Triton kernel on a small problem and check it.

On a machine without CUDA the kernel runs under the Triton interpreter (slow, small sizes).

`python -m sparse_kernels tune ...`: tune the kernels' launch configs for a model's attention
shape on this GPU (see `python -m sparse_kernels tune --help`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from types import MappingProxyType

import torch

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE = 0, 1, 2


def check() -> int:
    cuda = torch.cuda.is_available()  # without CUDA, main() turned the Triton interpreter on
    from sparse_kernels import attention
    from sparse_kernels.attention import attention_reference
    from sparse_kernels.testing import make_qkv

    dev = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float16
    S = 8192 if cuda else 256
    q, k, v = make_qkv(1, 28, 4, S, S, 128, dtype=dtype, device=dev)
    if cuda:  # compile first, so the time is the kernel's (the interpreter compiles nothing)
        attention(q, k, v, impl="triton")
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    res = attention(q, k, v, impl="triton")
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    gold = attention_reference(q[:, :7], k[:, :1], v[:, :1], compute_dtype=torch.float64)
    err = float((res.out[:, :7].double() - gold.out).norm() / gold.out.norm())
    where = torch.cuda.get_device_name() if cuda else "CPU (Triton interpreter)"
    print(f"sparse_kernels.attention on {where}: B=1 H=28 H_KV=4 S={S} D=128 {dtype}, causal")
    print(f"  time {dt * 1e3:.1f} ms; relative error vs float64 reference (7 heads) {err:.2e}")
    ok = err < 2e-2
    print("  check:", "OK" if ok else "FAILED")
    print(f"  FlashAttention-4 engine: {_fa4_line()}")
    return 0 if ok else 1


def _variant_words(variant: tuple[int, int] | str | None) -> str:
    """An AUTO_FA4 key's variant as words: its block size, or its window class."""
    if variant is None:
        return ""
    if isinstance(variant, str):
        return f", {variant} windows"
    return f", {variant[0]}x{variant[1]} blocks"


def _fa4_line() -> str:
    """Whether ``impl="auto"`` can pick FA4 here, and if not, why (one line)."""
    from sparse_kernels import fa4

    if fa4.available():
        major = torch.cuda.get_device_capability()[0]
        keys = sorted(
            f"{op} ({str(dt).removeprefix('torch.')}, D={d}" + _variant_words(variant) + ")"
            for op, m, dt, d, variant in fa4.AUTO_FA4 if m == major
        )  # fmt: skip
        return f"flash-attn-4 {fa4.version()}; impl='auto' runs it for {', '.join(keys) or 'no op'}"
    missing = fa4.support.import_problem()
    if missing is not None:
        return f"unavailable: {missing}"
    return "installed, but this machine has no GPU it runs on (sm90)"


# ---- tune ----

_SUFFIX = MappingProxyType({"": 1, "K": 1 << 10, "M": 1 << 20})


def parse_lengths(text: str) -> list[int]:
    """``"32K,128K,1M"`` -> ``[32768, 131072, 1048576]`` (K = 1024, M = 1024 * 1024)."""
    out = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*([KkMm]?)\s*", part)
        n = int(m.group(1)) * _SUFFIX[m.group(2).upper()] if m else 0
        if not 1 <= n < 2**31:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated key lengths like 32K,128K,1M (each 1 to 2**31 - 1), "
                f"got {part.strip()!r}"
            )
        out.append(n)
    return out


def _ops(text: str) -> list[str]:
    from sparse_kernels.tuning import OPS

    ops = [op.strip() for op in text.split(",")]
    bad = [op for op in ops if op not in OPS]
    if bad:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated ops from {','.join(OPS)}, got {bad[0]!r}"
        )
    return ops


def _presets(text: str) -> list[str]:
    from sparse_kernels.tuning import MODEL_SHAPES

    names = [n.strip() for n in text.split(",")]
    bad = [n for n in names if n not in MODEL_SHAPES]
    if bad:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated model names from {','.join(MODEL_SHAPES)}, got {bad[0]!r}"
        )
    return names


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, as the apps' CLIs print usage errors
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    from sparse_kernels.tuning import MODEL_SHAPES, OPS

    p = _Parser(
        prog="python -m sparse_kernels",
        description="Without a command: run the dense kernel on a small problem and check it.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    models = ", ".join(
        f"{n} ({s.heads}/{s.kv_heads}/{s.head_dim})" for n, s in MODEL_SHAPES.items()
    )
    t = sub.add_parser(
        "tune",
        help="tune launch configs for a model's attention shape on this GPU",
        description="Time every candidate launch config of each op at each key length on this "
        "GPU and write the fastest (see sparse_kernels.tuning.tune) into the user's tuning "
        "cache, read by every later process (or into --out). Keys already in the table are "
        "skipped unless --force. Needs a CUDA GPU.",
        epilog="examples:\n"
        "  python -m sparse_kernels tune --preset qwen2.5-vl-7b --lengths 32K,128K\n"
        "  python -m sparse_kernels tune --heads 28 --kv-heads 4 --head-dim 128 "
        "--dtype bfloat16 --lengths 128K,512K --ops triangle,permuted",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t.add_argument(
        "--preset",
        type=_presets,
        help=f"comma-separated model names whose attention shapes are tuned (H/H_KV/D): "
        f"{models}; instead of --heads/--kv-heads/--head-dim",
    )
    t.add_argument("--heads", type=_positive, help="query heads H")
    t.add_argument("--kv-heads", type=_positive, help="key/value heads H_KV (H %% H_KV == 0)")
    t.add_argument("--head-dim", type=_positive, help="head dim D")
    t.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16",
                   help="q/k/v dtype (default: bfloat16)")  # fmt: skip
    t.add_argument("--lengths", type=parse_lengths, required=True,
                   help="comma-separated key lengths, e.g. 32K,128K,1M")  # fmt: skip
    t.add_argument("--ops", type=_ops, default=list(OPS),
                   help=f"comma-separated ops (default: all: {','.join(OPS)})")  # fmt: skip
    t.add_argument("--out", help="table to write (default: the user's tuning cache of this GPU)")
    t.add_argument("--force", action="store_true", help="tune keys already in the table again")
    t.set_defaults(parser=t)  # its usage errors name `... tune`
    return p


def _shapes(args, parser) -> list:
    from sparse_kernels.tuning import MODEL_SHAPES, TuneShape

    explicit = (args.heads, args.kv_heads, args.head_dim)
    if args.preset is not None:
        if any(x is not None for x in explicit):
            parser.error("expected --preset or --heads/--kv-heads/--head-dim, got both")
        shapes = [MODEL_SHAPES[n] for n in args.preset]
        shapes = [TuneShape(s.heads, s.kv_heads, s.head_dim, args.dtype) for s in shapes]
        return list(dict.fromkeys(shapes))  # models that share a shape are tuned once
    if any(x is None for x in explicit):
        missing = [
            f for f, x in zip(("--heads", "--kv-heads", "--head-dim"), explicit) if x is None
        ]
        parser.error(f"expected --preset or all of --heads, --kv-heads, --head-dim; missing "
                     f"{', '.join(missing)}")  # fmt: skip
    try:
        return [TuneShape(*explicit, args.dtype)]
    except ValueError as e:
        parser.error(str(e))


def tune_main(args, parser) -> int:
    from sparse_kernels.tuning import tune

    shapes = _shapes(args, parser)
    if not torch.cuda.is_available():
        print("python -m sparse_kernels tune: error: tuning needs a CUDA GPU; torch sees none",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    command = "python -m sparse_kernels " + " ".join(sys.argv[1:])
    for shape in shapes:
        res = tune(shape, args.lengths, ops=args.ops, out=args.out, force=args.force,
                   command=command)  # fmt: skip
        print(f"{res.path}: {len(res.tuned)} entries tuned, {len(res.skipped)} already there, "
              f"{len(res.failures)} candidates failed (H={shape.heads} H_KV={shape.kv_heads} "
              f"D={shape.head_dim} {shape.dtype})")  # fmt: skip
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["tune"] and not torch.cuda.is_available():
        # Before anything imports triton: it reads TRITON_INTERPRET when it is imported.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        return check()
    return tune_main(args, args.parser)


if __name__ == "__main__":
    sys.exit(main())
