"""Vertical-slash attention with FA4's block-sparse kernel for the slash tiles.

A ``VerticalSlashIndex`` splits each query block's attended keys into two disjoint sets: whole key
blocks (the merged ranges the slashes round to) and leftover vertical columns. The ranges are
expanded to block lists (``vertical_slash/lists_triton.py``) and run by FA4's block-sparse kernel,
causal (the diagonal tiles are the only ones the causal rule cuts; FA4 gets every tile as a partial
block: listing the tiles below the diagonal as full blocks measured no faster on an H100); our
vertical-slash kernel then adds the columns to FA4's result in place (its ``MERGE`` mode). Columns are single keys gathered by index,
which FA4's tiles cannot express.
"""

from __future__ import annotations

import torch

from .._types import AttentionOutput
from .engine import block_sparse


def vertical_slash(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index, *, scale: float
) -> AttentionOutput:
    """``index``: a ``VerticalSlashIndex`` checked against q by the op; ``S_Q == S_KV``."""
    from ..vertical_slash.lists_triton import _launch_range_lists
    from ..vertical_slash.triton import _launch_vertical_slash_fwd

    num, idx = _launch_range_lists(index)
    out, lse = block_sparse(
        q, k, v, (num, idx, None, None),
        block_size=(index.block_m, index.block_n), causal=True, scale=scale,
    )  # fmt: skip
    _launch_vertical_slash_fwd(q, k, v, index, scale=scale, merge_into=(out, lse))
    return AttentionOutput(out, lse)
