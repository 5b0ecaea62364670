"""Content checks of a ``SparsePlan``'s index tensors, evaluated on their device.

Every condition is reduced to one flag on the device; the flags are read back together (one
host synchronisation per ``SparsePlan.check``). Only when a flag is set are the details (which entry, which
value) read back for the error message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from .reference import MAX_MODALITIES

if TYPE_CHECKING:
    from ..sparse_plan import SparsePlan

# (flag: 0-d bool tensor, message builder called only when the flag is set)
Check = tuple[torch.Tensor, Callable[[], str]]


def _first(bad: torch.Tensor) -> list[int]:
    """The index of the first set entry of ``bad`` (error path only: reads back)."""
    return bad.nonzero()[0].tolist()


def _at(bad: torch.Tensor, values: torch.Tensor) -> tuple[int, list[int]]:
    where = _first(bad)
    return int(values.expand(bad.shape)[tuple(where)]), where


def range_check(t: torch.Tensor, name: str, lo: int, hi: int | None, expected: str) -> Check:
    """Every entry of ``t`` in ``[lo, hi)`` (``hi=None``: no upper bound); ``expected``
    describes the allowed values."""
    bad = t < lo if hi is None else (t < lo) | (t >= hi)

    def message() -> str:
        val, where = _at(bad, t)
        return f"{name}: expected {expected}, got {val} at {where}"

    return bad.any(), message


def perm_check(perm: torch.Tensor, name: str) -> list[Check]:
    """``perm [..., S]`` is a permutation of ``0..S-1`` along its last dim: entries in range and
    each value hit exactly once (a scatter-add of ones, ``O(S)`` per row)."""
    S = perm.shape[-1]
    expected = f"a permutation of 0..{S - 1} along the last dim (every entry in [0, {S}))"
    in_range = range_check(perm, name, 0, S, expected)
    idx = perm.long().clamp(0, S - 1)
    hits = torch.zeros(perm.shape, dtype=torch.int32, device=perm.device)
    hits.scatter_add_(-1, idx, torch.ones_like(idx, dtype=torch.int32))
    bad = hits != 1

    def message() -> str:
        where = _first(bad)
        row = tuple(where[:-1])
        value, times = where[-1], int(hits[row + (where[-1],)])
        missing = int((hits[row] == 0).sum())
        at = f" in row {list(row)}" if row else ""
        return (
            f"{name}: expected a permutation of 0..{S - 1} along the last dim (every index "
            f"exactly once), got {value} {times} times{at} ({missing} of 0..{S - 1} missing)"
        )

    return [in_range, (bad.any(), message)]


def counted_checks(
    entries: torch.Tensor,
    counts: torch.Tensor,
    names: tuple[str, str, str],
    what: str,
    limit: int,
) -> tuple[list[Check], torch.Tensor]:
    """A padded list (``entries [..., W]`` of which the first ``counts [...]`` are read): counts
    in ``[0, W]`` and read entries in ``[0, limit)``. ``names``: the entries', the counts' and
    the width's names in the messages. Returns the checks and the read-entry mask."""
    ename, cname, wname = names
    width = entries.shape[-1]
    count_ok = range_check(counts, cname, 0, width + 1, f"values in [0, {wname}={width}]")
    listed = torch.arange(width, device=entries.device) < counts[..., None].long()
    bad = listed & ((entries < 0) | (entries >= limit))

    def message() -> str:
        val, where = _at(bad, entries)
        return f"{ename}: expected {what} in [0, {limit}), got {val} at {where}"

    return [count_ok, (bad.any(), message)], listed


