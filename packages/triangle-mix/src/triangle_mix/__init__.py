"""TriangleMix: dense shallow layers, triangle attention in deep layers, and the gradient probe."""

from importlib import metadata as _metadata

from .policy import KINDS, DynamicAttention, LayerPolicy
from .probe import ProbeResult, plot_probe, probe_start_layer, suggest_start_layer
from .prompts import KVSample, kv_retrieval_prompt, kv_short_prompt

__all__ = [
    "KINDS",
    "DynamicAttention",
    "KVSample",
    "LayerPolicy",
    "ProbeResult",
    "kv_retrieval_prompt",
    "kv_short_prompt",
    "plot_probe",
    "probe_start_layer",
    "suggest_start_layer",
]
try:
    __version__ = _metadata.version("triangle-mix")
except _metadata.PackageNotFoundError:  # imported from a source folder on PYTHONPATH, not installed
    __version__ = "0+unknown"
