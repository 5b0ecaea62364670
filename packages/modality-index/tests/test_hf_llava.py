"""Hand-built LLaVA-OneVision / Qwen2-VL inputs: the token layout the processor produces, the
pooled tokens per frame the model really emits, and the offline tokenizer."""

import pytest
import torch

pytest.importorskip("transformers")
from modality_index import Modality, ModalityLayout  # noqa: E402
from modality_index.integrations import hf  # noqa: E402


def _frames(n, h=37, w=53, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, h, w, 3), generator=g, dtype=torch.uint8)


@pytest.mark.parametrize(
    "image_size,per_frame",
    [
        pytest.param(28, 1, id="grid2-pool1"),
        pytest.param(56, 4, id="grid4-pool2"),
        pytest.param(70, 9, id="grid5-pool3-odd"),
    ],
)
def test_tokens_per_frame_is_what_the_model_emits(image_size, per_frame):
    """The video token count of the hand-built inputs equals the number of video features the
    model scatters into them (pooled frames + one newline): the model's own forward accepts the
    inputs, and rejects them with one video token fewer. (Whether the newline is appended in
    ``get_video_features`` or in ``forward`` changed between transformers releases, so the
    check goes through ``forward``.)"""
    import transformers

    cfg = hf.tiny_llava_onevision_config(layers=1, image_size=image_size)
    assert hf.llava_onevision_video_tokens_per_frame(cfg) == per_frame
    torch.manual_seed(0)
    model = transformers.LlavaOnevisionForConditionalGeneration(cfg).eval()
    frames = 3
    inputs, _ = hf.build_llava_onevision_inputs(cfg, _frames(frames), "q")
    ids = inputs["input_ids"]
    n_vid = int((ids == cfg.video_token_id).sum())
    assert n_vid == frames * per_frame + 1
    with torch.no_grad():
        out = model(**inputs)
    assert out.logits.shape == (1, ids.shape[1], cfg.text_config.vocab_size)
    first = int((ids[0] == cfg.video_token_id).nonzero()[0])
    short = dict(inputs, input_ids=torch.cat([ids[:, :first], ids[:, first + 1 :]], dim=1))
    short["attention_mask"] = torch.ones_like(short["input_ids"])
    with pytest.raises(ValueError, match="do not match"), torch.no_grad():
        model(**short)


def test_llava_inputs_exact_layout_and_pixels():
    cfg = hf.tiny_llava_onevision_config(layers=1)
    frames = _frames(5)
    inputs, after = hf.build_llava_onevision_inputs(cfg, frames, "Why?")
    ids = inputs["input_ids"][0].tolist()
    vid = cfg.video_token_id
    im_start, im_end = 257, 258
    pre = [im_start, *b"user "]
    post = [*b"\nWhy?", im_end, im_start, *b"assistant\n"]
    assert ids == pre + [vid] * (5 * 9 + 1) + post and after == len(post)
    assert torch.equal(inputs["attention_mask"], torch.ones_like(inputs["input_ids"]))
    px = inputs["pixel_values_videos"]
    assert px.shape == (1, 5, 3, 70, 70) and px.dtype == torch.float32
    # Independent: resize one frame in fp64 as two separable antialiased passes, width then
    # height, each rounded and clamped to uint8 levels (torchvision's uint8 resize), then
    # normalise per channel.
    x = frames[2:3].permute(0, 3, 1, 2).double()
    for size in ((x.shape[2], 70), (70, 70)):
        x = torch.nn.functional.interpolate(x, size=size, mode="bicubic", antialias=True)
        x = x.round().clamp(0, 255)
    x = x[0] / 255
    for c in range(3):
        want = (x[c] - hf.CLIP_MEAN[c]) / hf.CLIP_STD[c]
        # torch's uint8 path weighs in fixed point, fp64 here can land on the other side of a
        # .5 rounding: at most 2% of pixels one uint8 level apart (1/255/std ~ 0.015);
        # everything else to fp32 rounding.
        diff = (px[0, 2, c].double() - want).abs()
        assert float(diff.max()) < 0.016 and int((diff > 1e-5).sum()) <= 98, c

    layout = hf.layout_from_hf(cfg, inputs["input_ids"], video_tokens_per_frame=9)
    (item,) = layout.items
    assert (item.modality, item.start, item.length, item.tokens_per_frame, item.num_frames) == (
        Modality.VIDEO,
        len(pre),
        46,
        9,
        5,
    )


