"""The run split of :func:`~sparse_kernels.permuted.split_run_blocks` in one Triton launch (no
host read, no ``nonzero``): each program takes a tile of list rows, marks the entries it keeps
and writes them at their ranks (a cumulative sum along the row). The Grid heads' lists kernel,
which makes the same split on the fly, is ``sparse_kernels.grid_index``'s."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _split_runs_kernel(
    idx_ptr,
    cnt_ptr,
    runs_ptr,
    rest_ptr,
    rest_cnt_ptr,
    starts_ptr,
    run_cnt_ptr,
    n_rows,
    nqb,
    nkb,
    W,
    WIDTH,
    BLOCK_R: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    # Row r = (lead, query block): its listed key blocks whose run map entry (runs[lead, block])
    # is a start go to the run list as that start, the others stay; both keep list order.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    live = rows < n_rows
    c = tl.arange(0, BLOCK_W)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    cnt = tl.load(cnt_ptr + rows, mask=live, other=0)
    valid = (c < cnt[:, None]) & (c < W) & live[:, None]
    blk = tl.load(idx_ptr + r64 * W + c, mask=valid, other=0)
    lead = (rows // nqb).to(tl.int64)[:, None]
    start = tl.load(
        runs_ptr + lead * nkb + tl.minimum(tl.maximum(blk, 0), nkb - 1), mask=valid, other=-1
    )
    is_run = valid & (start >= 0)
    rest = valid & (start < 0)
    p_run = tl.cumsum(is_run.to(tl.int32), 1) - 1
    p_rest = tl.cumsum(rest.to(tl.int32), 1) - 1
    tl.store(starts_ptr + r64 * WIDTH + p_run, start, mask=is_run & (p_run < WIDTH))
    tl.store(rest_ptr + r64 * WIDTH + p_rest, blk, mask=rest & (p_rest < WIDTH))
    tl.store(run_cnt_ptr + rows, tl.sum(is_run.to(tl.int32), 1), mask=live)
    tl.store(rest_cnt_ptr + rows, tl.sum(rest.to(tl.int32), 1), mask=live)


# Widest list the split kernel takes in one tile; wider lists go through the torch path.
SPLIT_RUNS_MAX_WIDTH = 8192


def _launch_split_runs(idx, cnt, runs, width: int):
    """``split_run_blocks`` in one launch: ``idx [*lead, NQB, W]``, ``cnt [*lead, NQB]``,
    ``runs [*lead, NKB]`` (already broadcast to ``lead``), outputs ``width`` wide."""
    *lead, nqb, W = idx.shape
    nkb = runs.shape[-1]
    n_rows = cnt.numel()
    idx = idx.to(torch.int32).contiguous()
    cnt = cnt.to(torch.int32).contiguous()
    runs = runs.to(torch.int32).contiguous()
    dev = idx.device
    rest = torch.zeros(*lead, nqb, width, dtype=torch.int32, device=dev)
    starts = torch.zeros_like(rest)
    rest_cnt = torch.empty(*lead, nqb, dtype=torch.int32, device=dev)
    run_cnt = torch.empty_like(rest_cnt)
    block_w = triton.next_power_of_2(max(W, 1))
    block_r = max(1, 4096 // block_w)
    _split_runs_kernel[(triton.cdiv(n_rows, block_r),)](
        idx, cnt, runs, rest, rest_cnt, starts, run_cnt, n_rows, nqb, nkb, W, width,
        BLOCK_R=block_r, BLOCK_W=block_w,
    )  # fmt: skip
    return rest, rest_cnt, starts, run_cnt
