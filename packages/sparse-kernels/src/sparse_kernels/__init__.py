"""Triton attention kernels (dense and sparse) with exact PyTorch references.

Also the fused per-token ops a long prefill runs beside attention (``rms_norm``, ``silu_mul``, ``rotary``).

Layout ``[B, H, S, D]``; GQA handled natively; every op returns ``AttentionOutput(out, lse)``.
"""

from importlib import metadata as _metadata

from ._types import AttentionOutput
from .attention import attention
from .block_sparse import block_sparse_attention
from .estimate import line_folds, line_scores
from .fused import rms_norm, rotary, silu_mul
from .grid_index import GridIndex, GridIndexer, grid_index
from .merge import merge_attention
from .permuted import grid_permutation, permuted_block_sparse_attention
from .sparse_plan import SparsePlan
from .triangle import a_shape_attention, triangle_attention
from .vertical_slash import (
    VerticalSlashIndex,
    build_vertical_slash_index,
    vertical_slash_attention,
)

__all__ = [
    "AttentionOutput",
    "GridIndex",
    "GridIndexer",
    "SparsePlan",
    "VerticalSlashIndex",
    "a_shape_attention",
    "attention",
    "block_sparse_attention",
    "build_vertical_slash_index",
    "grid_index",
    "grid_permutation",
    "line_folds",
    "line_scores",
    "merge_attention",
    "permuted_block_sparse_attention",
    "rms_norm",
    "rotary",
    "silu_mul",
    "triangle_attention",
    "vertical_slash_attention",
]
try:
    __version__ = _metadata.version("sparse-kernels")
except _metadata.PackageNotFoundError:  # imported from a source folder on PYTHONPATH, not installed
    __version__ = "0+unknown"
