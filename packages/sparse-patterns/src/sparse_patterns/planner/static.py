"""Heads whose set does not depend on the scores beyond block pooling: the static patterns
(``Dense``, ``AShape``, ``TriShape``, the ``SFFixed`` / ``SFStrided`` baselines) and
``BlockSparse`` (top-k of pooled block scores)."""

from __future__ import annotations

from types import MappingProxyType

import torch

from .. import estimate as E
from .._device import heads_index, to_device
from ..block_lists import a_shape_lists, lists_from_chunks, static_block_mask
from ..patterns import AShape, Dense, SFFixed, SFStrided, TriShape
from ..plan import ExactAShapeHeads
from .context import LayerContext, per_head
from .group import GroupPlan

STATIC_KINDS = MappingProxyType(
    {Dense: "dense", AShape: "a_shape", TriShape: "tri_shape", SFFixed: "sf_fixed",
     SFStrided: "sf_strided"}
)  # fmt: skip
# The pattern fields each static kind reads, per head.
STATIC_FIELDS = MappingProxyType(
    {
        "dense": (),
        "a_shape": ("sink", "window"),
        "tri_shape": ("sink", "window", "last"),
        "sf_fixed": ("local", "vline_stride"),
        "sf_strided": ("local", "vline_stride"),
    }
)


def plan_static(
    ctx: LayerContext, hs, cfgs, kind: str, exact: bool = False, exact_lists: bool = True
) -> GroupPlan:
    """Heads of one static ``kind``. ``exact``: ``AShape(exact=True)`` heads, run by
    ``triangle_attention`` per ``(sink, window)``; their lists (block-rounded, for the plan's
    metrics) only when ``exact_lists``."""
    heads = tuple(hs)
    if kind == "a_shape":  # columns + diagonals: built without an NQB x NKB mask
        exact_a_shape = ()
        if exact:
            # Launch groups: heads of one (sink, window), run by triangle_attention.
            by: dict[tuple[int, int], list[int]] = {}
            for j, c in enumerate(cfgs):
                by.setdefault((c.pattern.sink, c.pattern.window), []).append(j)
            exact_a_shape = tuple(
                ExactAShapeHeads(tuple(hs[j] for j in local), sw[0], sw[1])
                for sw, local in by.items()
            )
            if not exact_lists:
                nb = -(-ctx.S // ctx.block)
                z = torch.zeros(ctx.B * len(cfgs), nb, dtype=torch.int32, device=ctx.q.device)
                return GroupPlan(heads, z[..., None], z, exact_a_shape=exact_a_shape)
        sink = [c.pattern.sink for c in cfgs] * ctx.B
        window = [c.pattern.window for c in cfgs] * ctx.B
        idx, cnt = a_shape_lists(sink, window, ctx.S, ctx.block, ctx.q.device)
        return GroupPlan(heads, idx, cnt, exact_a_shape=exact_a_shape)
    N = ctx.B * len(cfgs)
    params = {f: per_head(cfgs, ctx.B, f, ctx.q.device) for f in STATIC_FIELDS[kind]}
    if not params:
        params = {"n": torch.zeros(N, dtype=torch.int64, device=ctx.q.device)}
    nb = -(-ctx.S // ctx.block)
    idx, cnt = lists_from_chunks(
        static_block_mask(kind, params, ctx.S, ctx.block), N, nb, nb, ctx.q.device
    )
    return GroupPlan(heads, idx, cnt)


def static_element(
    kind: str, params: dict, i: torch.Tensor, j: torch.Tensor, S: int | torch.Tensor
) -> torch.Tensor:
    """Element mask of a static pattern (no causal), ``i`` ``[1 or N, R, 1]``, ``j`` ``[.., S]``."""
    d = i - j
    if kind == "dense":
        return torch.ones_like(d, dtype=torch.bool)
    if kind in ("a_shape", "tri_shape"):
        m = (j < _c(params["sink"])) | (d < _c(params["window"]))
        if kind == "tri_shape":
            m = m | (i >= S - _c(params["last"]))
        return m
    L, vs = _c(params["local"]), _c(params["vline_stride"])
    if kind == "sf_fixed":
        return (i // L == j // L) | (torch.remainder(j, vs) == vs - 1)
    return (d < L) | (torch.remainder(d, vs) == 0)


def _c(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, 1, 1)


def plan_block_sparse(ctx: LayerContext, hs, cfgs) -> GroupPlan:
    """``BlockSparse`` heads: per query block, the top ``top_k`` (or ``ratio`` of the causal
    blocks) key blocks by pooled score, with the first and the diagonal block always in."""
    dev = ctx.q.device
    for c in cfgs:
        if c.pattern.block != ctx.block:
            raise NotImplementedError(
                f"BlockSparse.block={c.pattern.block} differs from the layer's block={ctx.block}; "
                f"one block size per layer is supported"
            )
    pq = E.pool_blocks(ctx.q[:, heads_index(hs, dev)], ctx.block)
    H_KV = ctx.k.shape[1]
    G = ctx.H // H_KV
    pk = E.pool_blocks(ctx.k, ctx.block)[:, to_device(torch.tensor([h // G for h in hs]), dev)]
    nb = pq.shape[2]
    B, Hg = ctx.B, len(hs)
    topk = to_device(torch.tensor([c.pattern.top_k or 0 for c in cfgs]), dev).repeat(B)
    ratio = to_device(torch.tensor([c.pattern.ratio or 0.0 for c in cfgs]), dev).repeat(B)

    def fn(m0: int, m1: int) -> torch.Tensor:
        s = E.pooled_block_scores(pq[:, :, m0:m1], pk, scale=ctx.scale, m0=m0)  # [B, Hg, C, NKB]
        s = s.reshape(B * Hg, m1 - m0, nb)
        m = torch.arange(m0, m1, device=dev)
        n = torch.arange(nb, device=dev)
        s = s.masked_fill((n[None, None] == 0) | (n[None, None] == m[None, :, None]), float("inf"))
        kk = torch.where(
            topk[:, None] > 0, topk[:, None], torch.ceil(ratio[:, None] * (m[None] + 1)).long()
        )
        kk = torch.minimum(kk.clamp_min(1), m[None] + 1)
        kmax = int(kk.max())
        vals, idx = torch.topk(s, min(kmax, nb), dim=-1)
        keep = (torch.arange(idx.shape[-1], device=dev) < kk[..., None]) & (vals > float("-inf"))
        out = torch.zeros(B * Hg, m1 - m0, nb + 1, dtype=torch.bool, device=dev)
        out.scatter_(-1, torch.where(keep, idx, nb), True)
        return out[..., :nb]

    idx, cnt = lists_from_chunks(fn, B * Hg, nb, nb, dev)
    return GroupPlan(tuple(hs), idx, cnt)
