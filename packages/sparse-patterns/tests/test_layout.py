"""The layout contract: ``TokenLayoutLike`` (met by ``modality_index.ModalityLayout`` as it is
and by ``TokenLayout``), and ``as_token_layout`` accepting exactly those."""

from types import SimpleNamespace

import pytest
import torch
from modality_index import ModalityLayout
from sparse_patterns import TokenLayout
from sparse_patterns.layout import LAYOUT_ATTRIBUTES, as_token_layout

IMAGE, VIDEO = 151655, 151656
CPU = torch.device("cpu")


def _qwen2_vl_layout() -> ModalityLayout:
    """Text, an image (grid 1x4x4: 4 tokens), text, a video (grid 2x4x6: 2 frames of 6 tokens),
    text, a second image, text: interleaved modalities, as a Qwen2-VL processor lays them out."""
    runs = [(7, 5), (IMAGE, 4), (9, 3), (VIDEO, 12), (11, 4), (IMAGE, 4), (13, 2)]
    ids = torch.cat([torch.full((n,), t) for t, n in runs])
    return ModalityLayout.from_qwen2_vl(
        ids,
        image_token_id=IMAGE,
        video_token_id=VIDEO,
        image_grid_thw=torch.tensor([[1, 4, 4], [1, 4, 4]]),
        video_grid_thw=torch.tensor([[2, 4, 6]]),
    )


def test_token_layout_computes_the_permutation_of_modality_layout_exactly():
    ml = _qwen2_vl_layout()
    tl = TokenLayout(ml.modality.clone(), ml.tokens_per_frame)
    assert tl.tokens_per_frame == 6
    assert torch.equal(tl.perm, ml.perm) and torch.equal(tl.inv_perm, ml.inv_perm)
    assert tl.perm.dtype == tl.inv_perm.dtype == torch.int64
    x = torch.arange(ml.seq_len) * 10
    assert torch.equal(x[tl.perm][tl.inv_perm], x)
    assert torch.equal(tl.modality[tl.perm], torch.sort(tl.modality).values)


def test_modality_layout_is_accepted_with_its_own_permutation():
    ml = _qwen2_vl_layout()
    assert all(hasattr(ml, a) for a in LAYOUT_ATTRIBUTES)
    tl = as_token_layout(ml, ml.seq_len, CPU)
    assert isinstance(tl, TokenLayout)
    assert torch.equal(tl.modality, ml.modality) and tl.tokens_per_frame == 6
    assert tl.perm is ml.perm and tl.inv_perm is ml.inv_perm  # carried, not re-sorted


def test_a_layout_like_object_keeps_its_permutation():
    """The planner follows the layout's permutation: a layout that orders its tokens its own way
    (here: the reversed stable order) is not re-sorted."""
    mod = torch.tensor([0, 2, 2, 0, 1])
    perm = torch.tensor([4, 3, 0, 2, 1])
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(5)
    obj = SimpleNamespace(modality=mod, tokens_per_frame=2, perm=perm, inv_perm=inv)
    tl = as_token_layout(obj, 5, CPU)
    assert torch.equal(tl.perm, perm) and torch.equal(tl.inv_perm, inv)


def test_token_layout_passes_through_and_none_is_text():
    tl = TokenLayout.from_spans([(0, 3), (2, 4)], tokens_per_frame=2)
    assert as_token_layout(tl, 7, CPU) is tl
    text = as_token_layout(None, 4, CPU)
    assert torch.equal(text.modality, torch.zeros(4, dtype=torch.int64))
    assert torch.equal(text.perm, torch.arange(4)) and torch.equal(text.inv_perm, torch.arange(4))


@pytest.mark.parametrize("drop", [pytest.param(a, id=f"without-{a}") for a in LAYOUT_ATTRIBUTES])
def test_an_object_missing_an_attribute_is_refused_naming_it(drop):
    ml = _qwen2_vl_layout()
    attrs = {a: getattr(ml, a) for a in LAYOUT_ATTRIBUTES if a != drop}
    with pytest.raises(TypeError, match=f"got SimpleNamespace without {drop}$"):
        as_token_layout(SimpleNamespace(**attrs), ml.seq_len, CPU)


