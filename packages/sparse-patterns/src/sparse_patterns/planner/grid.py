"""Grid heads: the stride and phase search on the line scores of the last queries, the grid
permutation and its block lists, and the fused planner (fold, merge, search, block index and
lists kernels, replayed as a CUDA graph per shape) that plans a layer of Grid heads at once."""

from __future__ import annotations

import functools
import math

import torch
from sparse_kernels.estimate.search import stride_vector
from sparse_kernels.estimate.triton import _fold_partials, _search_partials
from sparse_kernels.permuted import grid_permutation
from sparse_kernels.permuted.grid_triton import grid_blocks_size, grid_blocks_triton
from sparse_kernels.permuted.lists_triton import (
    GRID_LISTS_MAX_WIDTH,
    grid_lists_size,
    launch_grid_lists,
)
from sparse_kernels.permuted.perms import grid_line_offsets, host_ints
from sparse_kernels.validation import TRITON_MAX_HEAD_DIM

from .. import estimate as E
from .._device import to_device
from .._graphs import OffsetGraph
from ..plan import (
    BlockPlan,
    grid_block_lines,
    grid_block_mask,
    grid_block_runs,
    grid_candidate_lists,
    grid_lists,
    lists_from_chunks,
)
from .context import LayerContext
from .group import GroupPlan

FOLD_MAX_PERIOD = 4096
# Grid groups planned by ``_plan_grid_fused`` where it fits: "auto" (on CUDA), "triton" (also
# elsewhere: the Triton interpreter in tests), "off" (never).
GRID_FUSED = "auto"
# Widest candidate row seen per (heads, S, block, stride space, device): the fused Grid planner
# launches the lists that wide before it reads the actual width (see ``_plan_grid_fused``), for
# shapes whose three lists take at most _GRID_LISTS_CAP_BYTES.
_GRID_LISTS_CAP: dict[tuple, int] = {}
_GRID_LISTS_CAP_BYTES = 256 << 20
# The fused Grid planner's launches as a CUDA graph per shape, once its row width is on record:
# "auto" (on CUDA), "off" (launched each call). Its kernel settings (``_FOLD_*``) are read at
# capture; a graph holds its workspace and outputs (at 128K tokens about 20 MB).
GRID_GRAPHS = "auto"
_GRID_GRAPHS: dict[tuple, OffsetGraph] = {}
_GRID_GRAPHS_MAX = 8
# Longest sequence planned through a graph: a replay copies its outputs (the permutation and
# lists, 4 bytes per head and token and more), and at 1M tokens on an H100 that copy made the
# graph 0.2 ms slower than the launches, whose host time the GPU work hides at that length
# (grid_and_boundaries.md section 12); at 512K the graph was still 0.08 ms faster.
_GRID_GRAPHS_MAX_S = 1 << 19


def _folds_fit(P: int, S: int) -> bool:
    """Whether a stride space of common period ``P`` is searched on line folds."""
    return 2 * P <= S and P <= FOLD_MAX_PERIOD


