"""Fused per-token ops that run beside attention in a long prefill: RMSNorm and the SiLU gate
of a gated MLP. Each is one pass over memory where the eager PyTorch form makes several."""

from .api import rms_norm, silu_mul
from .reference import rms_norm_reference, silu_mul_reference

__all__ = ["rms_norm", "rms_norm_reference", "silu_mul", "silu_mul_reference"]
