"""The per-layer entry: plan every head (estimation batched per pattern type), then one launch.

:class:`MMInferencePlanner` groups a layer's heads by (pattern type, boundary type), runs each
group's estimation pipeline for all of its heads at once (no per-head Python loop) and merges
the groups into ONE :class:`~sparse_patterns.plan.BlockPlan` over all heads (identity
permutations for heads that need none); the group planners live in
:mod:`sparse_patterns.planner`. :meth:`MMInferencePlanner.attention` executes the plan with ONE
launch of ``sparse_kernels.permuted_block_sparse_attention`` for the whole layer (the kernel
takes per-head block lists and per-head permutations, so grouping by pattern type costs no extra
launches). ``plan_layer`` and ``mminference_attention`` are the same with a planner made for the
call.
"""

from __future__ import annotations

import torch
from sparse_kernels import AttentionOutput

from . import estimate as E
from .layout import as_token_layout
from .patterns import BlockSparse, Grid, HeadConfig, KBoundary, NoBoundary, VerticalSlash
from .plan import BlockPlan
from .planner.assemble import assemble, group_heads
from .planner.boundary import plan_boundary
from .planner.context import LayerContext, normalize_head_configs
from .planner.grid import GridHeads
from .planner.static import STATIC_KINDS, plan_block_sparse, plan_static
from .planner.vertical_slash import plan_vertical_slash, vs_topk

_IMPLS = ("auto", "triton", "reference")
_BOUNDARY_LISTS = ("runs", "reference")


