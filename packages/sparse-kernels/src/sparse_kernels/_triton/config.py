"""Autotune configuration helpers: one small config under the interpreter, a real list on GPUs."""

from __future__ import annotations

import math
import os

import triton

from .._validate import interpreter_enabled

# exp2 is the fast path on GPUs; scores are pre-multiplied by log2(e) so exp2 gives exp.
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def on_interpreter() -> bool:
    return interpreter_enabled()


def configs(gpu: list[dict], interp: dict) -> list[triton.Config]:
    """Autotune list: the GPU list, or the single interpreter config."""
    if on_interpreter():
        return [triton.Config(dict(interp), num_warps=4, num_stages=1)]
    out = []
    for c in gpu:
        c = dict(c)
        w = c.pop("num_warps")
        s = c.pop("num_stages")
        out.append(triton.Config(c, num_warps=w, num_stages=s))
    return out


def block_d(D: int) -> int:
    return max(16, 1 << math.ceil(math.log2(D)))


# fp32 operands go through exact ("ieee") dots, emulated with FMAs: large tiles blow up shared
# memory and compile time, so fp32 gets one small tile whatever the autotune list says.
FP32_CONFIG = dict(BLOCK_M=64, BLOCK_N=32)


def autotune_off() -> bool:
    """``SPARSE_KERNELS_AUTOTUNE=0`` (set by ``nox -s gpu-tests``): compile one config per kernel;
    each config of a list has its own correctness test. Applied in the prune hooks, not in the
    list: with a single config Triton skips the hook (and the fp32 tile)."""
    return os.environ.get("SPARSE_KERNELS_AUTOTUNE", "1") == "0"


def smallest(configs_: list[triton.Config]) -> triton.Config:
    """The config with the least shared memory (tile area x stages): the one sure to fit."""
    return min(
        configs_,
        key=lambda c: (
            c.kwargs.get("BLOCK_M", c.kwargs.get("TILE_M", 1))
            * c.kwargs.get("BLOCK_N", c.kwargs.get("TILE_N", 1))
            * c.num_stages,
            c.num_warps,
        ),
    )


def prune_fp32(configs_, named_args, **kwargs):
    """``early_config_prune`` hook: the single small config for fp32 inputs, the list otherwise
    (one config when autotuning is off)."""
    import torch

    if on_interpreter():
        return configs_
    if named_args["q_ptr"].dtype == torch.float32:
        return [triton.Config(dict(FP32_CONFIG), num_warps=4, num_stages=1)]
    return [smallest(configs_)] if autotune_off() else configs_


# Autotuning times each config with ``triton.testing.do_bench`` by default: at least 8 calls (one,
# five to estimate the time, one warm-up, one timed). One call on a 1M-token layer takes seconds
# (dense attention: about 16 s on an H100), so that is minutes per config. A config whose first
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
    """``do_bench`` for ``triton.autotune``: one untimed call (compilation, caches), one timed
    call, and Triton's own repeated benchmark only when that call took less than
    ``LONG_CALL_MS``. Long configs thus cost 2 calls each instead of at least 8."""
    kernel_call()
    ms = _time_one_call(kernel_call)
    if ms < LONG_CALL_MS:
        return _triton_bench(kernel_call, quantiles)
    # the shapes triton.testing.do_bench returns: a float, or one value per quantile (a float for one)
    if quantiles is None or len(quantiles) == 1:
        return ms
    return [ms] * len(quantiles)


def seq_bucket(n: int) -> int:
    """Sequence-length bucket for autotune keys, one per factor of 4 in length: (8K, 32K],
    (32K, 128K], (128K, 512K], (512K, 2M] are buckets 7-10. A config tuned once at the first
    length seen and reused everywhere can be the wrong one: block-sparse attention at 128K took
    34.77 ms tuned at 32K and 31.17 ms tuned at 128K in two benchmark runs on an H100."""
    return (max(int(n), 1) - 1).bit_length() // 2
