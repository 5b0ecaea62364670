"""A vertical-slash index's key-block ranges as block lists (Triton), for block-sparse engines.

``VerticalSlashIndex`` keeps, per (batch, head, query block), merged ranges ``[start, end)`` of key
blocks. An engine that walks block lists (FlexAttention's ``BlockMask`` layout, which FA4 takes)
needs them expanded: one program per query block writes the key blocks of its ranges in order,
split into full blocks (every key visible to every row of the query block: no mask to apply) and
partial ones (the diagonal blocks, where the causal rule cuts). Both lists are as wide as their
longest row (one host read), so memory and work follow the number of listed blocks, not the
``NQB x NKB`` tile grid (30 GB of int32 for 64x64 tiles at 1M tokens).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton.config import on_interpreter


@triton.jit
def _range_lists_kernel(
    rcount_ptr, rstart_ptr, rend_ptr, fcount_ptr, full_ptr, part_ptr,
    R, NQB, WF, WP, S, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    m = tl.program_id(0) % NQB
    # Key blocks below this index hold only keys <= the block's first row (and < S): full.
    full_hi = tl.minimum(m * BLOCK_M + 1, S) // BLOCK_N
    n_full = tl.load(fcount_ptr + row)
    offs = tl.arange(0, BLOCK)
    n_ranges = tl.load(rcount_ptr + row)
    pos = tl.full([], 0, tl.int32)
    for r in range(0, n_ranges):
        start = tl.load(rstart_ptr + row * R + r)
        end = tl.load(rend_ptr + row * R + r)
        for j0 in range(start, end, BLOCK):
            blk = j0 + offs
            at = pos + (blk - start)  # position in the row's whole ascending list
            listed = blk < end
            # Full blocks precede partial ones in ascending order, so a full block's place is
            # its position and a partial block's is its position after the full ones.
            tl.store(full_ptr + row * WF + at, blk, mask=listed & (blk < full_hi))
            tl.store(part_ptr + row * WP + at - n_full, blk, mask=listed & (blk >= full_hi))
        pos += end - start


def _launch_range_lists(
    index,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(partial_num, partial_idx, full_num, full_idx)``, int32 ``[B, H, NQB]`` counts and
    ``[B, H, NQB, W]`` lists, ``W`` the longest row (at least 1): the key blocks of each query
    block's ranges, ascending, split into full and partial (diagonal) blocks; entries past a
    count are unset (``torch.empty``). Reads the two widths back to the host once."""
    BM, BN, S = index.block_m, index.block_n, index.seq_len
    R = index.range_start.shape[-1]
    dev = index.range_count.device
    nqb = index.range_count.shape[-1]
    listed = torch.arange(R, device=dev) < index.range_count[..., None]
    full_hi = (torch.arange(nqb, device=dev) * BM + 1).clamp(max=S) // BN
    start, end = index.range_start, index.range_end
    num = torch.where(listed, end - start, 0).sum(-1, dtype=torch.int32)
    full_end = torch.minimum(end, full_hi[:, None].to(end.dtype))
    full_num = torch.where(listed, (full_end - start).clamp(min=0), 0).sum(-1, dtype=torch.int32)
    part_num = num - full_num
    if num.numel():
        wf, wp = (max(int(w), 1) for w in torch.stack([full_num.max(), part_num.max()]).tolist())
    else:
        wf = wp = 1
    full_idx = torch.empty((*num.shape, wf), dtype=torch.int32, device=dev)
    part_idx = torch.empty((*num.shape, wp), dtype=torch.int32, device=dev)
    _range_lists_kernel[(num.numel(),)](
        index.range_count.contiguous(), start.contiguous(), end.contiguous(), full_num,
        full_idx, part_idx, R, nqb, wf, wp, S,
        BLOCK_M=BM, BLOCK_N=BN, BLOCK=16 if on_interpreter() else 128, num_warps=1,
    )  # fmt: skip
    return part_num, part_idx, full_num, full_idx
