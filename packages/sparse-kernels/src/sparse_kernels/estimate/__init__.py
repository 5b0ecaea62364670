"""Estimation kernels: the column and diagonal mass of the last query rows' attention."""

from .api import line_scores
from .reference import line_scores_reference

__all__ = ["line_scores", "line_scores_reference"]
