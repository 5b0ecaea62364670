"""Exact and approximate baselines: ZigZag ring attention, Star, APB-style, single-GPU dense.

Star and APB-style are Spava's own code with other configs (:func:`star_config`,
:func:`apb_config`): Star has no passing blocks, APB-style has no ZigZag and ``l_p = n / 64``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from sparse_kernels import AttentionOutput, attention, merge_attention

from ._comm import all_gather, world
from .layout import SpavaLayout


def dense_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    impl: str = "auto",
) -> AttentionOutput:
    """Single-device exact causal attention over the whole sequence (the 1-GPU baseline)."""
    return attention(q, k, v, causal=True, scale=scale, impl=impl)


def _check_ring(q, k, v, layout: SpavaLayout, rank: int, size: int) -> None:
    if layout.anchor_len or layout.query_len or not layout.zigzag:
        raise ValueError(
            "ring attention expects ring_layout(n, num_hosts=H) (ZigZag, no anchor, no query), "
            f"got anchor_len={layout.anchor_len}, query_len={layout.query_len}, zigzag={layout.zigzag}"
        )
    if size != layout.num_hosts:
        raise ValueError(f"layout is for {layout.num_hosts} hosts, the group has {size} ranks")
    n = layout.local_len(rank)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim != 4 or t.shape[2] != n:
            raise ValueError(f"{name}: expected [B, H, {n}, D] local rows, got {tuple(t.shape)}")


def zigzag_ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: SpavaLayout,
    group=None,
    *,
    comm: str = "ring",
    overlap_comm: bool = True,
    scale: float | None = None,
    impl: str = "auto",
) -> AttentionOutput:
    """Exact causal attention of this rank's two ZigZag chunks (``ring_layout``), merged by LSE.

    ``comm="ring"``: H-1 steps of send/recv of the local K/V to the next rank while the current
    one is attended. ``comm="allgather"``: one (async) all-gather of every rank's K/V.
    Local chunk ``c`` attends itself causally and every earlier chunk in full; later chunks are
    skipped.
    """
    rank, size = world(group)
    _check_ring(q, k, v, layout, rank, size)
    if comm not in ("ring", "allgather"):
        raise ValueError(f"comm: expected 'ring' or 'allgather', got {comm!r}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    mine = layout.virtual_of_host(rank)
    lens = [layout.block_len(c) for c in mine]
    qs = list(torch.split(q, lens, dim=2))
    # diagonal (causal) parts first: they need no communication
    acc = [
        [attention(qc, kc, vc, causal=True, scale=scale, impl=impl)]
        for qc, kc, vc in zip(qs, torch.split(k, lens, dim=2), torch.split(v, lens, dim=2))
    ]

    def visit(src: int, kv: torch.Tensor) -> None:
        theirs = layout.virtual_of_host(src)
        tl = [layout.block_len(c) for c in theirs]
        m = sum(tl)
        ks = torch.split(kv[0, :, :, :m], tl, dim=2)
        vs = torch.split(kv[1, :, :, :m], tl, dim=2)
        for i, c in enumerate(mine):
            for j, c2 in enumerate(theirs):
                if c2 < c:
                    acc[i].append(
                        attention(qs[i], ks[j], vs[j], causal=False, scale=scale, impl=impl)
                    )

    width = max(layout.local_len(h) for h in range(size))
    kv = torch.zeros(2, *k.shape[:2], width, k.shape[-1], dtype=k.dtype, device=k.device)
    kv[0, :, :, : k.shape[2]] = k
    kv[1, :, :, : k.shape[2]] = v
    if size == 1:
        visit(rank, kv)
    elif comm == "allgather":
        chunks = all_gather(kv, group, async_op=overlap_comm).wait()
        for src in range(size):
            visit(src, chunks[src])
    else:
        nxt, prv = (rank + 1) % size, (rank - 1) % size
        g_nxt = dist.get_global_rank(group, nxt) if group is not None else nxt
        g_prv = dist.get_global_rank(group, prv) if group is not None else prv
        cur = kv
        for step in range(size):
            reqs, recv = [], None
            if step < size - 1:
                recv = torch.empty_like(cur)
                ops = [
                    dist.P2POp(dist.isend, cur, g_nxt, group),
                    dist.P2POp(dist.irecv, recv, g_prv, group),
                ]
                reqs = dist.batch_isend_irecv(ops)
                if not overlap_comm:
                    for r in reqs:
                        r.wait()
                    reqs = []  # a gloo work waited twice can hang
            visit((rank - step) % size, cur)
            for r in reqs:
                r.wait()
            cur = recv
    outs, lses = [], []
    for parts in acc:
        r = (
            parts[0]
            if len(parts) == 1
            else merge_attention([p.out for p in parts], [p.lse for p in parts], impl=impl)
        )
        outs.append(r.out)
        lses.append(r.lse)
    return AttentionOutput(torch.cat(outs, dim=2), torch.cat(lses, dim=2))
