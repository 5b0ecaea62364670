"""`vlm-accel tune` and `vlm-accel warmup`: the GPU kernels' launch configs and compile cache
for a model, before its first prefill; and the status line shown while kernels compile.

Importable without torch: the commands' plans are plain data, checked before anything loads.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import IO

from . import progress
from .errors import EXIT_USAGE, CliError

# The models sparse_kernels.tuning.MODEL_SHAPES names (a test keeps the two equal): --model
# takes these names besides a checkpoint directory.
PRESETS = ("qwen2.5-vl-7b", "qwen2-vl-2b", "llava-onevision-7b", "smollm2-135m")
# sparse_kernels.tuning.OPS, the ops a tuning run can time (a test keeps the two equal).
TUNE_OPS = ("attention", "block_sparse", "permuted", "triangle", "vertical_slash", "line_scores")
TRIANGLE_SHAPE = (8, 512, 128)  # engine.apply_method's (sink, window, last)
TEXT_TOKENS = 64  # text before and after the video in a warmup's layout
# The presets' language-model widths for the fused per-token ops: (hidden size, MLP intermediate
# size, RMSNorm eps), from their checkpoints' config.json.
PRESET_WIDTHS = MappingProxyType(
    {
        "qwen2.5-vl-7b": (3584, 18944, 1e-6),
        "qwen2-vl-2b": (1536, 8960, 1e-6),
        "llava-onevision-7b": (3584, 18944, 1e-6),  # its language model is Qwen2-7B
        "smollm2-135m": (576, 1536, 1e-5),
    }
)
# Triton specialises a pointer on 16-byte alignment; a chunk's alignment depends on its first
# row modulo this many rows (16 bytes divide 16 rows of any width and dtype).
ALIGN_ROWS = 16


@dataclass(frozen=True)
class AttentionShape:
    """The language model's attention: query heads, key/value heads, head dim, layer count
    (None for a preset: only the attention shape is known) and dtype name."""

    heads: int
    kv_heads: int
    head_dim: int
    layers: int | None
    dtype: str


@dataclass(frozen=True)
class FusedShape:
    """What the fused per-token ops of ``run --fused`` see besides the attention shape: the
    hidden size (the RMSNorms' width), the MLP's intermediate size (the SiLU gate's width) and
    the RMSNorm eps."""

    hidden: int
    intermediate: int
    eps: float


def parse_lengths(text: str) -> list[int]:
    """``"128K,1M"`` -> ``[131072, 1048576]`` (K = 1024, M = 1024 * 1024); argparse type."""
    import argparse
    import re

    out = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*([KkMm]?)\s*", part)
        scale = {"": 1, "K": 1 << 10, "M": 1 << 20}[m.group(2).upper()] if m else 0
        n = int(m.group(1)) * scale if m else 0
        if not 1 <= n < 2**31:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated token counts like 128K,1M (each 1 to 2**31 - 1), "
                f"got {part.strip()!r}"
            )
        out.append(n)
    return sorted(set(out))


def parse_ops(text: str) -> list[str]:
    import argparse

    ops = [op.strip() for op in text.split(",")]
    bad = [op for op in ops if op not in TUNE_OPS]
    if bad:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated ops from {','.join(TUNE_OPS)}, got {bad[0]!r}"
        )
    return list(dict.fromkeys(ops))


def run_dtype(model: str) -> str:
    """The dtype ``vlm-accel run`` computes in: the tiny model's float32, else the default of
    its ``--dtype`` (bfloat16), whatever the checkpoint's config says."""
    return "float32" if model == "tiny" else "bfloat16"


def attention_shape(model: str, dtype: str) -> AttentionShape:
    """The attention shape of ``model``: a preset name, ``"tiny"`` or a checkpoint directory
    (its text config: heads, KV heads, head dim, layers), in ``dtype``."""
    if model in PRESETS:
        from sparse_kernels.tuning import MODEL_SHAPES

        s = MODEL_SHAPES[model]
        return AttentionShape(s.heads, s.kv_heads, s.head_dim, None, dtype)
    text = _text_config(model)
    H = text.num_attention_heads
    H_KV = getattr(text, "num_key_value_heads", None) or H
    D = getattr(text, "head_dim", None) or text.hidden_size // H
    return AttentionShape(H, H_KV, D, text.num_hidden_layers, dtype)


def fused_shape(model: str) -> FusedShape:
    """The :class:`FusedShape` of ``model`` (a preset name, ``"tiny"`` or a checkpoint
    directory). Raises CliError for a language model whose MLP is not SiLU-gated, which
    ``run --fused`` refuses too."""
    if model in PRESETS:
        return FusedShape(*PRESET_WIDTHS[model])
    text = _text_config(model)
    act = getattr(text, "hidden_act", None)
    if act not in ("silu", "swish"):
        raise CliError(f"--fused: expected a language model with a SiLU-gated MLP (hidden_act "
                       f"silu), got hidden_act {act!r} in {model}'s config")  # fmt: skip
    return FusedShape(text.hidden_size, text.intermediate_size, float(text.rms_norm_eps))


def _text_config(model: str):
    import transformers

    if model == "tiny":
        from .models import tiny_config

        cfg = tiny_config("qwen2_5_vl")
    else:
        try:
            cfg = transformers.AutoConfig.from_pretrained(model)
        except (OSError, ValueError, KeyError) as e:
            raise CliError(f"--model: {model}/config.json could not be read ({e})") from None
    return cfg.get_text_config()


# ---- warmup ----


@dataclass(frozen=True)
class WarmupStep:
    """One step of the warmup at ``length`` tokens. ``kind`` ``"triangle"``: TriangleMix's
    triangle layers' attention; ``"mminference"``: one layer's patterns (``layer``, standing for
    every layer in ``layers`` that has the same head configs); ``"fused"``: the fused per-token
    ops of ``run --fused``, the rotary step over ``length`` tokens and the RMSNorm and SiLU gate
    over each ``(first row, rows)`` chunk of ``pieces`` (see :func:`mlp_pieces`)."""

    kind: str
    length: int
    layer: int | None = None
    layers: tuple[int, ...] = ()
    pieces: tuple[tuple[int, int], ...] = ()


def warmup_lengths(lengths: Sequence[int]) -> list[int]:
    """Each length and the one below it. Triton compiles one binary per kernel, constexprs and
    integer-argument class (1, a multiple of 16, other): a length that is a multiple of 16 (as
    128K is) and one that is not (as most prompts are) take different binaries of every kernel
    that gets the length as an argument."""
    out = []
    for n in sorted(set(lengths)):
        out += [n, n - 1] if n > 2 else [n]
    return out


def mlp_pieces(length: int, chunk: int | None) -> list[tuple[int, int]]:
    """The ``(first row, rows)`` chunks in which a prefill of ``length`` tokens runs the RMSNorms
    and MLPs (``engine.chunked_mlp`` with ``run --mlp-chunk chunk``; None: one piece)."""
    if chunk is None or length <= chunk:
        return [(0, length)]
    return [(i, min(chunk, length - i)) for i in range(0, length, chunk)]


def warmup_plan(
    method: str,
    lengths: Sequence[int],
    *,
    num_layers: int | None,
    start_layer: int | None,
    pattern_layers: Sequence[tuple] | None = None,
    fused: bool = False,
    mlp_chunk: int | None = None,
) -> list[WarmupStep]:
    """The calls that make the compile cache hold every kernel variant a prefill of ``method``
    at ``lengths`` uses: per length (see :func:`warmup_lengths`), one call per distinct
    attention of the method's layers: the triangle layers' ``triangle_attention`` (TriangleMix),
    one MMInference layer per distinct set of head configs (MMInference layers: all of them for
    ``mminference``, those below ``start_layer`` for ``mminference+trianglemix``). Dense layers
    run torch SDPA: nothing to compile. ``fused`` (``run --fused``, with ``run --mlp-chunk
    mlp_chunk``) adds a ``"fused"`` step per length; its pieces are the chunks of
    :func:`mlp_pieces` not already run at an earlier step: chunks of equal rows whose first rows
    agree modulo ``ALIGN_ROWS`` launch the same variants."""
    mm = "mminference" in method
    tri = "trianglemix" in method
    if mm and pattern_layers is None:
        raise CliError(f"--method {method} needs --config CFG (write one with `vlm-accel search`)")
    groups: dict[tuple, list[int]] = {}
    if mm:
        n = len(pattern_layers)
        stop = n if not tri else min(n, n // 2 if start_layer is None else start_layer)
        for layer in range(stop):
            groups.setdefault(tuple(pattern_layers[layer]), []).append(layer)
    has_triangle = tri and (num_layers is None or (start_layer or 0) < num_layers)
    steps = []
    seen: set[tuple[int, int]] = set()
    for length in warmup_lengths(lengths):
        steps += [WarmupStep("mminference", length, ls[0], tuple(ls)) for ls in groups.values()]
        if has_triangle:
            steps.append(WarmupStep("triangle", length))
        if fused:
            pieces = []
            for first, rows in mlp_pieces(length, mlp_chunk):
                if (rows, first % ALIGN_ROWS) not in seen:
                    seen.add((rows, first % ALIGN_ROWS))
                    pieces.append((first, rows))
            steps.append(WarmupStep("fused", length, pieces=tuple(pieces)))
    return steps


def run_warmup(
    steps: Sequence[WarmupStep],
    shape: AttentionShape,
    *,
    device: str,
    pattern_layers: Sequence[tuple] | None = None,
    tokens_per_frame: int = 256,
    fused: FusedShape | None = None,
    on_step: Callable[[WarmupStep], None] | None = None,
) -> None:
    """Run each step on random inputs of ``shape`` (batch 1) through the same public ops, and so
    the same ``choose_config`` lookups, that a prefill takes; the attention's layout is text,
    video frames of ``tokens_per_frame`` tokens, text. ``fused`` (the model's widths) is needed
    by the ``"fused"`` steps."""
    import torch
    from sparse_kernels import triangle_attention

    if fused is None and any(step.kind == "fused" for step in steps):
        raise ValueError("run_warmup: expected fused=FusedShape(...) for the plan's fused steps, "
                         "got None")  # fmt: skip
    dt = getattr(torch, shape.dtype)
    scale = shape.head_dim**-0.5
    g = torch.Generator(device=device).manual_seed(0)

    def rand(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=g, device=device, dtype=dt)

    for step in steps:
        if on_step is not None:
            on_step(step)
        S, D = step.length, shape.head_dim
        if step.kind == "fused":
            _run_fused(step, shape, fused, rand)
        else:
            q, k, v = (rand(1, h, S, D) for h in (shape.heads, shape.kv_heads, shape.kv_heads))
            if step.kind == "triangle":
                sink, window, last = TRIANGLE_SHAPE
                triangle_attention(q, k, v, sink=sink, window=window, last=last, scale=scale)
            else:
                from sparse_patterns import TokenLayout, mminference_attention

                mod = torch.full((S,), 2, dtype=torch.long, device=device)
                mod[: min(TEXT_TOKENS, S)] = 0
                mod[max(S - TEXT_TOKENS, 0) :] = 0
                layout = TokenLayout(mod, tokens_per_frame=tokens_per_frame)
                heads = pattern_layers[step.layer]
                mminference_attention(q, k, v, heads, layout, scale=scale)
            del q, k, v
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)


def _run_fused(step: WarmupStep, shape: AttentionShape, widths: FusedShape, rand) -> None:
    """The calls ``sparse_kernels.integrations.hf.fuse_per_token_ops`` makes in a prefill (its
    functions, keywords and ``impl="auto"``), on inputs of the same shapes, strides, dtypes and
    alignment, so that the same Triton variants compile."""
    import sparse_kernels.fused as ops

    S, H, H_KV, D = step.length, shape.heads, shape.kv_heads, shape.head_dim
    # HF's q and k are [B, S, H, D] projections seen as [B, H, S, D]; cos and sin are [1, S, D].
    # Inline temporaries: each op's inputs are freed before the next op allocates.
    ops.rotary(rand(1, S, H, D).transpose(1, 2), rand(1, S, H_KV, D).transpose(1, 2),
               rand(1, S, D), rand(1, S, D), impl="auto")  # fmt: skip
    N = widths.hidden
    weight = rand(N)
    for first, rows in step.pieces:
        # A chunk is a view of the [1, S, N] hidden states from row ``first``: its strides, and
        # its alignment from a buffer that starts ``first`` rows earlier modulo ALIGN_ROWS.
        lead = first % ALIGN_ROWS
        x = rand((lead + rows) * N).as_strided((1, rows, N), (S * N, N, 1), lead * N)
        ops.rms_norm(x, weight, eps=widths.eps, impl="auto")
        del x
        gate_up = (1, rows, widths.intermediate)
        ops.silu_mul(rand(*gate_up), rand(*gate_up), impl="auto")


# ---- the status line while kernels compile ----


class CompileStatus:
    """``CompileLog(on_compile=...)`` callback: a status line ``vlm-accel: compiling GPU kernels
    on first use (cached on disk for later runs): <kernel> ...`` at most once per ``interval``
    seconds (a prefill may compile dozens of variants), drawn as :func:`progress.status` draws."""

    def __init__(
        self,
        *,
        no_progress: bool = False,
        stream: IO | None = None,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.no_progress, self.stream = no_progress, stream
        self.interval, self.clock = interval, clock
        self._last: float | None = None

    def __call__(self, kernel: str) -> None:
        now = self.clock()
        if self._last is not None and now - self._last < self.interval:
            return
        self._last = now
        progress.status(
            f"compiling GPU kernels on first use (cached on disk for later runs): {kernel}",
            no_progress=self.no_progress,
            stream=self.stream,
        )


@contextlib.contextmanager
def compiling(*, enabled: bool = True, no_progress: bool = False, stream: IO | None = None):
    """``with compiling(no_progress=...) as log:`` records the Triton kernel variants compiled
    (or loaded from Triton's disk cache) inside the block, with :class:`CompileStatus` lines,
    then a status line with ``log.summary()`` when there were any. ``enabled=False`` (a CPU
    run, where nothing compiles) records nothing and yields None."""
    if not enabled:
        yield None
        return
    from sparse_kernels.tuning import CompileLog

    with CompileLog(on_compile=CompileStatus(no_progress=no_progress, stream=stream)) as log:
        yield log
    if log.count:
        progress.status(log.summary(), no_progress=no_progress, stream=stream)


def need_cuda(command: str, device: str | None) -> str:
    """The CUDA device a tune or warmup runs on (``device``: None, ``cuda`` or ``cuda:N``)."""
    import torch

    if device is not None and not device.startswith("cuda"):
        raise CliError(f"--device: expected cuda or cuda:N ({command} runs GPU kernels), got "
                       f"{device!r}", EXIT_USAGE)  # fmt: skip
    if not torch.cuda.is_available():
        raise CliError(f"{command} needs a CUDA GPU; torch sees none")
    return device or "cuda"


def stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
