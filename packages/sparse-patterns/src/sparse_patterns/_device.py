"""Host data onto the device without making the host wait for it."""

from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Host tensor ``t`` on ``device``. To CUDA it goes through pinned memory with
    ``non_blocking``: a plain ``.to("cuda")`` of pageable memory synchronises the stream after
    the copy, so the host would wait for every kernel queued before it."""
    device = torch.device(device)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def heads_index(hs: list[int], device: torch.device | str) -> slice | torch.Tensor:
    """Index of the heads ``hs`` along a head dim: a slice when they are consecutive (no index
    tensor at all), else an int64 tensor on ``device`` (a Python list as an index is copied to
    the device with a synchronisation)."""
    if hs == list(range(hs[0], hs[0] + len(hs))):
        return slice(hs[0], hs[0] + len(hs))
    return to_device(torch.tensor(hs, dtype=torch.int64), device)
