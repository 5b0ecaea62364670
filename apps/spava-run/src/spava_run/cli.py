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
import os
import sys
import tempfile
from pathlib import Path

from .errors import EXIT_INTERNAL, EXIT_MEMORY, EXIT_OK, EXIT_USAGE, CliError
from .parser import SAMPLE, build_parser
from .sparse import check_sparse_args, model_config, sparsity_for

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
