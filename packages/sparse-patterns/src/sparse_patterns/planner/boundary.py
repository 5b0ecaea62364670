"""Q-Boundary and 2D-Boundary heads: rows in modality order, each modality with its own pattern.

Static and Vertical-Slash heads build their block lists at block level from row runs
(:class:`_Runs`, :func:`_boundary_block_mask`); the element path (one ``S``-wide row per query
row) is the reference they equal, and serves the SF baselines and the Q-Boundary Grid heads."""

from __future__ import annotations

import torch
from sparse_kernels.permuted import grid_permutation

from .. import estimate as E
from ..block_lists import lists_from_chunks
from ..element_lists import element_block_mask, lists_from_element_chunks
from ..patterns import Grid, VerticalSlash
from .context import LayerContext, per_head, topk_per_head
from .group import GroupPlan
from .static import STATIC_FIELDS, STATIC_KINDS, static_element
from .vertical_slash import vs_indices

# Boundary heads of these kinds (and Vertical-Slash) build their block lists from row runs.
_RUN_KINDS = ("dense", "a_shape", "tri_shape")


def _scatter_true(mask: torch.Tensor, idx: torch.Tensor, ok: torch.Tensor) -> None:
    S = mask.shape[-1]
    trash = torch.zeros(*mask.shape[:-1], 1, dtype=torch.bool, device=mask.device)
    full = torch.cat([mask, trash], dim=-1)
    full.scatter_(-1, torch.where(ok, idx, S).expand(*mask.shape[:-1], -1), True)
    mask.copy_(full[..., :S])


class _Runs:
    """Row runs of the query blocks ``[m0, m1)`` of a modality-ordered layout: stretches of
    consecutive rows of one modality inside one query block whose original positions are
    consecutive too (Q-Boundary) or, for 2D-Boundary, whose modality ranks are (always, in
    modality order). Per run ``u``: local query block ``qb``, modality ``mod``, first and last row
    in the pattern's coordinates (``lo``, ``hi``: original positions for Q-Boundary, ranks in
    the modality for 2D), and the last row's original position ``orig_hi`` (causality)."""

    def __init__(self, mperm, mi, start, m0: int, m1: int, S: int, blk: int, two_d: bool):
        dev = mperm.device
        pr = torch.arange(m0 * blk, min(m1 * blk, S), device=dev)
        orig = mperm[pr].long()
        qb = (pr - m0 * blk) // blk
        mod = mi[orig]
        new = torch.ones(pr.numel(), dtype=torch.bool, device=dev)
        new[1:] = (qb[1:] != qb[:-1]) | (mod[1:] != mod[:-1])
        if not two_d:
            new[1:] |= orig[1:] != orig[:-1] + 1
        first = new.nonzero().squeeze(1)  # one host read: the run count
        last = torch.cat([first[1:], first.new_tensor([pr.numel()])]) - 1
        self.qb, self.mod = qb[first], mod[first]
        self.orig_hi = orig[last]
        coord = (pr - start[mod]) if two_d else orig
        self.lo, self.hi = coord[first], coord[last]


