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
    if os.environ.get("SPARSE_KERNELS_AUTOTUNE", "1") == "0":
        # Tests: compile only the first config (each config has its own correctness test).
        gpu = gpu[:1]
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


def prune_fp32(configs_, named_args, **kwargs):
    """``early_config_prune`` hook: the single small config for fp32 inputs, the list otherwise."""
    import torch

    if named_args["q_ptr"].dtype == torch.float32 and not on_interpreter():
        return [triton.Config(dict(FP32_CONFIG), num_warps=4, num_stages=1)]
    return configs_
