from .api import (
    FULL,
    PARTIAL,
    SKIPPED,
    block_states,
    block_states_figure,
    plot_block_mask,
    plot_vertical_slash_index,
    vertical_slash_block_states,
)

__all__ = [
    "FULL",
    "PARTIAL",
    "SKIPPED",
    "block_states",
    "block_states_figure",
    "plot_block_mask",
    "plot_vertical_slash_index",
    "vertical_slash_block_states",
]
