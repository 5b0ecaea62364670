import pytest
import torch
from modality_index import Modality, ModalityLayout

T, I, V = Modality.TEXT, Modality.IMAGE, Modality.VIDEO  # noqa: E741
IMG, VID, VS, VE = 151655, 151656, 151652, 151653  # Qwen2.5-VL token ids


def _qwen_ids(parts):
    """parts: ("text", n) | ("image", n_pads) | ("video", n_pads) -> ids with start/end tokens."""
    ids = []
    for kind, n in parts:
        if kind == "text":
            ids += list(range(10, 10 + n))
        else:
            ids += [VS] + [IMG if kind == "image" else VID] * n + [VE]
    return torch.tensor(ids)


@pytest.mark.parametrize(
    "spans,seg_mod,cu",
    [
        pytest.param([(T, 5)], [0], [0, 5], id="text-only"),
        pytest.param([(V, 8, 4)], [2], [0, 8], id="video-only"),
        pytest.param(
            [(T, 3), (I, 4), (T, 2), (V, 6, 3), (T, 1)],
            [0, 1, 0, 2, 0],
            [0, 3, 7, 9, 15, 16],
            id="t-i-t-v-t",
        ),
        pytest.param([(T, 1)], [0], [0, 1], id="S1"),
        pytest.param([(V, 4, 2), (I, 3), (V, 4, 4)], [2, 1, 2], [0, 4, 7, 11], id="v-i-v"),
    ],
)
def test_segments_and_permutation(spans, seg_mod, cu):
    lay = ModalityLayout.from_spans(spans)
    assert torch.equal(lay.seg_modality, torch.tensor(seg_mod))
    assert torch.equal(lay.seg_cu_seqlens, torch.tensor(cu, dtype=torch.int32))
    S = lay.seq_len
    x = torch.randn(2, 3, S, 4)
    xp = lay.permute(x, dim=2)
    assert torch.equal(lay.unpermute(xp, dim=2), x)
    assert torch.equal(lay.perm[lay.inv_perm], torch.arange(S))
    # Permuted order: modality non-decreasing, token order kept inside a modality.
    pm = lay.modality[lay.perm]
    assert bool((pm[1:] >= pm[:-1]).all())
    for m in range(3):
        idx = lay.perm[pm == m]
        assert bool((idx[1:] > idx[:-1]).all())
    counts = torch.bincount(lay.modality, minlength=3)
    assert torch.equal(lay.modality_cu_seqlens, torch.cat([torch.zeros(1), counts.cumsum(0)]).int())


def test_frames_of_interleaved_items():
    lay = ModalityLayout.from_spans([(T, 2), (V, 6, 3), (T, 1), (I, 4), (V, 4, 2)])
    want = torch.tensor([[2, 5], [5, 8], [9, 13], [13, 15], [15, 17]], dtype=torch.int32)
    assert torch.equal(lay.frame_spans, want)
    assert lay.tokens_per_frame == 3 and lay.num_frames == 5
    assert lay.is_mixed
    assert not ModalityLayout.from_spans([(T, 2), (V, 6, 3), (T, 4)]).is_mixed


def test_from_qwen2_vl_image_and_two_videos():
    # image grid (1, 4, 6) -> 6 tokens; video (2, 4, 4) -> 2 frames x 4; video (3, 2, 4) -> 3 x 2.
    ids = _qwen_ids(
        [("text", 3), ("image", 6), ("text", 2), ("video", 8), ("video", 6), ("text", 4)]
    )
    lay = ModalityLayout.from_qwen2_vl(
        ids, image_token_id=IMG, video_token_id=VID,
        image_grid_thw=torch.tensor([[1, 4, 6]]), video_grid_thw=torch.tensor([[2, 4, 4], [3, 2, 4]]),
    )  # fmt: skip
    kinds = [
        (it.modality, it.start, it.length, it.tokens_per_frame, it.num_frames) for it in lay.items
    ]
    assert kinds == [(I, 4, 6, 6, 1), (V, 14, 8, 4, 2), (V, 24, 6, 2, 3)]
    assert lay.tokens_per_frame == 4
    tt = lay.modality.clone()
    again = ModalityLayout.from_qwen2_vl(
        ids[None], image_token_id=IMG, video_token_id=VID, image_grid_thw=torch.tensor([[1, 4, 6]]),
        video_grid_thw=torch.tensor([[2, 4, 4], [3, 2, 4]]), mm_token_type_ids=tt[None],
    )  # fmt: skip
    assert torch.equal(again.perm, lay.perm)


