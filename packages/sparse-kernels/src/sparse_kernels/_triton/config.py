"""Autotune configuration helpers: one small config under the interpreter, a real list on GPUs."""

from __future__ import annotations

import math

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
