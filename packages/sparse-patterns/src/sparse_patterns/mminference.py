"""The per-layer entry: plan every head (estimation batched per pattern type), then one launch.

``plan_layer(q, k, head_configs, layout)`` groups heads by (pattern type, boundary type), runs
each group's estimation pipeline for all of its heads at once (no per-head Python loop) and
merges the groups into ONE :class:`~sparse_patterns.plan.BlockPlan` over all heads (identity
permutations for heads that need none). ``mminference_attention`` executes it with ONE launch of
``sparse_kernels.permuted_block_sparse_attention`` for the whole layer (the kernel takes per-head
block lists and per-head permutations, so grouping by pattern type costs no extra launches).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
from sparse_kernels import AttentionOutput
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

from . import estimate as E
from ._device import heads_index, to_device
from ._graphs import OffsetGraph
from .layout import as_token_layout
from .patterns import (
    AShape,
    BlockSparse,
    Dense,
    Grid,
    HeadConfig,
    KBoundary,
    NoBoundary,
    SFFixed,
    SFStrided,
    TriShape,
    VerticalSlash,
)
from .plan import (
    BlockPlan,
    ExactAShapeHeads,
    ExactVerticalHeads,
    a_shape_lists,
    best_block_runs,
    element_block_mask,
    grid_block_lines,
    grid_block_mask,
    grid_block_runs,
    grid_candidate_lists,
    grid_lists,
    lists_from_chunks,
    lists_from_element_chunks,
    static_block_mask,
    vertical_slash_lists,
)

_STATIC = {
    Dense: "dense",
    AShape: "a_shape",
    TriShape: "tri_shape",
    SFFixed: "sf_fixed",
    SFStrided: "sf_strided",
}
_STATIC_FIELDS = {
    "dense": (),
    "a_shape": ("sink", "window"),
    "tri_shape": ("sink", "window", "last"),
    "sf_fixed": ("local", "vline_stride"),
    "sf_strided": ("local", "vline_stride"),
}


def normalize_head_configs(head_config, H: int) -> list[HeadConfig]:
    """A single HeadConfig / pattern (all heads) or a sequence of H of them -> list of H."""
    if isinstance(head_config, HeadConfig):
        return [head_config] * H
    if not isinstance(head_config, Sequence) or isinstance(head_config, (str, bytes)):
        try:
            return [HeadConfig(head_config)] * H
        except TypeError:
            raise TypeError(
                f"head_config: expected a HeadConfig, a pattern spec or a sequence of {H} "
                f"HeadConfig, got {type(head_config).__name__}"
            ) from None
    if len(head_config) != H:
        raise ValueError(
            f"head_config: expected {H} entries (one per query head), got {len(head_config)}"
        )
    c0 = head_config[0] if H else None
    if isinstance(c0, HeadConfig) and all(c is c0 for c in head_config):
        return list(head_config)  # one config for every head (checked once)
    out = []
    for h, c in enumerate(head_config):
        if not isinstance(c, HeadConfig):
            raise TypeError(f"head_config[{h}]: expected a HeadConfig, got {type(c).__name__}")
        out.append(c)
    return out


def _per_head(
    cfgs: list, B: int, field: str, dev, base: str = "pattern", dtype=torch.int64
) -> torch.Tensor:
    vals = [getattr(getattr(c, base), field) for c in cfgs]
    return to_device(torch.tensor(vals, dtype=dtype), dev).repeat(B)  # [(B, Hg)] b-major


def _topk_per_head(
    scores: torch.Tensor, k: torch.Tensor, forced: torch.Tensor, k_max: int
) -> torch.Tensor:
    """``scores [N, ..., S]``, ``k``/``forced`` ``[N]``: top ``k[n]`` indices with the first
    ``forced[n]`` positions always in; int64 ``[N, ..., kmax]`` with -1 past ``k[n]``.
    ``k_max``: ``max(k)``, from the host configs (reading it from ``k`` would synchronise)."""
    S = scores.shape[-1]
    shape = (-1,) + (1,) * (scores.ndim - 1)
    s = scores.masked_fill(
        torch.arange(S, device=scores.device) < forced.reshape(shape), float("inf")
    )
    kmax = min(S, k_max)
    if kmax == 0:
        return torch.full((*scores.shape[:-1], 1), -1, dtype=torch.int64, device=scores.device)
    vals, idx = torch.topk(s, kmax, dim=-1, sorted=True)
    keep = (torch.arange(kmax, device=s.device) < k.reshape(shape)) & (vals > float("-inf"))
    return torch.where(keep, idx, -1)


def _modality_rows(mod: torch.Tensor, uniq: torch.Tensor, L: int) -> torch.Tensor:
    """``[M, L]``: the last ``L`` positions of each modality (repeating its first position when
    it has fewer tokens)."""
    rows = []
    for m in uniq.tolist():
        pos = torch.nonzero(mod == m).flatten()[-L:]
        if pos.numel() < L:
            pos = torch.cat([pos[:1].expand(L - pos.numel()), pos])
        rows.append(pos)
    return torch.stack(rows)


class _Ctx:
    """Per-layer shared tensors, computed lazily once for all heads that need them."""

    def __init__(self, q, k, layout, block, scale):
        self.q, self.k, self.block, self.scale = q, k, block, scale
        self.B, self.H, self.S, _ = q.shape
        self.layout = layout
        self._p_mod: dict[int, torch.Tensor] = {}
        self._lines_last: dict[int, tuple] = {}
        self._line_folds: dict[tuple[int, int], tuple] = {}
        self.mod = layout.modality

    # Modality bookkeeping only the boundary planners need (torch.unique syncs with the GPU).
    @functools.cached_property
    def uniq(self) -> torch.Tensor:
        return torch.unique(self.mod)

    @functools.cached_property
    def mperm(self) -> torch.Tensor:
        return torch.sort(self.mod, stable=True).indices  # modality order

    @functools.cached_property
    def mod_index(self) -> torch.Tensor:
        return torch.searchsorted(self.uniq, self.mod)  # [S] in 0..M-1

    def lines_last(self, L: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Column and diagonal mass of the last ``L`` queries, ``[B, H, S]`` each (the Triton
        line-score kernel on CUDA: no ``[H, L, S]`` matrix)."""
        if L not in self._lines_last:
            self._lines_last[L] = E.last_line_scores(self.q, self.k, L, scale=self.scale)
        return self._lines_last[L]

    def line_folds(self, L: int, period: int) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`~sparse_patterns.estimate.last_line_folds` of the last ``L`` queries,
        ``[B, H, period]`` each: folded from the line scores when another group of the layer
        already made them, else one pass of the fold kernel (on CUDA)."""
        key = (L, period)
        if key not in self._line_folds:
            if L in self._lines_last:
                self._line_folds[key] = E.fold_grid_lines(*self._lines_last[L], period)
            else:
                self._line_folds[key] = E.last_line_folds(
                    self.q, self.k, L, period=period, scale=self.scale
                )
        return self._line_folds[key]

    def p_mod(self, L: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = _modality_rows(self.mod, self.uniq, L)
        if L not in self._p_mod:
            self._p_mod[L] = E.approx_scores(self.q, self.k, rows, scale=self.scale)
        return self._p_mod[L], rows

    def sel(self, t: torch.Tensor, hs: list[int]) -> torch.Tensor:
        """``[B, H, ...] -> [B * len(hs), ...]`` (b-major; no copy when ``hs`` is every head)."""
        if list(hs) == list(range(t.shape[1])):
            return t.reshape(-1, *t.shape[2:])
        return t[:, heads_index(list(hs), t.device)].reshape(-1, *t.shape[2:])


# ---------------------------------------------------------------------------------------------
# Group planners: return (indices [N, NQB, MAXB], counts [N, NQB], q_perm [N,S]|None,
# kv_perm [N,S]|None, meta)


def _plan_static(ctx: _Ctx, cfgs, kind, exact: bool = False, exact_lists: bool = True) -> tuple:
    if kind == "a_shape":  # columns + diagonals: built without an NQB x NKB mask
        meta = {}
        if exact:
            # Launch groups: heads of one (sink, window), run by triangle_attention.
            by: dict[tuple[int, int], list[int]] = {}
            for j, c in enumerate(cfgs):
                by.setdefault((c.pattern.sink, c.pattern.window), []).append(j)
            meta["exact_a_shape"] = [(local, sw[0], sw[1]) for sw, local in by.items()]
            if not exact_lists:
                nb = -(-ctx.S // ctx.block)
                z = torch.zeros(ctx.B * len(cfgs), nb, dtype=torch.int32, device=ctx.q.device)
                return z[..., None], z, None, None, meta
        sink = [c.pattern.sink for c in cfgs] * ctx.B
        window = [c.pattern.window for c in cfgs] * ctx.B
        idx, cnt = a_shape_lists(sink, window, ctx.S, ctx.block, ctx.q.device)
        return idx, cnt, None, None, meta
    N = ctx.B * len(cfgs)
    params = {f: _per_head(cfgs, ctx.B, f, ctx.q.device) for f in _STATIC_FIELDS[kind]}
    if not params:
        params = {"n": torch.zeros(N, dtype=torch.int64, device=ctx.q.device)}
    nb = -(-ctx.S // ctx.block)
    idx, cnt = lists_from_chunks(
        static_block_mask(kind, params, ctx.S, ctx.block), N, nb, nb, ctx.q.device
    )
    return idx, cnt, None, None, {}


def _vs_indices(p: torch.Tensor, rows: torch.Tensor, cfgs, B: int):
    return _vs_topk(E.vertical_scores(p), E.slash_scores(p, rows), cfgs, B)


def _vs_topk(col: torch.Tensor, slash: torch.Tensor, cfgs, B: int):
    dev = col.device
    nv, ns = _per_head(cfgs, B, "n_vertical", dev), _per_head(cfgs, B, "n_slash", dev)
    sink, local = _per_head(cfgs, B, "sink", dev), _per_head(cfgs, B, "local", dev)
    nv_max = max(c.pattern.n_vertical for c in cfgs)
    ns_max = max(c.pattern.n_slash for c in cfgs)
    vert = _topk_per_head(col, nv, torch.minimum(sink, nv), nv_max)
    sl = _topk_per_head(slash, ns, torch.minimum(local, ns), ns_max)
    return vert, sl


def _plan_vs(ctx: _Ctx, hs, cfgs, exact: bool = False, exact_lists: bool = True) -> tuple:
    L = max(c.pattern.last_q for c in cfgs)
    col, slash = ctx.lines_last(L)
    vert, sl = _vs_topk(ctx.sel(col, hs), ctx.sel(slash, hs), cfgs, ctx.B)
    N = vert.shape[0]
    if not exact:
        idx, cnt = vertical_slash_lists(vert, sl, ctx.S, ctx.block)
        return idx, cnt, None, None, {"vertical": vert, "slash": sl}
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
    nv = (vert >= 0).sum(-1).reshape(ctx.B, Hg)
    ns = (sl >= 0).sum(-1).reshape(ctx.B, Hg)
    if not (bool((nv == nv[:1]).all()) and bool((ns == ns[:1]).all())):
        raise NotImplementedError(
            "VerticalSlash(exact_verticals=True): the batch rows of one head found different "
            "numbers of columns or diagonals (only possible for very short sequences)"
        )
    # Heads with equal counts share one launch.
    parts: dict[tuple[int, int], list[int]] = {}
    for j, key in enumerate(zip(nv[0].tolist(), ns[0].tolist())):
        parts.setdefault(key, []).append(j)
    exact_parts = []
    for (a, b), local in parts.items():
        rows = torch.tensor(local, device=vert.device)
        v_ = vert.reshape(ctx.B, Hg, -1)[:, rows, vert.shape[-1] - a :]
        s_ = sl.reshape(ctx.B, Hg, -1)[:, rows, sl.shape[-1] - b :]
        exact_parts.append((local, v_.to(torch.int32), s_.to(torch.int32)))
    return idx, cnt, None, None, {"exact_vertical": exact_parts}


def _folds_fit(P: int, S: int) -> bool:
    """Whether a stride space of common period ``P`` is searched on line folds."""
    return 2 * P <= S and P <= FOLD_MAX_PERIOD


def _plan_grid(ctx: _Ctx, hs, cfgs) -> tuple:
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
    return idx, cnt, perm, perm, {"stride": stride, "phase": phase, "kv_runs": runs}


def _fused_grid_fits(ctx: _Ctx, hs, cfgs, spaces: dict, L: int) -> bool:
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
    if not _folds_fit(P, ctx.S) or L in ctx._lines_last:
        return False
    return not any(c.pattern.use_hline for c in cfgs)


@functools.lru_cache(maxsize=64)
def _head_flags(flags: tuple[tuple[bool, ...], ...], B: int, device: torch.device) -> torch.Tensor:
    """int32 ``[F, B * H]`` on ``device`` (b-major) from ``H`` tuples of ``F`` flags, made once
    per value."""
    return to_device(torch.tensor(flags, dtype=torch.int32).T.repeat(1, B), device)


def _plan_grid_fused(ctx: _Ctx, cfgs, sp: tuple[int, ...], L: int, one: bool) -> tuple:
    """:func:`_plan_grid` in five launches and one host read (see :func:`_fused_grid_fits`):
    the fold pass (interior and edge segments in one launch), its merge, the stride and phase
    search (``sparse_kernels.estimate.line_fold_search``), the permutation with each block's
    index (``grid_blocks_triton``) and the lists with their run split (what ``BlockPlan.run``
    launches with); :func:`_grid_fused_launch` launches them. The lists are launched before the
    read of the candidate widths when a width for the shape is on record (else, or when a row
    is wider, after it); the read is left to ``meta["lists"]``, which ``plan_layer`` calls once
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
                    f"sparse_patterns.mminference.GRID_GRAPHS = 'off' it launches its kernels "
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
        early lists themselves (``meta["early"]``) when they are as wide as the rows."""
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

    meta = {"stride": st, "phase": ph, "kv_runs": runs_bh, "lists": lists, "early": early}
    return None, None, perm, perm, meta


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


def _plan_block_sparse(ctx: _Ctx, hs, cfgs) -> tuple:
    dev = ctx.q.device
    for c in cfgs:
        if c.pattern.block != ctx.block:
            raise NotImplementedError(
                f"BlockSparse.block={c.pattern.block} differs from the layer's block={ctx.block}; "
                f"one block size per layer is supported"
            )
    pq = E.pool_blocks(ctx.q[:, heads_index(hs, dev)], ctx.block)
    H_KV = ctx.k.shape[1]
    G = ctx.H // H_KV
    pk = E.pool_blocks(ctx.k, ctx.block)[:, to_device(torch.tensor([h // G for h in hs]), dev)]
    nb = pq.shape[2]
    B, Hg = ctx.B, len(hs)
    topk = to_device(torch.tensor([c.pattern.top_k or 0 for c in cfgs]), dev).repeat(B)
    ratio = to_device(torch.tensor([c.pattern.ratio or 0.0 for c in cfgs]), dev).repeat(B)

    def fn(m0: int, m1: int) -> torch.Tensor:
        s = E.pooled_block_scores(pq[:, :, m0:m1], pk, scale=ctx.scale, m0=m0)  # [B, Hg, C, NKB]
        s = s.reshape(B * Hg, m1 - m0, nb)
        m = torch.arange(m0, m1, device=dev)
        n = torch.arange(nb, device=dev)
        s = s.masked_fill((n[None, None] == 0) | (n[None, None] == m[None, :, None]), float("inf"))
        kk = torch.where(
            topk[:, None] > 0, topk[:, None], torch.ceil(ratio[:, None] * (m[None] + 1)).long()
        )
        kk = torch.minimum(kk.clamp_min(1), m[None] + 1)
        kmax = int(kk.max())
        vals, idx = torch.topk(s, min(kmax, nb), dim=-1)
        keep = (torch.arange(idx.shape[-1], device=dev) < kk[..., None]) & (vals > float("-inf"))
        out = torch.zeros(B * Hg, m1 - m0, nb + 1, dtype=torch.bool, device=dev)
        out.scatter_(-1, torch.where(keep, idx, nb), True)
        return out[..., :nb]

    idx, cnt = lists_from_chunks(fn, B * Hg, nb, nb, dev)
    return idx, cnt, None, None, {}


def _static_element(
    kind: str, params: dict, i: torch.Tensor, j: torch.Tensor, S: int | torch.Tensor
) -> torch.Tensor:
    """Element mask of a static pattern (no causal), ``i`` ``[1 or N, R, 1]``, ``j`` ``[.., S]``."""
    d = i - j
    if kind == "dense":
        return torch.ones_like(d, dtype=torch.bool)
    if kind in ("a_shape", "tri_shape"):
        m = (j < _c(params["sink"])) | (d < _c(params["window"]))
        if kind == "tri_shape":
            m = m | (i >= S - _c(params["last"]))
        return m
    L, vs = _c(params["local"]), _c(params["vline_stride"])
    if kind == "sf_fixed":
        return (i // L == j // L) | (torch.remainder(j, vs) == vs - 1)
    return (d < L) | (torch.remainder(d, vs) == 0)


def _c(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, 1, 1)


def _scatter_true(mask: torch.Tensor, idx: torch.Tensor, ok: torch.Tensor) -> None:
    S = mask.shape[-1]
    trash = torch.zeros(*mask.shape[:-1], 1, dtype=torch.bool, device=mask.device)
    full = torch.cat([mask, trash], dim=-1)
    full.scatter_(-1, torch.where(ok, idx, S).expand(*mask.shape[:-1], -1), True)
    mask.copy_(full[..., :S])


# Boundary heads of these kinds build their block lists from row runs (see
# ``_boundary_block_mask``); the element path stays the reference and serves the SF baselines.
# Grid stride spaces whose common period is at most this (and at most S / 2) are searched on
# line scores folded modulo the period (``last_line_folds``); wider ones on the full vectors.
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
_RUN_KINDS = ("dense", "a_shape", "tri_shape")
_BOUNDARY_BLOCK_LEVEL = True  # False: every boundary head on the element path (tests compare)
# Elements of one batch of run ranges ([N, runs, ranges per run], several int64 temporaries).
_RANGE_CHUNK_ELEMS = 1 << 24


class _Runs:
    """Row runs of the query blocks ``[m0, m1)`` of a modality-ordered layout: stretches of
    consecutive rows of one modality inside one query block whose original positions are
    consecutive too (Q-Boundary) or, for 2D-Boundary, whose modality ranks are (always, in
    modality order). Per run ``u``: local query block ``qb``, modality ``mod``, first and last row
    in the pattern's coordinates (``lo``, ``hi``: original positions for Q-Boundary, ranks in
    the modality for 2D), and the last row's original position ``orig_hi`` (causality)."""

    def __init__(self, mperm, mi, start, m0: int, m1: int, S: int, blk: int, two_d: bool):
        dev = mperm.device
        pr = torch.arange(m0 * blk, min(m1 * blk, S), device=dev)
        orig = mperm[pr].long()
        qb = (pr - m0 * blk) // blk
        mod = mi[orig]
        new = torch.ones(pr.numel(), dtype=torch.bool, device=dev)
        new[1:] = (qb[1:] != qb[:-1]) | (mod[1:] != mod[:-1])
        if not two_d:
            new[1:] |= orig[1:] != orig[:-1] + 1
        first = new.nonzero().squeeze(1)  # one host read: the run count
        last = torch.cat([first[1:], first.new_tensor([pr.numel()])]) - 1
        self.qb, self.mod = qb[first], mod[first]
        self.orig_hi = orig[last]
        coord = (pr - start[mod]) if two_d else orig
        self.lo, self.hi = coord[first], coord[last]