def _plan_grid(ctx: LayerContext, hs, cfgs) -> GroupPlan:
    dev = ctx.q.device
    one = all(c is cfgs[0] for c in cfgs)  # one config object for every head (the usual layer)
    L = cfgs[0].pattern.last_q if one else max(c.pattern.last_q for c in cfgs)
    N = ctx.B * len(hs)
    # Heads sharing a stride space are searched together (a loop over distinct spaces, not heads).
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
                    E.stride_space(ctx.layout.tokens_per_frame, max_stride=c.max_stride, S=ctx.S)
                )
            )
        if not sp:
            raise ValueError(
                f"Grid head {i}: expected a stride space with at least one stride <= S/4, got none "
                f"for S={ctx.S} and tokens_per_frame={ctx.layout.tokens_per_frame}"
            )
        spaces.setdefault(sp, []).extend(range(N) if one else range(i, N, Hg))
    if _fused_grid_fits(ctx, hs, cfgs[:1] if one else cfgs, spaces, L):
        return _plan_grid_fused(ctx, cfgs, next(iter(spaces)), L, one)
    stride = torch.zeros(N, dtype=torch.int64, device=dev)
    phase = torch.zeros(N, dtype=torch.int64, device=dev)
    if len({math.lcm(*sp) for sp in spaces if _folds_fit(math.lcm(*sp), ctx.S)}) > 1:
        # Several common periods: one line-score pass, folded per period in torch, costs less
        # than one fold pass over the keys per period.
        ctx.lines_last(L)
    for sp, ns in spaces.items():
        ns = sorted(ns)
        whole = len(ns) == N  # one stride space for every head: no index tensors
        sel = slice(None) if whole else to_device(torch.tensor(ns), dev)
        P = math.lcm(*sp)
        if _folds_fit(P, ctx.S):
            # Every stride divides P: the search reads the line scores folded modulo P over
            # whole periods (one pass of the fold kernel on CUDA, no [B, H, S] vectors).
            cf, sf = (ctx.sel(x, hs) for x in ctx.line_folds(L, P))
            cs, ss = (cf, sf) if whole else (cf[sel], sf[sel])
            if len(sp) == 1:
                st, ph = torch.full((len(ns),), P, device=dev), cs.argmax(-1)
            else:
                st, ph, _ = E.search_grid_folds(cs, ss, list(sp))
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
                st, ph, _ = E.search_grid_lines(cs, ss, list(sp))
        if whole:
            stride, phase = st.to(torch.int64), ph.to(torch.int64)
        else:
            stride[sel], phase[sel] = st, ph
    # Every stride comes from a host-side space: their largest bounds the line table, so its
    # width is not read back from the device.
    max_stride = max(max(sp) for sp in spaces)
    offs = grid_line_offsets(ctx.S, stride, phase, device=dev, max_stride=max_stride)
    perm, _ = grid_permutation(ctx.S, stride, phase, device=dev, offsets=offs)
    names = ("use_hline", "use_vline", "use_slash")
    flags = to_device(torch.tensor([[getattr(c.pattern, f) for c in cfgs] for f in names]), dev)
    flags = flags.repeat(1, ctx.B)  # [3, N], b-major like every per-head tensor here
    nb = -(-ctx.S // ctx.block)
    lines = grid_block_lines(offs, N, ctx.S, ctx.block)
    if any(c.pattern.use_hline for c in cfgs):
        fn = grid_block_mask(perm, offs, *flags, ctx.S, ctx.block)
        idx, cnt = lists_from_chunks(fn, N, nb, nb, dev)
    else:
        idx, cnt = grid_lists(perm, offs, flags[1], flags[2], ctx.S, ctx.block, lines=lines)
    runs = grid_block_runs(perm, offs, ctx.S, ctx.block, lines=lines)  # step = stride
    return GroupPlan(
        tuple(hs), idx, cnt, q_perm=perm, kv_perm=perm, stride=stride, phase=phase,
        kv_runs=runs,
    )  # fmt: skip


def _fused_grid_fits(ctx: LayerContext, hs, cfgs, spaces: dict, L: int) -> bool:
    """Whether a Grid group is planned by :func:`_plan_grid_fused`: ``GRID_FUSED`` allows it
    ("auto": on CUDA), the group holds every head of the layer (the fold kernel groups query
    heads by KV head) with one stride space whose period fits the folds, no head has
    horizontal lines, at most 128 query rows, and no other group of the layer already made
    the line scores (then folding those costs less than a pass over the keys)."""
    if GRID_FUSED == "off" or (GRID_FUSED == "auto" and ctx.q.device.type != "cuda"):
        return False
    if len(spaces) != 1 or len(hs) != ctx.H or min(L, ctx.S) > 128:
        return False
    if not 1 <= ctx.q.shape[-1] <= TRITON_MAX_HEAD_DIM:
        return False
    P = math.lcm(*next(iter(spaces)))
    if not _folds_fit(P, ctx.S) or ctx.has_lines_last(L):
        return False
    return not any(c.pattern.use_hline for c in cfgs)


@functools.lru_cache(maxsize=64)
def _head_flags(flags: tuple[tuple[bool, ...], ...], B: int, device: torch.device) -> torch.Tensor:
    """int32 ``[F, B * H]`` on ``device`` (b-major) from ``H`` tuples of ``F`` flags, made once
    per value."""
    return to_device(torch.tensor(flags, dtype=torch.int32).T.repeat(1, B), device)


def _plan_grid_fused(ctx: LayerContext, cfgs, sp: tuple[int, ...], L: int, one: bool) -> GroupPlan:
    """:func:`_plan_grid` in five launches and one host read (see :func:`_fused_grid_fits`):
    the fold pass (interior and edge segments in one launch), its merge, the stride and phase
    search (``sparse_kernels.estimate.line_fold_search``), the permutation with each block's
    index (``grid_blocks_triton``) and the lists with their run split (what ``BlockPlan.run``
    launches with); :func:`_grid_fused_launch` launches them. The lists are launched before the
    read of the candidate widths when a width for the shape is on record (else, or when a row
    is wider, after it); the read is left to ``GroupPlan.lists``, which ``plan_layer`` calls once
    the rest of the plan is built, so that it waits only for the GPU. With a width on record,
    the launches are a CUDA graph (``GRID_GRAPHS``) captured for the shape and replayed for
    every layer: one host call instead of five launches and their host work (captured by the
    call that records the width, after its read). The same stride, phase, permutation, lists,
    runs and split as the unfused path (tests compare). ``one``: every head has the config
    object ``cfgs[0]``."""
    S, blk, dev = ctx.S, ctx.block, ctx.q.device
    N = ctx.B * ctx.H
    n = min(L, S)
    P = math.lcm(*sp)
    nb = -(-S // blk)
    # The lists are launched before the read of their width, as wide as the widest seen for this
    # shape and stride space (the read then waits for every kernel, and nothing is launched
    # after it); a wider row (the first call of a shape, or a wider stride choice) is launched
    # again after the read.
    key = (N, S, blk, sp, dev)
    cap = _GRID_LISTS_CAP.get(key, 0)
    c0 = cfgs[0].pattern
    # The line flags: (vertical, slash) when one config serves every head, else per head.
    flags = (
        (c0.use_vline, c0.use_slash)
        if one
        else tuple((c.pattern.use_vline, c.pattern.use_slash) for c in cfgs)
    )
    q_rows, k = ctx.q.narrow(2, S - n, n), ctx.k
    fits = _graphs_fit(dev, S, q_rows, k)

    def launch_for(c: int):
        per_head = (flags,) * len(cfgs) if one else flags
        return functools.partial(
            _grid_fused_launch, S=S, P=P, scale=ctx.scale, strides=stride_vector(sp, dev),
            max_stride=max(sp), block=blk, cap=c, flags=_head_flags(per_head, ctx.B, dev),
        )  # fmt: skip

    def graph_for(c: int) -> OffsetGraph | None:
        """The graph of the launches with lists ``c`` wide, captured if missing (None while the
        stream is being captured by someone else)."""
        gkey = (key, c, one, flags, ctx.scale, OffsetGraph.key_of(q_rows, k))
        graph = _GRID_GRAPHS.get(gkey)
        if graph is None and not torch.cuda.is_current_stream_capturing():
            if len(_GRID_GRAPHS) >= _GRID_GRAPHS_MAX:
                del _GRID_GRAPHS[next(iter(_GRID_GRAPHS))]  # the oldest
            try:
                graph = OffsetGraph(launch_for(c), q_rows, k)
            except Exception as e:
                raise RuntimeError(
                    f"capturing the fused Grid planner's CUDA graph failed ({e}); with "
                    f"sparse_patterns.planner.grid.GRID_GRAPHS = 'off' it launches its kernels "
                    f"on every call instead"
                ) from e
            _GRID_GRAPHS[gkey] = graph
        return graph

    # A graph is captured by the call that records a width (below, after its read: a call that
    # launches its lists again anyway), so that a timed later call only replays it.
    graph = graph_for(cap) if cap and fits else None
    if graph is not None:
        outs, read = graph(q_rows, k), graph.read
    else:
        _, outs, widths = launch_for(cap)(q_rows, k, None)
        read = functools.partial(host_ints, widths)
    st, ph, perm, runs_bh, kmin, qmax, s_lo, s_hi, runs, v_hi, widths, *early = outs
    B, H = ctx.B, ctx.H
    if early:
        idx, cnt, rest, rc, starts, sc = early
        early = (idx, cnt, (rest, rc, starts, sc))

    def lists():
        """``(idx [B, H, NB, W], cnt [B, H, NB], run split or None)`` after the read: the
        early lists themselves (``GroupPlan.early``) when they are as wide as the rows."""
        wv, ws = read()
        w = wv + ws + 1
        if early and w <= cap:
            return _narrow_lists(early, w)
        if w > GRID_LISTS_MAX_WIDTH:
            got = (*grid_candidate_lists(v_hi, s_lo, s_hi, kmin, qmax, wv, ws, nb), None)
        else:
            got = launch_grid_lists(v_hi, s_lo, s_hi, kmin, qmax, widths, w, nb, runs=runs)
            if grid_lists_size(N, nb, w) * 4 <= _GRID_LISTS_CAP_BYTES:
                _GRID_LISTS_CAP[key] = w
                if fits:
                    graph_for(w)
        idx, cnt, split = got
        if split is not None:
            split = tuple(t.view(B, H, *t.shape[1:]) for t in split)
        return idx.view(B, H, nb, -1), cnt.view(B, H, nb), split

    return GroupPlan(
        tuple(range(H)), lists=lists, early=early or None, q_perm=perm, kv_perm=perm,
        stride=st, phase=ph, kv_runs=runs_bh,
    )  # fmt: skip


def _graphs_fit(dev: torch.device, S: int, q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether the fused Grid planner replays a graph (``GRID_GRAPHS``) on ``dev`` for ``S``
    tokens: on CUDA, up to ``_GRID_GRAPHS_MAX_S``, with ``q`` and ``k`` of one dtype and
    unit last strides (a graph's fold kernel reads them in place)."""
    if GRID_GRAPHS != "auto" or dev.type != "cuda" or S > _GRID_GRAPHS_MAX_S:
        return False
    return q.stride(-1) == 1 and k.stride(-1) == 1 and q.dtype == k.dtype


def _grid_fused_launch(
    q_rows: torch.Tensor,
    k: torch.Tensor,
    qk_offsets: torch.Tensor | None,
    *,
    S: int,
    P: int,
    scale: float,
    strides: torch.Tensor,
    max_stride: int,
    block: int,
    cap: int,
    flags: torch.Tensor,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor]:
    """The launches of :func:`_plan_grid_fused`: ``(base, (stride [B, H], phase [B, H],
    perm [B, H, S], runs [B, H, NB], kmin, qmax, s_lo, s_hi, runs, v_hi, widths[, idx, cnt,
    rest, rest_cnt, starts, run_cnt]), widths)``, every output a view of ``base`` (one int32
    allocation): the block index as ``grid_blocks_triton`` gives it (``[B * H, ...]``) and
    what the plan keeps shaped as it keeps it (the lists ``[B, H, NB, cap]`` when ``cap``;
    shaped here, so that a graph replay makes these views for free). No host read;
    ``qk_offsets``: as ``_fold_partials`` takes it (an :class:`OffsetGraph`)."""
    B, H, n, _ = q_rows.shape
    N = B * H
    lo, hi = E.grid_window(P, S)
    # The fold pass first: the host work below runs while the GPU computes it.
    col, sl, seg = _fold_partials(
        q_rows, k, S - n, period=P, lo=lo, hi=hi, scale=scale, qk_offsets=qk_offsets
    )
    nb = -(-S // block)
    n_blocks = grid_blocks_size(N, S, block)
    n_lists = grid_lists_size(N, nb, cap) if cap else 0
    # One allocation (each costs host time): strides and phases (int64), the block index, the
    # lists.
    size = 4 * N + n_blocks + n_lists
    size += size % 2  # a whole number of int64 (a graph views a copy of it as int64 too)
    base = torch.empty(size, dtype=torch.int32, device=q_rows.device)
    buf = base[4 * N : 4 * N + n_blocks]
    st, ph, _ = _search_partials(
        col, sl, seg, P, S - n, strides, 0.15, zero=buf[-2:],
        out=base[: 4 * N].view(torch.int64).view(2, N),
    )  # fmt: skip
    perm, blocks, v_hi, widths = grid_blocks_triton(
        S, st, ph, flags[0], flags[1], block, max_stride, buf=buf
    )
    kmin, qmax, s_lo, s_hi, runs = blocks.unbind()
    bh = lambda t: t.view(B, H, *t.shape[1:])  # noqa: E731
    outs = (st.view(B, H), ph.view(B, H), bh(perm), bh(runs), kmin, qmax, s_lo, s_hi, runs, v_hi)
    outs += (widths,)
    if cap:
        idx, cnt, rest = launch_grid_lists(
            v_hi,
            s_lo,
            s_hi,
            kmin,
            qmax,
            widths,
            cap,
            nb,
            runs=runs,
            buf=base[4 * N + n_blocks : 4 * N + n_blocks + n_lists],
        )
        outs += tuple(map(bh, (idx, cnt, *rest)))
    return base, outs, widths


def _narrow_lists(lists: tuple, W: int) -> tuple:
    """The first ``W`` entries of each list of ``launch_grid_lists``'s ``(idx, cnt, (rest,
    rest_cnt, starts, run_cnt))`` (views; the same tensors when they are ``W`` wide)."""
    idx, cnt, (rest, rc, starts, sc) = lists
    if idx.shape[-1] == W:
        return lists
    return idx[..., :W], cnt, (rest[..., :W], rc, starts[..., :W], sc)


def _fused_grid_plan(ctx: LayerContext, g: GroupPlan) -> BlockPlan:
    """The plan of a layer of Grid heads that ``_plan_grid_fused`` planned together (every head,
    in order): what :func:`~sparse_patterns.planner.assemble.assemble` makes of that one group, without its merging."""
    perm, stride = g.kv_perm, g.stride  # shaped [B, H, ...] by _grid_fused_launch

    def plan(lists: tuple) -> BlockPlan:
        idx, cnt, run_split = lists
        return BlockPlan(
            idx, cnt, perm, perm, ctx.block, ctx.S, {"stride": stride, "phase": g.phase},
            kv_runs=(g.kv_runs, stride), run_split=run_split,
        )  # fmt: skip

    early = g.early
    if early:
        # The plan of the early lists, and the lists its run() launches with, made while the
        # GPU works: the read of the widths below usually finds the rows that wide.
        guess = plan(early)
        guess._launch_lists  # noqa: B018 (a cached property, made here)
    got = g.lists()
    return guess if early and got is early else plan(got)
