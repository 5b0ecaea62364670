"""Block plans: what the permuted block-sparse kernel consumes, built for every head at once.

A :class:`BlockPlan` holds, for ``[B, H]`` heads, the kernel inputs of
``sparse_kernels.permuted_block_sparse_attention``: per PERMUTED query block the listed PERMUTED
key blocks, and the row / column permutations (None = original order). Executed semantics
(the kernel's): permuted row ``r`` (original ``q_perm[r]``) attends permuted column ``c``
(original ``kv_perm[c]``) iff block ``(r // block, c // block)`` is listed and
``kv_perm[c] <= q_perm[r]`` (causal on original positions). The element masks of the pattern
specs are rounded UP to these blocks: the executed set is a superset of the pattern's set.

Builders work on chunks of query blocks (bounded memory at 1M tokens) and are vectorised over
heads, with per-head parameters as tensors.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from sparse_kernels.permuted.perms import block_lists_from_mask, compact_by_mask, host_ints

from ._device import heads_index, to_device

# Element budget of one chunk of a block-mask or element-mask builder (bools).
_CHUNK_ELEMS = 1 << 27


@dataclass(frozen=True)
class ExactVerticalHeads:
    """Vertical-Slash heads run by ``sparse_kernels.vertical_slash_attention`` (exact columns).

    ``heads``: the layer's head numbers (ascending); ``vertical`` / ``slash`` int32
    ``[B, len(heads), NV]`` / ``[B, len(heads), NS]``, rows strictly ascending. The plan's block
    lists of these heads hold their slash tiles only (what the kernel computes for the slashes).
    """

    heads: tuple[int, ...]
    vertical: torch.Tensor
    slash: torch.Tensor


@dataclass(frozen=True)
class ExactAShapeHeads:
    """``AShape(exact=True)`` heads of one ``(sink, window)``, run by
    ``sparse_kernels.triangle_attention(..., sink, window, last=0)``: key ``j`` for query ``i``
    iff ``j <= i`` and (``j < sink`` or ``i - j < window``), with no block rounding.
    ``heads``: the layer's head numbers (ascending)."""

    heads: tuple[int, ...]
    sink: int
    window: int


