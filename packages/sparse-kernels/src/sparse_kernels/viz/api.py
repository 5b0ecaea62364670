"""Heatmaps of the tiles a sparse pattern computes: full, partial (element-masked) or skipped.

matplotlib is an optional extra (``pip install "sparse-kernels[viz]"``), imported only when a
picture is drawn; the block-state tables themselves need only torch.
"""

from __future__ import annotations

import os

import torch

SKIPPED, PARTIAL, FULL = 0, 1, 2
_LABELS = ("skipped", "partial (element-masked)", "full")
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


# Cells per axis drawn one-to-one; past it the grid is pooled (a 6-inch axis at 120 dpi gives
# each cell at least 1.8 pixels).
_MAX_CELLS = 400


def _pool_states(states: torch.Tensor, f: int) -> torch.Tensor:
    """Max-pool a state table by ``f`` along both axes: a cell shows the most computed tile of
    its ``f x f`` group (FULL > PARTIAL > SKIPPED)."""
    nqb, nkb = states.shape
    a, b = -(-nqb // f), -(-nkb // f)
    pad = torch.full((a * f, b * f), SKIPPED, dtype=torch.int8)
    pad[:nqb, :nkb] = states
    return pad.reshape(a, f, b, f).amax(dim=(1, 3))


def block_states_figure(
    states: torch.Tensor, *, block: int | tuple[int, int], title: str | None = None
):
    """A matplotlib ``Figure`` of a state table (:func:`block_states`): one cell per tile,
    shaped as the tile (``block`` = ``(BLOCK_M, BLOCK_N)`` tokens), or per ``f x f`` tiles
    (stated on the figure) past 400 tiles a side; a legend gives each state's share of the
    tiles."""
    if not isinstance(states, torch.Tensor) or states.ndim != 2 or states.dtype != torch.int8:
        raise ValueError(
            f"states: expected an int8 [NQB, NKB] table from block_states, got "
            f"{getattr(states, 'dtype', type(states).__name__)} with shape "
            f"{tuple(getattr(states, 'shape', ()))}"
        )
    try:
        from matplotlib.colors import BoundaryNorm, ListedColormap
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
        from matplotlib.ticker import MaxNLocator
    except ImportError as e:  # pragma: no cover - exercised through a monkeypatched import
        raise ImportError(
            "sparse_kernels.viz needs matplotlib: install the extra, "
            'pip install "sparse-kernels[viz]" (matplotlib>=3.8)'
        ) from e
    BM, BN = (block, block) if isinstance(block, int) else tuple(block)
    nqb, nkb = states.shape
    f = max(1, -(-max(nqb, nkb) // _MAX_CELLS))
    shown = _pool_states(states, f) if f > 1 else states
    rows, cols = shown.shape
    # Fixed margins in inches around an axes box whose cells have the tiles' shape (BM x BN
    # tokens), so that the picture keeps the geometry of the attention matrix.
    side = 6.0
    th, tw = rows * BM, cols * BN
    w, h = (side, side * th / tw) if tw >= th else (side * tw / th, side)
    w, h = max(w, 0.5), max(h, 0.5)
    left, right, top, bottom = 0.9, 0.3, 0.75, 1.15
    W = max(w + left + right, 6.0)
    H = h + top + bottom
    fig = Figure(figsize=(W, H), dpi=120)
    ax = fig.add_axes(((W - w) / 2 / W, bottom / H, w / W, h / H))
    ax.imshow(
        shown.numpy(),
        cmap=ListedColormap(list(_COLORS)),
        norm=BoundaryNorm([-0.5, 0.5, 1.5, 2.5], 3),
        interpolation="nearest",
        aspect="auto",
        extent=(-0.5, cols * f - 0.5, rows * f - 0.5, -0.5),
    )
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.set_xlabel(f"key block (BLOCK_N = {BN} tokens)")
    ax.set_ylabel(f"query block (BLOCK_M = {BM} tokens)")
    scale = f"1 cell = 1 tile of {BM}x{BN} tokens"
    if f > 1:
        scale = f"1 cell = {f}x{f} tiles of {BM}x{BN} tokens (the most computed shown)"
    head = f"{title}\n" if title else ""
    ax.set_title(f"{head}{nqb} x {nkb} tiles; {scale}", fontsize=10)
    share = [float((states == i).float().mean()) for i in range(3)]
    fig.legend(
        handles=[
            Patch(facecolor=_COLORS[i], edgecolor="0.5", label=f"{lab}: {100 * share[i]:.1f}%")
            for i, lab in enumerate(_LABELS)
        ],
        title="share of tiles",
        loc="lower center",
        bbox_to_anchor=(0.5, 0.0),
        ncols=3,
        fontsize=8,
        frameon=False,
    )
    return fig


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
    block_states_figure(st, block=bs, title=title).savefig(os.fspath(path), format="png")
    return st


def plot_vertical_slash_index(
    index, path: str | os.PathLike, *, head: int = 0, batch: int = 0, title: str | None = None
) -> torch.Tensor:
    """Write a PNG heatmap of :func:`vertical_slash_block_states`; return the states."""
    st = vertical_slash_block_states(index, batch=batch, head=head)
    fig = block_states_figure(st, block=(index.block_m, index.block_n), title=title)
    fig.savefig(os.fspath(path), format="png")
    return st
