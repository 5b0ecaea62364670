"""The typed results of the Grid index."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..permuted.perms import inverse_permutation


class RunSplit(NamedTuple):
    """The block lists split into the key blocks that are not runs and the runs' original start
    positions (what ``split_run_blocks`` returns), int32: ``rest_idx [B, H, NQB, W]``,
    ``rest_cnt [B, H, NQB]``, ``run_starts [B, H, NQB, W]``, ``run_cnt [B, H, NQB]``."""

    rest_idx: torch.Tensor
    rest_cnt: torch.Tensor
    run_starts: torch.Tensor
    run_cnt: torch.Tensor


def _shape(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


@dataclass(frozen=True, repr=False, eq=False)
class GridIndex:
    """The sparse index of Grid heads, in their permuted order (rows and keys permuted alike).

    Attributes:
        stride, phase: int64 ``[B, H]``: the grid of each head (``0 <= phase < stride``).
        perm: int32 ``[B, H, S]``: ``perm[..., r]`` is the original token at permuted position
            ``r`` (:func:`~sparse_kernels.grid_permutation` of ``stride`` and ``phase``);
            :meth:`inverse` is its exact inverse.
        kv_runs: int32 ``[B, H, NB]``: per key block of the permuted order, the original position
            of its first key when its keys step by the head's stride, else -1
            (``kv_block_runs(perm, block, stride)``).
        block_indices, block_counts: int32 ``[B, H, NQB, W]`` and ``[B, H, NQB]``: per query
            block, the key blocks it attends (vertical line 0, its own lines, the diagonal
            block, pruned causally), in candidate order; entries past the count are 0.
        run_split: those lists split by ``kv_runs`` (:class:`RunSplit`), or None where the
            lists were wider than the lists kernel takes (``GridIndexSettings.lists_max_width``).
        block: the block size (query and key blocks).
    """

    stride: torch.Tensor
    phase: torch.Tensor
    perm: torch.Tensor
    kv_runs: torch.Tensor
    block_indices: torch.Tensor
    block_counts: torch.Tensor
    run_split: RunSplit | None
    block: int

    def inverse(self) -> torch.Tensor:
        """int32 ``[B, H, S]``: the permuted position of each original token (one scatter)."""
        return inverse_permutation(self.perm)

    def __repr__(self) -> str:
        split = "None" if self.run_split is None else _shape(self.run_split.rest_idx)
        return (
            f"GridIndex(stride={_shape(self.stride)}, phase={_shape(self.phase)}, "
            f"perm={_shape(self.perm)}, kv_runs={_shape(self.kv_runs)}, "
            f"block_indices={_shape(self.block_indices)}, "
            f"block_counts={_shape(self.block_counts)}, run_split={split}, block={self.block})"
        )
