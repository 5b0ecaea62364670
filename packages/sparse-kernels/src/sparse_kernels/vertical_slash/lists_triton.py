"""A vertical-slash index's key-block ranges as block lists (Triton), for block-sparse engines.

``VerticalSlashIndex`` keeps, per (batch, head, query block), merged ranges ``[start, end)`` of key
blocks. An engine that walks block lists (FlexAttention's ``BlockMask`` layout, which FA4 takes)
needs them expanded: one program per query block writes the key blocks of its ranges in order.
The lists are as wide as the longest one (one host read), so memory and work follow the number
of listed blocks, not the ``NQB x NKB`` tile grid (30 GB of int32 for 64x64 tiles at 1M tokens).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton.config import on_interpreter
from .._triton.launch import launch


@triton.jit
def _range_lists_kernel(rcount_ptr, rstart_ptr, rend_ptr, idx_ptr, R, W, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    n_ranges = tl.load(rcount_ptr + row)
    pos = tl.full([], 0, tl.int32)
    for r in range(0, n_ranges):
        start = tl.load(rstart_ptr + row * R + r)
        end = tl.load(rend_ptr + row * R + r)
        for j0 in range(start, end, BLOCK):
            blk = j0 + offs
            tl.store(idx_ptr + row * W + pos + (blk - start), blk, mask=blk < end)
        pos += end - start


def _launch_range_lists(index) -> tuple[torch.Tensor, torch.Tensor]:
    """``(num [B, H, NQB], idx [B, H, NQB, W])`` int32, ``W = max(num)`` (at least 1): the key
    blocks of each query block's ranges, ascending; entries of ``idx`` past ``num`` are unset
    (``torch.empty``). Reads ``W`` back to the host once."""
    R = index.range_start.shape[-1]
    dev = index.range_count.device
    listed = torch.arange(R, device=dev) < index.range_count[..., None]
    num = torch.where(listed, index.range_end - index.range_start, 0).sum(-1, dtype=torch.int32)
    width = max(int(num.max()), 1) if num.numel() else 1
    idx = torch.empty((*num.shape, width), dtype=torch.int32, device=dev)
    launch(
        _range_lists_kernel, (num.numel(),),
        (index.range_count.contiguous(), index.range_start.contiguous(),
         index.range_end.contiguous(), idx), (R, width),
        BLOCK=16 if on_interpreter() else 128, num_warps=1,
    )  # fmt: skip
    return num, idx
