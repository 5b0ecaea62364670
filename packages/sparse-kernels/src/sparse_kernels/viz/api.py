"""Heatmaps of the tiles a sparse pattern computes: full, partial (element-masked) or skipped.

matplotlib is an optional extra (``pip install "sparse-kernels[viz]"``), imported only when a
picture is drawn; the block-state tables themselves need only torch.
"""

from __future__ import annotations

import os

import torch

SKIPPED, PARTIAL, FULL = 0, 1, 2
_LABELS = ("skipped", "partial", "full")
_COLORS = ("#f2f2f2", "#f4a259", "#2a6f97")


def _pick(t: torch.Tensor, batch: int, head: int) -> torch.Tensor:
    b = 0 if t.shape[0] == 1 else batch
    h = 0 if t.shape[1] == 1 else head
    if not (0 <= b < t.shape[0] and 0 <= h < t.shape[1]):
        raise ValueError(
            f"batch/head ({batch}, {head}) out of range for a mask of batch/head sizes "
            f"{tuple(t.shape[:2])}"
        )
    return t[b, h]


def block_states(
    mask, *, batch: int = 0, head: int = 0, block: int | tuple[int, int] = 64
) -> torch.Tensor:
    """``[NQB, NKB]`` int8 table of ``SKIPPED`` / ``PARTIAL`` / ``FULL`` for one (batch, head).

    ``mask`` is a FlexAttention ``BlockMask`` (listed full blocks are FULL, listed partial blocks
    PARTIAL, the rest SKIPPED; ``block`` is ignored, the mask's ``BLOCK_SIZE`` is used) or a dense
    bool tensor ``[S_Q, S_KV]`` or ``[B, H, S_Q, S_KV]`` tiled by ``block`` (a tile that is all
    True is FULL, some True PARTIAL, none SKIPPED).
    """
    if isinstance(mask, torch.Tensor):
        if mask.dtype != torch.bool or mask.ndim not in (2, 4):
            raise ValueError(
                f"mask: expected a bool tensor [S_Q, S_KV] or [B, H, S_Q, S_KV], got "
                f"{mask.dtype} with shape {tuple(mask.shape)}"
            )
        m = mask if mask.ndim == 2 else _pick(mask, batch, head)
        BM, BN = (block, block) if isinstance(block, int) else block
        S_Q, S_KV = m.shape
        nqb, nkb = -(-S_Q // BM), -(-S_KV // BN)
        pad = torch.zeros(nqb * BM, nkb * BN, dtype=torch.int32, device=m.device)
        pad[:S_Q, :S_KV] = m.to(torch.int32)
        cnt = pad.reshape(nqb, BM, nkb, BN).sum((1, 3))
        # tile sizes without the padding
        rows = torch.clamp(S_Q - torch.arange(nqb) * BM, max=BM)
        cols = torch.clamp(S_KV - torch.arange(nkb) * BN, max=BN)
        size = (rows[:, None] * cols[None, :]).to(cnt.device)
        out = torch.full((nqb, nkb), SKIPPED, dtype=torch.int8)
        out[(cnt > 0).cpu()] = PARTIAL
        out[(cnt == size).cpu()] = FULL
        return out
    if not hasattr(mask, "kv_num_blocks"):
        raise TypeError(
            f"mask: expected a flex_attention BlockMask or a bool tensor, got {type(mask).__name__}"
        )
    from ..block_sparse.reference import _listed_blocks

    nkb = int(mask.kv_indices.shape[-1])
    if mask.full_kv_indices is not None:
        nkb = max(nkb, int(mask.full_kv_indices.shape[-1]))
    seq = getattr(mask, "seq_lengths", None)
    if seq is not None:
        nkb = -(-int(seq[1]) // int(mask.BLOCK_SIZE[1]))
    part = _pick(_listed_blocks(mask.kv_num_blocks, mask.kv_indices, nkb), batch, head)
    out = torch.where(part.cpu(), PARTIAL, SKIPPED).to(torch.int8)
    if mask.full_kv_num_blocks is not None:
        full = _listed_blocks(mask.full_kv_num_blocks, mask.full_kv_indices, nkb)
        out[_pick(full, batch, head).cpu()] = FULL
    return out


def vertical_slash_block_states(index, *, batch: int = 0, head: int = 0) -> torch.Tensor:
    """``[NQB, NKB]`` int8 for a ``VerticalSlashIndex``: range tiles strictly below the diagonal
    FULL, range tiles on the diagonal and tiles holding leftover vertical columns (gathered
    columns, causal-masked) PARTIAL, the rest SKIPPED."""
    S, BM, BN = index.seq_len, index.block_m, index.block_n
    tiles = _pick(index.tile_mask(), batch, head).cpu()
    nqb, nkb = tiles.shape
    cc = _pick(index.column_count, batch, head).cpu()
    cols = _pick(index.columns, batch, head).cpu().to(torch.int64)
    valid = torch.arange(cols.shape[-1]) < cc[:, None]
    colblk = torch.zeros(nqb, nkb + 1, dtype=torch.bool)
    colblk.scatter_(-1, torch.where(valid, cols // BN, nkb), True)
    m = torch.arange(nqb)[:, None]
    n = torch.arange(nkb)[None, :]
    below = ((n + 1) * BN - 1 <= m * BM) & ((n + 1) * BN <= S)
    out = torch.full((nqb, nkb), SKIPPED, dtype=torch.int8)
    out[colblk[:, :nkb] | tiles] = PARTIAL
    out[tiles & below] = FULL
    return out


def _draw(states: torch.Tensor, path: str | os.PathLike, title: str | None, blocks) -> None:
    try:
        from matplotlib.colors import BoundaryNorm, ListedColormap
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as e:  # pragma: no cover - exercised through a monkeypatched import
        raise ImportError(
            "sparse_kernels.viz needs matplotlib: install the extra, "
            'pip install "sparse-kernels[viz]" (matplotlib>=3.8)'
        ) from e
    nqb, nkb = states.shape
    fig = Figure(figsize=(6, 6 * max(nqb, 1) / max(nkb, 1) + 0.8), dpi=120)
    ax = fig.add_subplot(1, 1, 1)
    cmap = ListedColormap(list(_COLORS))
    norm = BoundaryNorm([-0.5, 0.5, 1.5, 2.5], 3)
    ax.imshow(states.numpy(), cmap=cmap, norm=norm, interpolation="nearest", aspect="auto")
    ax.set_xlabel(f"key block (BLOCK_N={blocks[1]})")
    ax.set_ylabel(f"query block (BLOCK_M={blocks[0]})")
    frac = {lab: float((states == i).float().mean()) for i, lab in enumerate(_LABELS)}
    handles = [
        Patch(color=_COLORS[i], label=f"{lab} {100 * frac[lab]:.1f}%")
        for i, lab in enumerate(_LABELS)
    ]
    ax.legend(handles=handles, loc="upper right", fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(os.fspath(path), format="png")


def plot_block_mask(
    block_mask_or_dense_bool,
    path: str | os.PathLike,
    *,
    head: int = 0,
    batch: int = 0,
    title: str | None = None,
    block: int | tuple[int, int] = 64,
) -> torch.Tensor:
    """Write a PNG heatmap of :func:`block_states` for one (batch, head); return the states."""
    st = block_states(block_mask_or_dense_bool, batch=batch, head=head, block=block)
    bs = getattr(block_mask_or_dense_bool, "BLOCK_SIZE", block)
    bs = (bs, bs) if isinstance(bs, int) else tuple(bs)
    _draw(st, path, title, bs)
    return st


def plot_vertical_slash_index(
    index, path: str | os.PathLike, *, head: int = 0, batch: int = 0, title: str | None = None
) -> torch.Tensor:
    """Write a PNG heatmap of :func:`vertical_slash_block_states`; return the states."""
    st = vertical_slash_block_states(index, batch=batch, head=head)
    _draw(st, path, title, (index.block_m, index.block_n))
    return st
