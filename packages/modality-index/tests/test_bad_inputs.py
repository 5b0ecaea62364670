"""Hostile input to the ModalityLayout constructors: refused with a ValueError/TypeError naming
the argument, what it must be and what came; never truncated or taken for its truth value."""

import pytest
import torch
from modality_index import ModalityLayout


@pytest.mark.parametrize(
    "spans, exc, match",
    [
        ([(9, 4)], ValueError, r"modality: expected one of \[0, 1, 2\] \(Modality\), got 9"),
        ([(-1, 4)], ValueError, r"modality: expected an int in \[0, 2\*\*62\), got -1"),
        ([(1.7, 4)], TypeError, r"modality: expected an int, got float 1.7"),
        ([(0, 2.5)], TypeError, r"length: expected an int, got float 2.5"),
        ([(0, "4")], TypeError, r"length: expected an int, got str '4'"),
        ([(0, True)], TypeError, r"length: expected an int, got bool True"),
        ([(0, 10**30)], ValueError, r"length: expected an int in \[1, 2\*\*62\), got 10{30}"),
        ([(2, 8, 4.5)], TypeError, r"tokens_per_frame: expected an int, got float 4.5"),
        ([(2, 8, 0)], ValueError, r"tokens_per_frame: expected an int in \[1, 2\*\*62\), got 0"),
        ([(0, 8, 3)], ValueError, r"a text span takes no tokens_per_frame, got 3"),
        ([5], ValueError, r"span 5: expected \(modality, length\[, tokens_per_frame\]\)"),
        ("abc", TypeError, r"spans: expected a sequence of tuples, got str"),
    ],
    ids=[
        "modality-9", "modality-neg", "modality-float", "length-float", "length-str",
        "length-bool", "length-huge", "tpf-float", "tpf-0", "tpf-on-text", "span-int", "spans-str",
    ],
)  # fmt: skip
def test_from_spans_bad_spans(spans, exc, match):
    with pytest.raises(exc, match=match):
        ModalityLayout.from_spans(spans)


def test_from_spans_bad_device():
    with pytest.raises(ValueError, match=r"device: expected a torch device, got 'bogus'"):
        ModalityLayout.from_spans([(0, 4)], device="bogus")


@pytest.mark.parametrize(
    "ids, grid, kw, exc, match",
    [
        ([1, 5, 5, 5, 5, 2], torch.tensor([[1.0, 4.0, 4.0]]), {}, TypeError, r"image_grid_thw: expected an integer tensor, got torch.float32"),
        ([1, 5, 5, 5, 5, 2], [[1, 4, 4]], {}, TypeError, r"image_grid_thw: expected a torch.Tensor \[N, 3\], got list"),
        ([1, 5, 5, 5, 5, 2], torch.tensor([1, 4, 4, 1]), {}, ValueError, r"image_grid_thw: expected shape \[N, 3\] \(t, h, w\), got \(4,\)"),
        ([1, 2], torch.tensor([[1, -4, 4]]), {}, ValueError, r"image_grid_thw\[0\]: expected positive \(t, h, w\) .*, got \(1, -4, 4\)"),
        ([1, 5, 2], torch.tensor([[1, 4, 4]]), dict(spatial_merge_size=3), ValueError, r"multiples of spatial_merge_size=3, got \(1, 4, 4\)"),
        ([1, 5, 5, 5, 5, 2], torch.tensor([[1, 4, 4]]), dict(spatial_merge_size=0), ValueError, r"spatial_merge_size: expected an int in \[1, 2\*\*62\), got 0"),
        ([1, 5, 5, 5, 5, 2], torch.tensor([[1, 4, 4]]), dict(video_token_id=5), ValueError, r"expected two different ids, got 5 for both"),
    ],
    ids=["grid-float", "grid-list", "grid-shape", "grid-negative", "grid-not-merged", "merge-0", "same-ids"],
)  # fmt: skip
def test_from_qwen2_vl_bad_grids(ids, grid, kw, exc, match):
    args = {"image_token_id": 5, "video_token_id": 6, "image_grid_thw": grid} | kw
    with pytest.raises(exc, match=match):
        ModalityLayout.from_qwen2_vl(torch.tensor(ids), **args)


def test_from_llava_tokens_per_frame_must_be_an_int():
    ids = torch.tensor([1, 6, 6, 6, 6, 6, 2])
    with pytest.raises(TypeError, match=r"video_tokens_per_frame: expected an int, got float 2.5"):
        ModalityLayout.from_llava_onevision(
            ids, image_token_id=5, video_token_id=6, video_tokens_per_frame=2.5
        )


@pytest.mark.parametrize("dim", [5, -3])
def test_permute_dim_out_of_range(dim):
    layout = ModalityLayout.from_spans([(0, 4)])
    with pytest.raises(ValueError, match=rf"dim: expected a dim of x in \[-2, 2\), got {dim}"):
        layout.permute(torch.zeros(4, 2), dim=dim)
