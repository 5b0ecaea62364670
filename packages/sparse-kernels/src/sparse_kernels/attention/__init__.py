from .api import attention
from .reference import attention_reference, causal_mask, masked_attention_reference

__all__ = ["attention", "attention_reference", "causal_mask", "masked_attention_reference"]
