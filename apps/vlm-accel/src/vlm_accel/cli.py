"""`vlm-accel`: long-video VLM prefill with MMInference and TriangleMix.

Commands: run, search, bench, show, demo (`vlm-accel <command> --help`). Exit codes: 0 ok,
1 internal error, 2 usage, 3 bad input (video, model, config), 4 does not fit in memory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from . import progress
from .errors import EXIT_INPUT, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE, CliError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _device(arg: str | None) -> str:
    return arg or ("cuda" if torch.cuda.is_available() else "cpu")


def _positive(name):
    def parse(x):
        try:
            v = int(x)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name}: expected an integer >= 1, got {x!r}"
            ) from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name}: expected an integer >= 1, got {v}")
        return v

    return parse


def _write_atomic(path: Path, data: bytes | str) -> None:
    """Write to a temporary file beside ``path`` and rename: nothing half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def _load_config(path: str | None):
    if path is None:
        return None
    from sparse_patterns import PatternConfig

    p = Path(path)
    if not p.is_file():
        raise CliError(f"--config: no such file: {p}")
    try:
        return PatternConfig.from_json(p.read_text())
    except (ValueError, TypeError, KeyError) as e:
        raise CliError(f"--config: {p} is not a valid pattern config ({e})") from None


def _model_and_inputs(args):
    from . import engine

    dev = _device(args.device)
    if args.model == "tiny":
        model, processor = engine.tiny_demo_model().to(dev), None
    else:
        model, processor = engine.load_model(args.model, device=dev, dtype=DTYPES[args.dtype])
    frames = args.frames
    if args.fps is not None:
        frames = _frames_for_fps(args.video, args.fps)
    inputs, layout = engine.video_inputs(
        model, processor, args.video, args.prompt, frames=frames, max_pixels=args.max_pixels
    )
    return model, processor, inputs, layout


def _frames_for_fps(video, fps: float) -> int:
    import av

    if fps <= 0:
        raise CliError(f"--fps: expected > 0, got {fps}")
    try:
        with av.open(str(video)) as c:
            s = c.streams.video[0]
            seconds = (
                float(s.duration * s.time_base) if s.duration else float(c.duration or 0) / 1e6
            )
    except (FileNotFoundError, IndexError, av.error.FFmpegError) as e:
        raise CliError(f"--video: {video} could not be read ({e})") from None
    return max(1, int(seconds * fps))


def cmd_run(args) -> int:
    from . import engine

    model, processor, inputs, layout = _model_and_inputs(args)
    applied = engine.apply_method(
        model,
        args.method,
        layout=layout,
        pattern_config=_load_config(args.config),
        start_layer=args.start_layer,
    )
    try:
        logits, ttft, peak = engine.prefill(
            model, inputs, applied, chunk=args.mlp_chunk, fused=args.fused
        )
        fuse = engine.fused_parts(model) if args.fused else contextlib.nullcontext()
        with torch.no_grad(), applied.context(), fuse:
            dev = next(model.parameters()).device
            gen = model.generate(**{k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()},
                                 max_new_tokens=args.max_new_tokens, do_sample=False,
                                 streamer=progress.GenerationBar(args.max_new_tokens, no_progress=args.no_progress))  # fmt: skip
    finally:
        applied.remove()
    new = gen[0, inputs["input_ids"].shape[1] :]
    answer = (
        processor.decode(new, skip_special_tokens=True)
        if processor is not None
        else " ".join(map(str, new.tolist()))
    )
    counts = layout.counts()
    print(f"answer: {answer.strip()}")
    print(f"method: {args.method}  TTFT: {ttft:.3f} s  tokens: {layout.seq_len} "
          f"(video {counts[2]}, image {counts[1]}, text {counts[0]})  generated: {len(new)}  "
          f"peak memory: {'n/a (CPU)' if peak is None else f'{peak:.2f} GiB'}")  # fmt: skip
    return EXIT_OK


def cmd_search(args) -> int:
    from sparse_patterns import search_config
    from sparse_patterns.integrations.hf import capture_qkv, use_layout

    from . import engine

    model, _, inputs, layout = _model_and_inputs(args)
    lm = engine.language_model(model)
    dev = next(model.parameters()).device
    inputs = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    n_layers = lm.config.num_hidden_layers

    def layers_with_bar(inp):  # search_config searches the captured layers in this order
        return progress.bar(capture_qkv(model, inp), total=n_layers, desc="search", unit="layer",
                            no_progress=args.no_progress)  # fmt: skip

    with use_layout(layout):
        cfg = search_config(layers_with_bar, inputs, layout, model_id=args.model_id or str(args.model),
                            num_layers=n_layers, num_heads=lm.config.num_attention_heads,
                            exact_a_shape=not args.block_rounded_a_shape)  # fmt: skip
    _write_atomic(Path(args.out), cfg.to_json())
    print(f"wrote {args.out}: {cfg.num_layers} layers x {cfg.num_heads} heads")
    return EXIT_OK


