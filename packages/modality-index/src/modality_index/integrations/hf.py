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
