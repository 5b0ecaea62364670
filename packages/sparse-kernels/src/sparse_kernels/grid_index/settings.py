"""The launch settings of the Grid index kernels, as one frozen value the caller passes.

The defaults are the fastest measured on H100s at the Qwen2.5-VL-7B shape; tests pass other
values to reach every layout the kernels can take.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GridIndexSettings:
    """How the fold pass and the lists kernel are cut into programs.

    Attributes:
        fold_programs: programs per fold launch the key range is split into (the partial
            accumulators they write are ``BLOCK_L x BLOCK_N`` floats each, two per program, so
            this also bounds that scratch memory). Up to ``fold_short_keys`` keys a quarter as
            many (at most 256): fewer partials for the merge to read. On an H100 at 128K keys
            with two heads per program 256 programs were the fastest of 256-2048; at 512K, 1024
            were faster than 512 (1.107 against 1.141 ms).
        fold_short_keys: the key count up to which the short-sequence settings apply (fewer
            programs, two query heads per interior program, 3 pipeline stages).
        fold_interior: segments whose tiles are all inside the window go to the interior body
            (one accumulator, no masks); False sends every segment through the general body.
        fold_heads: query heads of one KV group per interior program; 0 picks two up to
            ``fold_short_keys`` keys, else one.
        lists_block_w: widest candidate chunk a lists program walks at a time.
        lists_max_width: widest candidate row the lists kernel builds; wider rows are built in
            torch (their lists would be most of an ``NQB x NKB`` matrix).
    """

    fold_programs: int = 1024
    fold_short_keys: int = 262144
    fold_interior: bool = True
    fold_heads: int = 0
    lists_block_w: int = 128
    lists_max_width: int = 8192

    def __post_init__(self) -> None:
        for name in ("fold_programs", "fold_short_keys", "fold_heads", "lists_block_w",
                     "lists_max_width"):  # fmt: skip
            val = getattr(self, name)
            low = 0 if name in ("fold_short_keys", "fold_heads") else 1
            if isinstance(val, bool) or not isinstance(val, int) or val < low:
                raise ValueError(f"{name}: expected an int >= {low}, got {val!r}")
        if not isinstance(self.fold_interior, bool):
            raise TypeError(
                f"fold_interior: expected a bool, got {type(self.fold_interior).__name__}"
            )
        if self.lists_block_w & (self.lists_block_w - 1):
            raise ValueError(f"lists_block_w: expected a power of two, got {self.lists_block_w}")


DEFAULT_SETTINGS = GridIndexSettings()