def cmd_bench(args) -> int:
    from . import engine

    model, _, inputs, layout = _model_and_inputs(args)
    cfg = _load_config(args.config)
    rows = []
    ref = None
    methods = args.methods.split(",")
    pbar = progress.bar(total=len(methods) * (1 + args.repeat), desc="bench", unit="prefill",
                        no_progress=args.no_progress)  # fmt: skip
    for method in methods:
        if "mminference" in method and cfg is None:
            raise CliError(f"--methods {method} needs --config CFG")
        applied = engine.apply_method(
            model, method, layout=layout, pattern_config=cfg, start_layer=args.start_layer
        )
        try:
            pbar.set_postfix_str(method)
            engine.prefill(
                model, inputs, applied, chunk=args.mlp_chunk, fused=args.fused
            )  # warm-up
            pbar.update(1)
            times = []
            for _ in range(args.repeat):
                logits, t, peak = engine.prefill(
                    model, inputs, applied, chunk=args.mlp_chunk, fused=args.fused
                )
                times.append(t)
                pbar.update(1)
        finally:
            applied.remove()
        ref = logits if ref is None else ref
        rows.append({"method": method, "fused": args.fused, "tokens": layout.seq_len, "ttft_s": sorted(times)[len(times) // 2],
                     "peak_gib": peak, "top1_agrees_with_first": bool((logits.argmax(-1) == ref.argmax(-1)).all())})  # fmt: skip
        pbar.write(f"{method:28s} TTFT {rows[-1]['ttft_s']:.3f} s", file=sys.stdout)
    pbar.close()
    out = Path(args.out)
    _write_atomic(
        out.with_suffix(".json"),
        json.dumps({"device": str(next(model.parameters()).device), "rows": rows}, indent=1),
    )
    _plot_bench(rows, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return EXIT_OK


def _fused_arg(p) -> None:
    p.add_argument(
        "--fused",
        action="store_true",
        help="RMSNorms, the MLP SiLU gate and the rotary step as fused Triton kernels on CUDA "
        "(one pass each; equal to the eager modules up to rounding). Llama/Qwen2-style language "
        "models only",
    )


def _plot_bench(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh([r["method"] for r in rows], [r["ttft_s"] for r in rows])
    ax.set_xlabel(f"TTFT (s), {rows[0]['tokens']} tokens")
    fig.tight_layout()
    fd, tmp = tempfile.mkstemp(dir=path.parent if path.parent.exists() else None, suffix=".png")
    os.close(fd)
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)


def cmd_show(args) -> int:
    from sparse_patterns import plan_layer
    from sparse_patterns.integrations.hf import capture_qkv
    from sparse_patterns.plot import plot_head

    from . import engine

    model, _, inputs, layout = _model_and_inputs(args)
    cfg = _load_config(args.config)
    lm = engine.language_model(model)
    if not 0 <= args.layer < lm.config.num_hidden_layers:
        raise CliError(f"--layer: expected 0..{lm.config.num_hidden_layers - 1}, got {args.layer}")
    if not 0 <= args.head < lm.config.num_attention_heads:
        raise CliError(f"--head: expected 0..{lm.config.num_attention_heads - 1}, got {args.head}")
    dev = next(model.parameters()).device
    inputs = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    ((_, q, k, v),) = capture_qkv(model, inputs, layers=[args.layer])
    if cfg is None:
        from sparse_patterns import Dense, HeadConfig

        heads = (HeadConfig(Dense()),) * lm.config.num_attention_heads
    else:
        heads = cfg.layers[args.layer]
    plan = plan_layer(q, k, heads, layout)
    out = Path(args.out)
    tmp = out.with_name(f".{out.name}.tmp.png")
    plot_head(q, k, plan, tmp, head=args.head, title=f"layer {args.layer} head {args.head}")
    os.replace(tmp, out)
    print(f"wrote {out}")
    return EXIT_OK


def cmd_demo(args) -> int:
    from modality_index.integrations.hf import sample_clip_path

    from . import engine

    dev = _device(args.device)
    model = engine.tiny_demo_model().to(dev)
    clip = sample_clip_path()
    inputs, layout = engine.video_inputs(
        model,
        None,
        clip,
        "What happens in this video?",
        frames=args.frames,
        max_pixels=args.max_pixels,
    )
    lm = engine.language_model(model)
    n = lm.config.num_hidden_layers
    print(f"tiny random Qwen2.5-VL ({n} layers) on {dev}; clip {clip.name}, {args.frames} frames -> "
          f"{layout.seq_len} tokens ({layout.num_frames} temporal frames x {layout.tokens_per_frame} tokens)")  # fmt: skip
    shape = dict(sink=4, window=64, last=16)
    engine.prefill(model, inputs)  # warm-up
    dense, t_dense, _ = engine.prefill(model, inputs)
    applied = engine.apply_method(model, "trianglemix", layout=layout, start_layer=n // 2, **shape)
    try:
        engine.prefill(model, inputs, applied)
        acc, t_acc, _ = engine.prefill(model, inputs, applied)
    finally:
        applied.remove()
    diff = float((acc - dense).abs().max())
    agree = bool((acc.argmax(-1) == dense.argmax(-1)).all())
    print(f"dense TTFT       {t_dense * 1e3:8.1f} ms")
    print(
        f"trianglemix TTFT {t_acc * 1e3:8.1f} ms (triangle from layer {n // 2}: sink 4, window 64, last 16)"
    )
    print(
        f"agreement: next-token argmax {'same' if agree else 'DIFFERENT'}; max |logit difference| {diff:.3e}"
    )
    print(
        "On a CPU both run PyTorch reference attention; the speed-up needs a GPU and long inputs."
    )
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vlm-accel", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def video_args(sp, model_required=True):
        sp.add_argument(
            "--model",
            required=model_required,
            help="local checkpoint directory, or 'tiny' for the demo model",
        )
        sp.add_argument("--video", required=True, help="video file (decoded with PyAV)")
        sp.add_argument("--prompt", required=True, help="the question about the video")
        g = sp.add_mutually_exclusive_group()
        g.add_argument(
            "--frames",
            type=_positive("--frames"),
            default=8,
            help="frames sampled uniformly (default 8)",
        )
        g.add_argument(
            "--fps", type=float, help="frames per second of video to sample instead of --frames"
        )
        sp.add_argument(
            "--max-pixels",
            type=int,
            default=112 * 112,
            help="pixels per frame for the tiny model's patchify",
        )
        sp.add_argument("--device", help="cuda or cpu (default: cuda when available)")
        sp.add_argument(
            "--dtype", choices=list(DTYPES), default="bf16", help="weights dtype of a checkpoint"
        )
        sp.add_argument(
            "--no-progress",
            "--quiet",
            dest="no_progress",
            action="store_true",
            help="no progress bars on stderr (they are drawn only when stderr is a terminal)",
        )

    r = sub.add_parser("run", help="answer a question about a video; print TTFT, tokens, memory")
    video_args(r)
    r.add_argument(
        "--method",
        default="dense",
        help="dense | mminference | trianglemix | mminference+trianglemix",
    )
    r.add_argument("--config", help="pattern config JSON from `vlm-accel search` (for mminference)")
    r.add_argument(
        "--start-layer", type=int, help="first triangle layer (default: half the layers)"
    )
    r.add_argument("--max-new-tokens", type=_positive("--max-new-tokens"), default=32)
    r.add_argument(
        "--mlp-chunk", type=int, help="run MLPs in chunks of this many tokens (long inputs)"
    )
    _fused_arg(r)
    r.set_defaults(fn=cmd_run)

    s = sub.add_parser("search", help="offline MMInference pattern search; writes a config")
    video_args(s)
    s.add_argument("--out", required=True, help="output config JSON")
    s.add_argument("--model-id", help="model id stored in the config (default: --model)")
    s.add_argument(
        "--block-rounded-a-shape",
        action="store_true",
        help="A-shape candidates rounded up to 64-key blocks and run in the layer's block-sparse "
        "launch (default: exact sink + window, run by triangle_attention, faster on a GPU)",
    )
    s.set_defaults(fn=cmd_search)

    b = sub.add_parser("bench", help="TTFT of dense vs each method; JSON plus a PNG plot")
    video_args(b)
    b.add_argument("--methods", default="dense,trianglemix", help="comma-separated methods")
    b.add_argument("--config", help="pattern config for mminference methods")
    b.add_argument("--start-layer", type=int)
    b.add_argument("--repeat", type=_positive("--repeat"), default=3)
    b.add_argument("--mlp-chunk", type=int)
    _fused_arg(b)
    b.add_argument("--out", default="vlm-accel-bench", help="output path stem (.json and .png)")
    b.set_defaults(fn=cmd_bench)

    w = sub.add_parser("show", help="PNG of a layer/head's attention and its chosen pattern")
    video_args(w)
    w.add_argument("--layer", type=int, default=0)
    w.add_argument("--head", type=int, default=0)
    w.add_argument("--config", help="pattern config (default: dense)")
    w.add_argument("--out", default="head.png")
    w.set_defaults(fn=cmd_show)

    d = sub.add_parser("demo", help="tiny random Qwen2.5-VL on a real clip: dense vs accelerated")
    d.add_argument("--frames", type=_positive("--frames"), default=16)
    d.add_argument("--max-pixels", type=int, default=224 * 224)
    d.add_argument("--device")
    d.set_defaults(fn=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except CliError as e:
        print(f"vlm-accel: error: {e}", file=sys.stderr)
        return e.code
    except (FileNotFoundError, NotImplementedError) as e:
        print(f"vlm-accel: error: {e}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        return EXIT_USAGE
    except Exception as e:  # noqa: BLE001 - last resort: one line, internal-error code
        print(f"vlm-accel: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
