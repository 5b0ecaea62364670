from .api import permuted_block_sparse_attention
from .perms import Permutation, grid_line_offsets, grid_permutation, inverse_permutation
from .reference import (
    MAX_MODALITIES,
    pair_bit,
    permuted_block_sparse_attention_reference,
    permuted_mask,
)

__all__ = [
    "MAX_MODALITIES",
    "Permutation",
    "grid_line_offsets",
    "grid_permutation",
    "inverse_permutation",
    "pair_bit",
    "permuted_block_sparse_attention",
    "permuted_block_sparse_attention_reference",
    "permuted_mask",
]