class MMInferencePlanner:
    """The MMInference planner of a model: its settings, and what it keeps across layers and
    calls. Hold one per model (or per process group of layers of one shape): the fused Grid
    planner's list widths and CUDA graphs are kept per shape and replayed for every later layer.

    Args:
        block: block size of the plans (block_m = block_n).
        impl: the engine of the estimation and of the attention: ``"triton"``,
            ``"reference"`` (PyTorch only, also on CUDA), ``"auto"`` (Triton on CUDA where a
            step supports the shape, PyTorch elsewhere).
        boundary_lists: how Q- and 2D-Boundary heads of static and Vertical-Slash patterns
            get their block lists: ``"runs"`` (from runs of rows at block level, the fast path)
            or ``"reference"`` (from every element, the path the runs are tested against).
        boundary_chunk_elems: elements of one batch of the boundary heads' row-run ranges
            (bounds their int64 temporaries).
        grid: the planner of the Grid heads, with its settings (fused path, CUDA graphs, fold
            period) and what it keeps per shape (None: ``GridHeads()``, the defaults).
    """

    def __init__(
        self,
        *,
        block: int = 64,
        impl: str = "auto",
        boundary_lists: str = "runs",
        boundary_chunk_elems: int = 1 << 24,
        grid: GridHeads | None = None,
    ):
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"block: expected an int >= 1, got {block!r}")
        if impl not in _IMPLS:
            raise ValueError(f"impl: expected one of {_IMPLS}, got {impl!r}")
        if boundary_lists not in _BOUNDARY_LISTS:
            raise ValueError(
                f"boundary_lists: expected one of {_BOUNDARY_LISTS}, got {boundary_lists!r}"
            )
        n = boundary_chunk_elems
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"boundary_chunk_elems: expected an int >= 1, got {n!r}")
        self.block = block
        self.impl = impl
        self.boundary_lists = boundary_lists
        self.boundary_chunk_elems = boundary_chunk_elems
        if grid is not None and not isinstance(grid, GridHeads):
            raise TypeError(f"grid: expected a GridHeads or None, got {type(grid).__name__}")
        self.grid = GridHeads() if grid is None else grid

    def __repr__(self) -> str:
        return (
            f"MMInferencePlanner(block={self.block}, impl={self.impl!r}, "
            f"boundary_lists={self.boundary_lists!r}, grid={self.grid!r})"
        )

    def plan(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        head_config,
        layout=None,
        *,
        scale: float | None = None,
        exact_vertical_lists: bool = True,
    ) -> BlockPlan:
        """Estimate every head's sparse index and return one :class:`BlockPlan` for the layer.

        Args:
            q: ``[B, H, S, D]``; k: ``[B, H_KV, S, D]`` (prefill: ``S_Q == S_KV``).
            head_config: one :class:`HeadConfig` (or pattern spec) for all heads, or H of them.
            layout: None (all text), a :class:`~sparse_patterns.layout.TokenLayout` or a
                ``modality_index.ModalityLayout``-like object (same layout for every batch row).
            scale: softmax scale; None means ``D ** -0.5``.
            exact_vertical_lists: build the slash-tile block lists of the
                ``VerticalSlash(exact_verticals=True)`` heads. ``BlockPlan.run`` does not read
                them (those heads run ``vertical_slash_attention`` from their columns and
                diagonals); the plan's metrics do. ``False`` gives an execution-only plan: those
                heads get empty lists, and the metrics raise (at 1M tokens the lists are about
                2000 blocks per query block and head, which also widens the layer's index
                tensor). The same holds for ``AShape(exact=True)`` heads (run by
                ``triangle_attention``): with ``True`` their lists are the block-rounded set,
                an upper bound of what they compute for ``computed_blocks``; ``row_mask`` gives
                their exact set either way.
        """
        from sparse_kernels.validation import check_bool, check_qkv, check_scale

        # k stands in for v: the plan reads q and k only (shapes, dtypes, device, GQA, non-empty)
        check_qkv(q, k, k)
        B, H, S, D = q.shape
        if k.shape[2] != S:
            raise NotImplementedError(
                f"plan_layer: prefill only (S_Q == S_KV), got S_Q={S}, S_KV={k.shape[2]}"
            )
        scale = check_scale(scale, D)
        check_bool(exact_vertical_lists, "exact_vertical_lists", "plan_layer")
        cfgs = normalize_head_configs(head_config, H)
        lay = as_token_layout(layout, S, q.device)
        ctx = LayerContext(q, k, lay, self.block, scale, impl=self.impl)
        return self._plan(ctx, cfgs, exact_vertical_lists)

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        head_config,
        layout=None,
        *,
        scale: float | None = None,
    ) -> AttentionOutput:
        """MMInference attention of one layer: :meth:`plan` (execution only), then one launch of
        ``sparse_kernels.permuted_block_sparse_attention`` with this planner's ``impl``."""
        from sparse_kernels.validation import check_qkv

        check_qkv(q, k, v)  # before the estimation, which reads q and k only
        plan = self.plan(q, k, head_config, layout, scale=scale, exact_vertical_lists=False)
        return plan.run(q, k, v, scale=scale, impl=self.impl)

    def _plan(self, ctx: LayerContext, cfgs: list, exact_lists: bool) -> BlockPlan:
        c0 = cfgs[0]
        if (
            isinstance(c0.pattern, Grid)
            and isinstance(c0.boundary, (NoBoundary, KBoundary))
            and all(c is c0 for c in cfgs)
        ):  # one Grid config for every head: no grouping, and the fused planner's plan as it is
            g = self.grid.plan(ctx, list(range(ctx.H)), cfgs)
            if g.fused:
                return self.grid.layer_plan(ctx, g)
            return assemble(ctx, [g], exact_lists)
        plans = []
        for (ptype, bkind, exact), hs in group_heads(cfgs):
            gc = [cfgs[h] for h in hs]
            if bkind in ("q", "2d"):
                g = plan_boundary(
                    ctx, hs, gc, two_d=bkind == "2d",
                    reference=self.boundary_lists == "reference",
                    chunk_elems=self.boundary_chunk_elems,
                )  # fmt: skip
            elif ptype in STATIC_KINDS:
                g = plan_static(ctx, hs, gc, STATIC_KINDS[ptype], exact, exact_lists)
            elif ptype is VerticalSlash:
                g = plan_vertical_slash(ctx, hs, gc, exact, exact_lists)
            elif ptype is Grid:
                g = self.grid.plan(ctx, hs, gc)
            elif ptype is BlockSparse:
                g = plan_block_sparse(ctx, hs, gc)
            else:  # pragma: no cover - HeadConfig validates the type
                raise NotImplementedError(f"pattern {ptype.__name__}")
            plans.append(g)
        return assemble(ctx, plans, exact_lists)


