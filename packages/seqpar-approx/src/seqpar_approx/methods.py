"""One entry point for every method's split of a sequence: Spava, its baselines and dense."""

from __future__ import annotations

from .config import SpavaConfig, apb_config, resolve_apb, star_config
from .layout import SpavaLayout, build_layout, ring_layout

METHODS = ("spava", "ring", "star", "apb", "dense")


def layout_for(
    method: str, seq_len: int, *, query_len: int, num_hosts: int, config: SpavaConfig | None = None
) -> tuple[SpavaLayout | None, SpavaConfig | None]:
    """``(layout, config)`` of a method for one prompt (``config`` overrides spava's defaults)."""
    if method == "dense":
        return None, config
    if method == "ring":
        return ring_layout(seq_len, num_hosts=num_hosts), config or SpavaConfig(num_hosts=num_hosts)
    if method == "star":
        cfg = star_config(num_hosts, anchor_len=config.anchor_len if config else None)
    elif method == "apb":
        cfg = apb_config(
            num_hosts,
            anchor_len=config.anchor_len if config else None,
            passing_len=config.passing_len if config else None,
        )
        cfg = resolve_apb(cfg, seq_len)
    elif method == "spava":
        cfg = config or SpavaConfig(num_hosts=num_hosts)
    else:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    if cfg.num_hosts != num_hosts:
        raise ValueError(f"config.num_hosts={cfg.num_hosts} but the group has {num_hosts} ranks")
    return build_layout(seq_len, query_len=query_len, config=cfg), cfg
