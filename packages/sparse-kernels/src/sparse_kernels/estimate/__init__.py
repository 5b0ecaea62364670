"""Estimation kernels: the column and diagonal mass of the last query rows' attention."""

from .api import line_fold_search, line_folds, line_scores
from .reference import fold_positions, line_folds_reference, line_scores_reference
from .search import search_folds_reference

__all__ = [
    "fold_positions",
    "line_fold_search",
    "line_folds",
    "line_folds_reference",
    "line_scores",
    "line_scores_reference",
    "search_folds_reference",
]
