"""Spava's configuration: block lengths, host count and the switch for each system optimisation."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpavaConfig:
    """How one sequence is split over hosts and approximated.

    Attributes:
        num_hosts: physical hosts ``H`` (one rank of the process group each).
        anchor_len: ``l_a``, tokens at the start every host attends; ``None`` means ``n // 64``.
        passing_len: ``l_p``, essential KVs each virtual host passes on; ``None`` means
            ``n // 128``. ``0`` disables passing (Star attention).
        zigzag: ``True``: ``2H`` virtual hosts, virtual ``h`` and ``2H-1-h`` on physical host ``h``
            (balanced). ``False``: ``H`` virtual hosts, one contiguous block per host (APB, Star).
        fused_query: run the query block's projections in the same pass as the context
            (model-level: the benchmark layer stack; the HF path is always fused).
        overlap_comm: start collectives asynchronously and wait only where the result is needed.
        frame_parallel_vision: each host encodes ``F / H`` frames then all-gathers embeddings.
    """

    num_hosts: int
    anchor_len: int | None = None
    passing_len: int | None = None
    zigzag: bool = True
    fused_query: bool = True
    overlap_comm: bool = True
    frame_parallel_vision: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.num_hosts, bool) or not isinstance(self.num_hosts, int):
            raise TypeError(f"num_hosts: expected an int, got {type(self.num_hosts).__name__}")
        if self.num_hosts < 1:
            raise ValueError(f"num_hosts: expected >= 1, got {self.num_hosts}")
        for name in ("anchor_len", "passing_len"):
            val = getattr(self, name)
            if val is None:
                continue
            if isinstance(val, bool) or not isinstance(val, int):
                raise TypeError(f"{name}: expected an int or None, got {type(val).__name__}")
            if val < 0:
                raise ValueError(f"{name}: expected >= 0, got {val}")
        for name in ("zigzag", "fused_query", "overlap_comm", "frame_parallel_vision"):
            val = getattr(self, name)
            # "no" or 0 would be taken for their truth value and switch the layout silently
            if not isinstance(val, bool):
                raise TypeError(f"{name}: expected a bool, got {type(val).__name__} {val!r:.40}")

    @property
    def num_virtual(self) -> int:
        return 2 * self.num_hosts if self.zigzag else self.num_hosts

    def resolved(self, seq_len: int) -> tuple[int, int]:
        """``(anchor_len, passing_len)`` for a sequence of ``seq_len`` tokens (paper defaults)."""
        l_a = seq_len // 64 if self.anchor_len is None else self.anchor_len
        l_p = seq_len // 128 if self.passing_len is None else self.passing_len
        return l_a, l_p


def _check_config(config: object) -> None:
    if not isinstance(config, SpavaConfig):
        raise TypeError(f"config: expected a SpavaConfig, got {type(config).__name__}")


def star_config(num_hosts: int, *, anchor_len: int | None = None) -> SpavaConfig:
    """Star attention: anchor + local block, no passing, contiguous blocks."""
    return SpavaConfig(num_hosts=num_hosts, anchor_len=anchor_len, passing_len=0, zigzag=False)


def apb_config(
    num_hosts: int, *, anchor_len: int | None = None, passing_len: int | None = None
) -> SpavaConfig:
    """APB-style: contiguous blocks (no ZigZag), ``l_p = n / 64`` by default.

    ``passing_len=None`` is resolved to ``n // 64`` by :func:`resolve_apb` (a config cannot know n).
    """
    return SpavaConfig(
        num_hosts=num_hosts, anchor_len=anchor_len, passing_len=passing_len, zigzag=False
    )


def resolve_apb(config: SpavaConfig, seq_len: int) -> SpavaConfig:
    """Fix APB's default ``l_p = n // 64`` for a given length."""
    _check_config(config)
    if config.passing_len is not None:
        return config
    return SpavaConfig(
        num_hosts=config.num_hosts,
        anchor_len=config.anchor_len,
        passing_len=seq_len // 64,
        zigzag=config.zigzag,
        fused_query=config.fused_query,
        overlap_comm=config.overlap_comm,
        frame_parallel_vision=config.frame_parallel_vision,
    )
