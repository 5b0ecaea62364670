"""Grid heads: the stride and phase search on the line scores of the last queries, the grid
permutation and its block lists. :class:`GridHeads` plans a group of them; a layer of Grid heads
with one stride space goes through ``sparse_kernels.GridIndexer`` (fold, merge, search, block
index and lists kernels, replayed as a CUDA graph per shape), which it owns."""

from __future__ import annotations

import math

import torch
from sparse_kernels.grid_index import (
    GridIndexer,
    GridIndexSettings,
    grid_block_lines,
    grid_block_mask,
    grid_block_runs,
    grid_list_ranges,
    search_grid_folds,
    search_grid_lines,
)
from sparse_kernels.permuted import grid_line_offsets, grid_permutation
from sparse_kernels.validation import TRITON_MAX_HEAD_DIM

from .. import estimate as E
from .._device import to_device
from ..block_lists import lists_from_chunks
from ..plan import BlockPlan
from .context import LayerContext
from .group import GroupPlan

_FUSED = ("auto", "triton", "off")


class GridHeads:
    """The planner of Grid heads, with the state it keeps across layers (the
    :class:`~sparse_kernels.grid_index.GridIndexer` of the fused path: list widths and CUDA graphs
    per shape).

    Args:
        fused: where a layer of Grid heads is planned by the fused Grid index
            (:meth:`fused_fits` says when it applies): ``"auto"`` (on CUDA), ``"triton"`` (also
            elsewhere: the Triton interpreter in tests), ``"off"`` (never).
        graphs: the fused path's CUDA graphs, ``"auto"`` or ``"off"`` (see ``GridIndexer``).
        fold_max_period: stride spaces whose common period is at most this (and at most
            ``S / 2``) are searched on line scores folded modulo the period; wider ones on the
            full vectors.
        kernel_settings: the Grid index kernels' launch settings.
    """

    def __init__(
        self,
        *,
        fused: str = "auto",
        graphs: str = "auto",
        fold_max_period: int = 4096,
        kernel_settings: GridIndexSettings | None = None,
    ):
        if fused not in _FUSED:
            raise ValueError(f"fused: expected one of {_FUSED}, got {fused!r}")
        bad = isinstance(fold_max_period, bool) or not isinstance(fold_max_period, int)
        if bad or fold_max_period < 1:
            raise ValueError(f"fold_max_period: expected an int >= 1, got {fold_max_period!r}")
        self.fused = fused
        self.fold_max_period = fold_max_period
        self.indexer = GridIndexer(graphs=graphs, settings=kernel_settings or GridIndexSettings())

    def __repr__(self) -> str:
        return (
            f"GridHeads(fused={self.fused!r}, fold_max_period={self.fold_max_period}, "
            f"indexer={self.indexer!r})"
        )

    def folds_fit(self, P: int, S: int) -> bool:
        """Whether a stride space of common period ``P`` is searched on line folds."""
        return 2 * P <= S and self.fold_max_period >= P

    def plan(self, ctx: LayerContext, hs: list[int], cfgs: list) -> GroupPlan:
        """The plan of the Grid heads ``hs`` (``cfgs``: their configs). Heads sharing a stride
        space are searched together (a loop over distinct spaces, not heads)."""
        one = all(c is cfgs[0] for c in cfgs)  # one config object for every head (the usual)
        L = cfgs[0].pattern.last_q if one else max(c.pattern.last_q for c in cfgs)
        N = ctx.B * len(hs)
        spaces: dict[tuple[int, ...], list[int]] = {}
        Hg = len(cfgs)
        made: dict[int, tuple[int, ...]] = {}  # per config object: a layer repeats one config
        for i, cfg in enumerate(cfgs[:1] if one else cfgs):
            sp = made.get(id(cfg))
            if sp is None:
                c = cfg.pattern
                sp = made[id(cfg)] = (
                    (c.stride,)
                    if c.stride is not None
                    else tuple(
                        E.stride_space(
                            ctx.layout.tokens_per_frame, max_stride=c.max_stride, S=ctx.S
                        )
                    )
                )
            if not sp:
                raise ValueError(
                    f"Grid head {i}: expected a stride space with at least one stride <= S/4, "
                    f"got none for S={ctx.S} and tokens_per_frame={ctx.layout.tokens_per_frame}"
                )
            spaces.setdefault(sp, []).extend(range(N) if one else range(i, N, Hg))
        if self.fused_fits(ctx, hs, cfgs[:1] if one else cfgs, spaces, L):
            return self._plan_fused(ctx, cfgs, next(iter(spaces)), L, one)
        return self._plan_unfused(ctx, hs, cfgs, spaces, L)

    def fused_fits(self, ctx: LayerContext, hs, cfgs, spaces: dict, L: int) -> bool:
        """Whether a Grid group is planned by the fused Grid index: ``fused`` allows it
        ("auto": on CUDA; never with the reference engine), the group holds every head of the
        layer (the fold kernel groups query heads by KV head) with one stride space whose
        period fits the folds, no head has horizontal lines, at most 128 query rows, and no
        other group of the layer already made the line scores (then folding those costs less
        than a pass over the keys)."""
        if self.fused == "off" or ctx.impl == "reference":
            return False
        if self.fused == "auto" and ctx.q.device.type != "cuda":
            return False
        if len(spaces) != 1 or len(hs) != ctx.H or min(L, ctx.S) > 128:
            return False
        if not 1 <= ctx.q.shape[-1] <= TRITON_MAX_HEAD_DIM:
            return False
        P = math.lcm(*next(iter(spaces)))
        if not self.folds_fit(P, ctx.S) or ctx.has_lines_last(L):
            return False
        return not any(c.pattern.use_hline for c in cfgs)

    def _plan_fused(self, ctx: LayerContext, cfgs, sp: tuple[int, ...], L: int, one: bool):
        """:meth:`plan` by ``GridIndexer.start`` (five launches, or one graph replay, and one
        host read, left to ``GroupPlan.lists``, which the layer calls once the rest of its plan
        is queued, so that the read waits only for the GPU). The same stride, phase,
        permutation, lists, runs and split as the unfused path (tests compare). ``one``: every
        head has the config object ``cfgs[0]``."""
        if one:
            vline, slash = cfgs[0].pattern.use_vline, cfgs[0].pattern.use_slash
        else:
            vline = tuple(c.pattern.use_vline for c in cfgs)
            slash = tuple(c.pattern.use_slash for c in cfgs)
        pending = self.indexer.start(
            ctx.q, ctx.k, strides=sp, last_q=L, block=ctx.block, use_vline=vline,
            use_slash=slash, scale=ctx.scale,
        )  # fmt: skip
        early = pending.early
        early_lists = (
            None if early is None else (early.block_indices, early.block_counts, early.run_split)
        )

        def lists():
            """``(idx [B, H, NB, W], cnt [B, H, NB], run split or None)`` after the read: the
            early lists themselves (``GroupPlan.early``) when they are as wide as the rows."""
            got = pending.result()
            if got is early:
                return early_lists
            return got.block_indices, got.block_counts, got.run_split

        return GroupPlan(
            tuple(range(ctx.H)), lists=lists, early=early_lists, q_perm=pending.perm,
            kv_perm=pending.perm, stride=pending.stride, phase=pending.phase,
            kv_runs=pending.kv_runs, fused=True,
        )  # fmt: skip

    def _plan_unfused(self, ctx: LayerContext, hs, cfgs, spaces: dict, L: int) -> GroupPlan:
        """:meth:`plan` step by step in torch and the estimation kernels: the search per stride
        space, then the permutation, its lists and runs for every head. Without horizontal
        lines the lists are made by ``GroupPlan.lists`` (their width's read comes last)."""
        dev = ctx.q.device
        N = ctx.B * len(hs)
        stride = torch.zeros(N, dtype=torch.int64, device=dev)
        phase = torch.zeros(N, dtype=torch.int64, device=dev)
        periods = {math.lcm(*sp) for sp in spaces}
        if len({P for P in periods if self.folds_fit(P, ctx.S)}) > 1:
            # Several common periods: one line-score pass, folded per period in torch, costs
            # less than one fold pass over the keys per period.
            ctx.lines_last(L)
        for sp, ns in spaces.items():
            ns = sorted(ns)
            whole = len(ns) == N  # one stride space for every head: no index tensors
            sel = slice(None) if whole else to_device(torch.tensor(ns), dev)
            P = math.lcm(*sp)
            if self.folds_fit(P, ctx.S):
                # Every stride divides P: the search reads the line scores folded modulo P over
                # whole periods (one pass of the fold kernel on CUDA, no [B, H, S] vectors).
                cf, sf = (ctx.sel(x, hs) for x in ctx.line_folds(L, P))
                cs, ss = (cf, sf) if whole else (cf[sel], sf[sel])
                if len(sp) == 1:
                    st, ph = torch.full((len(ns),), P, device=dev), cs.argmax(-1)
                else:
                    st, ph, _ = search_grid_folds(cs, ss, list(sp))
            else:
                col, sl = (ctx.sel(x, hs) for x in ctx.lines_last(L))  # [N, S]
                cs, ss = (col, sl) if whole else (col[sel], sl[sel])
                if len(sp) == 1:
                    s = sp[0]
                    v = (
                        cs[..., s : ctx.S // s * s].reshape(len(ns), -1, s).mean(-2)
                        if 2 * s <= ctx.S
                        else cs[..., :s]
                    )
                    st, ph = torch.full((len(ns),), s, device=dev), v.argmax(-1)
                else:
                    st, ph, _ = search_grid_lines(cs, ss, list(sp))
            if whole:
                stride, phase = st.to(torch.int64), ph.to(torch.int64)
            else:
                stride[sel], phase[sel] = st, ph
        # Every stride comes from a host-side space: their largest bounds the line table, so
        # its width is not read back from the device.
        max_stride = max(max(sp) for sp in spaces)
        offs = grid_line_offsets(ctx.S, stride, phase, device=dev, max_stride=max_stride)
        perm, _ = grid_permutation(ctx.S, stride, phase, device=dev, offsets=offs)
        names = ("use_hline", "use_vline", "use_slash")
        flags = to_device(torch.tensor([[getattr(c.pattern, f) for c in cfgs] for f in names]), dev)
        flags = flags.repeat(1, ctx.B)  # [3, N], b-major like every per-head tensor here
        nb = -(-ctx.S // ctx.block)
        lines = grid_block_lines(offs, N, ctx.S, ctx.block)
        runs = grid_block_runs(perm, offs, ctx.S, ctx.block, lines=lines)  # step = stride
        common = dict(q_perm=perm, kv_perm=perm, stride=stride, phase=phase, kv_runs=runs)
        if any(c.pattern.use_hline for c in cfgs):
            fn = grid_block_mask(perm, offs, *flags, ctx.S, ctx.block)
            return GroupPlan(tuple(hs), *lists_from_chunks(fn, N, nb, nb, dev), **common)
        # The read of the lists' width is left to ``GroupPlan.lists``, which the layer calls last.
        ranges = grid_list_ranges(perm, offs, flags[1], flags[2], ctx.S, ctx.block, lines=lines)
        settings = self.indexer.settings
        return GroupPlan(
            tuple(hs), lists=lambda: (*ranges.lists(settings=settings), None), **common
        )

    def layer_plan(self, ctx: LayerContext, g: GroupPlan) -> BlockPlan:
        """The plan of a layer whose every head is in the fused group ``g`` (in order): what
        :func:`~sparse_patterns.planner.assemble.assemble` makes of that one group, without
        its merging."""
        perm, stride = g.kv_perm, g.stride  # shaped [B, H, ...] by the Grid index

        def plan(lists: tuple) -> BlockPlan:
            idx, cnt, run_split = lists
            return BlockPlan(
                idx, cnt, perm, perm, ctx.block, ctx.S, {"stride": stride, "phase": g.phase},
                kv_runs=(g.kv_runs, stride), run_split=run_split,
            )  # fmt: skip

        early = g.early
        if early:
            # The plan of the early lists, and the lists its run() launches with, made while
            # the GPU works: the read of the widths below usually finds the rows that wide.
            guess = plan(early)
            guess._launch_lists  # noqa: B018 (a cached property, made here)
        got = g.lists()
        return guess if early and got is early else plan(got)