def _boundary_block_mask(
    kind, params, vert, sl, cross, ctx: LayerContext, N: int, two_d: bool, counts, start, inv,
    chunk_elems: int,
):  # fmt: skip
    """Chunk function of a boundary head's block mask, equal to the element path's for a static
    ``kind`` in ``_RUN_KINDS`` or Vertical-Slash (``kind None``; per-modality ``vert``
    ``[N, M, NV]`` original columns, ``sl`` ``[N, M, NS]`` offsets; 2D: ``cross`` ``[N, M, C]``
    original columns of the other modalities), without an ``S``-wide row per query row.
    ``counts``/``start``: tokens per modality and where each starts in modality order; ``inv``:
    the modality-order position of each original position.

    Rows are in modality order. Q-Boundary keys are in original order and the pattern is in
    original positions; 2D-Boundary keys are in modality order too and the pattern is in ranks
    inside the row's modality (its length ``n_a`` where TriShape uses ``S``). Each run of rows
    (:class:`_Runs`) ``[lo, hi]`` attends a few key ranges, the exact union of its rows' sets: the
    sink ``[0, min(sink, hi + 1))``, the window ``[lo - window + 1, hi]``, ``[0, hi]`` for dense
    rows, per slash offset ``o`` the keys ``[lo - o, hi - o]`` (clipped at 0), and each column
    (vertical or cross) at or before the run's last row in original positions. The ranges go
    into a difference array over key blocks. Cost per chunk: ``N * runs * ranges per run`` plus
    the ``N * blocks * NKB`` mask; one host read (the run count). ``chunk_elems``: elements of
    one batch of run ranges (``[N, runs, ranges per run]``, several int64 temporaries)."""
    S, blk, dev = ctx.S, ctx.block, ctx.q.device
    nkb = -(-S // blk)
    mi = ctx.mod_index
    width = (vert.shape[-1] + sl.shape[-1] if kind is None else 3) + (
        cross.shape[-1] if cross is not None else 0
    )
    run_step = max(1, chunk_elems // max(1, N * width))

    def ranges_of(r: _Runs, u: slice) -> list:
        """(first, last) key ranges of runs ``u``, in key order, ``[N or 1, U, P]``; a range with
        last < first is empty."""
        mod = r.mod[u]
        lo, hi = r.lo[u][None, :, None], r.hi[u][None, :, None]  # pattern coordinates
        orig_hi = r.orig_hi[u][None, :, None]
        shift = start[mod][None, :, None] if two_d else 0  # to key order
        length = counts[mod][None, :, None] if two_d else S
        out = []

        def columns(c):  # original columns at or before the run's last row
            ok = (c >= 0) & (c <= orig_hi)
            key = inv[c.clamp_min(0)].long() if two_d else c
            out.append((torch.where(ok, key, 0), torch.where(ok, key, -1)))

        if kind is None:
            columns(vert[:, mod])
            o = sl[:, mod]
            top = hi - o
            ok = (o >= 0) & (top >= 0)
            out.append((torch.where(ok, (lo - o).clamp_min(0) + shift, 0),
                        torch.where(ok, top + shift, -1)))  # fmt: skip
        elif kind == "dense":
            out.append((torch.zeros_like(lo) + shift, hi + shift))
        else:
            sink, win = params["sink"][:, None, None], params["window"][:, None, None]
            out.append((torch.zeros_like(sink + lo) + shift,
                        torch.minimum(sink, hi + 1) - 1 + shift))  # fmt: skip
            out.append(((lo - win + 1).clamp_min(0) + shift, torch.where(win > 0, hi, -1) + shift))
            if kind == "tri_shape":
                dense = hi >= length - params["last"][:, None, None]
                out.append((torch.zeros_like(dense, dtype=torch.long) + shift,
                            torch.where(dense, hi + shift, -1)))  # fmt: skip
        if cross is not None:
            columns(cross[:, mod])
        return out

    def fn(m0: int, m1: int) -> torch.Tensor:
        r = _Runs(ctx.mperm, mi, start, m0, m1, S, blk, two_d)
        C, U = m1 - m0, r.qb.numel()
        diff = torch.zeros(N, C, nkb + 1, dtype=torch.int32, device=dev)
        flat = diff.view(-1)
        for u0 in range(0, U, run_step):  # bounded temporaries: run_step runs at a time
            u = slice(u0, min(U, u0 + run_step))
            base = torch.arange(N, device=dev)[:, None, None] * C + r.qb[u][None, :, None]
            base = base * (nkb + 1)
            for a, b in ranges_of(r, u):
                a, b = (t.expand(N, -1, -1) for t in torch.broadcast_tensors(a, b))
                ok = b >= a
                one = ok.int().reshape(-1)
                flat.scatter_add_(0, (base + torch.where(ok, a // blk, 0)).reshape(-1), one)
                flat.scatter_add_(0, (base + torch.where(ok, b // blk + 1, 0)).reshape(-1), -one)
        return diff.cumsum(-1, dtype=torch.int32)[..., :nkb] > 0

    return fn


def plan_boundary(
    ctx: LayerContext, hs, cfgs, two_d: bool, *, reference: bool, chunk_elems: int
) -> GroupPlan:
    """Q-Boundary (``two_d=False``) or 2D-Boundary heads of one intra-modality pattern type.

    ``reference``: every head's lists from the element path (the reference of the row runs);
    else the row runs for the kinds they cover (static ``_RUN_KINDS`` and Vertical-Slash), in
    batches of ``chunk_elems`` range elements."""
    dev, S, B = ctx.q.device, ctx.S, ctx.B
    pat = cfgs[0].pattern
    kind = STATIC_KINDS.get(type(pat))
    if isinstance(pat, Grid) and not two_d:
        return _plan_q_boundary_grid(ctx, hs, cfgs)
    if kind is None and not isinstance(pat, VerticalSlash):
        which = "2D-Boundary" if two_d else "Q-Boundary"
        supported = "VerticalSlash, Dense, AShape, TriShape, SFFixed, SFStrided"
        raise NotImplementedError(
            f"{which} with a {type(pat).__name__} intra-modality pattern is not implemented "
            f"(supported: {supported}{'' if two_d else ', Grid'})"
        )
    N = B * len(hs)
    M = ctx.uniq.numel()
    mi = ctx.mod_index
    # Rank of each token inside its modality (the coordinates of 2D diagonal pairs).
    counts = torch.bincount(mi, minlength=M)
    start = torch.cumsum(counts, 0) - counts
    inv_m = ctx.inv_mperm
    rank = inv_m - start[mi]
    L = max(getattr(c.pattern, "last_q", 64) for c in cfgs)
    need_est = isinstance(pat, VerticalSlash) or two_d
    vert = sl = cross = None
    if need_est:
        p_all, rows = ctx.p_mod(L)  # [B, H, M, L, S], rows [M, L]
        p = ctx.sel(p_all, hs)  # [N, M, L, S]
    if isinstance(pat, VerticalSlash):
        if not two_d:
            vert, sl = vs_indices(p, rows, cfgs, B)
        else:
            vl, sll = [], []
            for a in range(M):
                cols = ctx.mperm[start[a] : start[a] + counts[a]]
                pa = p[:, a][..., cols]  # [N, L, n_a] keys of modality a in rank order
                v, s_ = vs_indices(pa, rank[rows[a]], cfgs, B)
                vl.append(torch.where(v >= 0, cols[v.clamp_min(0)], -1))
                sll.append(s_)
            w = max(x.shape[-1] for x in vl)
            vert = torch.stack(
                [torch.nn.functional.pad(x, (0, w - x.shape[-1]), value=-1) for x in vl], 1
            )
            w = max(x.shape[-1] for x in sll)
            sl = torch.stack(
                [torch.nn.functional.pad(x, (0, w - x.shape[-1]), value=-1) for x in sll], 1
            )
    if two_d:
        cv = per_head(cfgs, B, "cross_vertical", dev, base="boundary")
        cv_max = max(c.boundary.cross_vertical for c in cfgs)
        col = E.vertical_scores(p)  # [N, M, S]
        parts = []
        for b in range(M):
            cb = col.masked_fill((mi != b)[None, None], float("-inf"))
            t = topk_per_head(cb, cv, torch.zeros_like(cv), cv_max)  # [N, M, k]
            a_eq_b = (torch.arange(M, device=dev) == b)[None, :, None]
            parts.append(torch.where(a_eq_b, -1, t))
        cross = torch.cat(parts, dim=-1)  # [N, M(a), M * k]
    params = {f: per_head(cfgs, B, f, dev) for f in STATIC_FIELDS.get(kind, ())}

    def row_fn(r: torch.Tensor) -> torch.Tensor:
        R = r.numel()
        i = r[None, :, None]
        j = torch.arange(S, device=dev)[None, None, :]
        causal = j <= i
        a = mi[r]
        if kind is not None:
            if two_d:
                same = mi[None, None, :] == a[None, :, None]
                # Modality-compacted coordinates: ranks, and the modality's own length.
                n_a = counts[a][None, :, None]
                em = (
                    static_element(kind, params, rank[r][None, :, None], rank[None, None, :], n_a)
                    & same
                )
            else:
                em = static_element(kind, params, i, j, S)
            em = em.expand(N, R, S).clone()
        else:
            em = torch.zeros(N, R, S, dtype=torch.bool, device=dev)
            v = vert[:, a]  # [N, R, NV]
            _scatter_true(em, v.clamp_min(0), v >= 0)
            o = sl[:, a]  # [N, R, NS]
            if two_d:
                rr = rank[r][None, :, None] - o
                ok = (o >= 0) & (rr >= 0)
                jj = ctx.mperm[(start[a][None, :, None] + rr.clamp_min(0)).clamp(max=S - 1)]
            else:
                jj = i - o
                ok = (o >= 0) & (jj >= 0)
            _scatter_true(em, jj.clamp_min(0), ok)
        if cross is not None:
            c = cross[:, a]
            _scatter_true(em, c.clamp_min(0), c >= 0)
        return em & causal

    q_perm = ctx.mperm.to(torch.int32)
    kv_perm = q_perm if two_d else None
    if not reference and (kind is None or kind in _RUN_KINDS):
        nb = -(-S // ctx.block)
        fn = _boundary_block_mask(
            kind, params, vert, sl, cross, ctx, N, two_d, counts, start, inv_m, chunk_elems
        )
        idx, cnt = lists_from_chunks(fn, N, nb, nb, dev)
    else:
        fn = element_block_mask(row_fn, q_perm, kv_perm, N, S, ctx.block)
        idx, cnt = lists_from_element_chunks(fn, N, S, ctx.block, dev)
    qp = q_perm.expand(N, S)
    return GroupPlan(tuple(hs), idx, cnt, q_perm=qp, kv_perm=qp if two_d else None)


def _plan_q_boundary_grid(ctx: LayerContext, hs, cfgs) -> GroupPlan:
    """Q-Boundary Grid head: each modality's stride and phase from its own last queries.

    Rows: modality order, and inside each modality its own grid order ``(i - phase_a) mod
    stride_a``. Columns: the grid order of the largest non-text modality (the "owner"; the
    largest modality when all is text). Row ``i`` of modality ``a`` attends, causally: keys
    ``j = phase_a (mod stride_a)`` (vline), ``j = i (mod stride_a)`` (slash), every key if
    ``i = phase_a (mod stride_a)`` (hline), and itself. Rows of non-owner modalities follow
    their own grid, which is not contiguous in the owner's column order (correct, denser).
    """
    dev, S, B = ctx.q.device, ctx.S, ctx.B
    N = B * len(hs)
    M = ctx.uniq.numel()
    mi = ctx.mod_index
    L = max(c.pattern.last_q for c in cfgs)
    p_all, rows = ctx.p_mod(L)
    p = ctx.sel(p_all, hs)  # [N, M, L, S]
    stride = torch.zeros(N, M, dtype=torch.int64, device=dev)
    phase = torch.zeros(N, M, dtype=torch.int64, device=dev)
    c0 = cfgs[0].pattern
    for c in cfgs:
        if (c.pattern.stride, c.pattern.max_stride) != (c0.stride, c0.max_stride):
            raise NotImplementedError(
                "Q-Boundary Grid heads of one layer must share stride / max_stride settings"
            )
    space = (
        [c0.stride]
        if c0.stride is not None
        else E.stride_space(ctx.layout.tokens_per_frame, max_stride=c0.max_stride, S=S)
    )
    for a in range(M):
        st, ph, _ = E.search_grid(p[:, a], rows[a], space)
        stride[:, a], phase[:, a] = st, ph
    counts = torch.bincount(mi, minlength=M)
    visual = [a for a in range(M) if int(ctx.uniq[a]) != 0]
    owner = max(visual or range(M), key=lambda a: int(counts[a]))
    kv_perm, _ = grid_permutation(S, stride[:, owner], phase[:, owner], device=dev)
    i = torch.arange(S, device=dev)
    st_i = stride[:, mi]  # [N, S]
    ph_i = phase[:, mi]
    line = torch.remainder(i[None] - ph_i, st_i)
    key = (mi[None] * S + line) * S + i[None]
    q_perm = torch.argsort(key, dim=-1).to(torch.int32)
    flags = {
        f: per_head(cfgs, B, f, dev, dtype=torch.bool)[:, None, None]
        for f in ("use_hline", "use_vline", "use_slash")
    }

    def row_fn(r: torch.Tensor) -> torch.Tensor:  # r: [N, R] original rows
        ii = r[..., None]
        j = i[None, None, :]
        s_r = st_i.gather(1, r)[..., None]
        p_r = ph_i.gather(1, r)[..., None]
        em = ii == j
        em = em | (flags["use_vline"] & (torch.remainder(j - p_r, s_r) == 0))
        em = em | (flags["use_slash"] & (torch.remainder(ii - j, s_r) == 0))
        em = em | (flags["use_hline"] & (torch.remainder(ii - p_r, s_r) == 0))
        return em & (j <= ii)

    fn = _element_block_mask_per_head(row_fn, q_perm, kv_perm, N, S, ctx.block)
    idx, cnt = lists_from_element_chunks(fn, N, S, ctx.block, dev)
    return GroupPlan(
        tuple(hs), idx, cnt, q_perm=q_perm, kv_perm=kv_perm,
        stride=stride[:, owner], phase=phase[:, owner],
    )  # fmt: skip


def _element_block_mask_per_head(row_fn, q_perm, kv_perm, N: int, S: int, blk: int):
    """As :func:`~sparse_patterns.element_lists.element_block_mask` with per-head ``[N, S]``
    permutations; ``row_fn(rows [N, R]) -> bool [N, R, S]``."""
    nkb = -(-S // blk)
    pad = nkb * blk - S
    kvp = kv_perm.long()

    def fn(m0: int, m1: int) -> torch.Tensor:
        r0, r1 = m0 * blk, min(m1 * blk, S)
        rows = q_perm[:, r0:r1].long()
        em = row_fn(rows)
        em = em.gather(-1, kvp[:, None, :].expand(-1, em.shape[1], -1))
        em = torch.nn.functional.pad(em, (0, pad, 0, (m1 - m0) * blk - (r1 - r0)))
        return em.reshape(N, m1 - m0, blk, nkb, blk).any(-1).any(2)

    return fn
