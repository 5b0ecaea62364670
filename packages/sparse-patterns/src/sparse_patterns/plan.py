"""Block plans: what the permuted block-sparse kernel consumes, built for every head at once.

A :class:`BlockPlan` holds, for ``[B, H]`` heads, the kernel inputs of
``sparse_kernels.permuted_block_sparse_attention``: per PERMUTED query block the listed PERMUTED
key blocks, and the row / column permutations (None = original order). Executed semantics
(the kernel's): permuted row ``r`` (original ``q_perm[r]``) attends permuted column ``c``
(original ``kv_perm[c]``) iff block ``(r // block, c // block)`` is listed and
``kv_perm[c] <= q_perm[r]`` (causal on original positions). The element masks of the pattern
specs are rounded UP to these blocks: the executed set is a superset of the pattern's set.

The lists are built by :mod:`sparse_patterns.block_lists`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from sparse_kernels.permuted.perms import host_ints

from ._device import heads_index
from .block_lists import best_block_runs


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