def unique_blocks_check(lists: list[tuple[torch.Tensor, torch.Tensor]]) -> Check:
    """No key block listed twice for one query block, within a list or across the lists
    (``(entries, listed mask)`` pairs of broadcastable leading dims): the kernel would add it
    twice. One sort per query block's concatenated lists."""
    shape = torch.broadcast_shapes(*(i.shape[:-1] for i, _ in lists))
    idx = torch.cat([i.long().expand(*shape, -1) for i, _ in lists], dim=-1)
    listed = torch.cat([m.expand(*shape, -1) for _, m in lists], dim=-1)
    # Unlisted slots get distinct negative keys so that they never compare equal.
    keyed = torch.where(listed, idx, -1 - torch.arange(idx.shape[-1], device=idx.device))
    s = torch.sort(keyed, dim=-1).values
    bad = s[..., 1:] == s[..., :-1]

    def message() -> str:
        where = _first(bad)
        block = int(s[tuple(where)])
        times = int((keyed[tuple(where[:-1])] == block).sum())
        return (
            "kv_indices / full_kv_indices: expected each key block at most once "
            f"per query block (over both lists), got key block {block} listed {times} times "
            f"for [b, h, query block] = {where[:-1]}"
        )

    return bad.any(), message


def inverse_check(perm: torch.Tensor, inv: torch.Tensor, name: str, of: str) -> list[Check]:
    """``inv`` is the inverse of the permutation ``perm`` (same shape): entries in range and
    ``perm[inv[i]] == i`` for every ``i``."""
    S = inv.shape[-1]
    in_range = range_check(inv, name, 0, S, f"the inverse of {of} (every entry in [0, {S}))")
    back = perm.long().gather(-1, inv.long().clamp(0, S - 1))
    bad = back != torch.arange(S, device=inv.device)

    def message() -> str:
        where = _first(bad)
        return (
            f"{name}: expected the inverse of {of} ({of}[{name}[i]] == i), got "
            f"{of}[{name}[{where[-1]}]] = {int(back[tuple(where)])} at {where}"
        )

    return [in_range, (bad.any(), message)]


def modality_check(mod: torch.Tensor, name: str) -> Check:
    return range_check(mod, name, 0, MAX_MODALITIES, f"modality ids in [0, {MAX_MODALITIES})")


def plan_checks(plan: SparsePlan) -> list[Check]:
    """The content checks of every index tensor of ``plan`` (see ``SparsePlan.check``), not yet
    read back."""
    found = []
    for side in ("q", "kv"):
        perm, inv = getattr(plan, f"{side}_perm"), getattr(plan, f"{side}_perm_inv")
        if perm is not None:
            found += perm_check(perm, f"{side}_perm")
        if inv is not None:
            found += inverse_check(perm, inv, f"{side}_perm_inv", f"{side}_perm")
    if plan.q_modality is not None:
        found.append(modality_check(plan.q_modality, "q_modality"))
        found.append(modality_check(plan.kv_modality, "kv_modality"))
    listed = []
    for prefix in ("", "full_"):
        idx, cnt = getattr(plan, f"{prefix}kv_indices"), getattr(plan, f"{prefix}kv_num_blocks")
        if idx is not None:
            names = (f"{prefix}kv_indices", f"{prefix}kv_num_blocks", "W")
            got, mask = counted_checks(idx, cnt, names, "listed key blocks", plan.num_kv_blocks)
            found += got
            listed.append((idx, mask))
    # A key block listed twice for one query block (in one list, or in both) would be summed
    # twice by the kernel.
    found.append(unique_blocks_check(listed))
    if plan.kv_run_starts is not None:
        names = ("kv_run_starts", "kv_run_counts", "R")
        got, _ = counted_checks(plan.kv_run_starts, plan.kv_run_counts, names,
                                "original key positions", plan.seq_lengths[1])  # fmt: skip
        found += got
        if isinstance(plan.kv_run_step, torch.Tensor):
            found.append(range_check(plan.kv_run_step, "kv_run_step", 1, None, "steps >= 1"))
    return found


def raise_first(checks: list[Check]) -> None:
    """Read every flag back at once; raise ``ValueError`` with the first failed check's message."""
    if not checks:
        return
    flags = torch.stack([f.reshape(()) for f, _ in checks]).tolist()
    for failed, (_, message) in zip(flags, checks):
        if failed:
            raise ValueError(message())
