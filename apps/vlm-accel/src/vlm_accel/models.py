"""The model families vlm-accel runs: how each is loaded, how its video inputs are built without
a processor, and what its ModalityLayout needs.

Qwen2.5-VL and Qwen2-VL share the video layout (M-RoPE, ``video_grid_thw``, one vision
start/end pair around the video pads). LLaVA-OneVision pools each frame to a fixed number of
tokens and appends one newline token; its layout needs that per-frame count, read from the
vision tower's geometry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType

import torch

from .errors import CliError


@dataclass(frozen=True)
class Family:
    model_type: str
    model_class: str  # transformers class name
    config_class: str
    tiny_config: str  # JSON in vlm_accel.configs
    mrope: bool  # M-RoPE: the model needs mm_token_type_ids for 3-D video positions


FAMILIES = MappingProxyType({
    f.model_type: f
    for f in (
        Family("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLConfig",
               "tiny_qwen2_5_vl.json", True),
        Family("qwen2_vl", "Qwen2VLForConditionalGeneration", "Qwen2VLConfig",
               "tiny_qwen2_vl.json", True),
        Family("llava_onevision", "LlavaOnevisionForConditionalGeneration", "LlavaOnevisionConfig",
               "tiny_llava_onevision.json", False),
    )
})  # fmt: skip
SUPPORTED = tuple(FAMILIES)


def family_of(config) -> Family:
    """The family of a transformers config; an unsupported model type is a one-line CliError."""
    mt = getattr(config, "model_type", None)
    if mt not in FAMILIES:
        raise CliError(
            f"--model: model type {mt!r} is not supported (supported: {', '.join(SUPPORTED)})"
        )
    return FAMILIES[mt]


def tiny_config(model_type: str):
    """The tiny random config kept in the package for ``model_type``."""
    import transformers

    fam = FAMILIES[model_type]
    text = resources.files("vlm_accel.configs").joinpath(fam.tiny_config).read_text()
    return getattr(transformers, fam.config_class).from_dict(json.loads(text))


def tiny_model(model_type: str, seed: int = 0):
    """A tiny random model of ``model_type`` (sdpa attention, eval mode), seeded."""
    import transformers

    cfg = tiny_config(model_type)
    torch.manual_seed(seed)
    model = getattr(transformers, FAMILIES[model_type].model_class)(cfg).eval()
    model.set_attn_implementation("sdpa")
    return model


def model_class(config):
    import transformers

    return getattr(transformers, family_of(config).model_class)


def hand_inputs(config, clip: torch.Tensor, prompt: str, *, tokenizer=None, max_pixels: int):
    """Processor-shaped inputs built without a processor (see modality_index.integrations.hf
    for the exact layout of each family)."""
    from modality_index.integrations import hf

    mt = family_of(config).model_type
    if mt == "llava_onevision":
        inputs, _ = hf.build_llava_onevision_inputs(config, clip, prompt, tokenizer=tokenizer)
    elif mt == "qwen2_vl":
        inputs, _ = hf.build_qwen2_vl_inputs(
            config, clip, prompt, tokenizer=tokenizer, max_pixels=max_pixels
        )
    else:
        inputs, _ = hf.build_qwen2_5_vl_inputs(
            config, clip, prompt, tokenizer=tokenizer, max_pixels=max_pixels
        )
    return inputs


def layout_kwargs(config) -> dict:
    """What ``layout_from_hf`` needs beyond the processor outputs."""
    if family_of(config).model_type == "llava_onevision":
        from modality_index.integrations.hf import llava_onevision_video_tokens_per_frame

        return {"video_tokens_per_frame": llava_onevision_video_tokens_per_frame(config)}
    return {}


def has_video(config, inputs: dict) -> bool:
    """Whether the inputs carry a video (Qwen: ``video_grid_thw``; LLaVA: video pixels)."""
    if family_of(config).mrope:
        return "video_grid_thw" in inputs
    return inputs.get("pixel_values_videos") is not None and bool(
        (inputs["input_ids"] == config.video_token_id).any()
    )
