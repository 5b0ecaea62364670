"""MMInference sparse patterns: typed specs, online estimation, block plans, configs, search."""

from importlib import metadata as _metadata

from .config import PatternConfig
from .layout import TokenLayout
from .mminference import (
    MMInferencePlanner,
    estimate_vertical_slash,
    mminference_attention,
    plan_layer,
)
from .patterns import (
    AShape,
    BlockSparse,
    Dense,
    Grid,
    HeadConfig,
    KBoundary,
    NoBoundary,
    QBoundary,
    SFFixed,
    SFStrided,
    TriShape,
    TwoDBoundary,
    VerticalSlash,
)
from .plan import BlockPlan
from .planner.grid import GridHeads
from .search import CostTable, search_config, search_layer, table3_candidates

__all__ = [
    "AShape",
    "BlockPlan",
    "BlockSparse",
    "CostTable",
    "Dense",
    "Grid",
    "GridHeads",
    "HeadConfig",
    "KBoundary",
    "MMInferencePlanner",
    "NoBoundary",
    "PatternConfig",
    "QBoundary",
    "SFFixed",
    "SFStrided",
    "TokenLayout",
    "TriShape",
    "TwoDBoundary",
    "VerticalSlash",
    "estimate_vertical_slash",
    "mminference_attention",
    "plan_layer",
    "search_config",
    "search_layer",
    "table3_candidates",
]
try:
    __version__ = _metadata.version("sparse-patterns")
except _metadata.PackageNotFoundError:  # imported from a source folder on PYTHONPATH, not installed
    __version__ = "0+unknown"
