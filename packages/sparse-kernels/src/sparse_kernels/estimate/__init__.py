"""Estimation kernels: the column and diagonal mass of the last query rows' attention, and the
column mass of rows that follow every key."""

from .api import column_mass, line_fold_search, line_folds, line_scores
from .reference import (
    column_mass_reference,
    fold_positions,
    line_folds_reference,
    line_scores_reference,
)
from .search import search_folds_reference

__all__ = [
    "column_mass",
    "column_mass_reference",
    "fold_positions",
    "line_fold_search",
    "line_folds",
    "line_folds_reference",
    "line_scores",
    "line_scores_reference",
    "search_folds_reference",
]
