from .api import merge_attention
from .reference import merge_attention_reference

__all__ = ["merge_attention", "merge_attention_reference"]