def _call_planner(planner, block: int | None, impl: str | None) -> MMInferencePlanner:
    """``planner``, or one made for this call from ``block`` and ``impl`` (64, ``"auto"``)."""
    if planner is None:
        return MMInferencePlanner(
            block=64 if block is None else block, impl="auto" if impl is None else impl
        )
    if not isinstance(planner, MMInferencePlanner):
        raise TypeError(
            f"planner: expected a MMInferencePlanner or None, got {type(planner).__name__}"
        )
    for name, got, its in (("block", block, planner.block), ("impl", impl, planner.impl)):
        if got is not None and got != its:
            raise ValueError(
                f"{name}: expected None or the planner's {name} {its!r} (the planner sets it), "
                f"got {got!r}"
            )
    return planner


def plan_layer(
    q: torch.Tensor,
    k: torch.Tensor,
    head_config,
    layout=None,
    *,
    block: int | None = None,
    scale: float | None = None,
    exact_vertical_lists: bool = True,
    impl: str | None = None,
    planner: MMInferencePlanner | None = None,
) -> BlockPlan:
    """:meth:`MMInferencePlanner.plan` of ``planner``. Without one, a planner is made for this
    call (``block`` default 64, ``impl`` default ``"auto"``) and nothing is kept for the next
    call: a model that plans layer after layer passes the one it holds (then ``block`` and
    ``impl`` are the planner's)."""
    planner = _call_planner(planner, block, impl)
    return planner.plan(
        q, k, head_config, layout, scale=scale, exact_vertical_lists=exact_vertical_lists
    )


def mminference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    head_config,
    layout=None,
    *,
    block: int | None = None,
    scale: float | None = None,
    impl: str | None = None,
    planner: MMInferencePlanner | None = None,
) -> AttentionOutput:
    """:meth:`MMInferencePlanner.attention` of ``planner``. Without one, a planner is made for
    this call (``block`` default 64, ``impl`` default ``"auto"``) and nothing is kept for the
    next call: a model that runs layer after layer passes the one it holds (then ``block`` and
    ``impl`` are the planner's).

    ``impl`` selects the engine of the estimation and of the attention (``"auto"``: Triton on
    CUDA, the PyTorch reference elsewhere; ``"reference"``: PyTorch also on CUDA)."""
    planner = _call_planner(planner, block, impl)
    return planner.attention(q, k, v, head_config, layout, scale=scale)


def estimate_vertical_slash(
    q: torch.Tensor,
    k: torch.Tensor,
    pattern: VerticalSlash,
    *,
    scale: float | None = None,
    impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """MInference's online estimation for one Vertical-Slash pattern on every head.

    Returns ``(vertical_indices [B, H, NV], slash_indices [B, H, NS])``, int32, each row sorted
    ascending (key columns; diagonal offsets ``i - j``), ``NV = min(n_vertical, S)``,
    ``NS = min(n_slash, S)``: the inputs of ``sparse_kernels.vertical_slash_attention``.
    ``impl``: the engine of the line scores, as :func:`~sparse_patterns.estimate.last_line_scores`
    takes it.
    """
    from sparse_kernels.validation import check_scale

    if not isinstance(pattern, VerticalSlash):
        raise TypeError(f"pattern: expected a VerticalSlash, got {type(pattern).__name__}")
    B, H, S, D = q.shape
    scale = check_scale(scale, D)
    col, slash = E.last_line_scores(q, k, pattern.last_q, scale=scale, impl=impl)
    vert, sl = vs_topk(col.reshape(B * H, S), slash.reshape(B * H, S), [HeadConfig(pattern)], B * H)
    vert = torch.sort(vert, -1).values.reshape(B, H, -1)
    sl = torch.sort(sl, -1).values.reshape(B, H, -1)
    return vert.to(torch.int32), sl.to(torch.int32)
