"""The Grid index of MMInference's Grid heads: stride and phase search from the last query rows,
the Grid permutation and the block lists of its permuted order, with PyTorch oracles."""

from .api import grid_index, grid_index_reference
from .graphs import OffsetGraph
from .indexer import GridIndexer, PendingGridIndex
from .lists import GridListRanges, grid_candidate_lists, grid_list_ranges, grid_lists
from .reference import (
    block_min_max,
    candidate_lists_reference,
    fold_grid_lines,
    grid_block_lines,
    grid_block_mask,
    grid_block_runs,
    grid_window,
    search_grid_folds,
    search_grid_lines,
)
from .settings import DEFAULT_SETTINGS, GridIndexSettings
from .types import GridIndex, RunSplit

__all__ = [
    "DEFAULT_SETTINGS",
    "GridIndex",
    "GridIndexSettings",
    "GridIndexer",
    "GridListRanges",
    "OffsetGraph",
    "PendingGridIndex",
    "RunSplit",
    "block_min_max",
    "candidate_lists_reference",
    "fold_grid_lines",
    "grid_block_lines",
    "grid_block_mask",
    "grid_block_runs",
    "grid_candidate_lists",
    "grid_index",
    "grid_index_reference",
    "grid_list_ranges",
    "grid_lists",
    "grid_window",
    "search_grid_folds",
    "search_grid_lines",
]
