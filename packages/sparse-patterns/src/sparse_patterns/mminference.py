"""The per-layer entry: plan every head (estimation batched per pattern type), then one launch.

``plan_layer(q, k, head_configs, layout)`` groups heads by (pattern type, boundary type), runs
each group's estimation pipeline for all of its heads at once (no per-head Python loop) and
merges the groups into ONE :class:`~sparse_patterns.plan.BlockPlan` over all heads (identity
permutations for heads that need none); the planners live in :mod:`sparse_patterns.planner`.
``mminference_attention`` executes it with ONE launch of
``sparse_kernels.permuted_block_sparse_attention`` for the whole layer (the kernel takes per-head
block lists and per-head permutations, so grouping by pattern type costs no extra launches).
"""

from __future__ import annotations

import torch
from sparse_kernels import AttentionOutput

from . import estimate as E
from .layout import as_token_layout
from .patterns import HeadConfig, VerticalSlash
from .plan import BlockPlan
from .planner.assemble import plan_heads
from .planner.context import LayerContext, normalize_head_configs
from .planner.vertical_slash import vs_topk


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
    return plan_heads(LayerContext(q, k, lay, block, scale), cfgs, exact_vertical_lists)


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
    vert, sl = vs_topk(col.reshape(B * H, S), slash.reshape(B * H, S), [HeadConfig(pattern)], B * H)
    vert = torch.sort(vert, -1).values.reshape(B, H, -1)
    sl = torch.sort(sl, -1).values.reshape(B, H, -1)
    return vert.to(torch.int32), sl.to(torch.int32)
