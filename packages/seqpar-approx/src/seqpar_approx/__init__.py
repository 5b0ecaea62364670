"""Spava: sequence-parallel approximate attention over torch.distributed, with exact baselines."""

from importlib import metadata as _metadata

from .baselines import dense_attention, zigzag_ring_attention
from .config import SpavaConfig, apb_config, resolve_apb, star_config
from .host_attention import (
    DENSE,
    DenseHost,
    HostAttention,
    HostSparsity,
    MMInferenceHost,
    TriangleHost,
)
from .layout import SpavaLayout, build_layout, even_split, ring_layout, split_frames
from .methods import METHODS, layout_for
from .prefix_blocks import PrefixBlocks
from .spava import (
    essential_scores,
    select_essential,
    simulate_spava_attention,
    spava_attention,
    top_indices,
)
from .timing import SECTIONS, SectionTimer

__all__ = [
    "DENSE",
    "DenseHost",
    "HostAttention",
    "HostSparsity",
    "METHODS",
    "MMInferenceHost",
    "PrefixBlocks",
    "SECTIONS",
    "SectionTimer",
    "SpavaConfig",
    "SpavaLayout",
    "TriangleHost",
    "apb_config",
    "build_layout",
    "dense_attention",
    "essential_scores",
    "even_split",
    "layout_for",
    "resolve_apb",
    "ring_layout",
    "select_essential",
    "simulate_spava_attention",
    "spava_attention",
    "split_frames",
    "star_config",
    "top_indices",
    "zigzag_ring_attention",
]
try:
    __version__ = _metadata.version("seqpar-approx")
except _metadata.PackageNotFoundError:  # imported from a source folder on PYTHONPATH, not installed
    __version__ = "0+unknown"
