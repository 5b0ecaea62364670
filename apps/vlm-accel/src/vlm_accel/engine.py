"""App-level wiring of the libraries to HF VLMs: load, build inputs, apply a method, prefill.

Algorithms live in the packages (modality_index, sparse_patterns, triangle_mix); this module
only connects them to a model and measures.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .choices import METHODS
from .errors import EXIT_MEMORY, CliError
from .models import FAMILIES, family_of, hand_inputs, has_video, layout_kwargs, model_class

SUPPORTED = tuple(FAMILIES)  # the model types vlm-accel runs


def _tf():
    import transformers

    return transformers


def tiny_demo_model(seed: int = 0):
    """The demo's tiny random Qwen2.5-VL, built from the config kept in the package."""
    from .models import tiny_model

    return tiny_model("qwen2_5_vl", seed)


def load_model(path: str | Path, *, device: str, dtype: torch.dtype):
    """A local checkpoint directory: model and processor (both from the directory).

    When the directory's processor cannot be built but its tokenizer can (transformers' video
    processors need torchvision; a tiny test checkpoint may ship only a tokenizer), the
    tokenizer is returned instead and the video inputs are built by hand in the processor's
    layout; a note on stderr says so."""
    tf = _tf()
    path = Path(path)
    if not (path / "config.json").is_file():
        raise CliError(f"--model: {path} is not a checkpoint directory (no config.json)")
    cfg = tf.AutoConfig.from_pretrained(path)
    cls = model_class(cfg)
    try:
        processor = tf.AutoProcessor.from_pretrained(path)
        problem = None if is_processor(processor) else "the directory has only a tokenizer"
    except Exception as e:  # noqa: BLE001 - any processor failure is one user-facing problem
        first = (str(e).strip().splitlines() or [""])[0].split(". ")[0]
        problem = f"{type(e).__name__}: {first}"
        try:
            processor = tf.AutoTokenizer.from_pretrained(path)
        except Exception:  # noqa: BLE001
            raise CliError(f"--model: {path} has no usable processor ({problem})") from None
    if problem is not None:
        print(
            f"vlm-accel: note: no video processor for {path} ({problem}); "
            "building the video inputs by hand in the processor's layout",
            file=sys.stderr,
        )
    model = cls.from_pretrained(path, dtype=dtype).to(device).eval()
    model.set_attn_implementation("sdpa")
    return model, processor


def is_processor(obj) -> bool:
    """A multimodal processor (has a video processor), not a bare tokenizer."""
    return obj is not None and getattr(obj, "video_processor", None) is not None


def language_model(model):
    inner = getattr(model, "model", model)
    return getattr(inner, "language_model", inner)


def video_inputs(model, processor, video: str | Path, prompt: str, *, frames: int, max_pixels: int):
    """Inputs for one video and a question, and its ModalityLayout. ``processor`` is the
    model's processor, a bare tokenizer (inputs built by hand, text tokenized with it) or None
    (inputs built by hand, byte-level text)."""
    from modality_index.integrations.hf import decode_video, layout_from_hf

    if not prompt or not prompt.strip():
        raise CliError("--prompt: expected a question about the video, got an empty prompt")
    cfg = model.config
    fam = family_of(cfg)
    try:
        clip = decode_video(video, frames)
    except (FileNotFoundError, ValueError) as e:
        raise CliError(str(e)) from None
    if is_processor(processor):
        msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": prompt}]}]
        text = processor.apply_chat_template(msgs, add_generation_prompt=True)
        inputs = dict(processor(text=[text], videos=[clip], return_tensors="pt"))
    else:
        inputs = hand_inputs(cfg, clip, prompt, tokenizer=processor, max_pixels=max_pixels)
    if not has_video(cfg, inputs):
        raise CliError("the processor produced no video tokens for this prompt")
    if not fam.mrope:
        inputs.pop("mm_token_type_ids", None)  # 1-D RoPE: the model has no use for it
    elif inputs.get("mm_token_type_ids") is None:
        # transformers 5.x computes M-RoPE (3-D) positions only when mm_token_type_ids is given;
        # without it the model silently falls back to 1-D text positions for the video.
        ids = inputs["input_ids"]
        mm = torch.zeros_like(ids, dtype=torch.int32)
        mm[ids == getattr(cfg, "image_token_id", -1)] = 1
        mm[ids == cfg.video_token_id] = 2
        inputs["mm_token_type_ids"] = mm
    rest = {k: v for k, v in inputs.items() if k != "input_ids"}
    layout = layout_from_hf(cfg, inputs["input_ids"], **rest, **layout_kwargs(cfg))
    return inputs, layout


@dataclass
class Applied:
    handles: list

    def remove(self) -> None:
        for h in reversed(self.handles):
            h.remove()


def check_config(model, pattern_config) -> None:
    """A CliError unless ``pattern_config`` has the language model's numbers of layers and
    attention heads (checked once the model is known, before any prefill)."""
    cfg = language_model(model).config
    n, H = cfg.num_hidden_layers, cfg.num_attention_heads
    got = (pattern_config.num_layers, pattern_config.num_heads)
    if got != (n, H):
        raise CliError(
            f"--config: expected a config for {n} layers x {H} heads (this model), got "
            f"{got[0]} layers x {got[1]} heads (made for {pattern_config.model_id})"
        )