def test_guessed_attribute_names_are_refused():
    obj = SimpleNamespace(modalities=torch.zeros(4, dtype=torch.int64))
    with pytest.raises(TypeError, match="without modality, tokens_per_frame, perm, inv_perm"):
        as_token_layout(obj, 4, CPU)


def test_bad_permutations_and_lengths_are_refused():
    ml = _qwen2_vl_layout()
    S = ml.seq_len
    base = {a: getattr(ml, a) for a in LAYOUT_ATTRIBUTES}
    short = SimpleNamespace(**{**base, "perm": ml.perm[:-1]})
    with pytest.raises(ValueError, match=rf"layout.perm: expected int64 of shape \({S},\)"):
        as_token_layout(short, S, CPU)
    int32 = SimpleNamespace(**{**base, "inv_perm": ml.inv_perm.int()})
    with pytest.raises(ValueError, match="layout.inv_perm: expected int64"):
        as_token_layout(int32, S, CPU)
    listed = SimpleNamespace(**{**base, "perm": ml.perm.tolist()})
    with pytest.raises(TypeError, match="layout.perm: expected a torch.Tensor, got list"):
        as_token_layout(listed, S, CPU)
    with pytest.raises(ValueError, match=f"expected {S + 1} tokens"):
        as_token_layout(ml, S + 1, CPU)


@pytest.mark.gpu
def test_moved_layout_carries_the_permutation_to_the_device():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    ml = _qwen2_vl_layout()
    dev = torch.device("cuda", torch.cuda.current_device())
    tl = as_token_layout(ml, ml.seq_len, dev)
    assert tl.modality.device == tl.perm.device == tl.inv_perm.device == dev
    assert torch.equal(tl.perm.cpu(), ml.perm) and torch.equal(tl.inv_perm.cpu(), ml.inv_perm)


def test_segment_is_the_slice_without_a_device_read():
    """A host's rows of a checked layout: the same modality slice and frame size, its own
    permutation, and no read back (``TokenLayout(...)`` itself reads the modality's minimum)."""
    from sparse_patterns.testing import SyncRecorder

    ml = _qwen2_vl_layout()
    tl = TokenLayout(ml.modality.clone(), ml.tokens_per_frame)
    with SyncRecorder() as rec:
        seg = tl.segment(7, 22)
    assert rec.events == []
    assert torch.equal(seg.modality, tl.modality[7:22]) and seg.tokens_per_frame == 6
    want = TokenLayout(tl.modality[7:22], 6)
    assert torch.equal(seg.perm, want.perm) and torch.equal(seg.inv_perm, want.inv_perm)
    with SyncRecorder() as rec:
        TokenLayout(tl.modality[7:22], 6)
    assert rec.events  # the checked constructor does read back: the recorder can fail
    assert tl.segment(4, 4).modality.numel() == 0


@pytest.mark.parametrize(
    "start, stop, err, match",
    [
        pytest.param(
            -1,
            3,
            ValueError,
            r"expected 0 <= start <= stop <= 30 .*got start=-1, stop=3",
            id="negative-start",
        ),
        pytest.param(5, 31, ValueError, r"got start=5, stop=31", id="stop-past-the-end"),
        pytest.param(6, 5, ValueError, r"got start=6, stop=5", id="stop-before-start"),
        pytest.param(1.0, 3, TypeError, r"start: expected an int, got 1.0", id="float-start"),
        pytest.param(0, True, TypeError, r"stop: expected an int, got True", id="bool-stop"),
    ],
)
def test_segment_bounds_are_checked(start, stop, err, match):
    tl = TokenLayout(torch.zeros(30, dtype=torch.int64))
    with pytest.raises(err, match=match):
        tl.segment(start, stop)
