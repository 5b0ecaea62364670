"""Vertical-slash index build: indices -> per-query-block key-block ranges + leftover columns.

Every (batch, head) at once, on the indices' device: by Triton kernels (``index_triton`` for the
slash tiles and ranges, ``columns_triton`` for the leftover columns; ``impl="triton"``, what
``"auto"`` runs on CUDA) or by torch ops (``impl="reference"``, what ``"auto"`` runs elsewhere),
which build the same index with ``[B*H, NQB, NV]`` intermediates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._validate import check_bool, resolve_impl

_OP = "build_vertical_slash_index"
SUPPORTED_BLOCKS = (64, 128)


@dataclass(frozen=True)
class VerticalSlashIndex:
    """What the vertical-slash kernel executes, per (batch, head, query block ``m``).

    Attributes:
        seq_len, block_m, block_n: ``S`` and the tile sizes (query rows / key columns per block).
        range_count: ``[B, H, NQB]`` int32, number of key-block ranges of each query block.
        range_start, range_end: ``[B, H, NQB, R]`` int32, ranges ``[start, end)`` of key-block
            indices (merged: disjoint, ascending, non-adjacent); entries past ``range_count`` are
            padding. These tiles are computed densely (causal mask on the diagonal).
        column_count: ``[B, H, NQB]`` int32, number of leftover vertical columns.
        columns: ``[B, H, NQB, C]`` int32, ascending key columns ``j`` with ``j <= last row of the
            block`` that are not inside a range; entries past ``column_count`` are padding.
    """

    seq_len: int
    block_m: int
    block_n: int
    range_count: torch.Tensor
    range_start: torch.Tensor
    range_end: torch.Tensor
    column_count: torch.Tensor
    columns: torch.Tensor

    def tile_mask(self) -> torch.Tensor:
        """``[B, H, NQB, NKB]`` bool: the key blocks covered by the ranges."""
        # A difference array over key blocks (+1 where a range starts, -1 where it ends), so
        # memory is one int32 per (query block, key block), not one per range as well.
        nkb = -(-self.seq_len // self.block_n)
        dev = self.range_start.device
        R = self.range_start.shape[-1]
        s = self.range_start.to(torch.int64).clamp(0, nkb)
        e = self.range_end.to(torch.int64).clamp(0, nkb)
        valid = (torch.arange(R, device=dev) < self.range_count[..., None]) & (e > s)
        one = valid.to(torch.int32)
        diff = torch.zeros(*s.shape[:-1], nkb + 1, dtype=torch.int32, device=dev)
        diff.scatter_add_(-1, torch.where(valid, s, nkb), one)
        diff.scatter_add_(-1, torch.where(valid, e, nkb), -one)
        return diff[..., :nkb].cumsum(-1, dtype=torch.int32) > 0

    def to_dense(self) -> torch.Tensor:
        """``[B, H, S, S]`` bool: the exact attended set this index executes (causal)."""
        S, BM, BN = self.seq_len, self.block_m, self.block_n
        tiles = self.tile_mask()
        dense = tiles.repeat_interleave(BM, dim=2).repeat_interleave(BN, dim=3)[..., :S, :S]
        C = self.columns.shape[-1]
        valid = torch.arange(C, device=tiles.device) < self.column_count[..., None]
        cols = torch.zeros(*tiles.shape[:3], S + 1, dtype=torch.bool, device=tiles.device)
        cols.scatter_(-1, torch.where(valid, self.columns.to(torch.int64), S), True)
        dense = dense | cols[..., :S].repeat_interleave(BM, dim=2)[..., :S, :]
        causal = torch.ones(S, S, dtype=torch.bool, device=tiles.device).tril()
        return dense & causal

    def to_block_mask(self):
        """FlexAttention ``BlockMask`` with the same attended set (for comparisons).

        Range tiles entirely below the diagonal are full blocks; diagonal range tiles and blocks
        holding leftover columns are partial, with a ``mask_mod`` that evaluates the exact set.
        """
        from torch.nn.attention.flex_attention import BlockMask

        S, BM, BN = self.seq_len, self.block_m, self.block_n
        dev = self.range_start.device
        B, H, nqb = self.range_count.shape
        nkb = -(-S // BN)
        tiles = self.tile_mask()
        C = self.columns.shape[-1]
        valid = torch.arange(C, device=dev) < self.column_count[..., None]
        colblk = torch.zeros(B, H, nqb, nkb + 1, dtype=torch.bool, device=dev)
        colblk.scatter_(-1, torch.where(valid, self.columns.to(torch.int64) // BN, nkb), True)
        colblk = colblk[..., :nkb]
        m = torch.arange(nqb, device=dev)[:, None]
        n = torch.arange(nkb, device=dev)[None, :]
        below = ((n + 1) * BN - 1 <= m * BM) & ((n + 1) * BN <= S)
        full = tiles & below
        part = (tiles | colblk) & ~full
        vert = torch.zeros(B, H, S + 1, dtype=torch.bool, device=dev)
        # a leftover column of any query block is a vertical of the head
        vert.scatter_(
            -1, torch.where(valid, self.columns.to(torch.int64), S).reshape(B, H, -1), True
        )
        vert = vert[..., :S]

        def lists(sel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            num = sel.sum(-1).to(torch.int32)
            idx = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True).to(torch.int32)
            return num, idx

        def mask_mod(b, h, q_idx, kv_idx):
            in_tile = tiles[b, h, q_idx // BM, kv_idx // BN]
            return (kv_idx <= q_idx) & (in_tile | vert[b, h, kv_idx])

        pn, pi = lists(part)
        fn, fi = lists(full)
        return BlockMask.from_kv_blocks(
            pn, pi, fn, fi, BLOCK_SIZE=(BM, BN), mask_mod=mask_mod, seq_lengths=(S, S)
        )


def _check_indices(
    t: object, name: str, B: int, H: int, S: int, contents: bool = True
) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name}: expected dtype torch.int32 or torch.int64, got {t.dtype}")
    if t.ndim != 3 or t.shape[0] != B or t.shape[1] != H:
        raise ValueError(f"{name}: expected shape [B={B}, H={H}, N], got {tuple(t.shape)}")
    if contents and t.numel() > 0:
        lo, hi = int(t.min()), int(t.max())
        if lo < 0 or hi >= S:
            raise ValueError(
                f"{name}: entries must lie in [0, {S}) (S = seq_len), got [{lo}, {hi}]"
            )
        if t.shape[-1] > 1 and bool((t[..., 1:] <= t[..., :-1]).any()):
            raise ValueError(
                f"{name}: each row must be sorted strictly ascending (no duplicates); "
                f"sort with torch.sort(..., dim=-1) and drop repeats"
            )
    return t


def _check_blocks(block_m: object, block_n: object, op: str) -> None:
    for nm, bsz in (("block_m", block_m), ("block_n", block_n)):
        # 64.0 == 64: a float would pass the membership test and fail later inside torch
        if isinstance(bsz, bool) or not isinstance(bsz, int):
            raise TypeError(f"{op}: {nm}: expected an int in {SUPPORTED_BLOCKS}, got {bsz!r}")
        if bsz not in SUPPORTED_BLOCKS:
            raise NotImplementedError(f"{op}: {nm} must be one of {SUPPORTED_BLOCKS}, got {bsz!r}")


def _compact(mask: torch.Tensor, width: int, fill: int, values: torch.Tensor) -> torch.Tensor:
    """``[N, M, width]`` int32: per row ``(n, m)``, ``values`` (broadcast to ``mask``'s shape) at
    the set entries of ``mask[n, m, :]`` in ascending position order, then ``fill``. Placed by
    their ranks (a cumulative sum), so no size is read back; every row's count must be at most
    ``width``."""
    pos = mask.cumsum(-1, dtype=torch.int32) - 1
    out = torch.full((*mask.shape[:-1], width + 1), fill, dtype=torch.int32, device=mask.device)
    # Set entries go to their rank; the others to a last column that is dropped.
    out.scatter_(
        -1, torch.where(mask, pos, width).long(), values.expand(mask.shape).to(torch.int32)
    )
    return out[..., :width]


def build_vertical_slash_index(
    vertical_indices: torch.Tensor,
    slash_indices: torch.Tensor,
    *,
    seq_len: int,
    block_m: int = 64,
    block_n: int = 64,
    check_contents: bool = True,
    impl: str = "auto",
) -> VerticalSlashIndex:
    """Convert MInference vertical/slash indices to the block ranges + columns the kernel runs.

    Attended set (causal, ``S = seq_len``): query ``i`` attends key ``j <= i`` iff
    (a) ``j`` is in ``vertical_indices[b, h]``, or (b) some slash offset ``o`` in
    ``slash_indices[b, h]`` has its diagonal ``{(r, r - o)}`` pass through the tile
    ``(i // block_m, j // block_n)``, i.e. some row ``r`` of query block ``i // block_m`` has
    ``r - o`` inside key block ``j // block_n``. So every slash is rounded up to whole
    ``block_m x block_n`` tiles along its diagonal (about ``block_m + block_n - 1`` keys per row
    instead of 1); verticals stay single columns (or fall inside a computed tile).

    Args:
        vertical_indices: ``[B, H, NV]`` int32/int64 key columns in ``[0, S)``, each row strictly
            ascending.
        slash_indices: ``[B, H, NS]`` int32/int64 diagonal offsets ``i - j`` in ``[0, S)``, each
            row strictly ascending.
        seq_len: ``S``; block_m, block_n: 64 or 128.
        check_contents: check that the indices lie in ``[0, S)`` and ascend strictly (three
            host reads per tensor). ``False`` is for callers whose indices hold that by
            construction (``sparse_patterns``' planner): invalid ones then give a wrong index or
            a device-side error, not a ``ValueError``. Shapes and dtypes are checked either way.
        impl: ``"triton"`` builds with Triton kernels (CUDA, or CPU under ``TRITON_INTERPRET=1``),
            ``"reference"`` with torch ops (any device; bound by launching its many small ops on
            a GPU, about 11x slower there at 128K); ``"auto"``: Triton on CUDA, torch ops
            elsewhere. Both build the same tensors.

    Returns:
        :class:`VerticalSlashIndex` on the indices' device. Synchronises with the host once,
        for the sizes of the padded range/column tensors, plus the content checks' reads when
        ``check_contents``.
    """
    # The index holds int32 key blocks and columns.
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 0 < seq_len < 2**31:
        raise ValueError(f"{_OP}: seq_len: expected an int in [1, 2**31), got {seq_len!r}")
    _check_blocks(block_m, block_n, _OP)
    check_contents = check_bool(check_contents, "check_contents", _OP)
    if not isinstance(vertical_indices, torch.Tensor):
        raise TypeError(
            f"vertical_indices: expected a torch.Tensor, got {type(vertical_indices).__name__}"
        )
    if vertical_indices.ndim != 3:
        raise ValueError(
            f"vertical_indices: expected shape [B, H, NV], got {tuple(vertical_indices.shape)}"
        )
    B, H = vertical_indices.shape[:2]
    if B * H == 0:
        raise ValueError(f"{_OP}: expected B*H >= 1, got B={B}, H={H}")
    which = resolve_impl(impl, vertical_indices.device, _OP)
    if isinstance(slash_indices, torch.Tensor) and slash_indices.device != vertical_indices.device:
        raise ValueError(
            f"{_OP}: vertical_indices and slash_indices must be on one device, got "
            f"{vertical_indices.device} and {slash_indices.device}"
        )
    _check_indices(vertical_indices, "vertical_indices", B, H, seq_len, check_contents)
    _check_indices(slash_indices, "slash_indices", B, H, seq_len, check_contents)
    build = _build_triton if which == "triton" else _build_torch
    range_count, range_start, range_end, column_count, columns = build(
        vertical_indices.reshape(B * H, -1), slash_indices.reshape(B * H, -1), seq_len, block_m,
        block_n,
    )  # fmt: skip
    nqb = range_count.shape[-1]
    return VerticalSlashIndex(
        seq_len=seq_len,
        block_m=block_m,
        block_n=block_n,
        range_count=range_count.reshape(B, H, nqb),
        range_start=range_start.reshape(B, H, nqb, -1).contiguous(),
        range_end=range_end.reshape(B, H, nqb, -1).contiguous(),
        column_count=column_count.reshape(B, H, nqb),
        columns=columns.reshape(B, H, nqb, -1).contiguous(),
    )


def _sizes(range_count: torch.Tensor, column_count: torch.Tensor, nkb: int) -> tuple[int, int]:
    """The widths ``(R, C)`` of the padded range and column tensors (one host read)."""
    R, C = (max(int(x), 1) for x in torch.stack([range_count.max(), column_count.max()]).tolist())
    return min(R, nkb), C


def _build_triton(v: torch.Tensor, sl: torch.Tensor, S: int, BM: int, BN: int) -> tuple:
    """``(range_count, range_start, range_end, column_count, columns)`` of ``N`` heads
    (``v``: ``[N, NV]``, ``sl``: ``[N, NS]``) by the Triton kernels."""
    # imported here: `import sparse_kernels` does not import Triton
    from .columns_triton import _launch_column_count, _launch_columns
    from .index_triton import SlashTiles

    tiles = SlashTiles(sl.contiguous(), S, BM, BN)
    range_count = tiles.range_count()
    v = v.contiguous()
    if v.shape[1] > 0:
        column_count = _launch_column_count(v, tiles)
    else:
        column_count = torch.zeros_like(range_count)
    R, C = _sizes(range_count, column_count, tiles.nkb)
    range_start, range_end = tiles.ranges(R)
    if v.shape[1] > 0:
        columns = _launch_columns(v, tiles, C)
    else:
        columns = torch.zeros(*range_count.shape, 1, dtype=torch.int32, device=v.device)
    return range_count, range_start, range_end, column_count, columns


def _build_torch(v: torch.Tensor, sl: torch.Tensor, S: int, BM: int, BN: int) -> tuple:
    """:func:`_build_triton` by torch ops (``impl="reference"``; any device)."""
    dev = v.device
    N = v.shape[0]
    nqb, nkb = -(-S // BM), -(-S // BN)
    sl = sl.to(torch.int64).contiguous()

    def any_slash(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        """``[N, L]``: some slash offset lies in ``[lo, hi]`` (``lo``/``hi`` ``[L]``)."""
        L = lo.shape[0]
        if sl.shape[1] == 0:
            return torch.zeros(N, L, dtype=torch.bool, device=dev)
        a = torch.searchsorted(sl, lo.expand(N, L).contiguous(), right=False)
        b = torch.searchsorted(sl, hi.expand(N, L).contiguous(), right=True)
        return (b > a) & (hi >= 0)

    # Tile (m, n) is crossed by diagonal o iff o lies in [max(0, t - BN + 1), t + BM - 1] with
    # t = m*BM - n*BN. With g = gcd(BM, BN), a = BM/g and p = BN/g, t = tmin + g*u for the class
    # index u = m*a + (nkb - 1 - n)*p, so one lookup per class covers every tile: row m reads the
    # classes u = m*a + k*p, k = nkb - 1 - n = 0 .. nkb - 1. Nothing below is NQB x NKB.
    g = math.gcd(BM, BN)
    a, p = BM // g, BN // g  # coprime; p == 2 for BM=64, BN=128
    tmin = -(nkb - 1) * BN
    T = (nqb - 1) * a + (nkb - 1) * p + 1
    ts = tmin + g * torch.arange(T, device=dev)
    cov_t = any_slash((ts - BN + 1).clamp_min(0), ts + BM - 1)  # [N, T]
    # Split the classes by residue mod p: row m reads seq[r_m, c_m + k] (r_m, c_m = divmod).
    Lr = -(-T // p)
    seq = torch.nn.functional.pad(cov_t, (0, Lr * p - T)).reshape(N, Lr, p).transpose(1, 2)
    m = torch.arange(nqb, device=dev)
    r_m, c_m = (m * a) % p, (m * a) // p
    # The last query block may be short (rows up to S - 1 only): exact lookup for it.
    n = torch.arange(nkb, device=dev)
    c0 = n * BN
    cov_last = any_slash(((nqb - 1) * BM - c0 - BN + 1).clamp_min(0), S - 1 - c0)  # [N, NKB]

    # Ranges = maximal runs of covered classes inside each row's window [c_m, c_m + nkb - 1],
    # reversed (k grows as n falls). Runs are numbered along each residue's sequence.
    prev = torch.nn.functional.pad(seq[..., :-1], (1, 0))
    nxt = torch.nn.functional.pad(seq[..., 1:], (0, 1))
    first, last = seq & ~prev, seq & ~nxt
    runs = first.cumsum(-1, dtype=torch.int32)  # [N, p, Lr]: runs started at or before k
    run_lo = torch.full((N, p, Lr + 1), Lr, dtype=torch.int32, device=dev)
    run_hi = torch.full((N, p, Lr + 1), Lr, dtype=torch.int32, device=dev)
    k_all = torch.arange(Lr, dtype=torch.int32, device=dev).expand(N, p, Lr)
    run_lo.scatter_(-1, torch.where(first, runs - 1, Lr).long(), k_all)
    run_hi.scatter_(-1, torch.where(last, runs - 1, Lr).long(), k_all)

    def at(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """``x[n, r_m, k]`` for ``x`` ``[N, p, W]``; ``k`` ``[NQB]`` (one per row m) or
        ``[N, NQB, R]``; the result has ``k``'s shape (``[N, NQB]`` for the first)."""
        W = x.shape[-1]
        if k.ndim == 1:
            idx = (r_m * W + k)[None, :].expand(N, -1)
        else:
            idx = (r_m * W)[None, :, None] + k
        flat = x.reshape(N, p * W).gather(1, idx.reshape(N, -1).long())
        return flat.reshape(idx.shape)

    lo, hi = c_m, c_m + nkb - 1
    runs_hi = at(runs, hi)  # [N, NQB]
    runs_before = torch.where(lo > 0, at(runs, (lo - 1).clamp_min(0)), 0)
    carried = (at(seq, lo) & ~at(first, lo)).to(torch.int32)  # a run enters the window at lo
    range_count = runs_hi - runs_before + carried

    st_last = cov_last & ~torch.nn.functional.pad(cov_last[:, :-1], (1, 0))
    en_last = cov_last & ~torch.nn.functional.pad(cov_last[:, 1:], (0, 1))
    range_count[:, -1] = st_last.sum(-1, dtype=torch.int32)

    NV = v.shape[1]
    if NV > 0:
        v = v.to(torch.int64)
        # Tile of (row m, vertical v): class index c_m + (nkb - 1 - v // BN) of residue r_m.
        kv = (nkb - 1 - v // BN)[:, None, :]  # [N, 1, NV]
        in_tile = torch.empty(N, nqb, NV, dtype=torch.bool, device=dev)
        for r in range(p):
            # rows m = r, r + p, ...: residue (r*a) % p, windows starting at (r*a) // p, a apart
            rows = slice(r, None, p)
            n_rows = len(range(r, nqb, p))
            if n_rows == 0:
                continue
            win = seq[:, (r * a) % p, (r * a) // p :].unfold(-1, nkb, a)[:, :n_rows]
            in_tile[:, rows] = torch.gather(win, 2, kv.expand(N, n_rows, NV))
        in_tile[:, -1] = torch.gather(cov_last, 1, v // BN)
        last_row = (torch.clamp((m + 1) * BM, max=S) - 1)[None, :, None]
        keep = ~in_tile & (v[:, None, :] <= last_row)
        column_count = keep.sum(-1, dtype=torch.int32)
    else:
        column_count = torch.zeros(N, nqb, dtype=torch.int32, device=dev)

    R, C = _sizes(range_count, column_count, nkb)
    # Range i of row m (ascending n) is run (runs_hi - 1 - i), clipped to the window.
    i = torch.arange(R, device=dev)
    ok = i < range_count[..., None]  # [N, NQB, R]
    j = (runs_hi[..., None] - 1 - i).clamp_min(0)
    k_lo = torch.maximum(at(run_lo, j), lo[:, None])
    k_hi = torch.minimum(at(run_hi, j), hi[:, None])
    range_start = torch.where(ok, nkb - 1 - (k_hi - c_m[:, None]), nkb).to(torch.int32)
    range_end = torch.where(ok, nkb - (k_lo - c_m[:, None]), nkb + 1).to(torch.int32)
    kb = torch.arange(nkb, device=dev)
    range_start[:, -1] = _compact(st_last[:, None], R, nkb, kb)[:, 0]
    range_end[:, -1] = _compact(en_last[:, None], R, nkb + 1, kb + 1)[:, 0]
    if NV > 0:
        columns = _compact(keep, C, S, v[:, None, :])
    else:
        columns = torch.zeros(N, nqb, 1, dtype=torch.int32, device=dev)
    return range_count, range_start, range_end, column_count, columns
