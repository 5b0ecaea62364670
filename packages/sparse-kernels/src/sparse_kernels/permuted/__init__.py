from .api import permuted_block_sparse_attention
from .perms import Permutation, grid_line_offsets, grid_permutation, inverse_permutation
from .reference import permuted_block_sparse_attention_reference, permuted_mask

__all__ = [
    "Permutation",
    "grid_line_offsets",
    "grid_permutation",
    "inverse_permutation",
    "permuted_block_sparse_attention",
    "permuted_block_sparse_attention_reference",
    "permuted_mask",
]
