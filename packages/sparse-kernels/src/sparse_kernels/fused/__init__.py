"""Fused per-token ops that run beside attention in a long prefill: RMSNorm, the SiLU gate of a
gated MLP and the rotary embedding of queries and keys. Each is one pass over memory where the
eager PyTorch form makes several."""

from .api import rms_norm, rotary, silu_mul
from .reference import rms_norm_reference, rotary_reference, silu_mul_reference

__all__ = [
    "rms_norm",
    "rms_norm_reference",
    "rotary",
    "rotary_reference",
    "silu_mul",
    "silu_mul_reference",
]
