"""Tensor descriptors for the copy engine (TMA) of Hopper and later GPUs.

A kernel that walks contiguous key tiles can load them with the copy engine instead of index
loads: the tile arrives in shared memory without the threads computing its addresses, which frees
registers and issue slots for the matrix work (on an H100, same launch configs and equal
outputs: dense causal 1.04x-1.05x at 32K and 128K, block-sparse 1.08x-1.12x, vertical-slash
1.02x-1.17x; ``docs/results.md``). The copy engine needs a descriptor per tensor, built here on
the host and passed to the kernel as an argument; it zero-fills what lies outside the tensor, as
the index loads' masks do.
"""

from __future__ import annotations

import functools

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

# The copy engine reads from 16-byte aligned addresses with 16-byte aligned strides.
_ALIGN_BYTES = 16


def _strides(t: torch.Tensor) -> list[int]:
    """``t``'s strides, where a dim of size 1 (only ever read at 0, its stride unused) gets the
    span of the dims after it, so that an arbitrary stride there does not fail the alignment."""
    strides = list(t.stride())
    for i in range(t.dim() - 2, -1, -1):
        if t.shape[i] == 1:
            strides[i] = strides[i + 1] * t.shape[i + 1]
    return strides


def tma_layout_ok(t: torch.Tensor) -> bool:
    """Whether ``t``'s layout suits a descriptor: last stride 1, every other stride positive and,
    as the address, a multiple of 16 bytes."""
    size = t.element_size()
    strides = _strides(t)
    return (
        strides[-1] == 1
        and t.data_ptr() % _ALIGN_BYTES == 0
        and all(s > 0 and s * size % _ALIGN_BYTES == 0 for s in strides[:-1])
    )


@functools.cache
def _has_copy_engine(device_index: int) -> bool:
    """Whether that CUDA GPU (compute capability 9.0 and later) has the copy engine: a fixed fact
    of the device, looked up once per process rather than on every launch."""
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


def tma_default(*tensors: torch.Tensor) -> bool:
    """The launchers' choice when the caller names none: the copy engine on CUDA GPUs of compute
    capability 9.0 and later, for tensors whose layout suits it; index loads elsewhere."""
    t = tensors[0]
    return t.is_cuda and _has_copy_engine(t.device.index) and all(tma_layout_ok(x) for x in tensors)


def kv_descriptors(
    k: torch.Tensor, v: torch.Tensor, *, block_n: int, block_d: int, tma: bool | None, op: str
) -> tuple[TensorDescriptor | None, TensorDescriptor | None]:
    """Descriptors of ``k`` and ``v`` (``[B, H_KV, S_KV, D]``) for tiles of ``block_n`` keys and
    ``block_d`` head dims, or ``(None, None)`` for index loads. ``tma``: ``None`` for
    :func:`tma_default`, True or False to choose (True raises ``ValueError`` when a layout does
    not suit a descriptor)."""
    if tma is None:
        tma = tma_default(k, v)  # checks the layouts
    elif tma:
        for name, t in (("k", k), ("v", v)):
            if not tma_layout_ok(t):
                raise ValueError(
                    f"{op}: tma=True needs {name} with last stride 1 and 16-byte aligned strides "
                    f"and address, got strides {tuple(t.stride())} of {t.dtype} at address "
                    f"{t.data_ptr()} (mod 16: {t.data_ptr() % _ALIGN_BYTES})"
                )
    if not tma:
        return None, None
    block = [1, 1, block_n, block_d]
    return (
        TensorDescriptor(k, list(k.shape), _strides(k), block),
        TensorDescriptor(v, list(v.shape), _strides(v), block),
    )
