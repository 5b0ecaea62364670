"""Where one call's GPU time goes, kernel by kernel. The benchmark suites profile ``ours-auto``
once per case and print the result under a target it misses: which kernels take the time, and
how much of the timed median is no kernel at all (host work, launches, waits)."""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

# Kernels named one by one in a profile line; the rest are summed as "other".
TOP_KERNELS = 3
# Longest kernel name kept (FA4's CuTe kernels have names of several hundred characters).
NAME_CHARS = 48


def short_kernel_name(name: str) -> str:
    """``name`` without a leading return type, anonymous namespaces, its template and argument
    lists, cut to :data:`NAME_CHARS` characters."""
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    name = re.split(r"[<(]", name, maxsplit=1)[0].strip()
    return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 3] + "..."


def kernel_times_ms(fn: Callable[[], object]) -> dict[str, float]:
    """GPU time in ms of each kernel of one call of ``fn`` (copies and fills included), by
    :func:`short_kernel_name`, summed over its launches (``torch.profiler``, CUDA activity).
    Run ``fn`` once before, so that compiles and tuning stay out of the profile."""
    if not torch.cuda.is_available():
        raise RuntimeError("kernel_times_ms profiles GPU kernels: it needs a CUDA GPU")
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for event in prof.events():
        if event.device_type == DeviceType.CUDA:
            name = short_kernel_name(event.name)
            times[name] = times.get(name, 0.0) + event.time_range.elapsed_us() / 1e3
    return times


def top_kernels(times: dict[str, float], top: int = TOP_KERNELS) -> dict[str, float]:
    """The ``top`` longest entries of ``times``, largest first, and the sum of the rest as
    ``"other"`` when any remain."""
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top}")
    ranked = sorted(times.items(), key=lambda kv: kv[1], reverse=True)
    kept = dict(ranked[:top])
    if len(ranked) > top:
        kept["other"] = sum(ms for _, ms in ranked[top:])
    return kept


def profile_line(kernels_ms: dict[str, float], median_ms: float) -> str:
    """``"kernels 13.52 of 14.27 ms: flash_fwd 12.31 (86%), ..."``: the kernels' total against
    the timed median, then each entry of ``kernels_ms`` with its share of that median."""
    if not median_ms > 0:
        raise ValueError(f"median_ms must be positive, got {median_ms}")
    total = sum(kernels_ms.values())
    parts = [f"{name} {ms:.2f} ({100 * ms / median_ms:.0f}%)" for name, ms in kernels_ms.items()]
    return f"kernels {total:.2f} of {median_ms:.2f} ms: " + ", ".join(parts)
