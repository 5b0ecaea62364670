"""Block lists of the non-Grid patterns: per query block the listed key blocks, built for every
head at once, in chunks of query blocks (bounded memory at 1M tokens).

Two ways in: a chunk function ``fn(m0, m1) -> bool [N, m1 - m0, NKB]`` (a block mask:
:func:`static_block_mask`, :func:`vertical_slash_block_mask`) compacted by
:func:`lists_from_chunks`; or, for patterns made of key-block columns and block diagonals
(Vertical-Slash, A-shape), :func:`line_block_lists` merging the two sorted sets by ranks without
an ``NQB x NKB`` mask. The element-level builders of the boundary heads are in
:mod:`sparse_patterns.element_lists`. Lists are
``([N, NQB, MAXB] int32, [N, NQB] int32)``; the element masks of the patterns are rounded UP to
blocks. :func:`best_block_runs`: per head, the key blocks that are runs of original keys (the
kernel loads those without the key permutation).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from sparse_kernels.permuted.perms import block_lists_from_mask, compact_by_mask, host_ints

from ._device import to_device

# Element budget of one chunk of a block-mask or element-mask builder (bools).
_CHUNK_ELEMS = 1 << 27


def best_block_runs(
    kv_perm: torch.Tensor, blk: int, stride: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head, the key blocks of ``kv_perm`` (int ``[..., S]``) that are runs of step 1, or of
    step = the head's ``stride`` (int ``[...]``; heads with a stride > 1) when that step gives it
    more runs. Returns ``(runs, step)``: int32 ``[..., NKB]`` as
    ``sparse_kernels.permuted.kv_block_runs`` and int64 ``[...]``. No host reads."""
    from sparse_kernels.permuted import kv_block_runs

    runs = kv_block_runs(kv_perm, blk)
    step = torch.ones(kv_perm.shape[:-1], dtype=torch.int64, device=kv_perm.device)
    if stride is None:
        return runs, step
    grid = torch.where(stride > 1, stride, 1).to(kv_perm.device).expand(step.shape)
    grid_runs = kv_block_runs(kv_perm, blk, grid)
    use_grid = (grid_runs >= 0).sum(-1) > (runs >= 0).sum(-1)
    return torch.where(use_grid[..., None], grid_runs, runs), torch.where(use_grid, grid, step)


# ---------------------------------------------------------------------------------------------
# Block mask -> lists