@dataclass(frozen=True)
class BlockPlan:
    """Kernel inputs for ``[B, H]`` heads (see module docstring).

    ``kv_block_indices`` int32 ``[B, H, NQB, MAXB]``; ``kv_block_counts`` int32 ``[B, H, NQB]``;
    ``q_perm`` / ``kv_perm`` int32 ``[B, H, S]`` or None; ``block`` = block_m = block_n.
    ``meta``: what estimation found (e.g. ``{"stride": [B, H], "phase": [B, H]}``).
    ``exact_vertical``: Vertical-Slash heads whose columns are attended exactly (see
    :class:`ExactVerticalHeads`); they are left out of the block-sparse launch.
    ``exact_lists``: False for an execution-only plan (``plan_layer(...,
    exact_vertical_lists=False)``), whose exact-vertical heads have empty block lists; its
    metrics (``computed_blocks``, ``density``, ``row_mask``) raise.
    ``exact_a_shape``: A-shape heads attended exactly by ``triangle_attention`` (see
    :class:`ExactAShapeHeads`); left out of the block-sparse launch like the exact-vertical ones.
    ``kv_runs``: ``(runs, step)`` when the planner knows which key blocks of ``kv_perm`` are
    runs: ``runs`` int32 ``[B, H, NKB]`` equal to ``sparse_kernels.permuted.kv_block_runs(
    kv_perm, block, step)`` and ``step`` int64 ``[B, H]``, or the int 1 for every head; None:
    :meth:`run` finds them from ``kv_perm``.
    ``run_split``: ``(kv_block_indices, kv_block_counts, kv_run_starts, kv_run_counts)``, the
    lists split by ``kv_runs`` as ``sparse_kernels.permuted.split_run_blocks`` splits them, when
    the planner made them with the lists (no exact heads); None: :meth:`run` splits them.
    """

    kv_block_indices: torch.Tensor
    kv_block_counts: torch.Tensor
    q_perm: torch.Tensor | None
    kv_perm: torch.Tensor | None
    block: int
    S: int
    meta: dict
    exact_vertical: tuple[ExactVerticalHeads, ...] = ()
    exact_lists: bool = True
    kv_runs: tuple[torch.Tensor, torch.Tensor | int] | None = None
    exact_a_shape: tuple[ExactAShapeHeads, ...] = ()
    run_split: tuple[torch.Tensor, ...] | None = None

    @property
    def _exact_parts(self) -> tuple:
        return (*self.exact_vertical, *self.exact_a_shape)

    def _need_lists(self, what: str) -> None:
        if not self.exact_lists:
            raise ValueError(
                f"BlockPlan.{what}: this plan was built with exact_vertical_lists=False "
                f"(execution only: its exact-vertical heads have no slash-tile lists); expected "
                f"a plan from plan_layer(..., exact_vertical_lists=True)"
            )

    @property
    def computed_blocks(self) -> int:
        """Listed blocks, plus for exact-vertical heads one ``1 / block`` of a tile per column
        and query block that sees it (an upper bound: columns inside slash tiles count twice)."""
        self._need_lists("computed_blocks")
        n = int(self.kv_block_counts.sum())
        nqb = -(-self.S // self.block)
        for part in self.exact_vertical:
            n += int((nqb - part.vertical.long() // self.block).sum()) / self.block
        return n

    def density(self) -> float:
        """Computed blocks / blocks of dense causal attention (same block size), over all heads."""
        nb = -(-self.S // self.block)
        B, H = self.kv_block_counts.shape[:2]
        return self.computed_blocks / (B * H * nb * (nb + 1) / 2)

    def row_mask(self, rows: torch.Tensor) -> torch.Tensor:
        """Exact executed mask for ORIGINAL query rows ``rows`` (int64 ``[R]``), original key
        order: bool ``[B, H, R, S]``."""
        self._need_lists("row_mask")
        B, H, nqb, maxb = self.kv_block_indices.shape
        S, blk = self.S, self.block
        nkb = -(-S // blk)
        dev = rows.device
        if self.q_perm is None:
            r = rows.expand(B, H, -1)
        else:
            inv = torch.empty_like(self.q_perm, dtype=torch.int64)
            ar = torch.arange(S, device=dev).expand_as(self.q_perm)
            inv.scatter_(-1, self.q_perm.long(), ar)
            r = inv[..., rows]
        qb = r // blk  # [B, H, R]
        idx = self.kv_block_indices.long().gather(2, qb[..., None].expand(-1, -1, -1, maxb))
        cnt = self.kv_block_counts.long().gather(2, qb)
        valid = torch.arange(maxb, device=dev) < cnt[..., None]
        idx = torch.where(valid, idx, nkb)
        bm = torch.zeros(B, H, rows.numel(), nkb + 1, dtype=torch.bool, device=dev)
        bm.scatter_(-1, idx, True)
        colp = bm[..., :nkb].repeat_interleave(blk, dim=-1)[..., :S]  # permuted columns
        if self.kv_perm is not None:
            invk = torch.empty_like(self.kv_perm, dtype=torch.int64)
            ar = torch.arange(S, device=dev).expand_as(self.kv_perm)
            invk.scatter_(-1, self.kv_perm.long(), ar)
            colp = colp.gather(-1, invk[:, :, None, :].expand(-1, -1, rows.numel(), -1))
        causal = torch.arange(S, device=dev)[None, :] <= rows[:, None]
        for part in self.exact_vertical:
            cols = torch.zeros(B, len(part.heads), S, dtype=torch.bool, device=dev)
            cols.scatter_(-1, part.vertical.long(), True)
            hs = list(part.heads)
            colp[:, hs] |= cols[:, :, None, :]
        j = torch.arange(S, device=dev)
        for part in self.exact_a_shape:
            em = (j[None, :] < part.sink) | (rows[:, None] - j[None, :] < part.window)
            colp[:, list(part.heads)] = em
        return colp & causal

    def to_block_mask(self):
        """The plan as a FlexAttention ``BlockMask`` (what ``sparse_kernels.block_sparse_attention``
        and ``flex_attention`` take), for plans WITHOUT permutations: its block lists as a
        ``sparse_kernels.SparsePlan`` and that plan's ``to_block_mask`` (whose ``mask_mod``
        agrees with the lists, so eager and compiled ``flex_attention`` both compute the plan
        exactly). Raises ``NotImplementedError`` for permuted plans (identity permutations are
        checked by a host read) and plans with exact heads."""
        from sparse_kernels import SparsePlan

        if self.exact_vertical:
            raise NotImplementedError(
                "to_block_mask: the plan has Vertical-Slash heads with exact_verticals=True; "
                "their columns are not blocks, run it with BlockPlan.run"
            )
        if self.exact_a_shape:
            raise NotImplementedError(
                "to_block_mask: the plan has A-shape heads with exact=True; their window is not "
                "blocks, run it with BlockPlan.run"
            )
        plan = SparsePlan(
            kv_num_blocks=self.kv_block_counts, kv_indices=self.kv_block_indices,
            seq_lengths=(self.S, self.S), block_size=self.block, causal=True,
            q_perm=self.q_perm, kv_perm=self.kv_perm, check_contents=False,
        )  # fmt: skip
        return plan.to_block_mask()

    @functools.cached_property
    def sparse_plan(self):
        """The ``sparse_kernels.SparsePlan`` that :meth:`run` executes with one
        ``permuted_block_sparse_attention`` launch, made on first use from the launch lists
        (see :meth:`_launch_lists`): the exact heads have no blocks in it (they run apart).
        Valid by construction: made without content checks, so without a host read."""
        from sparse_kernels import SparsePlan

        idx, counts, runs = self._launch_lists
        return SparsePlan(
            kv_num_blocks=counts, kv_indices=idx, seq_lengths=(self.S, self.S),
            block_size=self.block, causal=True, q_perm=self.q_perm, kv_perm=self.kv_perm,
            kv_run_starts=runs[0] if runs else None, kv_run_counts=runs[1] if runs else None,
            kv_run_step=runs[2] if runs else 1, check_contents=False,
        )  # fmt: skip

    @functools.cached_property
    def _launch_lists(self):
        """The lists :meth:`run` launches with, made on its first call: the exact-vertical heads'
        counts zeroed, and, when there is a key permutation, the listed blocks that are runs
        moved to a run list, which the kernel loads without the permutation. Both lists keep the
        width of ``kv_block_indices``, so that no width is read back from the device; with
        ``kv_runs`` from the planner the split reads nothing back at all. Without it, a head's
        run step is 1 (identity and modality orders: blocks that do not cross a segment end) or
        its grid stride (Grid orders: blocks inside one grid line), whichever gives it more
        runs, and two host reads decide whether there are runs and whether every step is 1."""
        from sparse_kernels.permuted import split_run_blocks

        counts = self.kv_block_counts
        if self._exact_parts and self.exact_lists:
            counts = counts.clone()
            for part in self._exact_parts:
                counts[:, heads_index(list(part.heads), counts.device)] = 0
        if self.kv_perm is None:
            return self.kv_block_indices, counts, None
        if self.run_split is not None and not self._exact_parts:
            idx, cnt, rs, rc = self.run_split
            return idx, cnt, (rs, rc, self.kv_runs[1])
        if self.kv_runs is not None:
            runs, step = self.kv_runs
        else:
            runs, step = self._find_runs()
            if runs is None:
                return self.kv_block_indices, counts, None
        idx, cnt, rs, rc = split_run_blocks(
            self.kv_perm, self.kv_block_indices, counts, self.block, step=step, runs=runs,
            width=self.kv_block_indices.shape[-1],
        )  # fmt: skip
        return idx, cnt, (rs, rc, step)

    def _find_runs(self):
        """``(runs, step)`` from ``kv_perm`` (see :meth:`_launch_lists`); ``(None, 1)`` when no
        listed key block could be a run. Two host reads."""
        runs, step = best_block_runs(self.kv_perm, self.block, self.meta.get("stride"))
        has_runs, all_one = host_ints((runs >= 0).any(), (step == 1).all())
        if not has_runs:
            return None, 1
        return runs, (1 if all_one else step)

    def run(self, q, k, v, *, scale: float | None = None, impl: str = "auto"):
        """Execute with ``sparse_kernels.permuted_block_sparse_attention`` (one launch, left out
        when exact heads are all there is), plus one ``sparse_kernels.vertical_slash_attention``
        launch per group of exact-vertical heads and one ``sparse_kernels.triangle_attention``
        launch per group of exact A-shape heads."""
        from sparse_kernels import AttentionOutput, permuted_block_sparse_attention

        B, H, S, _ = q.shape
        parts = self._exact_parts
        if len(parts) == 1 and list(parts[0].heads) == list(range(H)):
            # One exact launch over every head in order: its output is the layer's, no buffer.
            return self._run_part(parts[0], q, k, v, scale, impl)[1]
        if sum(len(p.heads) for p in parts) == H:
            res = AttentionOutput(
                torch.empty_like(q), torch.empty(B, H, S, dtype=torch.float32, device=q.device)
            )
        else:
            res = permuted_block_sparse_attention(q, k, v, self.sparse_plan, scale=scale, impl=impl)
        for part in parts:
            at, part_res = self._run_part(part, q, k, v, scale, impl)
            res.out[:, at] = part_res.out
            res.lse[:, at] = part_res.lse
        return res

    def _run_part(self, part, q, k, v, scale, impl):
        """``(at, AttentionOutput)`` of one group of exact heads (``q[:, at]``): exact-vertical
        heads by ``vertical_slash_attention``, exact A-shape heads by ``triangle_attention``."""
        from sparse_kernels import triangle_attention, vertical_slash_attention

        at, ks, vs = _head_subset(part.heads, q, k, v)
        if isinstance(part, ExactAShapeHeads):
            return at, triangle_attention(
                q[:, at], ks, vs, sink=part.sink, window=part.window, last=0, scale=scale,
                impl=impl,
            )  # fmt: skip
        # The planner's indices are in range and strictly ascending by construction: no
        # content checks (six host reads).
        return at, vertical_slash_attention(
            q[:, at], ks, vs, part.vertical, part.slash, scale=scale, impl=impl,
            block_m=self.block, block_n=self.block, check_indices=False,
        )  # fmt: skip


def _head_subset(heads: tuple[int, ...], q, k, v):
    """``(at, k_sub, v_sub)`` for query heads ``heads``: ``q[:, at]`` with the K/V heads they
    read, GQA kept without copying K/V where the heads take the same number from each KV head
    in order (unless only some KV heads are used)."""
    G = q.shape[1] // k.shape[1]
    dev = q.device
    hs = list(heads)
    at = heads_index(hs, dev)  # a slice, or an index copied without blocking
    kv = [h // G for h in hs]
    uniq = sorted(set(kv))
    per = len(hs) // len(uniq)
    if len(hs) % len(uniq) == 0 and all(kv[i] == uniq[i // per] for i in range(len(hs))):
        sel = heads_index(uniq, dev) if uniq != list(range(k.shape[1])) else slice(None)
        return at, k[:, sel], v[:, sel]
    return at, k[:, heads_index(kv, dev)], v[:, heads_index(kv, dev)]


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
    vblk: torch.Tensor, dist: torch.Tensor, m0: int, m1: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`line_block_lists` at the bound width ``A + C`` (no read-back)."""
    N, A = vblk.shape
    C = dist.shape[1]
    W = A + C
    dev = vblk.device
    step = max(1, _LINE_CHUNK_ELEMS // max(1, N * W))
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
    vertical: torch.Tensor, slash: torch.Tensor, S: int, blk: int, *, path: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The block lists of :func:`vertical_slash_block_mask` (exactly: same indices, counts and
    width). ``path="lines"`` builds them from the columns' blocks and the diagonals' block
    distances by :func:`line_block_lists`, ``"mask"`` compacts the ``NQB x NKB`` block mask in
    chunks (at 1M tokens 2.7e8 entries per head), ``"auto"`` picks by :func:`_use_lines`. On the
    line path a partial last query block (``S % blk != 0``), which sees fewer keys, still comes
    from the mask."""
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
    idx, cnt = _line_lists_wide(vblk, dist, 0, full)
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
    row)."""
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
    return line_block_lists(to_device(vblk, device), to_device(dist, device), 0, nkb)


# ---------------------------------------------------------------------------------------------
# Element-level builders (boundary heads): rows in permuted order, mask reduced to blocks


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
