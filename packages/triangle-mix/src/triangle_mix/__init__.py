"""TriangleMix: dense shallow layers, triangle attention in deep layers, and the gradient probe."""

from .policy import KINDS, DynamicAttention, LayerPolicy

__all__ = ["KINDS", "DynamicAttention", "LayerPolicy"]
__version__ = "0.1.0"