def lists_from_chunks(
    chunk_fn: Callable[[int, int], torch.Tensor], N: int, nqb: int, nkb: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Call ``chunk_fn(m0, m1) -> bool [N, m1 - m0, NKB]`` over query-block chunks and turn
    the block mask into index lists ``([N, NQB, MAXB] int32, [N, NQB] int32)``."""
    step = max(1, _CHUNK_ELEMS // max(1, N * nkb * 8))
    idx_chunks, cnt_chunks = [], []
    for m0 in range(0, nqb, step):
        m1 = min(nqb, m0 + step)
        order, cnt = block_lists_from_mask(chunk_fn(m0, m1))
        idx_chunks.append(order)
        cnt_chunks.append(cnt)
    maxb = max(1, max(c.shape[-1] for c in idx_chunks))
    idx = torch.zeros(N, nqb, maxb, dtype=torch.int32, device=device)
    m0 = 0
    for c in idx_chunks:
        idx[:, m0 : m0 + c.shape[1], : c.shape[2]] = c
        m0 += c.shape[1]
    return idx, torch.cat(cnt_chunks, dim=1)


def _block_ranges(m0: int, m1: int, nkb: int, S: int, blk: int, device):
    mq = torch.arange(m0, m1, device=device)[:, None]
    n = torch.arange(nkb, device=device)[None, :]
    i_lo, i_hi = mq * blk, torch.clamp((mq + 1) * blk, max=S) - 1
    j_lo, j_hi = n * blk, torch.clamp((n + 1) * blk, max=S) - 1
    return i_lo, i_hi, j_lo, j_hi


def _col(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, 1, 1)


# ---------------------------------------------------------------------------------------------
# Static patterns, original order (params: [N] int64 tensors)


def static_block_mask(kind: str, params: dict[str, torch.Tensor], S: int, blk: int):
    """Chunk function for a static pattern in original order (``kind`` as in the specs)."""

    def fn(m0: int, m1: int) -> torch.Tensor:
        dev = next(iter(params.values())).device if params else torch.device("cpu")
        i_lo, i_hi, j_lo, j_hi = _block_ranges(m0, m1, -(-S // blk), S, blk, dev)
        causal = (j_lo <= i_hi)[None]
        dmin, dmax = (i_lo - j_hi)[None], (i_hi - j_lo)[None]
        if kind == "dense":
            n = next(iter(params.values())).numel() if params else 1
            return causal.expand(n, -1, -1).clone()
        if kind in ("a_shape", "tri_shape"):
            sink, win = _col(params["sink"]), _col(params["window"])
            m = (j_lo[None] < sink) | ((dmax >= 0) & (dmin <= win - 1))
            if kind == "tri_shape":
                m = m | (i_hi[None] >= S - _col(params["last"]))
            return m & causal
        if kind == "sf_fixed":
            L, vs = _col(params["local"]), _col(params["vline_stride"])
            local = ((i_lo[None] // L) <= (j_hi[None] // L)) & (
                (j_lo[None] // L) <= (i_hi[None] // L)
            )
            j0 = j_lo[None] + torch.remainder(vs - 1 - j_lo[None], vs)
            vline = (j0 <= j_hi[None]) & (j0 <= i_hi[None])
            return (local | vline) & causal
        if kind == "sf_strided":
            L, vs = _col(params["local"]), _col(params["vline_stride"])
            local = (dmax >= 0) & (dmin <= L - 1)
            d0 = dmin.clamp_min(0)
            first = (d0 + vs - 1) // vs * vs
            return (local | (first <= dmax)) & causal
        raise NotImplementedError(f"static_block_mask: unknown kind {kind!r}")

    return fn


# ---------------------------------------------------------------------------------------------
# Vertical-Slash, original order


def vertical_slash_block_mask(
    vertical: torch.Tensor, slash: torch.Tensor, S: int, blk: int
) -> Callable[[int, int], torch.Tensor]:
    """Chunk function: key columns ``vertical`` and diagonals ``slash`` (int64 ``[N, NV]``,
    ``[N, NS]``, entries < 0 ignored) rounded up to blocks, causal.

    Built from two per-head block vectors, not per query block: a column ``v`` lists block
    ``v // blk`` in every query block ``m >= v // blk``; a diagonal ``o`` crosses query block
    ``m`` in key blocks ``m - floor(o / blk)`` and ``m - ceil(o / blk)`` (those ``>= 0``). Only a
    partial last query block (``S % blk != 0``) sees fewer keys; its row is built directly.
    """
    nkb = -(-S // blk)
    N = vertical.shape[0]
    dev = vertical.device
    vb = torch.zeros(N, nkb + 1, dtype=torch.bool, device=dev)
    vb.scatter_(-1, torch.where(vertical >= 0, vertical // blk, nkb).clamp(max=nkb), True)
    db = torch.zeros(N, nkb + 1, dtype=torch.bool, device=dev)  # block distances m - n
    ok = slash >= 0
    db.scatter_(-1, torch.where(ok, slash // blk, nkb).clamp(max=nkb), True)
    db.scatter_(-1, torch.where(ok, -(-slash // blk), nkb).clamp(max=nkb), True)
    vb, db = vb[:, :nkb], db[:, :nkb]

    def last_row(m: int) -> torch.Tensor:
        i_lo, i_hi = m * blk, S - 1
        out = torch.zeros(N, nkb + 1, dtype=torch.bool, device=dev)
        okv = (vertical >= 0) & (vertical <= i_hi)
        out.scatter_(-1, torch.where(okv, vertical // blk, nkb), True)
        hi = i_hi - slash
        oks = (slash >= 0) & (hi >= 0)
        out.scatter_(-1, torch.where(oks, (i_lo - slash).clamp_min(0) // blk, nkb), True)
        out.scatter_(-1, torch.where(oks, hi.clamp_min(0) // blk, nkb), True)
        return out[:, :nkb]

    def fn(m0: int, m1: int) -> torch.Tensor:
        d = torch.arange(m0, m1, device=dev)[:, None] - torch.arange(nkb, device=dev)[None, :]
        causal = d >= 0
        diag = db.gather(-1, d.clamp_min(0).reshape(1, -1).expand(N, -1)).reshape(N, m1 - m0, nkb)
        out = (vb[:, None, :] | diag) & causal
        if S % blk and m1 == nkb:
            out[:, -1] = last_row(nkb - 1)
        return out

    return fn


# Element budget of one chunk of :func:`line_block_lists` (int64 temporaries, several per chunk).
_LINE_CHUNK_ELEMS = 1 << 25


def _sorted_unique(x: torch.Tensor, pad: int, *, descending: bool = False) -> torch.Tensor:
    """Per row, the distinct values of ``x`` sorted, the repeats replaced by ``pad`` (which
    sorts to the end ascending, to the front descending). ``x`` may already hold ``pad``."""
    x = torch.sort(x, dim=-1).values
    rep = torch.zeros_like(x, dtype=torch.bool)
    rep[:, 1:] = x[:, 1:] == x[:, :-1]
    x = torch.sort(torch.where(rep, pad, x), dim=-1, descending=descending).values
    return x


def line_block_lists(
    vblk: torch.Tensor, dist: torch.Tensor, m0: int, m1: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block lists of query blocks ``m0 <= m < m1`` for patterns made of key-block columns and
    block diagonals: row ``m`` lists every column block ``n`` in ``vblk`` with ``n <= m`` and every
    ``m - d`` for ``d`` in ``dist`` with ``d <= m``, once each, in increasing order.

    Args:
        vblk: int64 ``[N, A]``, per row sorted ascending and distinct; entries ``>= m1`` are
            padding (never listed).
        dist: int64 ``[N, C]``, per row sorted descending and distinct; entries ``>= m1`` are
            padding.

    Returns:
        int32 ``[N, m1 - m0, max(1, max count)]`` (listed blocks first, then zeros) and int32
        counts ``[N, m1 - m0]``: what :func:`lists_from_chunks` gives for the same block mask,
        built by ranks in ``O(rows * (A + C))``, not from an ``NQB x NKB`` mask. The two sorted
        sets of a row are merged by counting, for each entry, the entries of the other set below
        it (``searchsorted``); a diagonal block that is also a column block is listed once.
    """
    return _trim(*_line_lists_wide(vblk, dist, m0, m1))


def _trim(idx: torch.Tensor, cnt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut lists to the longest count (one read-back), at least 1 wide."""
    width = max(1, *host_ints(cnt.max())) if cnt.numel() else 1
    if idx.shape[-1] < width:
        raise AssertionError(f"block lists: width {idx.shape[-1]} holds fewer than {width}")
    return idx[..., :width].contiguous(), cnt


def _line_lists_wide(
    vblk: torch.Tensor,
    dist: torch.Tensor,
    m0: int,
    m1: int,
    *,
    chunk_elems: int = _LINE_CHUNK_ELEMS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`line_block_lists` at the bound width ``A + C`` (no read-back), ``chunk_elems``
    elements per chunk of rows."""
    N, A = vblk.shape
    C = dist.shape[1]
    W = A + C
    dev = vblk.device
    step = max(1, chunk_elems // max(1, N * W))
    ar_a = torch.arange(A, device=dev, dtype=torch.int32)
    idx_chunks, cnt_chunks = [], []
    for r0 in range(m0, m1, step):
        r1 = min(m1, r0 + step)
        R = r1 - r0
        m = torch.arange(r0, r1, device=dev)
        sblk = m[None, :, None] - dist[:, None, :]  # [N, R, C], ascending along C
        below = torch.searchsorted(vblk, sblk.reshape(N, R * C)).reshape(N, R, C)  # #cols < s
        dup = vblk.gather(1, below.clamp(max=A - 1).reshape(N, -1)).reshape(N, R, C) == sblk
        ok_s = (sblk >= 0) & ~dup
        cs = ok_s.cumsum(-1, dtype=torch.int32)  # listed diagonals up to and including each
        rank_s = cs - ok_s.int() + below.int()
        ok_v = vblk[:, None, :] <= m[None, :, None]  # [N, R, A]: a prefix of each row
        vals = vblk[:, None, :].expand(N, R, A).reshape(N * R, A).contiguous()
        pos = torch.searchsorted(sblk.reshape(N * R, C), vals, out_int32=True)  # cands < v
        cs0 = torch.nn.functional.pad(cs, (1, 0))  # cs0[p] = listed among the first p
        rank_v = ar_a + cs0.gather(-1, pos.reshape(N, R, A).long())
        out = torch.zeros(N, R, W + 1, dtype=torch.int32, device=dev)
        vv = vblk[:, None, :].expand(N, R, A).int()
        out.scatter_(-1, torch.where(ok_v, rank_v, W).long(), vv)
        out.scatter_(-1, torch.where(ok_s, rank_s, W).long(), sblk.int())
        idx_chunks.append(out[..., :W])
        cnt_chunks.append(ok_v.sum(-1, dtype=torch.int32) + cs[..., -1])
    if not idx_chunks:  # no rows (a sequence shorter than one block has only a partial row)
        return (
            torch.zeros(N, 0, W, dtype=torch.int32, device=dev),
            torch.zeros(N, 0, dtype=torch.int32, device=dev),
        )
    return torch.cat(idx_chunks, dim=1), torch.cat(cnt_chunks, dim=1)


_PATHS = ("auto", "lines", "mask")


def _use_lines(path: str, width: int, nkb: int) -> bool:
    """``auto``: the line path once its candidates per row (``width``) are at most half the key
    blocks. On an H100 (``benchmarks/list_builders.py``) it was slower at 128K tokens for
    ~2000-3000 candidates in 2048 key blocks, and 1.3-4x faster at 512K-1M (8192-16384)."""
    if path not in _PATHS:
        raise ValueError(f"path: expected one of {_PATHS}, got {path!r}")
    return path == "lines" or (path == "auto" and 2 * width <= nkb)


def vertical_slash_lists(
    vertical: torch.Tensor,
    slash: torch.Tensor,
    S: int,
    blk: int,
    *,
    path: str = "auto",
    line_chunk_elems: int = _LINE_CHUNK_ELEMS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The block lists of :func:`vertical_slash_block_mask` (exactly: same indices, counts and
    width). ``path="lines"`` builds them from the columns' blocks and the diagonals' block
    distances by :func:`line_block_lists`, ``"mask"`` compacts the ``NQB x NKB`` block mask in
    chunks (at 1M tokens 2.7e8 entries per head), ``"auto"`` picks by :func:`_use_lines`. On the
    line path a partial last query block (``S % blk != 0``), which sees fewer keys, still comes
    from the mask. ``line_chunk_elems``: the line path's element budget per chunk of rows."""
    if line_chunk_elems < 1:
        raise ValueError(f"line_chunk_elems: expected a positive count, got {line_chunk_elems}")
    nkb = -(-S // blk)
    if not _use_lines(path, vertical.shape[1] + 2 * slash.shape[1], nkb):
        fn = vertical_slash_block_mask(vertical, slash, S, blk)
        return lists_from_chunks(fn, vertical.shape[0], nkb, nkb, vertical.device)
    if vertical.shape[1] == 0 or slash.shape[1] == 0:  # an empty set: one ignored (-1) entry
        pad = torch.nn.functional.pad
        vertical = pad(vertical, (0, int(vertical.shape[1] == 0)), value=-1)
        slash = pad(slash, (0, int(slash.shape[1] == 0)), value=-1)
    vblk = _sorted_unique(torch.where(vertical >= 0, vertical // blk, nkb), nkb)
    ok = slash >= 0
    d = torch.cat([torch.where(ok, slash // blk, nkb), torch.where(ok, -(-slash // blk), nkb)], 1)
    dist = _sorted_unique(d.clamp(max=nkb), nkb, descending=True)
    full = nkb if S % blk == 0 else nkb - 1
    idx, cnt = _line_lists_wide(vblk, dist, 0, full, chunk_elems=line_chunk_elems)
    if full < nkb:  # one block per column, two per diagonal at most: A + C holds the row
        fn = vertical_slash_block_mask(vertical, slash, S, blk)
        row = fn(full, nkb)
        cols = torch.arange(nkb, dtype=torch.int32, device=row.device).expand_as(row)
        last = compact_by_mask(row, cols, width=idx.shape[-1])
        idx, cnt = torch.cat([idx, last[0]], dim=1), torch.cat([cnt, last[1]], dim=1)
    return _trim(idx, cnt)


def a_shape_lists(
    sink: list[int], window: list[int], S: int, blk: int, device, *, path: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The block lists of ``static_block_mask("a_shape", ...)`` (exactly), per row ``n`` of the
    lists with ``sink[n]``, ``window[n]`` (Python ints); ``path`` as in
    :func:`vertical_slash_lists`. On the line path, with full query blocks the sink covers
    column blocks ``n < ceil(sink / blk)`` and the window the distances
    ``0 .. floor((window + blk - 2) / blk)``; the partial last query block, if any, lists the
    same blocks (its keys end earlier, but every listed block still starts at or before its last
    row), and the lists' width comes from the sinks and windows: no read-back."""
    if len(sink) != len(window) or not sink:
        raise ValueError(f"a_shape_lists: expected one window per sink, got {len(sink)} sinks "
                         f"and {len(window)} windows")  # fmt: skip
    nkb = -(-S // blk)
    sb = [max(0, min(nkb, -(-s // blk))) for s in sink]
    # Distances d whose nearest pair lies in the window: d * blk - (blk - 1) <= window - 1.
    dw = [min(nkb - 1, (w + blk - 2) // blk) for w in window]
    A, C = max(1, *sb), max(1, *(d + 1 for d in dw))
    if not _use_lines(path, A + C, nkb):
        p = {
            "sink": to_device(torch.tensor(sink), device),
            "window": to_device(torch.tensor(window), device),
        }
        return lists_from_chunks(
            static_block_mask("a_shape", p, S, blk), len(sink), nkb, nkb, device
        )
    ar_a, ar_c = torch.arange(A), torch.arange(C - 1, -1, -1)
    vblk = torch.where(ar_a[None] < torch.tensor(sb)[:, None], ar_a[None], nkb)
    dist = torch.where(ar_c[None] <= torch.tensor(dw)[:, None], ar_c[None], nkb)
    idx, cnt = _line_lists_wide(to_device(vblk, device), to_device(dist, device), 0, nkb)
    # A row's count never falls as the row grows, so the last row (m = nkb - 1) is the longest:
    # its sb sink blocks and dw + 1 window blocks, less the sink blocks inside the window. Known
    # on the host, so the lists are cut without reading the counts back.
    last = (s + d + 1 - max(0, s - (nkb - 1 - d)) for s, d in zip(sb, dw))
    return idx[..., : max(1, *last)].contiguous(), cnt
