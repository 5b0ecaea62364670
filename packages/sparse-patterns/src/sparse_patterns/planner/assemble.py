"""A layer's heads grouped by (pattern type, boundary kind, exact), and the groups' plans merged
into one :class:`~sparse_patterns.plan.BlockPlan` over all heads (identity permutations for
heads that need none)."""

from __future__ import annotations

import torch

from .._device import heads_index
from ..block_lists import best_block_runs
from ..patterns import AShape, KBoundary, NoBoundary, VerticalSlash
from ..plan import BlockPlan
from .context import LayerContext
from .group import GroupPlan


def group_heads(cfgs: list) -> list[tuple[tuple[type, str, bool], list[int]]]:
    """The layer's heads grouped by ``(pattern type, boundary kind, exact)``, in planning order:
    Vertical-Slash groups without a boundary first (the line scores they make are cached, and
    a Grid group folds them instead of passing over the keys again). The boundary kind is
    ``"none"`` (no boundary, or ``KBoundary``), ``"q"`` or ``"2d"``; ``exact``: the heads run
    by an exact kernel (``VerticalSlash(exact_verticals=True)``, ``AShape(exact=True)``)."""
    groups: dict[tuple, list[int]] = {}
    for h, c in enumerate(cfgs):
        bkind = "none" if isinstance(c.boundary, (NoBoundary, KBoundary)) else c.boundary.kind
        exact = bool(getattr(c.pattern, "exact_verticals", False))
        if exact and bkind != "none":
            raise NotImplementedError(
                f"head {h}: VerticalSlash(exact_verticals=True) runs without a boundary, with "
                f"NoBoundary or KBoundary; got {type(c.boundary).__name__} (use "
                f"exact_verticals=False there)"
            )
        if isinstance(c.pattern, AShape) and c.pattern.exact:
            exact = True
            if bkind != "none":
                raise NotImplementedError(
                    f"head {h}: AShape(exact=True) runs without a boundary, with NoBoundary or "
                    f"KBoundary; got {type(c.boundary).__name__} (use exact=False there)"
                )
        groups.setdefault((type(c.pattern), bkind, exact), []).append(h)
    return sorted(
        groups.items(), key=lambda g: not (g[0][0] is VerticalSlash and g[0][1] == "none")
    )


def assemble(ctx: LayerContext, plans: list[GroupPlan], exact_vertical_lists: bool) -> BlockPlan:
    """One :class:`BlockPlan` from each group's plan: per-head tensors merged into
    ``[B, H, ...]``, the lists made last."""
    B, H, S, block = ctx.B, ctx.H, ctx.S, ctx.block
    nb = -(-S // block)
    dev = ctx.q.device
    parts: dict[str, list] = {k: [] for k in ("idx", "cnt", "q", "kv", "runs", "step", "st", "ph")}
    step_one = True  # known on the host: no head has a grid step
    exact_vertical, exact_a_shape = [], []
    for g in plans:
        hs = list(g.heads)
        exact_vertical.extend(g.exact_vertical)
        exact_a_shape.extend(g.exact_a_shape)
        Hg = len(hs)
        if g.q_perm is not None:
            parts["q"].append((hs, g.q_perm.reshape(B, Hg, S)))
        if g.kv_perm is not None:
            parts["kv"].append((hs, g.kv_perm.reshape(B, Hg, S)))
            if g.kv_runs is not None:
                r, st = g.kv_runs, g.stride
            else:
                r, st = best_block_runs(g.kv_perm, block, g.stride)
            parts["runs"].append((hs, r.reshape(B, Hg, nb)))
            parts["step"].append((hs, st.reshape(B, Hg)))
            step_one &= g.stride is None
        if g.stride is not None:
            parts["st"].append((hs, g.stride.reshape(B, Hg)))
            parts["ph"].append((hs, g.phase.reshape(B, Hg)))

    def merged(key: str, shape: tuple, dtype: torch.dtype, make_fill) -> torch.Tensor:
        """Every group's ``[B, Hg, *shape]`` tensors as one ``[B, H, *shape]`` tensor of
        ``dtype``: the group's own when one group holds every head (no copy, and no fill
        made), else ``make_fill()`` (per-head ``shape``) with each group's heads written in."""
        got = parts[key]
        if len(got) == 1 and len(got[0][0]) == H and tuple(got[0][1].shape[2:]) == tuple(shape):
            return got[0][1].to(dtype).contiguous()
        fill = make_fill()
        out = fill.expand(B, H, *fill.shape).clone()
        for hs, t in got:
            out[(slice(None), heads_index(hs, dev), *(slice(0, n) for n in t.shape[2:]))] = t
        return out

    i32 = dict(dtype=torch.int32, device=dev)
    i64 = dict(dtype=torch.int64, device=dev)
    ident = lambda: torch.arange(S, **i32)  # noqa: E731
    minus_one = lambda: torch.full((), -1, **i64)  # noqa: E731
    kv_runs = None
    if parts["kv"]:  # which key blocks are runs: every one in the identity order
        runs = merged("runs", (nb,), torch.int32, lambda: torch.arange(nb, **i32) * block)
        one = lambda: torch.ones((), **i64)  # noqa: E731
        kv_runs = (runs, 1 if step_one else merged("step", (), torch.int64, one))
    q_perm = merged("q", (S,), torch.int32, ident) if parts["q"] else None
    kv_perm = merged("kv", (S,), torch.int32, ident) if parts["kv"] else None
    meta = {"stride": merged("st", (), torch.int64, minus_one),
            "phase": merged("ph", (), torch.int64, minus_one)}  # fmt: skip
    # The lists last: a planner may leave them to ``GroupPlan.lists``, whose host read of their
    # width then waits for the GPU only after everything above was queued.
    run_split = None
    for g in plans:
        i, c = g.kv_block_indices, g.kv_block_counts
        if i is None:
            i, c, run_split = g.lists()
        hs = list(g.heads)
        parts["idx"].append((hs, i.reshape(B, len(hs), nb, -1)))
        parts["cnt"].append((hs, c.reshape(B, len(hs), nb)))
    if len(plans) > 1:
        run_split = None  # split for one group of heads: the merged lists are split by run()
    # (else one group: every head, in order, and the fused planner's split is [B, H, ...])
    maxb = max(t.shape[-1] for _, t in parts["idx"])
    return BlockPlan(
        merged("idx", (nb, maxb), torch.int32, lambda: torch.zeros(nb, maxb, **i32)),
        merged("cnt", (nb,), torch.int32, lambda: torch.zeros(nb, **i32)),
        q_perm, kv_perm, block, S, meta,
        tuple(exact_vertical), exact_lists=exact_vertical_lists or not (exact_vertical or exact_a_shape),
        kv_runs=kv_runs, exact_a_shape=tuple(exact_a_shape), run_split=run_split,
    )  # fmt: skip
