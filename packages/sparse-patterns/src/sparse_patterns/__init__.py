"""MMInference sparse patterns: typed specs, online estimation, block plans, configs, search."""

from .layout import TokenLayout
from .mminference import mminference_attention, plan_layer
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

__all__ = [
    "AShape",
    "BlockPlan",
    "BlockSparse",
    "Dense",
    "Grid",
    "HeadConfig",
    "KBoundary",
    "NoBoundary",
    "QBoundary",
    "SFFixed",
    "SFStrided",
    "TokenLayout",
    "TriShape",
    "TwoDBoundary",
    "VerticalSlash",
    "mminference_attention",
    "plan_layer",
]
__version__ = "0.1.0"
