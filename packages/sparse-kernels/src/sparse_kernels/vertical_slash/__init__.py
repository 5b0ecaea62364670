from .api import vertical_slash_attention
from .index import VerticalSlashIndex, build_vertical_slash_index
from .reference import vertical_slash_attention_reference, vertical_slash_mask

__all__ = [
    "VerticalSlashIndex",
    "build_vertical_slash_index",
    "vertical_slash_attention",
    "vertical_slash_attention_reference",
    "vertical_slash_mask",
]
