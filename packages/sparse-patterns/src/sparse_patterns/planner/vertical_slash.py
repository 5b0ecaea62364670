"""Vertical-Slash heads (MInference): the top columns and diagonals of the last queries' scores,
as block lists or, with ``exact_verticals``, as the exact inputs of
``sparse_kernels.vertical_slash_attention``."""

from __future__ import annotations

import torch

from .. import estimate as E
from .._device import heads_index
from ..block_lists import vertical_slash_lists
from ..plan import ExactVerticalHeads
from .context import LayerContext, per_head, topk_per_head
from .group import GroupPlan


def vs_indices(p: torch.Tensor, rows: torch.Tensor, cfgs, B: int):
    """Vertical and slash indices from approximate scores ``p [N, ..., L, S]`` of query ``rows``."""
    return vs_topk(E.vertical_scores(p), E.slash_scores(p, rows), cfgs, B)


def vs_topk(col: torch.Tensor, slash: torch.Tensor, cfgs, B: int, *, drop_masked: bool = True):
    """Top ``n_vertical`` columns (the first ``sink`` forced in) and top ``n_slash`` diagonals
    (the first ``local`` forced in) per head, int64 with -1 padding. ``drop_masked``:
    :func:`~.context.topk_per_head`'s (False: exactly ``min(n, S)`` real indices per head)."""
    dev = col.device
    nv, ns = per_head(cfgs, B, "n_vertical", dev), per_head(cfgs, B, "n_slash", dev)
    sink, local = per_head(cfgs, B, "sink", dev), per_head(cfgs, B, "local", dev)
    nv_max = max(c.pattern.n_vertical for c in cfgs)
    ns_max = max(c.pattern.n_slash for c in cfgs)
    vert = topk_per_head(col, nv, torch.minimum(sink, nv), nv_max, drop_masked=drop_masked)
    sl = topk_per_head(slash, ns, torch.minimum(local, ns), ns_max, drop_masked=drop_masked)
    return vert, sl


def plan_vertical_slash(
    ctx: LayerContext, hs, cfgs, exact: bool = False, exact_lists: bool = True
) -> GroupPlan:
    """Vertical-Slash heads without a Q/2D boundary. ``exact``: ``exact_verticals=True`` heads,
    grouped by their column and diagonal counts into ``ExactVerticalHeads``; their lists hold
    the slash tiles only when ``exact_lists``."""
    heads = tuple(hs)
    L = max(c.pattern.last_q for c in cfgs)
    col, slash = ctx.lines_last(L)
    # The exact heads keep every selected column and diagonal (none of these line scores is
    # masked), so their counts are the configs' clipped to the length: known on the host.
    vert, sl = vs_topk(ctx.sel(col, hs), ctx.sel(slash, hs), cfgs, ctx.B, drop_masked=not exact)
    N = vert.shape[0]
    if not exact:
        idx, cnt = vertical_slash_lists(vert, sl, ctx.S, ctx.block)
        return GroupPlan(heads, idx, cnt)
    if ctx.block not in (64, 128):
        raise ValueError(
            f"VerticalSlash(exact_verticals=True) runs sparse_kernels.vertical_slash_attention, "
            f"which takes block 64 or 128; expected plan block 64 or 128, got {ctx.block}"
        )
    # Slash tiles only in the block lists; the columns go to the exact kernel. The lists are
    # for the plan's metrics: BlockPlan.run leaves these heads out of the block-sparse launch.
    if exact_lists:
        idx, cnt = vertical_slash_lists(torch.full_like(vert[:, :1], -1), sl, ctx.S, ctx.block)
    else:
        nb = -(-ctx.S // ctx.block)
        idx = torch.zeros(N, nb, 1, dtype=torch.int32, device=vert.device)
        cnt = torch.zeros(N, nb, dtype=torch.int32, device=vert.device)
    vert = torch.sort(vert, dim=-1).values  # -1 padding first
    sl = torch.sort(sl, dim=-1).values
    Hg = len(hs)
    # Heads with equal counts share one launch.
    parts: dict[tuple[int, int], list[int]] = {}
    for j, c in enumerate(cfgs):
        key = (min(c.pattern.n_vertical, ctx.S), min(c.pattern.n_slash, ctx.S))
        parts.setdefault(key, []).append(j)
    exact_vertical = []
    for (a, b), local in parts.items():
        rows = heads_index(local, vert.device)
        v_ = vert.reshape(ctx.B, Hg, -1)[:, rows, vert.shape[-1] - a :]
        s_ = sl.reshape(ctx.B, Hg, -1)[:, rows, sl.shape[-1] - b :]
        exact_vertical.append(
            ExactVerticalHeads(tuple(hs[j] for j in local), v_.to(torch.int32), s_.to(torch.int32))
        )
    return GroupPlan(heads, idx, cnt, exact_vertical=tuple(exact_vertical))
