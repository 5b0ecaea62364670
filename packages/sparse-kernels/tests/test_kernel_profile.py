"""The benchmark suites' kernel profile: names, ranking, the summary line (CPU), and one profiled
call of a real kernel (GPU)."""

from __future__ import annotations

import pytest
import torch
from sparse_kernels.kernel_profile import (
    NAME_CHARS,
    kernel_times_ms,
    profile_line,
    short_kernel_name,
    top_kernels,
)


def test_short_kernel_names_drop_types_templates_and_arguments():
    assert short_kernel_name("_sink_merge_fwd_kernel") == "_sink_merge_fwd_kernel"
    assert short_kernel_name("void at::native::fill_kernel<float>(int, float*)") == (
        "at::native::fill_kernel"
    )
    anonymous = "void (anonymous namespace)::elementwise_kernel_with_index<int, F>(int, F)"
    assert short_kernel_name(anonymous) == "elementwise_kernel_with_index"
    copy = "void at::native::(anonymous namespace)::CatArrayBatchedCopy<T>(T*)"
    assert short_kernel_name(copy) == "at::native::CatArrayBatchedCopy"
    cute = "kernel_cutlass_kernel_flash_attncuteflash_fwd_sm90FlashAttentionForwardSm90_object_at_"
    short = short_kernel_name(cute + "_tensorptrbf16gmem")
    assert len(short) == NAME_CHARS and short == cute[: NAME_CHARS - 3] + "..."


def test_top_kernels_keeps_the_longest_and_sums_the_rest():
    times = {"a": 1.0, "b": 5.0, "c": 0.5, "d": 2.0, "e": 0.25}
    assert list(top_kernels(times, 2).items()) == [("b", 5.0), ("d", 2.0), ("other", 1.75)]
    assert top_kernels({"a": 1.0}, 3) == {"a": 1.0}  # nothing left over: no "other"
    with pytest.raises(ValueError, match="top must be >= 1, got 0"):
        top_kernels(times, 0)


def test_profile_line_gives_each_kernel_its_share_of_the_median():
    line = profile_line({"flash_fwd": 12.0, "_sink_merge": 1.5}, 15.0)
    assert line == "kernels 13.50 of 15.00 ms: flash_fwd 12.00 (80%), _sink_merge 1.50 (10%)"
    with pytest.raises(ValueError, match="median_ms must be positive, got 0"):
        profile_line({"a": 1.0}, 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_kernel_times_ms_says_it_needs_a_gpu():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        kernel_times_ms(lambda: None)


@pytest.mark.gpu
def test_kernel_times_ms_profiles_one_call_on_the_gpu():
    a = torch.randn(2048, 2048, device="cuda")
    buf = torch.empty(1 << 24, device="cuda")

    def fill():
        buf.fill_(1.0)

    def both():
        fill()
        return a @ a

    both()
    alone = kernel_times_ms(fill)
    assert len(alone) == 1, alone
    times = kernel_times_ms(both)
    (fill_name,) = alone
    assert fill_name in times and len(times) >= 2, times
    assert max(times, key=times.get) != fill_name, times  # the 2048^3 product takes longer
    assert all(ms > 0 for ms in times.values()), times
