"""vlm-accel's commands: each takes the parsed and checked arguments and returns an exit code.
torch and transformers are imported inside them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from . import kernels, progress
from .checks import (
    SAMPLE,
    _first_prefill,
    _model_and_inputs,
    _model_id,
    _on_device,
    _say,
    _start_layer,
    _video_path,
    _write,
)
from .errors import EXIT_OK, EXIT_USAGE, CliError


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
                model, inputs, chunk=args.mlp_chunk, fused=args.fused
            )
        fuse = engine.fused_parts(model) if args.fused else contextlib.nullcontext()
        with torch.no_grad(), fuse:
            dev = next(model.parameters()).device
            gen = model.generate(**_on_device(inputs, dev),
                                 max_new_tokens=args.max_new_tokens,
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
    from sparse_patterns.integrations.hf import capture_qkv

    from . import engine

    model, _, inputs, layout = _model_and_inputs(args)
    lm = engine.language_model(model)
    inputs = _on_device(inputs, next(model.parameters()).device)
    n_layers = lm.config.num_hidden_layers

    def layers_with_bar(inp):  # search_config searches the captured layers in this order
        return progress.bar(capture_qkv(model, inp), total=n_layers, desc="search", unit="layer",
                            no_progress=args.no_progress)  # fmt: skip

    _first_prefill(args, "the pattern search", layout.seq_len)
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
            engine.prefill(model, inputs, chunk=args.mlp_chunk, fused=args.fused)  # warm-up
            pbar.update(1)
            times = []
            for _ in range(args.repeat):
                logits, t, peak = engine.prefill(
                    model, inputs, chunk=args.mlp_chunk, fused=args.fused
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
        engine.prefill(model, inputs)
        acc, t_acc, _ = engine.prefill(model, inputs)
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
