"""Shared kernel constants and helpers: exp2 constants, the head-dim tile, the fp32 tile, and
the per-config timing that the tuner (``sparse_kernels.tuning``) uses."""

from __future__ import annotations

import math
from types import MappingProxyType

import triton

from .._validate import interpreter_enabled

# exp2 is the fast path on GPUs; scores are pre-multiplied by log2(e) so exp2 gives exp.
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def on_interpreter() -> bool:
    return interpreter_enabled()


def block_d(D: int) -> int:
    return max(16, 1 << math.ceil(math.log2(D)))


# fp32 operands go through exact ("ieee") dots, emulated with FMAs: large tiles blow up shared
# memory and compile time, so fp32 gets one small tile whatever a tuned table says.
FP32_CONFIG = MappingProxyType(dict(BLOCK_M=64, BLOCK_N=32))


# ``triton.testing.do_bench`` times a config with at least 8 calls (one, five to estimate the
# time, one warm-up, one timed). One call on a 1M-token layer takes seconds (dense attention:
# about 16 s on an H100), so that is minutes per config. A config whose first
# timed call already takes LONG_CALL_MS is timed by that call alone.
LONG_CALL_MS = 20.0


def _time_one_call(fn) -> float:
    """Milliseconds of one call of ``fn`` (CUDA events)."""
    import torch

    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _triton_bench(fn, quantiles):
    return triton.testing.do_bench(fn, quantiles=quantiles)


def bench_config(kernel_call, quantiles=None):
    """Time one launch config: one untimed call (compilation, caches), one timed call, and
    Triton's own repeated benchmark only when that call took less than ``LONG_CALL_MS``. Long
    configs thus cost 2 calls each instead of at least 8."""
    kernel_call()
    ms = _time_one_call(kernel_call)
    if ms < LONG_CALL_MS:
        return _triton_bench(kernel_call, quantiles)
    # the shapes triton.testing.do_bench returns: a float, or one value per quantile (a float for one)
    if quantiles is None or len(quantiles) == 1:
        return ms
    return [ms] * len(quantiles)