def _boundary_block_mask(
    kind, params, vert, sl, cross, ctx: _Ctx, N: int, two_d: bool, counts, start, inv
):  # fmt: skip
    """Chunk function of a boundary head's block mask, equal to the element path's for a static
    ``kind`` in ``_RUN_KINDS`` or Vertical-Slash (``kind None``; per-modality ``vert``
    ``[N, M, NV]`` original columns, ``sl`` ``[N, M, NS]`` offsets; 2D: ``cross`` ``[N, M, C]``
    original columns of the other modalities), without an ``S``-wide row per query row.
    ``counts``/``start``: tokens per modality and where each starts in modality order; ``inv``:
    the modality-order position of each original position.

    Rows are in modality order. Q-Boundary keys are in original order and the pattern is in
    original positions; 2D-Boundary keys are in modality order too and the pattern is in ranks
    inside the row's modality (its length ``n_a`` where TriShape uses ``S``). Each run of rows
    (:class:`_Runs`) ``[lo, hi]`` attends a few key ranges, the exact union of its rows' sets: the
    sink ``[0, min(sink, hi + 1))``, the window ``[lo - window + 1, hi]``, ``[0, hi]`` for dense
    rows, per slash offset ``o`` the keys ``[lo - o, hi - o]`` (clipped at 0), and each column
    (vertical or cross) at or before the run's last row in original positions. The ranges go
    into a difference array over key blocks. Cost per chunk: ``N * runs * ranges per run`` plus
    the ``N * blocks * NKB`` mask; one host read (the run count)."""
    S, blk, dev = ctx.S, ctx.block, ctx.q.device
    nkb = -(-S // blk)
    mi = ctx.mod_index
    width = (vert.shape[-1] + sl.shape[-1] if kind is None else 3) + (
        cross.shape[-1] if cross is not None else 0
    )
    run_step = max(1, _RANGE_CHUNK_ELEMS // max(1, N * width))

    def ranges_of(r: _Runs, u: slice) -> list:
        """(first, last) key ranges of runs ``u``, in key order, ``[N or 1, U, P]``; a range with
        last < first is empty."""
        mod = r.mod[u]
        lo, hi = r.lo[u][None, :, None], r.hi[u][None, :, None]  # pattern coordinates
        orig_hi = r.orig_hi[u][None, :, None]
        shift = start[mod][None, :, None] if two_d else 0  # to key order
        length = counts[mod][None, :, None] if two_d else S
        out = []

        def columns(c):  # original columns at or before the run's last row
            ok = (c >= 0) & (c <= orig_hi)
            key = inv[c.clamp_min(0)].long() if two_d else c
            out.append((torch.where(ok, key, 0), torch.where(ok, key, -1)))

        if kind is None:
            columns(vert[:, mod])
            o = sl[:, mod]
            top = hi - o
            ok = (o >= 0) & (top >= 0)
            out.append((torch.where(ok, (lo - o).clamp_min(0) + shift, 0),
                        torch.where(ok, top + shift, -1)))  # fmt: skip
        elif kind == "dense":
            out.append((torch.zeros_like(lo) + shift, hi + shift))
        else:
            sink, win = params["sink"][:, None, None], params["window"][:, None, None]
            out.append((torch.zeros_like(sink + lo) + shift,
                        torch.minimum(sink, hi + 1) - 1 + shift))  # fmt: skip
            out.append(((lo - win + 1).clamp_min(0) + shift, torch.where(win > 0, hi, -1) + shift))
            if kind == "tri_shape":
                dense = hi >= length - params["last"][:, None, None]
                out.append((torch.zeros_like(dense, dtype=torch.long) + shift,
                            torch.where(dense, hi + shift, -1)))  # fmt: skip
        if cross is not None:
            columns(cross[:, mod])
        return out

    def fn(m0: int, m1: int) -> torch.Tensor:
        r = _Runs(ctx.mperm, mi, start, m0, m1, S, blk, two_d)
        C, U = m1 - m0, r.qb.numel()
        diff = torch.zeros(N, C, nkb + 1, dtype=torch.int32, device=dev)
        flat = diff.view(-1)
        for u0 in range(0, U, run_step):  # bounded temporaries: run_step runs at a time
            u = slice(u0, min(U, u0 + run_step))
            base = torch.arange(N, device=dev)[:, None, None] * C + r.qb[u][None, :, None]
            base = base * (nkb + 1)
            for a, b in ranges_of(r, u):
                a, b = (t.expand(N, -1, -1) for t in torch.broadcast_tensors(a, b))
                ok = b >= a
                one = ok.int().reshape(-1)
                flat.scatter_add_(0, (base + torch.where(ok, a // blk, 0)).reshape(-1), one)
                flat.scatter_add_(0, (base + torch.where(ok, b // blk + 1, 0)).reshape(-1), -one)
        return diff.cumsum(-1, dtype=torch.int32)[..., :nkb] > 0

    return fn


def _plan_boundary(ctx: _Ctx, hs, cfgs, two_d: bool) -> tuple:
    dev, S, B = ctx.q.device, ctx.S, ctx.B
    pat = cfgs[0].pattern
    kind = _STATIC.get(type(pat))
    if isinstance(pat, Grid) and not two_d:
        return _plan_q_boundary_grid(ctx, hs, cfgs)
    if kind is None and not isinstance(pat, VerticalSlash):
        which = "2D-Boundary" if two_d else "Q-Boundary"
        supported = "VerticalSlash, Dense, AShape, TriShape, SFFixed, SFStrided"
        raise NotImplementedError(
            f"{which} with a {type(pat).__name__} intra-modality pattern is not implemented "
            f"(supported: {supported}{'' if two_d else ', Grid'})"
        )
    N = B * len(hs)
    M = ctx.uniq.numel()
    mi = ctx.mod_index
    # Rank of each token inside its modality (the coordinates of 2D diagonal pairs).
    counts = torch.bincount(mi, minlength=M)
    start = torch.cumsum(counts, 0) - counts
    inv_m = torch.empty_like(ctx.mperm)
    inv_m[ctx.mperm] = torch.arange(S, device=dev)
    rank = inv_m - start[mi]
    L = max(getattr(c.pattern, "last_q", 64) for c in cfgs)
    need_est = isinstance(pat, VerticalSlash) or two_d
    vert = sl = cross = None
    if need_est:
        p_all, rows = ctx.p_mod(L)  # [B, H, M, L, S], rows [M, L]
        p = ctx.sel(p_all, hs)  # [N, M, L, S]
    if isinstance(pat, VerticalSlash):
        if not two_d:
            vert, sl = _vs_indices_m(p, rows, cfgs, B)
        else:
            vl, sll = [], []
            for a in range(M):
                cols = ctx.mperm[start[a] : start[a] + counts[a]]
                pa = p[:, a][..., cols]  # [N, L, n_a] keys of modality a in rank order
                v, s_ = _vs_indices(pa, rank[rows[a]], cfgs, B)
                vl.append(torch.where(v >= 0, cols[v.clamp_min(0)], -1))
                sll.append(s_)
            w = max(x.shape[-1] for x in vl)
            vert = torch.stack(
                [torch.nn.functional.pad(x, (0, w - x.shape[-1]), value=-1) for x in vl], 1
            )
            w = max(x.shape[-1] for x in sll)
            sl = torch.stack(
                [torch.nn.functional.pad(x, (0, w - x.shape[-1]), value=-1) for x in sll], 1
            )
    if two_d:
        cv = _per_head(cfgs, B, "cross_vertical", dev, base="boundary")
        cv_max = max(c.boundary.cross_vertical for c in cfgs)
        col = E.vertical_scores(p)  # [N, M, S]
        parts = []
        for b in range(M):
            cb = col.masked_fill((mi != b)[None, None], float("-inf"))
            t = _topk_per_head(cb, cv, torch.zeros_like(cv), cv_max)  # [N, M, k]
            a_eq_b = (torch.arange(M, device=dev) == b)[None, :, None]
            parts.append(torch.where(a_eq_b, -1, t))
        cross = torch.cat(parts, dim=-1)  # [N, M(a), M * k]
    params = {f: _per_head(cfgs, B, f, dev) for f in _STATIC_FIELDS.get(kind, ())}

    def row_fn(r: torch.Tensor) -> torch.Tensor:
        R = r.numel()
        i = r[None, :, None]
        j = torch.arange(S, device=dev)[None, None, :]
        causal = j <= i
        a = mi[r]
        if kind is not None:
            if two_d:
                same = mi[None, None, :] == a[None, :, None]
                # Modality-compacted coordinates: ranks, and the modality's own length.
                n_a = counts[a][None, :, None]
                em = (
                    _static_element(kind, params, rank[r][None, :, None], rank[None, None, :], n_a)
                    & same
                )
            else:
                em = _static_element(kind, params, i, j, S)
            em = em.expand(N, R, S).clone()
        else:
            em = torch.zeros(N, R, S, dtype=torch.bool, device=dev)
            v = vert[:, a]  # [N, R, NV]
            _scatter_true(em, v.clamp_min(0), v >= 0)
            o = sl[:, a]  # [N, R, NS]
            if two_d:
                rr = rank[r][None, :, None] - o
                ok = (o >= 0) & (rr >= 0)
                jj = ctx.mperm[(start[a][None, :, None] + rr.clamp_min(0)).clamp(max=S - 1)]
            else:
                jj = i - o
                ok = (o >= 0) & (jj >= 0)
            _scatter_true(em, jj.clamp_min(0), ok)
        if cross is not None:
            c = cross[:, a]
            _scatter_true(em, c.clamp_min(0), c >= 0)
        return em & causal

    q_perm = ctx.mperm.to(torch.int32)
    kv_perm = q_perm if two_d else None
    if _BOUNDARY_BLOCK_LEVEL and (kind is None or kind in _RUN_KINDS):
        nb = -(-S // ctx.block)
        fn = _boundary_block_mask(
            kind, params, vert, sl, cross, ctx, N, two_d, counts, start, inv_m
        )
        idx, cnt = lists_from_chunks(fn, N, nb, nb, dev)
    else:
        fn = element_block_mask(row_fn, q_perm, kv_perm, N, S, ctx.block)
        idx, cnt = lists_from_element_chunks(fn, N, S, ctx.block, dev)
    qp = q_perm.expand(N, S)
    return idx, cnt, qp, (qp if two_d else None), {}


def _plan_q_boundary_grid(ctx: _Ctx, hs, cfgs) -> tuple:
    """Q-Boundary Grid head: each modality's stride and phase from its own last queries.

    Rows: modality order, and inside each modality its own grid order ``(i - phase_a) mod
    stride_a``. Columns: the grid order of the largest non-text modality (the "owner"; the
    largest modality when all is text). Row ``i`` of modality ``a`` attends, causally: keys
    ``j = phase_a (mod stride_a)`` (vline), ``j = i (mod stride_a)`` (slash), every key if
    ``i = phase_a (mod stride_a)`` (hline), and itself. Rows of non-owner modalities follow
    their own grid, which is not contiguous in the owner's column order (correct, denser).
    """
    dev, S, B = ctx.q.device, ctx.S, ctx.B
    N = B * len(hs)
    M = ctx.uniq.numel()
    mi = ctx.mod_index
    L = max(c.pattern.last_q for c in cfgs)
    p_all, rows = ctx.p_mod(L)
    p = ctx.sel(p_all, hs)  # [N, M, L, S]
    stride = torch.zeros(N, M, dtype=torch.int64, device=dev)
    phase = torch.zeros(N, M, dtype=torch.int64, device=dev)
    c0 = cfgs[0].pattern
    for c in cfgs:
        if (c.pattern.stride, c.pattern.max_stride) != (c0.stride, c0.max_stride):
            raise NotImplementedError(
                "Q-Boundary Grid heads of one layer must share stride / max_stride settings"
            )
    space = (
        [c0.stride]
        if c0.stride is not None
        else E.stride_space(ctx.layout.tokens_per_frame, max_stride=c0.max_stride, S=S)
    )
    for a in range(M):
        st, ph, _ = E.search_grid(p[:, a], rows[a], space)
        stride[:, a], phase[:, a] = st, ph
    counts = torch.bincount(mi, minlength=M)
    visual = [a for a in range(M) if int(ctx.uniq[a]) != 0]
    owner = max(visual or range(M), key=lambda a: int(counts[a]))
    kv_perm, _ = grid_permutation(S, stride[:, owner], phase[:, owner], device=dev)
    i = torch.arange(S, device=dev)
    st_i = stride[:, mi]  # [N, S]
    ph_i = phase[:, mi]
    line = torch.remainder(i[None] - ph_i, st_i)
    key = (mi[None] * S + line) * S + i[None]
    q_perm = torch.argsort(key, dim=-1).to(torch.int32)
    flags = {
        f: _per_head(cfgs, B, f, dev, dtype=torch.bool)[:, None, None]
        for f in ("use_hline", "use_vline", "use_slash")
    }

    def row_fn(r: torch.Tensor) -> torch.Tensor:  # r: [N, R] original rows
        ii = r[..., None]
        j = i[None, None, :]
        s_r = st_i.gather(1, r)[..., None]
        p_r = ph_i.gather(1, r)[..., None]
        em = ii == j
        em = em | (flags["use_vline"] & (torch.remainder(j - p_r, s_r) == 0))
        em = em | (flags["use_slash"] & (torch.remainder(ii - j, s_r) == 0))
        em = em | (flags["use_hline"] & (torch.remainder(ii - p_r, s_r) == 0))
        return em & (j <= ii)

    fn = _element_block_mask_per_head(row_fn, q_perm, kv_perm, N, S, ctx.block)
    idx, cnt = lists_from_element_chunks(fn, N, S, ctx.block, dev)
    meta = {"stride": stride[:, owner], "phase": phase[:, owner]}
    return idx, cnt, q_perm, kv_perm, meta


def _element_block_mask_per_head(row_fn, q_perm, kv_perm, N: int, S: int, blk: int):
    """As :func:`~sparse_patterns.plan.element_block_mask` with per-head ``[N, S]``
    permutations; ``row_fn(rows [N, R]) -> bool [N, R, S]``."""
    nkb = -(-S // blk)
    pad = nkb * blk - S
    kvp = kv_perm.long()

    def fn(m0: int, m1: int) -> torch.Tensor:
        r0, r1 = m0 * blk, min(m1 * blk, S)
        rows = q_perm[:, r0:r1].long()
        em = row_fn(rows)
        em = em.gather(-1, kvp[:, None, :].expand(-1, em.shape[1], -1))
        em = torch.nn.functional.pad(em, (0, pad, 0, (m1 - m0) * blk - (r1 - r0)))
        return em.reshape(N, m1 - m0, blk, nkb, blk).any(-1).any(2)

    return fn


def _vs_indices_m(p: torch.Tensor, rows: torch.Tensor, cfgs, B: int):
    """Per-modality VS indices: ``p [N, M, L, S]`` -> vertical ``[N, M, NV]``, slash ``[N, M, NS]``."""
    return _vs_indices(p, rows, cfgs, B)


# ---------------------------------------------------------------------------------------------


def plan_layer(
    q: torch.Tensor,
    k: torch.Tensor,
    head_config,
    layout=None,
    *,
    block: int = 64,
    scale: float | None = None,
    exact_vertical_lists: bool = True,
) -> BlockPlan:
    """Estimate every head's sparse index and return one :class:`BlockPlan` for the layer.

    Args:
        q: ``[B, H, S, D]``; k: ``[B, H_KV, S, D]`` (prefill: ``S_Q == S_KV``).
        head_config: one :class:`HeadConfig` (or pattern spec) for all heads, or H of them.
        layout: None (all text), a :class:`~sparse_patterns.layout.TokenLayout` or a
            ``modality_index.ModalityLayout``-like object (same layout for every batch row).
        block: block size of the plan (block_m = block_n).
        exact_vertical_lists: build the slash-tile block lists of the
            ``VerticalSlash(exact_verticals=True)`` heads. ``BlockPlan.run`` does not read them
            (those heads run ``vertical_slash_attention`` from their columns and diagonals);
            the plan's metrics do. ``False`` gives an execution-only plan: those heads get
            empty lists, and the metrics raise (at 1M tokens the lists are about 2000 blocks
            per query block and head, which also widens the layer's index tensor). The same
            holds for ``AShape(exact=True)`` heads (run by ``triangle_attention``): with
            ``True`` their lists are the block-rounded set, an upper bound of what they compute
            for ``computed_blocks``; ``row_mask`` gives their exact set either way.
    """
    from sparse_kernels.validation import check_bool, check_qkv, check_scale

    # k stands in for v: the plan reads q and k only (shapes, dtypes, device, GQA, non-empty)
    check_qkv(q, k, k)
    B, H, S, D = q.shape
    if k.shape[2] != S:
        raise NotImplementedError(
            f"plan_layer: prefill only (S_Q == S_KV), got S_Q={S}, S_KV={k.shape[2]}"
        )
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block: expected an int >= 1, got {block!r}")
    scale = check_scale(scale, D)
    check_bool(exact_vertical_lists, "exact_vertical_lists", "plan_layer")
    cfgs = normalize_head_configs(head_config, H)
    lay = as_token_layout(layout, S, q.device)
    ctx = _Ctx(q, k, lay, block, scale)
    c0 = cfgs[0]
    if (
        isinstance(c0.pattern, Grid)
        and isinstance(c0.boundary, (NoBoundary, KBoundary))
        and all(c is c0 for c in cfgs)
    ):  # one Grid config for every head: no grouping, and the fused planner's plan as it is
        res = _plan_grid(ctx, list(range(H)), cfgs)
        if res[0] is None:
            return _fused_grid_plan(ctx, res)
        return _assemble(ctx, [(list(range(H)), res)], exact_vertical_lists)
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
    results = []
    # Vertical-Slash groups first: the line scores they make are cached, and a Grid group folds
    # them instead of passing over the keys again.
    order = sorted(
        groups.items(), key=lambda g: not (g[0][0] is VerticalSlash and g[0][1] == "none")
    )
    for (ptype, bkind, exact), hs in order:
        gc = [cfgs[h] for h in hs]
        if bkind in ("q", "2d"):
            res = _plan_boundary(ctx, hs, gc, two_d=bkind == "2d")
        elif ptype in _STATIC:
            res = _plan_static(ctx, gc, _STATIC[ptype], exact, exact_vertical_lists)
        elif ptype is VerticalSlash:
            res = _plan_vs(ctx, hs, gc, exact, exact_vertical_lists)
        elif ptype is Grid:
            res = _plan_grid(ctx, hs, gc)
        elif ptype is BlockSparse:
            res = _plan_block_sparse(ctx, hs, gc)
        else:  # pragma: no cover - HeadConfig validates the type
            raise NotImplementedError(f"pattern {ptype.__name__}")
        results.append((hs, res))
    return _assemble(ctx, results, exact_vertical_lists)


def _fused_grid_plan(ctx: _Ctx, res: tuple) -> BlockPlan:
    """The plan of a layer of Grid heads that ``_plan_grid_fused`` planned together (every head,
    in order): what :func:`_assemble` makes of that one group, without its merging."""
    _, _, perm, _, meta = res  # shaped [B, H, ...] by _grid_fused_launch
    stride = meta["stride"]

    def plan(lists: tuple) -> BlockPlan:
        idx, cnt, run_split = lists
        return BlockPlan(
            idx, cnt, perm, perm, ctx.block, ctx.S, {"stride": stride, "phase": meta["phase"]},
            kv_runs=(meta["kv_runs"], stride), run_split=run_split,
        )  # fmt: skip

    early = meta["early"]
    if early:
        # The plan of the early lists, and the lists its run() launches with, made while the
        # GPU works: the read of the widths below usually finds the rows that wide.
        guess = plan(early)
        guess._launch_lists  # noqa: B018 (a cached property, made here)
    got = meta["lists"]()
    return guess if early and got is early else plan(got)


def _assemble(ctx: _Ctx, results: list, exact_vertical_lists: bool) -> BlockPlan:
    """One :class:`BlockPlan` from each group's planner result ``(heads, (idx, cnt, q_perm,
    kv_perm, meta))``: per-head tensors merged into ``[B, H, ...]``, the lists made last."""
    B, H, S, block = ctx.B, ctx.H, ctx.S, ctx.block
    nb = -(-S // block)
    dev = ctx.q.device
    parts: dict[str, list] = {k: [] for k in ("idx", "cnt", "q", "kv", "runs", "step", "st", "ph")}
    step_one = True  # known on the host: no head has a grid step
    exact_vertical, exact_a_shape = [], []
    for hs, (_, _, qp, kp, meta) in results:
        for local, vv, ss in meta.get("exact_vertical", ()):
            exact_vertical.append(ExactVerticalHeads(tuple(hs[j] for j in local), vv, ss))
        for local, sink, window in meta.get("exact_a_shape", ()):
            exact_a_shape.append(ExactAShapeHeads(tuple(hs[j] for j in local), sink, window))
        Hg = len(hs)
        if qp is not None:
            parts["q"].append((hs, qp.reshape(B, Hg, S)))
        if kp is not None:
            parts["kv"].append((hs, kp.reshape(B, Hg, S)))
            if "kv_runs" in meta:
                r, st = meta["kv_runs"], meta["stride"]
            else:
                r, st = best_block_runs(kp, block, meta.get("stride"))
            parts["runs"].append((hs, r.reshape(B, Hg, nb)))
            parts["step"].append((hs, st.reshape(B, Hg)))
            step_one &= "stride" not in meta
        if "stride" in meta:
            parts["st"].append((hs, meta["stride"].reshape(B, Hg)))
            parts["ph"].append((hs, meta["phase"].reshape(B, Hg)))

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
    # The lists last: a planner may leave them to a closure (``lists``) whose host read of their
    # width then waits for the GPU only after everything above was queued.
    run_split = None
    for hs, (i, c, _, _, m) in results:
        if i is None:
            i, c, run_split = m["lists"]()
        parts["idx"].append((hs, i.reshape(B, len(hs), nb, -1)))
        parts["cnt"].append((hs, c.reshape(B, len(hs), nb)))
    if len(results) > 1:
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


def mminference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    head_config,
    layout=None,
    *,
    block: int = 64,
    scale: float | None = None,
    impl: str = "auto",
) -> AttentionOutput:
    """MMInference attention of one layer: :func:`plan_layer`, then one kernel launch.

    ``impl`` is passed to ``sparse_kernels.permuted_block_sparse_attention`` (``"auto"``:
    Triton on CUDA, the exact PyTorch reference elsewhere).
    """
    from sparse_kernels.validation import check_qkv

    check_qkv(q, k, v)  # before the estimation, which reads q and k only
    plan = plan_layer(
        q, k, head_config, layout, block=block, scale=scale, exact_vertical_lists=False
    )
    return plan.run(q, k, v, scale=scale, impl=impl)


def estimate_vertical_slash(
    q: torch.Tensor, k: torch.Tensor, pattern: VerticalSlash, *, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """MInference's online estimation for one Vertical-Slash pattern on every head.

    Returns ``(vertical_indices [B, H, NV], slash_indices [B, H, NS])``, int32, each row sorted
    ascending (key columns; diagonal offsets ``i - j``), ``NV = min(n_vertical, S)``,
    ``NS = min(n_slash, S)``: the inputs of ``sparse_kernels.vertical_slash_attention``.
    """
    from sparse_kernels.validation import check_scale

    if not isinstance(pattern, VerticalSlash):
        raise TypeError(f"pattern: expected a VerticalSlash, got {type(pattern).__name__}")
    B, H, S, D = q.shape
    scale = check_scale(scale, D)
    col, slash = E.last_line_scores(q, k, pattern.last_q, scale=scale)
    vert, sl = _vs_topk(
        col.reshape(B * H, S), slash.reshape(B * H, S), [HeadConfig(pattern)], B * H
    )
    vert = torch.sort(vert, -1).values.reshape(B, H, -1)
    sl = torch.sort(sl, -1).values.reshape(B, H, -1)
    return vert.to(torch.int32), sl.to(torch.int32)