def test_adjacent_videos_in_one_run_are_split_by_grid():
    ids = torch.tensor([1, 2] + [VID] * 14 + [3])
    lay = ModalityLayout.from_qwen2_vl(
        ids,
        image_token_id=IMG,
        video_token_id=VID,
        video_grid_thw=torch.tensor([[2, 4, 4], [3, 2, 4]]),
    )
    assert [(it.start, it.length) for it in lay.items] == [(2, 8), (10, 6)]


def test_from_llava_onevision():
    IMGL, VIDL = 151646, 151647
    ids = torch.tensor([5, 6] + [IMGL] * 7 + [8] + [VIDL] * (3 * 4 + 1) + [9, 9])
    lay = ModalityLayout.from_llava_onevision(
        ids, image_token_id=IMGL, video_token_id=VIDL, video_tokens_per_frame=4
    )
    assert [(it.modality, it.start, it.length, it.num_frames) for it in lay.items] == [
        (I, 2, 7, 1),
        (V, 10, 13, 3),
    ]
    assert torch.equal(
        lay.frame_spans[1:], torch.tensor([[10, 14], [14, 18], [18, 22]], dtype=torch.int32)
    )
    with pytest.raises(ValueError, match="newline"):
        ModalityLayout.from_llava_onevision(
            ids, image_token_id=IMGL, video_token_id=VIDL, video_tokens_per_frame=5
        )


@pytest.mark.parametrize(
    "call,match",
    [
        pytest.param(
            lambda: ModalityLayout.from_qwen2_vl(
                _qwen_ids([("video", 8)]),
                image_token_id=IMG,
                video_token_id=VID,
                video_grid_thw=torch.tensor([[2, 4, 6]]),
            ),
            "need 12 video pad tokens, input_ids has 8",
            id="grid-count",
        ),
        pytest.param(
            lambda: ModalityLayout.from_qwen2_vl(
                torch.zeros(2, 5, dtype=torch.long), image_token_id=IMG, video_token_id=VID
            ),
            "one sequence",
            id="batch",
        ),
        pytest.param(
            lambda: ModalityLayout.from_qwen2_vl(
                _qwen_ids([("image", 4)]),
                image_token_id=IMG,
                video_token_id=VID,
                image_grid_thw=torch.tensor([[1, 4, 4]]),
                mm_token_type_ids=torch.zeros(6, dtype=torch.long),
            ),
            "disagrees",
            id="type-ids",
        ),
        pytest.param(lambda: ModalityLayout.from_spans([(V, 7, 3)]), "multiple", id="frames"),
        pytest.param(lambda: ModalityLayout.from_spans([]), "at least one", id="empty"),
        pytest.param(lambda: ModalityLayout(torch.tensor([0, 3])), "0..2", id="bad-code"),
        pytest.param(
            lambda: ModalityLayout.from_spans([(T, 4)]).permute(torch.zeros(5, 2), dim=0),
            "expected 4 tokens",
            id="permute-len",
        ),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_layout_from_hf_config():
    from modality_index.integrations.hf import layout_from_hf
    from transformers import Qwen2_5_VLConfig

    cfg = Qwen2_5_VLConfig()
    ids = torch.tensor(
        [1, cfg.vision_start_token_id] + [cfg.video_token_id] * 8 + [cfg.vision_end_token_id, 2]
    )
    lay = layout_from_hf(cfg, ids, video_grid_thw=torch.tensor([[2, 4, 4]]))
    assert lay.tokens_per_frame == 4 and lay.num_frames == 2
    with pytest.raises(NotImplementedError, match="model_type"):
        layout_from_hf(type("C", (), {"model_type": "bert"})(), ids)
