"""Hostile input to Spava's configuration and layouts: refused with a ValueError/TypeError naming
what it must be and what came; a flag is never taken for its truth value."""

import pytest
import torch
from seqpar_approx import SpavaConfig, build_layout, even_split, resolve_apb, split_frames


@pytest.mark.parametrize("flag", ["zigzag", "fused_query", "overlap_comm", "frame_parallel_vision"])
@pytest.mark.parametrize("value", ["no", 0, None], ids=repr)
def test_config_flags_must_be_bools(flag, value):
    # zigzag="no" is truthy: it would pick the 2H-virtual-host layout without a word
    with pytest.raises(TypeError, match=rf"{flag}: expected a bool, got {type(value).__name__}"):
        SpavaConfig(num_hosts=2, **{flag: value})


@pytest.mark.parametrize(
    "make, exc, match",
    [
        (lambda: build_layout(100, query_len=10, config=None), TypeError, r"config: expected a SpavaConfig, got NoneType"),
        (lambda: build_layout(100, query_len=10, config={"num_hosts": 2}), TypeError, r"config: expected a SpavaConfig, got dict"),
        (lambda: resolve_apb(None, 100), TypeError, r"config: expected a SpavaConfig, got NoneType"),
        (lambda: even_split(10, 0), ValueError, r"parts: expected an int >= 1, got 0"),
        (lambda: even_split(-10, 3), ValueError, r"total: expected an int >= 0, got -10"),
        (lambda: even_split(10.5, 3), ValueError, r"total: expected an int >= 0, got 10.5"),
        (lambda: split_frames(10.5, 2), ValueError, r"expected ints num_frames >= 0 and num_hosts >= 1, got 10.5 and 2"),
    ],
    ids=["layout-None", "layout-dict", "apb-None", "split-0", "split-neg", "split-float", "frames-float"],
)  # fmt: skip
def test_layouts(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_shard_dim_out_of_range():
    layout = build_layout(100, query_len=10, config=SpavaConfig(num_hosts=2))
    with pytest.raises(ValueError, match=r"shard: expected a dim of x in \[-2, 2\), got 7"):
        layout.shard(torch.zeros(100, 2), 0, dim=7)
