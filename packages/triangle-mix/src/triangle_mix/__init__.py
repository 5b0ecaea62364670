"""TriangleMix: dense shallow layers, triangle attention in deep layers, and the gradient probe."""

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
__version__ = "0.1.0"
