from .api import a_shape_attention, triangle_attention
from .reference import triangle_attention_reference, triangle_mask

__all__ = [
    "a_shape_attention",
    "triangle_attention",
    "triangle_attention_reference",
    "triangle_mask",
]
