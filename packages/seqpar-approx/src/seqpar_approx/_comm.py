"""Collectives used by the attention functions: all-gather with an optional async handle."""

from __future__ import annotations

import torch
import torch.distributed as dist


class Pending:
    """An all-gather in flight: ``wait()`` returns one tensor per rank (rank order)."""

    def __init__(self, work, chunks: list[torch.Tensor]):
        self._work = work
        self._chunks = chunks

    def wait(self) -> list[torch.Tensor]:
        if self._work is not None:
            self._work.wait()
            self._work = None
        return self._chunks


def world(group) -> tuple[int, int]:
    """``(rank, size)`` of this process in ``group`` (``(0, 1)`` without torch.distributed)."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def all_gather(t: torch.Tensor, group, *, async_op: bool) -> Pending:
    """All-gather ``t`` (same shape on every rank). NCCL uses ``all_gather_into_tensor`` into one
    buffer; other backends (gloo) the list form."""
    t = t.contiguous()
    _, size = world(group)
    if size == 1:
        return Pending(None, [t])
    if dist.get_backend(group) == "nccl":
        buf = torch.empty((size, *t.shape), dtype=t.dtype, device=t.device)
        work = dist.all_gather_into_tensor(buf, t, group=group, async_op=async_op)
        return Pending(work, list(buf.unbind(0)))
    chunks = [torch.empty_like(t) for _ in range(size)]
    work = dist.all_gather(chunks, t, group=group, async_op=async_op)
    return Pending(work, chunks)


def all_gather_uneven(t: torch.Tensor, lengths: list[int], group, *, dim: int = 0) -> torch.Tensor:
    """Concatenate along ``dim`` the tensors of every rank, rank ``r`` contributing ``lengths[r]``
    rows (padded to the longest for the collective, trimmed after)."""
    rank, size = world(group)
    if t.shape[dim] != lengths[rank]:
        raise ValueError(
            f"all_gather_uneven: rank {rank} expected {lengths[rank]} rows at dim {dim}, "
            f"got {t.shape[dim]}"
        )
    if size == 1:
        return t
    m = max(lengths)
    pad_shape = list(t.shape)
    pad_shape[dim] = m - t.shape[dim]
    padded = torch.cat([t, t.new_zeros(pad_shape)], dim=dim) if pad_shape[dim] else t
    chunks = all_gather(padded, group, async_op=False).wait()
    return torch.cat([c.narrow(dim, 0, n) for c, n in zip(chunks, lengths)], dim=dim)