def apply_method(model, method: str, *, layout, pattern_config=None, start_layer: int | None = None,
                 sink: int = 8, window: int = 512, last: int = 128) -> Applied:  # fmt: skip
    """Switch the language model's attention to ``method``; ``Applied.remove()`` undoes it and
    the attention functions hold ``layout``, the modality layout of the prompt."""
    if method not in METHODS:
        raise CliError(f"--method: expected one of {', '.join(METHODS)}, got {method!r}")
    lm = language_model(model)
    n = lm.config.num_hidden_layers
    if method == "dense":
        return Applied([])
    if "mminference" in method and pattern_config is None:
        raise CliError(
            "--method mminference needs --config CFG (write one with `vlm-accel search`)"
        )
    if pattern_config is not None:
        check_config(model, pattern_config)
    if method == "mminference":
        from sparse_patterns.integrations.hf import apply_pattern_config

        return Applied([apply_pattern_config(lm, pattern_config, layout=layout)])
    from triangle_mix import LayerPolicy
    from triangle_mix.integrations.hf import apply_triangle_mix

    start = n // 2 if start_layer is None else start_layer
    if not 0 <= start <= n:
        raise CliError(f"--start-layer: expected 0..{n} (the model has {n} layers), got {start}")
    shape = dict(sink=sink, window=window, last=last)
    if method == "trianglemix":
        return Applied([apply_triangle_mix(lm, LayerPolicy.triangle_from(n, start, **shape))])
    from sparse_patterns import MMInferencePlanner, mminference_attention

    # One planner for every layer: what it keeps per shape (the Grid heads' CUDA graphs) serves
    # each layer after the first.
    planner = MMInferencePlanner()

    def dynamic(q, k, v, *, layer_idx, scale):
        heads = pattern_config.layers[layer_idx]
        return mminference_attention(q, k, v, heads, layout, scale=scale, planner=planner).out

    pol = LayerPolicy.triangle_from(n, start, shallow="dynamic", **shape)
    return Applied([apply_triangle_mix(lm, pol, dynamic=dynamic)])


_PER_TOKEN = ("mlp", "input_layernorm", "post_attention_layernorm")


@contextlib.contextmanager
def chunked_mlp(model, chunk: int = 16384):
    """Run every decoder layer's MLP and RMSNorms (and the final norm) over the sequence in
    chunks of ``chunk`` tokens. Exact: these act on each token alone, so 512K-1M token prefills
    do not hold the full fp32 norm or MLP intermediate activations."""
    from sparse_kernels.integrations.hf import ForwardPatches

    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise CliError(f"--mlp-chunk: expected an integer >= 1, got {chunk!r}")
    lm = language_model(model)
    mods = [getattr(layer, n) for layer in getattr(lm, "layers", []) for n in _PER_TOKEN]
    if getattr(lm, "norm", None) is not None:
        mods.append(lm.norm)
    patches = ForwardPatches()
    for mod in mods:
        fwd = mod.forward

        def run(x, _fwd=fwd):
            if x.dim() != 3 or x.shape[1] <= chunk:
                return _fwd(x)
            return torch.cat(
                [_fwd(x[:, i : i + chunk]) for i in range(0, x.shape[1], chunk)], dim=1
            )

        patches.set(mod, run)
    try:
        yield
    finally:
        patches.remove()


@contextlib.contextmanager
def fused_parts(model, *, impl: str = "auto"):
    """:func:`fuse_parts` for the duration of a ``with`` block."""
    handle = fuse_parts(model, impl=impl)
    try:
        yield handle
    finally:
        handle.remove()


def fuse_parts(model, *, impl: str = "auto"):
    """``sparse_kernels.integrations.hf.fuse_per_token_ops`` (the RMSNorms, MLP gates and rotary
    step as fused kernels; returns the handle that undoes it), with its refusals as CliError."""
    from sparse_kernels.integrations.hf import fuse_per_token_ops

    try:
        return fuse_per_token_ops(model, impl=impl)
    except ValueError as e:
        raise CliError(f"--fused: {e}") from None


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def prefill(
    model, inputs: dict, *, chunk: int | None = None,
    fused: bool = False,
):  # fmt: skip
    """One prefill returning ``(last_logits [B, V], seconds, peak_gib or None)``; logits only
    for the last position. ``fused``: norms, MLP gates and rotary step as fused kernels
    (:func:`fuse_parts`). Out of memory becomes a CliError with the length that would fit."""
    dev = next(model.parameters()).device
    inputs = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    mlp = chunked_mlp(model, chunk) if chunk else contextlib.nullcontext()
    fuse = fused_parts(model) if fused else contextlib.nullcontext()
    S = inputs["input_ids"].shape[1]
    try:
        _sync(dev)
        t0 = time.perf_counter()
        with torch.no_grad(), fuse, mlp:  # chunks run the fused forwards
            logits = model(**inputs, use_cache=False, logits_to_keep=1).logits[:, -1]
        _sync(dev)
        dt = time.perf_counter() - t0
    except torch.OutOfMemoryError:
        free, total = torch.cuda.mem_get_info(dev) if dev.type == "cuda" else (0, 0)
        fit = _fitting_length(model, total, S)
        raise CliError(
            f"out of memory prefilling {S} tokens on {dev}; about {fit} tokens would fit "
            "(use fewer --frames, a lower --fps, or a GPU with more memory)",
            EXIT_MEMORY,
        ) from None
    peak = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None
    return logits.float(), dt, peak


def _fitting_length(model, total_bytes: int, S: int) -> int:
    """Tokens whose per-token activations fit beside the weights (hidden, MLP chunk, q/k/v)."""
    cfg = language_model(model).config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    per_token = 2 * (
        6 * cfg.hidden_size
        + 2 * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    )
    return max(0, int((0.9 * total_bytes - weights) // max(per_token, 1)))
