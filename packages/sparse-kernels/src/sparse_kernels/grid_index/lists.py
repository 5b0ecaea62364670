"""The block lists of Grid heads from their permutation: public entries with ``impl=``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validate import resolve_impl
from ..estimate.search import host_to_device
from ..permuted.perms import host_ints
from .reference import block_min_max, candidate_lists_reference, grid_block_lines
from .settings import DEFAULT_SETTINGS, GridIndexSettings


@dataclass(frozen=True)
class GridListRanges:
    """The candidate ranges of Grid heads' block lists (see :func:`grid_list_ranges`), with
    ``widths``, int ``[2]`` on their device: ``(max(v_hi) + 1, max(0, max(s_hi - s_lo + 1)))``,
    the lists' candidate widths, not yet read back."""

    v_hi: torch.Tensor
    s_lo: torch.Tensor
    s_hi: torch.Tensor
    kmin: torch.Tensor
    qmax: torch.Tensor
    widths: torch.Tensor
    nkb: int

    def lists(
        self, *, impl: str = "auto", settings: GridIndexSettings = DEFAULT_SETTINGS
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The lists of :func:`grid_lists`: one host read, of ``widths`` (on CUDA it waits for
        the queued work), then :func:`grid_candidate_lists`."""
        wv, ws = host_ints(self.widths)
        return grid_candidate_lists(
            self.v_hi, self.s_lo, self.s_hi, self.kmin, self.qmax, wv, ws, self.nkb,
            impl=impl, settings=settings,
        )  # fmt: skip


def grid_list_ranges(
    perm: torch.Tensor,
    offsets: torch.Tensor,
    use_vline: torch.Tensor,
    use_slash: torch.Tensor,
    S: int,
    blk: int,
    *,
    lines: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> GridListRanges:
    """The first half of :func:`grid_lists`, without its read: per query block of the permuted
    order, the candidate ranges of vertical line 0 and of the block's own lines. A planner
    queues its other work before calling :meth:`GridListRanges.lists`, so that the read waits
    only for the GPU."""
    if isinstance(blk, bool) or not isinstance(blk, int) or blk < 1:
        raise ValueError(f"grid_list_ranges: blk: expected an int >= 1, got {blk!r}")
    if perm.ndim != 2 or perm.shape[1] != S:
        raise ValueError(
            f"grid_list_ranges: perm: expected shape [N, S={S}], got {tuple(perm.shape)}"
        )
    nkb = -(-S // blk)
    dev = perm.device
    kmin, qmax = block_min_max(perm, blk)
    offs = offsets.to(dev)
    c_lo, c_hi = grid_block_lines(offs, perm.shape[0], S, blk) if lines is None else lines
    s_lo = offs.gather(1, c_lo) // blk  # [N, NQB]
    s_hi = (offs.gather(1, c_hi + 1) - 1) // blk
    v_hi = torch.where(use_vline, (offs[:, 1] - 1) // blk, -1)  # [N]
    s_hi = torch.where(use_slash[:, None], s_hi, s_lo - 1)
    widths = torch.stack([v_hi.max() + 1, (s_hi - s_lo + 1).max().clamp_min(0)])
    return GridListRanges(v_hi, s_lo, s_hi, kmin, qmax, widths, nkb)


def grid_lists(
    perm: torch.Tensor,
    offsets: torch.Tensor,
    use_vline: torch.Tensor,
    use_slash: torch.Tensor,
    S: int,
    blk: int,
    *,
    lines: tuple[torch.Tensor, torch.Tensor] | None = None,
    impl: str = "auto",
    settings: GridIndexSettings = DEFAULT_SETTINGS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The block lists of Grid heads without horizontal lines: per query block of the permuted
    order, the key blocks of vertical line 0, of the block's own lines and the diagonal block,
    each kept if it holds a key causally visible from the block (what
    :func:`~sparse_kernels.grid_index.reference.grid_block_mask` lists, built from the three
    candidate ranges, so its cost is ``O(NQB * (line blocks))``, not ``O(NQB * NKB)``).

    ``perm`` int ``[N, S]`` (grid orders), ``offsets`` their ``grid_line_offsets``, flags
    ``[N]`` bool; ``lines``: :func:`grid_block_lines` of them, if the caller has it. The lists
    are as wide as the candidate ranges (one host read, of the ranges' widths; split in two by
    :func:`grid_list_ranges`). ``impl``: as in :func:`grid_candidate_lists`. Returns int32
    ``(idx [N, NQB, W], cnt [N, NQB])``."""
    ranges = grid_list_ranges(perm, offsets, use_vline, use_slash, S, blk, lines=lines)
    return ranges.lists(impl=impl, settings=settings)


def grid_candidate_lists(
    v_hi: torch.Tensor,
    s_lo: torch.Tensor,
    s_hi: torch.Tensor,
    kmin: torch.Tensor,
    qmax: torch.Tensor,
    wv: int,
    ws: int,
    nkb: int,
    *,
    impl: str = "auto",
    settings: GridIndexSettings = DEFAULT_SETTINGS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The lists of :func:`grid_lists` from its candidate ranges: ``v_hi [N]`` (last key block
    of vertical line 0, -1 without), ``s_lo``/``s_hi [N, NQB]`` (each query block's slash
    range), ``kmin [N, NKB]``/``qmax [N, NQB]`` (smallest original key of a key block, largest
    original row of a query block), and the widths ``wv >= max(v_hi) + 1``,
    ``ws >= max(s_hi - s_lo + 1)`` (the lists' width is ``wv + ws + 1``).

    ``impl``: ``"triton"`` (one kernel for the candidates and their compaction; rows of up to
    ``settings.lists_max_width`` candidates), ``"reference"`` (torch), ``"auto"`` (triton on
    CUDA where the rows fit, else torch; the same lists either way)."""
    which = resolve_impl(impl, s_lo.device, "grid_lists")
    W = wv + ws + 1
    if which == "triton" and settings.lists_max_width < W:
        if impl == "triton":
            raise NotImplementedError(
                f"grid_lists: impl='triton' takes rows of up to {settings.lists_max_width} "
                f"candidate blocks, got {W}; use impl='reference' or 'auto'"
            )
        which = "reference"
    if which == "reference":
        return candidate_lists_reference(v_hi, s_lo, s_hi, kmin, qmax, wv, ws, nkb)
    from .lists_triton import launch_grid_lists

    widths = host_to_device(torch.tensor([wv, ws], dtype=torch.int32), s_lo.device)
    ins = (t.contiguous() for t in (v_hi, s_lo, s_hi, kmin, qmax))
    return launch_grid_lists(*ins, widths, W, nkb, block_w=settings.lists_block_w)