def test_llava_inputs_with_the_tiny_tokenizer_match_byte_ids():
    """The tiny tokenizer encodes text to byte ids and the specials to 256.., so the tokenized
    and the byte-level inputs are the same sequence."""
    cfg = hf.tiny_llava_onevision_config(layers=1)
    tok = hf.tiny_tokenizer()
    assert tok.convert_tokens_to_ids(list(hf.TINY_SPECIAL_TOKENS)) == list(range(256, 265))
    a, _ = hf.build_llava_onevision_inputs(cfg, _frames(2), "héllo? 7")
    b, _ = hf.build_llava_onevision_inputs(cfg, _frames(2), "héllo? 7", tokenizer=tok)
    assert torch.equal(a["input_ids"], b["input_ids"])
    text = b["input_ids"][0, b["input_ids"][0] != cfg.video_token_id][6:]
    assert tok.decode(text) == "\nhéllo? 7<|im_end|><|im_start|>assistant\n"


def test_qwen2_vl_inputs_and_layout():
    cfg = hf.tiny_qwen2_vl_config(layers=1)
    inputs, after = hf.build_qwen2_vl_inputs(cfg, _frames(4, 60, 90), "q", max_pixels=56 * 84)
    t, h, w = inputs["video_grid_thw"][0].tolist()
    assert (t, h, w) == (2, 4, 6)
    n = t * h * w // 4
    vid = inputs["input_ids"][0] == cfg.video_token_id
    assert int(vid.sum()) == n and torch.equal(inputs["mm_token_type_ids"][0] == 2, vid)
    rest = {k: v for k, v in inputs.items() if k != "input_ids"}
    layout = hf.layout_from_hf(cfg, inputs["input_ids"], **rest)
    assert (layout.num_frames, layout.tokens_per_frame) == (2, 6)
    want = ModalityLayout.from_qwen2_vl(
        inputs["input_ids"],
        image_token_id=cfg.image_token_id,
        video_token_id=cfg.video_token_id,
        video_grid_thw=inputs["video_grid_thw"],
        spatial_merge_size=2,
    )
    assert torch.equal(layout.modality, want.modality) and layout.items == want.items


@pytest.mark.parametrize(
    "fn,config,msg",
    [
        pytest.param(
            hf.build_llava_onevision_inputs,
            hf.tiny_qwen2_vl_config,
            "expected a llava_onevision config",
            id="llava-builder-qwen-config",
        ),
        pytest.param(
            hf.build_qwen2_vl_inputs,
            hf.tiny_llava_onevision_config,
            "expected a qwen2_vl config",
            id="qwen-builder-llava-config",
        ),
    ],
)
def test_builders_reject_the_other_family(fn, config, msg):
    with pytest.raises(ValueError, match=msg):
        fn(config(layers=1), _frames(2), "q")


def test_llava_builder_rejects_bad_frames():
    cfg = hf.tiny_llava_onevision_config(layers=1)
    with pytest.raises(
        ValueError, match=r"expected uint8 \[N, H, W, 3\], got torch.uint8 \(2, 3, 8, 8\)"
    ):
        hf.build_llava_onevision_inputs(cfg, torch.zeros(2, 3, 8, 8, dtype=torch.uint8), "q")
    with pytest.raises(
        ValueError, match=r"expected uint8 \[N, H, W, 3\], got torch.float32 \(2, 8, 8, 3\)"
    ):
        hf.build_llava_onevision_inputs(cfg, torch.zeros(2, 8, 8, 3), "q")


def test_hand_built_pixels_match_the_video_processor():
    """Where torchvision is installed (transformers' video processors need it): the hand-built
    pixels match ``LlavaOnevisionVideoProcessor`` at the tiny model's size up to one uint8
    level of resize rounding."""
    pytest.importorskip("torchvision")
    from transformers import LlavaOnevisionVideoProcessor

    cfg = hf.tiny_llava_onevision_config(layers=1)
    frames = _frames(3, 90, 121, seed=3)
    vp = LlavaOnevisionVideoProcessor(size={"height": 70, "width": 70})
    want = vp(videos=[frames], return_tensors="pt")["pixel_values_videos"]
    got, _ = hf.build_llava_onevision_inputs(cfg, frames, "q")
    got = got["pixel_values_videos"]
    assert got.shape == tuple(want.shape) == (1, 3, 3, 70, 70)
    diff = (got - want.float()).abs()
    assert float(diff.max()) < 0.035 and float(diff.mean()) < 0.005
