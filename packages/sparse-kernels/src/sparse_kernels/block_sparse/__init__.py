from .api import block_sparse_attention
from .reference import block_mask_to_dense, block_sparse_attention_reference

__all__ = ["block_mask_to_dense", "block_sparse_attention", "block_sparse_attention_reference"]
