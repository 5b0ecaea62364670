from .api import permuted_block_sparse_attention
from .perms import (
    Permutation,
    block_lists_from_mask,
    grid_line_offsets,
    grid_permutation,
    inverse_permutation,
    kv_block_runs,
    split_run_blocks,
)
from .reference import (
    MAX_MODALITIES,
    pair_bit,
    permuted_block_sparse_attention_reference,
)

__all__ = [
    "MAX_MODALITIES",
    "Permutation",
    "block_lists_from_mask",
    "grid_line_offsets",
    "grid_permutation",
    "inverse_permutation",
    "kv_block_runs",
    "pair_bit",
    "permuted_block_sparse_attention",
    "permuted_block_sparse_attention_reference",
    "split_run_blocks",
]
