"""TTFT of a Qwen2.5-VL-7B-shaped language model on long video: dense vs MMInference vs
MMInference + TriangleMix, with the time split by part (attention, MLP, estimation).

Model: the Qwen2.5-VL-7B language model's shape (28 layers, hidden 3584, H=28, H_KV=4, D=128,
MLP 18944), random bf16 weights (seeded). The vision encoder is skipped: the video embeddings
are given directly (``inputs_embeds``, random), with M-RoPE position ids ``[3, 1, S]``.
Layout: 64 text tokens, the video (256 tokens per frame: 448x448 frames after the 2x2 merge),
64 text tokens. MLPs and norms run in chunks (exact; see ``vlm_accel.engine.chunked_mlp``).

Methods:
- ``dense``: HF SDPA attention under the cuDNN backend.
- ``dense-fa4``: dense causal attention by FlashAttention-4 (``sparse_kernels.attention`` with
  ``impl="fa4"``; needs ``sparse-kernels[hopper]`` on an sm90 GPU), the fastest dense a user
  could pick there. Each row also gets ``speedup_vs_dense_fa4`` when this method ran.
- ``mminference``: every layer runs ``sparse_patterns.plan_layer`` + ``BlockPlan.run`` with a
  fixed head mix: per KV group of 7 heads, 4 Grid (stride = tokens per frame), 2 Vertical-Slash
  (`--exact-verticals`: columns not rounded to blocks, MInference's kernel), 1 A-shape
  (`--exact-a-shape`: no block rounding, ``triangle_attention``), planned in 64-token blocks
  (``--block 128``: 128, the tile at which ``AUTO_FA4`` runs exact Vertical-Slash heads on
  FlashAttention-4's block-sparse kernel when ``sparse-kernels[hopper]`` is installed). Or, with
  ``--search-tokens N``, the config the offline search finds on a calibration prefill of N tokens
  of this same model (on random weights attention is nearly uniform, so the search picks the
  pattern that covers the most keys within its budget), or a saved config with ``--config``.
- ``mminference+trianglemix``: the same below layer 14, triangle attention from it
  (sink 128, window 4096, last 128; last layer last-row only as in triangle_mix).

Run (one GPU; a 1M dense prefill takes minutes, so give lengths per call if a call is capped):

    python apps/vlm-accel/benchmarks/bench_ttft.py --lengths 128K,256K --out ttft-a.json
    python apps/vlm-accel/benchmarks/bench_ttft.py --lengths 512K --out ttft-b.json
    python apps/vlm-accel/benchmarks/bench_ttft.py --lengths 1M --out ttft-c.json

``--smoke`` runs the same code on the CPU at a tiny shape (a dry run of the logic, not a result),
with the pattern shapes scaled to its 1024 tokens (sink 16, window 256, last 64, 64 verticals and
64 slashes) so that every method drops keys.
Output JSON: one row per (length, method): ``ttft_s`` (median of ``--repeat`` timed prefills after
one warm-up), ``attention_core_ms`` (the attention function alone, estimation excluded: the
``attention`` part also counts the projections and M-RoPE of ``self_attn``),
``parts_ms`` (attention, estimation, mlp, other; from CUDA events in one extra
prefill), ``peak_gib``, and the environment. For 1M, where one dense prefill takes minutes,
``--warmup-tokens 8192 --single-pass`` warms up on a short input and times one event-timed
prefill (TTFT and parts from the same pass).

``--cold-start`` times what a user's first request at a new length costs. Per length L and
method, in one process: a warm-up prefill at ``--warmup-tokens`` (default 8192; 0: none), then
the first prefill at L and a second one, each timed once. Triton compiles one binary per kernel
variant on its first launch in a process, or loads it from its on-disk cache; rows give
``first_s``, ``warm_s``, ``first_over_warm``, the variants made ready during the first prefill
(``compiled_variants``, ``compile_s``, ``compile_share`` of ``first_s``, ``compiled_by_kernel``)
and during the warm-up and the second prefill, and whether Triton's cache directory was empty when
the process started (``triton_cache_was_empty``). An empty cache: ``TRITON_CACHE_DIR=$(mktemp -d)``;
a warm one: the same command twice with the same ``TRITON_CACHE_DIR``, the second run's rows:

    export TRITON_CACHE_DIR=$(mktemp -d)
    python apps/vlm-accel/benchmarks/bench_ttft.py --cold-start --lengths 128K,256K \\
        --methods mminference,mminference+trianglemix+fused --out cold-a.json

``--lengths`` also takes token counts: Triton compiles integer arguments apart by whether they are
multiples of 16, so ``131001`` after a warm-up at 8192 shows what that costs a first prefill.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

LENGTHS = {"128K": 131072, "256K": 262144, "512K": 524288, "1M": 1048576}
DEFAULT_LENGTHS = "128K,256K,512K,1M"
METHODS = ("dense", "dense-fa4", "mminference", "mminference+trianglemix")
# Run unless --methods names others: dense-fa4 needs the hopper extra and an sm90 GPU.
DEFAULT_METHODS = ("dense", "mminference", "mminference+trianglemix")
FUSED = "+fused"  # method suffix: norms, MLP gates, rotary step via sparse_kernels.fused
TEXT = 64
TPF = 256
# --cold-start's default warm-up: a prefill short beside the timed lengths that makes the kernels
# ready at a length bucket other than theirs.
COLD_WARMUP = 8192
COLD_WARMUP_SMOKE = 512
# Pattern shapes (A-shape and triangle sink/window, triangle last rows, Vertical-Slash counts)
# belong to the model shape: at the smoke's 1024 tokens the full shape's 4096-key window would
# cover every key and each method would run dense.
FULL = dict(layers=28, hidden=3584, heads=28, kv_heads=4, mlp=18944, tpf=256, start=14,
            sink=128, window=4096, last=128, n_vertical=1000, n_slash=1024)  # fmt: skip
MODEL_ID = "qwen2.5-vl-7b-language-model-shape (random weights)"
# One KV group of 4 heads: Grid, Grid, Vertical-Slash, A-shape in the fixed mix.
SMOKE = dict(layers=4, hidden=128, heads=4, kv_heads=1, mlp=256, tpf=32, start=2,
             sink=16, window=256, last=64, n_vertical=64, n_slash=64)  # fmt: skip


def structure_qk(layer, norm: float, seed: int = 1) -> None:
    """Give every KV head of ``layer`` a shared query/key bias of L2 norm ``norm`` (its query
    heads get the same vector). After RoPE, ``q_m . k_n`` then gains
    ``sum_i |c_i|^2 cos(theta_i (pos_m - pos_n))``, which peaks at small relative (M-RoPE: 3-D)
    positions: the locality of trained heads, which random weights lack. ``norm=0`` zeroes it."""
    attn = layer.self_attn
    d = attn.head_dim
    h_kv = attn.k_proj.out_features // d
    group = attn.q_proj.out_features // attn.k_proj.out_features
    c = torch.randn(h_kv, d, generator=torch.Generator().manual_seed(seed))
    c = c / c.norm(dim=-1, keepdim=True) * norm
    with torch.no_grad():
        attn.k_proj.bias.copy_(c.reshape(-1))
        attn.q_proj.bias.copy_(c.repeat_interleave(group, dim=0).reshape(-1))


def _model(dims: dict, device: str, dtype: torch.dtype, qk_bias_norm: float | None = None):
    import transformers

    cfg = transformers.Qwen2_5_VLTextConfig(
        vocab_size=152064, hidden_size=dims["hidden"], intermediate_size=dims["mlp"],
        num_hidden_layers=dims["layers"], num_attention_heads=dims["heads"],
        num_key_value_heads=dims["kv_heads"], max_position_embeddings=1 << 21,
        rope_theta=1e6, rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]}
        if dims["hidden"] // dims["heads"] == 128 else {"type": "mrope", "mrope_section": [4, 6, 6]},
    )  # fmt: skip
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = transformers.Qwen2_5_VLTextModel(cfg).eval()
    finally:
        torch.set_default_dtype(prev)
    model.set_attn_implementation("sdpa")
    if qk_bias_norm is not None:  # seeded per layer: each layer gets its own directions
        for i, layer in enumerate(model.layers):
            structure_qk(layer, qk_bias_norm, seed=1 + i)
    return model


def _layout(S: int, tpf: int, device: str):
    from sparse_patterns import TokenLayout

    mod = torch.full((S,), 2, dtype=torch.long, device=device)
    mod[:TEXT] = 0
    mod[S - TEXT :] = 0
    return TokenLayout(mod, tokens_per_frame=tpf)


def _positions(S: int, tpf: int, device: str) -> torch.Tensor:
    """M-RoPE ids [3, 1, S]: text advances all three; video uses (frame, row, column)."""
    side = int(tpf**0.5)
    pos = torch.empty(3, S, dtype=torch.long, device=device)
    pos[:, :TEXT] = torch.arange(TEXT, device=device)
    n = S - 2 * TEXT
    i = torch.arange(n, device=device)
    f, r, c = i // tpf, (i % tpf) // side, i % side
    pos[0, TEXT : S - TEXT] = TEXT + f
    pos[1, TEXT : S - TEXT] = TEXT + r
    pos[2, TEXT : S - TEXT] = TEXT + c
    start = int(pos[:, : S - TEXT].max()) + 1
    pos[:, S - TEXT :] = start + torch.arange(TEXT, device=device)
    return pos[:, None]


def _head_mix(
    heads: int, kv_heads: int, tpf: int, exact_verticals: bool = False, exact_a_shape: bool = False,
    *, sink: int = FULL["sink"], window: int = FULL["window"],
    n_vertical: int = FULL["n_vertical"], n_slash: int = FULL["n_slash"],
):  # fmt: skip
    from sparse_patterns import AShape, Grid, HeadConfig, VerticalSlash

    group = heads // kv_heads
    mix = []
    for h in range(heads):
        j = h % group
        if j < (4 * group) // 7 or group < 3:
            mix.append(HeadConfig(Grid(stride=tpf)))
        elif j < group - 1:
            mix.append(
                HeadConfig(
                    VerticalSlash(
                        n_vertical=n_vertical, n_slash=n_slash, exact_verticals=exact_verticals
                    )
                )
            )
        else:
            mix.append(HeadConfig(AShape(sink=sink, window=window, exact=exact_a_shape)))
    return tuple(mix)


class _Timer:
    """Sums event-timed intervals per part (CUDA events on GPU, wall clock on CPU)."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.pairs: dict[str, list] = {}
        self.on = False

    def start(self, part: str):
        if not self.on:
            return None
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return (part, e)
        return (part, time.perf_counter())

    def stop(self, tok) -> None:
        if tok is None:
            return
        part, t0 = tok
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.pairs.setdefault(part, []).append((t0, e))
        else:
            self.pairs.setdefault(part, []).append((t0, time.perf_counter()))

    def totals_ms(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
            return {p: sum(a.elapsed_time(b) for a, b in v) for p, v in self.pairs.items()}
        return {p: sum(b - a for a, b in v) * 1e3 for p, v in self.pairs.items()}


def _hook_parts(model, timer: _Timer):
    hooks = []
    for layer in model.layers:
        for name, part in (("self_attn", "attention"), ("mlp", "mlp")):
            mod = getattr(layer, name)
            state = {}

            def pre(_m, _a, _part=part, _s=state):
                _s["tok"] = timer.start(_part)

            def post(_m, _a, _o, _s=state):
                timer.stop(_s.pop("tok", None))

            hooks.append(mod.register_forward_pre_hook(pre))
            hooks.append(mod.register_forward_hook(post))
    return hooks


CORE_NAME = "bench_ttft_timed_core"


def _time_attention_core(model, timer: _Timer):
    """Wrap the model's attention function (SDPA, or triangle_mix's) so that its calls are timed
    as ``attention_core``: the attention itself, without the q/k/v/o projections and M-RoPE
    that the ``attention`` part (the whole ``self_attn`` module) also counts. The same function
    and the same mask builder run; returns the undo."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = model.config._attn_implementation
    fn = ALL_ATTENTION_FUNCTIONS[name]

    def timed(*args, **kwargs):
        tok = timer.start("attention_core")
        try:
            return fn(*args, **kwargs)
        finally:
            timer.stop(tok)

    # One timed name per wrapped name: each keeps its own mask builder (none for a swap that
    # builds no mask, such as dense-fa4's).
    core = f"{CORE_NAME}_{name}"
    AttentionInterface.register(core, timed)
    if name in ALL_MASK_ATTENTION_FUNCTIONS:
        ALL_MASK_ATTENTION_FUNCTIONS.register(core, ALL_MASK_ATTENTION_FUNCTIONS[name])
    model.set_attn_implementation(core)
    return lambda: model.set_attn_implementation(name)


def _apply(model, method: str, dims: dict, layout, timer: _Timer):
    from sparse_patterns import MMInferencePlanner
    from triangle_mix import LayerPolicy
    from triangle_mix.integrations.hf import apply_triangle_mix

    method = split_method(method)[0]
    if method == "dense":
        return None
    if method == "dense-fa4":
        from sparse_kernels.integrations.hf import dense_attention, swap_attention

        return swap_attention(model, dense_attention(impl="fa4"), name="bench_ttft_dense_fa4")
    config = dims.get("config")
    mix = _head_mix(
        dims["heads"],
        dims["kv_heads"],
        dims["tpf"],
        dims.get("exact_verticals", False),
        dims.get("exact_a_shape", False),
        **{k: dims[k] for k in ("sink", "window", "n_vertical", "n_slash")},
    )

    # one for every layer: its per-shape state serves them all
    planner = MMInferencePlanner(block=dims.get("block", 64))

    def dynamic(q, k, v, *, layer_idx, scale):
        heads = mix if config is None else config.layer(layer_idx)
        tok = timer.start("estimation")
        plan = planner.plan(q, k, heads, layout, scale=scale, exact_vertical_lists=False)
        timer.stop(tok)
        return plan.run(q, k, v, scale=scale).out

    n = dims["layers"]
    if method == "mminference":
        pol = LayerPolicy(("dynamic",) * n)
    else:
        shape = {k: dims[k] for k in ("sink", "window", "last")}
        pol = LayerPolicy.triangle_from(n, dims["start"], shallow="dynamic", **shape)
    return apply_triangle_mix(model, pol, dynamic=dynamic)


def split_method(method: str) -> tuple[str, bool]:
    """``"mminference+fused"`` -> ``("mminference", True)``: the attention method, and whether
    the norms, MLP gates and rotary step run fused (``vlm_accel.engine.fused_parts``)."""
    base = method.removesuffix(FUSED)
    return base, base != method


def _warm_up(model, method, dims, tokens, device, dtype, timer, chunk) -> None:
    """One prefill of ``method`` at ``tokens`` tokens (its own layout): compiles the kernels it
    launches without a full-length pass."""
    x = torch.randn(1, tokens, dims["hidden"], device=device, dtype=dtype)
    handle = _apply(model, method, dims, _layout(tokens, dims["tpf"], device), timer)
    try:
        _prefill(model, x, _positions(tokens, dims["tpf"], device), chunk, split_method(method)[1])
    finally:
        if handle is not None:
            handle.remove()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _prefill(model, embeds, pos, chunk: int, fused: bool = False):
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel
    from vlm_accel.engine import chunked_mlp, fused_parts

    backends = [SDPBackend.CUDNN_ATTENTION] if embeds.is_cuda else [SDPBackend.MATH]
    fuse = fused_parts(model, impl="auto") if fused else contextlib.nullcontext()
    with torch.no_grad(), sdpa_kernel(backends), fuse, chunked_mlp(model, chunk):
        h = model(inputs_embeds=embeds, position_ids=pos, use_cache=False).last_hidden_state
    return h[:, -1]


def _profile(model, embeds, pos, chunk: int, out_dir: Path, name: str, method: str) -> None:
    """One more prefill under torch.profiler (GPU activity): the kernels' total times, largest
    first, to ``out_dir/profile-<length>-<method>.txt`` (``+`` in the method as ``_``)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        _prefill(model, embeds, pos, chunk, split_method(method)[1])
        torch.cuda.synchronize()
    table = prof.key_averages().table(
        sort_by="self_cuda_time_total", row_limit=40, max_name_column_width=90
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"profile-{name}-{method.replace('+', '_')}.txt").write_text(table)


def search(model, dims: dict, tokens: int, *, device: str, dtype, eval_rows: int, out: Path):
    """The offline search (``sparse_patterns.search_config``: kernel-aware, measured cost on
    CUDA) on one calibration prefill of ``tokens`` tokens with this benchmark's layout and
    positions; writes the config to ``out`` and returns it."""
    from sparse_patterns import search_config

    g = torch.Generator(device).manual_seed(tokens)
    embeds = torch.randn(1, tokens, dims["hidden"], device=device, dtype=dtype, generator=g)
    inputs = dict(inputs_embeds=embeds, position_ids=_positions(tokens, dims["tpf"], device),
                  use_cache=False)  # fmt: skip
    t0 = time.perf_counter()

    def progress(li: int, info: dict) -> None:
        print(f"search: layer {li} done at {time.perf_counter() - t0:.1f} s "
              f"({info['skipped_over_budget']} of {info['n_candidates']} candidates skipped, "
              f"known over budget)", flush=True)  # fmt: skip

    cfg = search_config(model, inputs, _layout(tokens, dims["tpf"], device), model_id=MODEL_ID,
                        n_eval_rows=eval_rows, progress=progress,
                        exact_a_shape=bool(dims.get("exact_a_shape", False)))  # fmt: skip
    cfg.metadata["calibration_tokens"] = tokens
    cfg.metadata["search_s"] = round(time.perf_counter() - t0, 1)
    cfg.metadata["qk_bias_norm"] = dims.get("qk_bias_norm")
    cfg.save(out)
    print(f"search: {tokens} tokens, {cfg.metadata['search_s']} s, heads {head_kinds(cfg)}; "
          f"wrote {out}", flush=True)  # fmt: skip
    return cfg


def head_kinds(cfg) -> dict[str, int]:
    """How many heads of the config use each pattern (with boundary), over all layers."""
    out: dict[str, int] = {}
    for layer in cfg.layers:
        for hc in layer:
            name = type(hc.pattern).__name__
            b = type(hc.boundary).__name__
            key = name if b == "NoBoundary" else f"{name}+{b}"
            out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def parse_lengths(text: str, dims: dict) -> list[tuple[str, int]]:
    """``"128K,131001"`` -> ``[("128K", 131072), ("131001", 131001)]``: names of :data:`LENGTHS`
    or token counts. A count need not be a multiple of 16 (a real prompt seldom is, and Triton
    compiles integer arguments apart by that); it must hold the two text spans and one frame."""
    least = 2 * TEXT + dims["tpf"]
    out = []
    for x in text.split(","):
        if x in LENGTHS:
            out.append((x, LENGTHS[x]))
        elif x.isdigit() and int(x) >= least:
            out.append((x, int(x)))
        else:
            raise ValueError(f"--lengths: expected names of {', '.join(LENGTHS)} or token counts "
                             f">= {least}, got {x!r}")  # fmt: skip
    return out


def triton_cache_state() -> dict:
    """Triton's on-disk compile cache (``TRITON_CACHE_DIR``, else ``.triton/cache`` under
    ``TRITON_HOME`` or the home directory) and whether it holds nothing yet: read before anything
    compiles, it says whether the process started cold."""
    import triton

    path = Path(triton.knobs.cache.dir)
    empty = not path.is_dir() or next(path.iterdir(), None) is None
    return {"triton_cache_dir": str(path), "triton_cache_was_empty": empty}


def _timed_prefill(model, embeds, pos, chunk: int, fused: bool, device: str):
    """One prefill, synchronised on both sides, inside a ``CompileLog``: (seconds, last hidden
    state, the kernel variants made ready during it)."""
    from sparse_kernels.tuning import CompileLog

    with CompileLog() as log:
        _sync(device)
        t0 = time.perf_counter()
        out = _prefill(model, embeds, pos, chunk, fused)
        _sync(device)
        seconds = time.perf_counter() - t0
    return seconds, out, log


def cold_start(lengths, methods, model, *, device: str, dtype, dims: dict, chunk: int,
               warmup_tokens: int) -> list[dict]:  # fmt: skip
    """Per length and method: a warm-up prefill at ``warmup_tokens`` (none if 0), the first
    prefill at the length, then a second one; each timed once, with the kernel variants each
    one made ready. Lengths and methods run in the order given, so a later row finds the
    variants that earlier rows made ready in memory."""
    from sparse_kernels.tuning import CompileLog

    rows = []
    for name, S in lengths:
        g = torch.Generator(device).manual_seed(S)
        embeds = torch.randn(1, S, dims["hidden"], device=device, dtype=dtype, generator=g)
        pos = _positions(S, dims["tpf"], device)
        layout = _layout(S, dims["tpf"], device)
        for method in methods:
            fused = split_method(method)[1]
            timer = _Timer(device)  # stays off: the passes are timed whole
            row = {"length": name, "tokens": S, "method": method, "fused_parts": fused,
                   "warmup_tokens": warmup_tokens}  # fmt: skip
            if warmup_tokens:
                with CompileLog() as log:
                    _sync(device)
                    t0 = time.perf_counter()
                    _warm_up(model, method, dims, warmup_tokens, device, dtype, timer, chunk)
                    _sync(device)
                    row["warmup_s"] = time.perf_counter() - t0
                row.update(warmup_compiled_variants=log.count, warmup_compile_s=log.seconds)
            handle = _apply(model, method, dims, layout, timer)
            try:
                if device == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                first_s, first, first_log = _timed_prefill(model, embeds, pos, chunk, fused, device)
                warm_s, warm, warm_log = _timed_prefill(model, embeds, pos, chunk, fused, device)
            except torch.OutOfMemoryError:
                rows.append(dict(row, error="OOM"))
                print(f"{name:>5s} {method:30s} out of memory", flush=True)
                continue
            finally:
                if handle is not None:
                    handle.remove()
            for label, out in (("first", first), ("second", warm)):
                if not torch.isfinite(out).all():
                    raise RuntimeError(f"{method} at {name}: non-finite output of the {label} pass")
            row.update(
                first_s=first_s, warm_s=warm_s, first_over_warm=first_s / warm_s,
                compiled_variants=first_log.count, compile_s=first_log.seconds,
                compile_share=first_log.seconds / first_s,
                compiled_by_kernel=first_log.by_kernel(),
                warm_compiled_variants=warm_log.count, warm_compile_s=warm_log.seconds,
                peak_gib=torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
            )  # fmt: skip
            rows.append(row)
            print(f"{name:>5s} {method:30s} first {first_s:8.3f} s  warm {warm_s:8.3f} s  "
                  f"x{row['first_over_warm']:.2f}  {first_log.summary()}", flush=True)  # fmt: skip
        del embeds, pos, layout
    return rows


def bench(
    lengths,
    methods,
    *,
    device: str,
    dims: dict,
    repeat: int,
    chunk: int,
    warmup_tokens: int | None = None,
    single_pass: bool = False,
    cold_start_cache: dict | None = None,
    profile_dir: str | None = None,
    search_tokens: int | None = None,
    search_eval_rows: int = 1024,
    search_out: str | None = None,
) -> list[dict]:
    from sparse_kernels.benchmarking import env_info

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = _model(dims, device, dtype, dims.get("qk_bias_norm"))
    if search_tokens is not None:
        out = Path(search_out or "bench_ttft_config.json")
        dims = dict(dims, config=search(model, dims, search_tokens, device=device, dtype=dtype,
                                        eval_rows=search_eval_rows, out=out))  # fmt: skip
    cfg = dims.get("config")
    info = dict(
        env_info(),
        exact_verticals=bool(dims.get("exact_verticals", False)),
        exact_a_shape=bool(dims.get("exact_a_shape", False)),
        qk_bias_norm=dims.get("qk_bias_norm"),
        block=dims.get("block", 64),
        pattern_shape={k: dims[k] for k in ("sink", "window", "last", "n_vertical", "n_slash")},
        head_config="fixed mix" if cfg is None else {
            "source": dims.get("config_source", "searched in this run"),
            "calibration_tokens": cfg.metadata.get("calibration_tokens"),
            "heads": head_kinds(cfg),
        },
    )  # fmt: skip
    if cold_start_cache is not None:  # the --cold-start mode; its rows carry the cache state
        rows = cold_start(lengths, methods, model, device=device, dtype=dtype, dims=dims,
                          chunk=chunk, warmup_tokens=warmup_tokens or 0)  # fmt: skip
        return [dict(r, **cold_start_cache, env=info) for r in rows]
    rows = []
    for name, S in lengths:
        g = torch.Generator(device).manual_seed(S)
        embeds = torch.randn(1, S, dims["hidden"], device=device, dtype=dtype, generator=g)
        pos = _positions(S, dims["tpf"], device)
        layout = _layout(S, dims["tpf"], device)
        ref = None
        for method in methods:
            timer = _Timer(device)
            if warmup_tokens is not None:  # when a full-length warm-up pass is too long
                _warm_up(model, method, dims, warmup_tokens, device, dtype, timer, chunk)
            fused = split_method(method)[1]
            handle = _apply(model, method, dims, layout, timer)
            try:
                if device == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                try:
                    last = None  # the checked output; from the parts pass after a short warm-up
                    if warmup_tokens is None:
                        last = _prefill(model, embeds, pos, chunk, fused)  # warm-up + check
                    times = []
                    for _ in range(0 if single_pass else repeat):
                        _sync(device)
                        t0 = time.perf_counter()
                        _prefill(model, embeds, pos, chunk, fused)
                        _sync(device)
                        times.append(time.perf_counter() - t0)
                    hooks = _hook_parts(model, timer)
                    undo_core = _time_attention_core(model, timer)
                    timer.on = True
                    _sync(device)
                    t0 = time.perf_counter()
                    try:
                        out = _prefill(model, embeds, pos, chunk, fused)
                    finally:
                        _sync(device)
                        total_ms = (time.perf_counter() - t0) * 1e3
                        timer.on = False
                        undo_core()
                        for hk in hooks:
                            hk.remove()
                    if profile_dir is not None:
                        _profile(model, embeds, pos, chunk, Path(profile_dir), name, method)
                except torch.OutOfMemoryError:
                    rows.append({"length": name, "tokens": S, "method": method, "error": "OOM"})
                    print(f"{name:>5s} {method:26s} out of memory", flush=True)
                    continue
                last = out if last is None else last
                if single_pass:  # the timed prefill is the event-timed one
                    times = [total_ms / 1e3]
                if not torch.isfinite(last).all():
                    raise RuntimeError(f"{method} at {name}: non-finite output")
                ref = last.float() if ref is None else ref
                parts = timer.totals_ms()
                # The core is timed inside the attention part: kept out of the parts' sum.
                core = parts.pop("attention_core", 0.0) - parts.get("estimation", 0.0)
                parts["attention"] = parts.get("attention", 0.0) - parts.get("estimation", 0.0)
                parts["other"] = total_ms - sum(parts.values())
                # A parts pass after a separate warm-up must compute what that warm-up did.
                parts_diff = (
                    None if last is out else float((out.float() - last.float()).abs().max())
                )
                peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
            finally:
                if handle is not None:
                    handle.remove()
            cos = torch.nn.functional.cosine_similarity(last.float(), ref, dim=-1).item()
            rows.append({
                "length": name, "tokens": S, "method": method,
                "ttft_s": statistics.median(times), "times_s": times,
                "parts_ms": {k: round(v, 3) for k, v in sorted(parts.items())},
                "attention_core_ms": round(core, 3),
                "parts_pass_max_abs_diff": parts_diff,
                "peak_gib": peak, "last_hidden_cosine_vs_first_method": cos,
                "warmup_tokens": warmup_tokens or S, "single_pass": single_pass,
                "fused_parts": fused,
            })  # fmt: skip
            print(f"{name:>5s} {method:26s} TTFT {rows[-1]['ttft_s']:9.3f} s  parts(ms) "
                  f"{rows[-1]['parts_ms']}  attention core {core:.1f} ms", flush=True)  # fmt: skip
        del embeds, pos, layout
    for r in rows:
        for base_method, key in (("dense", "speedup_vs_dense"),
                                 ("dense-fa4", "speedup_vs_dense_fa4")):  # fmt: skip
            base = next((x for x in rows if x["length"] == r["length"]
                         and x["method"] == base_method and "ttft_s" in x), None)  # fmt: skip
            if base is not None and "ttft_s" in r:
                r[key] = base["ttft_s"] / r["ttft_s"]
    return [dict(r, env=info) for r in rows]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--lengths",
        default=None,
        help=f"of {', '.join(LENGTHS)}, or token counts such as 131001 (default: {DEFAULT_LENGTHS}; "
        "with --smoke, 1024)",
    )
    p.add_argument(
        "--methods",
        default=",".join(DEFAULT_METHODS),
        help=f"of {', '.join(METHODS)}, each optionally with the suffix {FUSED!r} (RMSNorms and "
        "MLP gates and the rotary step as fused kernels, vlm_accel.engine.fused_parts)",
    )
    p.add_argument("--repeat", type=int, default=1, help="timed prefills per row (median)")
    p.add_argument("--mlp-chunk", type=int, default=32768)
    p.add_argument(
        "--warmup-tokens",
        type=int,
        default=None,
        help="warm up at this many tokens instead of a full-length prefill (--cold-start: below "
        f"every length, default {COLD_WARMUP} ({COLD_WARMUP_SMOKE} with --smoke), 0 for none)",
    )
    p.add_argument(
        "--single-pass",
        action="store_true",
        help="one prefill per row: TTFT and parts from the same event-timed pass",
    )
    p.add_argument(
        "--cold-start",
        action="store_true",
        help="per length and method: a warm-up at --warmup-tokens, then the first prefill at the "
        "length and a second one, each timed once, with the kernel variants compiled or loaded "
        "during each (see the module docstring)",
    )
    p.add_argument(
        "--exact-verticals",
        action="store_true",
        help="Vertical-Slash heads attend their columns exactly (MInference's kernel) instead of "
        "rounding them to key blocks",
    )
    p.add_argument(
        "--exact-a-shape",
        action="store_true",
        help="A-shape heads (the fixed mix's, and the search's Table 3 candidates) as "
        "AShape(exact=True): no block rounding, run by triangle_attention",
    )
    p.add_argument(
        "--block",
        type=int,
        choices=(64, 128),
        default=64,
        help="the MMInference planner's block (query rows = key columns per tile); 128 is the "
        "block FlashAttention-4's block-sparse kernel runs (sparse-kernels[hopper])",
    )
    p.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="after each row, one more prefill under torch.profiler; kernel totals to DIR",
    )
    p.add_argument(
        "--qk-bias-norm",
        type=float,
        default=None,
        help="give every KV head a shared query/key bias of this L2 norm (local attention after "
        "RoPE, as in trained heads; see structure_qk); default: plain random weights",
    )
    p.add_argument(
        "--config",
        default=None,
        metavar="CFG",
        help="per-layer head patterns from this PatternConfig JSON instead of the fixed mix",
    )
    p.add_argument(
        "--search-tokens",
        type=int,
        default=None,
        help="first run the offline search on a calibration prefill of this many tokens and "
        "time its config (written to --search-out)",
    )
    p.add_argument("--search-out", default="bench_ttft_config.json", metavar="CFG")
    p.add_argument(
        "--search-eval-rows",
        type=int,
        default=1024,
        help="query rows scored per head in the search",
    )
    p.add_argument("--smoke", action="store_true", help="tiny shape on the CPU (dry run)")
    p.add_argument("--out", default="bench_ttft.json")
    a = p.parse_args(argv)
    cache = triton_cache_state()  # before anything in this process compiles
    methods = a.methods.split(",")
    for m in methods:
        if split_method(m)[0] not in METHODS:
            p.error(f"--methods: expected some of {', '.join(METHODS)} (optionally + {FUSED!r}), "
                    f"got {m!r}")  # fmt: skip
    if a.smoke:
        if a.profile is not None:
            p.error("--profile: records GPU kernels, expected no --smoke")
        dims, device = SMOKE, "cpu"
        lengths = [("smoke-1K", 1024)] if a.lengths is None else None
    else:
        if not torch.cuda.is_available():
            p.error("needs a CUDA GPU (or --smoke)")
        dims, device, lengths = FULL, "cuda", None
    if lengths is None:
        try:
            lengths = parse_lengths(a.lengths or DEFAULT_LENGTHS, dims)
        except ValueError as e:
            p.error(str(e))
    dims = dict(
        dims,
        exact_verticals=a.exact_verticals,
        exact_a_shape=a.exact_a_shape,
        qk_bias_norm=a.qk_bias_norm,
        block=a.block,
    )
    if a.qk_bias_norm is not None and a.qk_bias_norm < 0:
        p.error(f"--qk-bias-norm: expected a norm >= 0, got {a.qk_bias_norm}")
    if a.config is not None and a.search_tokens is not None:
        p.error("--config and --search-tokens: expected one of them, got both")
    if a.search_tokens is not None and a.search_tokens < 2 * TEXT + dims["tpf"]:
        p.error(
            f"--search-tokens: expected at least {2 * TEXT + dims['tpf']}, got {a.search_tokens}"
        )
    if a.config is not None:
        from sparse_patterns import PatternConfig

        try:
            cfg = PatternConfig.load(a.config)
        except (OSError, ValueError, TypeError) as e:
            p.error(f"--config {a.config}: {e}")
        if (cfg.num_layers, cfg.num_heads) != (dims["layers"], dims["heads"]):
            p.error(f"--config {a.config}: expected {dims['layers']} layers x {dims['heads']} "
                    f"heads, got {cfg.num_layers} x {cfg.num_heads}")  # fmt: skip
        dims = dict(dims, config=cfg, config_source=a.config)
    if a.cold_start:
        for flag, given in (("--single-pass", a.single_pass), ("--repeat", a.repeat != 1),
                            ("--profile", a.profile is not None),
                            ("--search-tokens", a.search_tokens is not None)):  # fmt: skip
            if given:  # one timed prefill each; a search would compile kernels before the rows
                p.error(f"--cold-start: expected no {flag}, got {flag}")
        if a.warmup_tokens is None:
            a.warmup_tokens = COLD_WARMUP_SMOKE if a.smoke else COLD_WARMUP
        shortest = min(S for _, S in lengths)
        if a.warmup_tokens >= shortest:
            p.error(f"--warmup-tokens: expected fewer than the shortest length ({shortest}) with "
                    f"--cold-start, got {a.warmup_tokens}")  # fmt: skip
    least, warm = 2 * TEXT + dims["tpf"], a.warmup_tokens
    if warm is not None and warm < least and not (a.cold_start and warm == 0):
        p.error(f"--warmup-tokens: expected at least {least}{' (or 0)' if a.cold_start else ''}, "
                f"got {warm}")  # fmt: skip
    rows = bench(lengths, methods, device=device, dims=dims, repeat=a.repeat, chunk=a.mlp_chunk,
                 warmup_tokens=a.warmup_tokens, single_pass=a.single_pass,
                 cold_start_cache=cache if a.cold_start else None, profile_dir=a.profile,
                 search_tokens=a.search_tokens, search_eval_rows=a.search_eval_rows,
                 search_out=a.search_out)  # fmt: skip
    out = Path(a.out)
    fd, tmp = tempfile.mkstemp(dir=out.parent if str(out.parent) else ".", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump({"rows": rows}, f, indent=1)
    os.replace(tmp, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
