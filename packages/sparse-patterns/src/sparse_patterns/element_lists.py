"""Block lists from element masks (the boundary heads): rows in permuted order, each chunk's
element mask reduced to blocks, then compacted by
:func:`~sparse_patterns.block_lists.lists_from_chunks`."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .block_lists import _CHUNK_ELEMS, lists_from_chunks


def element_block_mask(
    row_fn: Callable[[torch.Tensor], torch.Tensor],
    q_perm: torch.Tensor,
    kv_perm: torch.Tensor | None,
    N: int,
    S: int,
    blk: int,
) -> Callable[[int, int], torch.Tensor]:
    """Chunk function from an element mask: ``row_fn(rows) -> bool [N, R, S]`` for ORIGINAL
    rows (original key order); rows of the chunk are ``q_perm`` of the permuted rows; columns
    are reordered by ``kv_perm`` before the block reduction. Memory: ``N * chunk_rows * S``."""
    nkb = -(-S // blk)
    pad = nkb * blk - S

    def fn(m0: int, m1: int) -> torch.Tensor:
        r0, r1 = m0 * blk, min(m1 * blk, S)
        rows = q_perm[r0:r1].long()
        em = row_fn(rows)  # [N, R, S]
        if kv_perm is not None:
            em = em[..., kv_perm.long()]
        em = torch.nn.functional.pad(em, (0, pad, 0, (m1 - m0) * blk - (r1 - r0)))
        return em.reshape(N, m1 - m0, blk, nkb, blk).any(-1).any(2)

    return fn


def chunk_rows_step(N: int, S: int, blk: int) -> int:
    """Query blocks per chunk for element-level builders."""
    return max(1, _CHUNK_ELEMS // max(1, N * S * blk))


def lists_from_element_chunks(
    chunk_fn: Callable[[int, int], torch.Tensor], N: int, S: int, blk: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    nqb = nkb = -(-S // blk)
    step = chunk_rows_step(N, S, blk)
    idx_chunks, cnt_chunks = [], []
    for m0 in range(0, nqb, step):
        i, c = lists_from_chunks(
            lambda a, b, o=m0: chunk_fn(o + a, o + b), N, min(step, nqb - m0), nkb, device
        )
        idx_chunks.append(i)
        cnt_chunks.append(c)
    maxb = max(i.shape[-1] for i in idx_chunks)
    idx = torch.cat(
        [torch.nn.functional.pad(i, (0, maxb - i.shape[-1])) for i in idx_chunks], dim=1
    )
    return idx, torch.cat(cnt_chunks, dim=1)
