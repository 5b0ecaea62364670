import pytest
import torch
from modality_index import Modality

transformers = pytest.importorskip("transformers")
from modality_index.integrations.hf import (  # noqa: E402
    build_qwen2_5_vl_inputs,
    decode_video,
    layout_from_hf,
    sample_clip_path,
    tiny_qwen2_5_vl_config,
)


def test_tiny_qwen2_5_vl_with_a_real_clip():
    frames = decode_video(sample_clip_path(), 4)
    assert frames.dtype == torch.uint8 and frames.shape[0] == 4 and frames.shape[-1] == 3
    cfg = tiny_qwen2_5_vl_config()
    inputs, n_after = build_qwen2_5_vl_inputs(cfg, frames, "What happens?")
    t, h, w = inputs["video_grid_thw"][0].tolist()
    lay = layout_from_hf(
        cfg,
        inputs["input_ids"],
        video_grid_thw=inputs["video_grid_thw"],
        mm_token_type_ids=inputs["mm_token_type_ids"],
    )
    assert t == 2  # 4 frames / temporal patch 2
    assert lay.tokens_per_frame == h * w // 4 and lay.num_frames == 2
    assert lay.counts()[Modality.VIDEO] == t * h * w // 4
    assert lay.seg_modality.tolist() == [0, 2, 0]
    torch.manual_seed(0)
    model = transformers.Qwen2_5_VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        out = model(**inputs)
    assert out.logits.shape[:2] == inputs["input_ids"].shape and torch.isfinite(out.logits).all()


def test_decode_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        decode_video(tmp_path / "missing.mp4", 2)
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video at all")
    with pytest.raises(ValueError, match="could not be decoded|no video stream"):
        decode_video(bad, 2)
    with pytest.raises(ValueError, match="frames"):
        decode_video(sample_clip_path(), 0)
