""":class:`GroupPlan`: what a group planner returns for its heads, before the layer's groups are
merged into one :class:`~sparse_patterns.plan.BlockPlan`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..plan import ExactAShapeHeads, ExactVerticalHeads

# ``(kv_block_indices [.., NB, W], kv_block_counts [.., NB], run split or None)``: the lists
# of a group and, for the fused Grid planner, the split ``BlockPlan.run`` launches with.
Lists = tuple[torch.Tensor, torch.Tensor, "tuple[torch.Tensor, ...] | None"]


@dataclass(frozen=True, eq=False)
class GroupPlan:
    """The plan of one group of a layer's heads (one pattern type and boundary kind).

    Per-head tensors have ``N = B * len(heads)`` rows, b-major (row ``b * len(heads) + j`` is
    batch row ``b`` of head ``heads[j]``), or are shaped ``[B, len(heads), ...]``.

    Attributes:
        heads: the layer's head numbers of this group, ascending.
        kv_block_indices: ``[N, NQB, W]`` int32 block lists, or None when ``lists`` makes them.
        kv_block_counts: ``[N, NQB]`` int32, or None with ``kv_block_indices``.
        lists: makes the lists after the rest of the layer's plan is queued (its host read of
            their width then waits only for the GPU); set exactly when the lists above are None.
        early: the lists (``Lists`` with the run split) the fused Grid planner launched before
            that read, as wide as the widest seen for the shape; ``lists()`` returns this very
            tuple when its rows fit.
        q_perm / kv_perm: ``[N, S]`` int32 query / key order, None for the identity.
        stride / phase: ``[N]`` int64 grid stride and phase of a Grid head.
        kv_runs: ``[N, NQB]`` the first key of each contiguous run of ``kv_perm`` per block (the
            step is ``stride``); None makes the layer derive them from ``kv_perm``.
        exact_vertical: heads run by ``vertical_slash_attention`` with their exact columns.
        exact_a_shape: heads run by ``triangle_attention`` (``AShape(exact=True)``).
        fused: made by the fused Grid index for every head of the layer (its tensors shaped
            ``[B, H, ...]``): ``GridHeads.layer_plan`` makes the layer's plan of it as it is.
    """

    heads: tuple[int, ...]
    kv_block_indices: torch.Tensor | None = None
    kv_block_counts: torch.Tensor | None = None
    lists: Callable[[], Lists] | None = None
    early: Lists | None = None
    q_perm: torch.Tensor | None = None
    kv_perm: torch.Tensor | None = None
    stride: torch.Tensor | None = None
    phase: torch.Tensor | None = None
    kv_runs: torch.Tensor | None = None
    exact_vertical: tuple[ExactVerticalHeads, ...] = ()
    exact_a_shape: tuple[ExactAShapeHeads, ...] = ()
    fused: bool = False

    def __post_init__(self):
        if (self.kv_block_indices is None) != (self.kv_block_counts is None):
            raise ValueError(
                "GroupPlan: expected kv_block_indices and kv_block_counts both set or both None"
            )
        if (self.lists is None) == (self.kv_block_indices is None):
            raise ValueError(
                "GroupPlan: expected either block lists or a lists callable, got "
                f"{'both' if self.lists is not None else 'neither'}"
            )
        if self.fused and self.lists is None:
            raise ValueError("GroupPlan: expected a lists callable with fused=True, got None")
        if (self.stride is None) != (self.phase is None):
            raise ValueError("GroupPlan: expected stride and phase both set or both None")
