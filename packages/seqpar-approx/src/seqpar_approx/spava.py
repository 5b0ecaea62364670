"""Spava's approximate attention (Eq. 4-5, Algorithm 1), distributed and simulated.

What each token attends (global positions, see :mod:`seqpar_approx.layout`):

* anchor rows: the anchor, causally (exact);
* rows of virtual block ``v``: the anchor, the *passing block* of ``v`` (the essential KVs of every
  earlier virtual block ``g < v``, kept at their original positions, i.e. with the RoPE they got
  before selection) and block ``v`` itself causally;
* query rows: every key of the sequence, causally (exact). The work is split over hosts: host ``h``
  attends the ``h``-th slice of the anchor and its own context blocks with ``causal=False`` (all
  those keys precede every query row), and host 0 additionally the query's own keys with
  ``causal=True`` under bottom-right alignment (row ``i`` at ``i + S_KV - S_Q``, so the prefix keys
  are all visible and the query part is causal). Every key therefore enters the merge exactly
  once; the partials are merged by LSE (``merge_attention``). Unlike a bottom-right causal mask
  applied on every host (which silently hides trailing context keys from early query rows on
  hosts that do not hold the query keys), nothing is dropped.

A host's own rows (anchor rows, each local block's rows) go through a :class:`HostAttention`
step (default :data:`~seqpar_approx.host_attention.DENSE`): dense, TriangleMix or MMInference
(see :mod:`seqpar_approx.host_attention` for exactly what each attends). The query partials and
their merge are dense and exact under every step.

Essential-KV selection for block ``v`` (per batch and KV head): ``p = softmax(q_qr k_v^T * scale)``
over the block's keys for every query row and query head, summed over the query rows and the
``H / H_KV`` query heads that share the KV head; the ``min(l_p, len(v))`` keys with the largest sum
are kept, ties broken towards the lower position (a stable sort), then restored to position order.
The sums are ``sparse_kernels.estimate.column_mass``: on CUDA a Triton kernel, which never holds a
block's ``[H, query rows, block keys]`` scores in memory; elsewhere its float32 PyTorch reference,
which does.
"""

from __future__ import annotations

import torch
from sparse_kernels import AttentionOutput, attention, merge_attention
from sparse_kernels.estimate import column_mass

from ._comm import all_gather, world
from .config import SpavaConfig
from .host_attention import DENSE, HostAttention
from .layout import SpavaLayout
from .timing import SectionTimer, section


def _check_local(q, k, v, layout: SpavaLayout, rank: int) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 4:
            raise ValueError(f"{name}: expected [B, H, S, D], got shape {tuple(t.shape)}")
    n = layout.local_len(rank)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape[2] != n:
            raise ValueError(
                f"{name}: expected host {rank}'s {n} local rows (anchor + its blocks + query), "
                f"got {t.shape[2]}"
            )
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"GQA needs H % H_KV == 0, got H={q.shape[1]}, H_KV={k.shape[1]}")


def essential_scores(q_qr: torch.Tensor, k_blk: torch.Tensor, *, scale: float) -> torch.Tensor:
    """Importance ``[B, H_KV, L]`` of a block's keys for the query block (module docstring)."""
    B, H = q_qr.shape[:2]
    H_KV, L = k_blk.shape[1], k_blk.shape[2]
    per_head = column_mass(q_qr, k_blk, scale=scale)  # [B, H, L]
    return per_head.reshape(B, H_KV, H // H_KV, L).sum(dim=2)


def top_indices(scores: torch.Tensor, count: int) -> torch.Tensor:
    """Deterministic top-``count`` along the last dim: ties go to the lower index (stable sort);
    the result is in ascending index order."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    return torch.sort(order[..., :count], dim=-1).values


def select_essential(
    q_qr: torch.Tensor, k_blk: torch.Tensor, v_blk: torch.Tensor, count: int, *, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(k_c, v_c, idx)``: the ``count`` essential KVs of a block (module docstring) and their
    indices in the block ``[B, H_KV, count]``, ascending."""
    idx = top_indices(essential_scores(q_qr, k_blk, scale=scale), count)
    gidx = idx[..., None].expand(-1, -1, -1, k_blk.shape[-1])
    return k_blk.gather(2, gidx), v_blk.gather(2, gidx), idx


def _local_parts(t: torch.Tensor, layout: SpavaLayout, rank: int) -> dict:
    parts, off = {"blocks": []}, 0
    for kind, s, e in layout.local_segments(rank):
        x = t[:, :, off : off + e - s]
        off += e - s
        if kind == "block":
            parts["blocks"].append(x)
        else:
            parts[kind] = x
    return parts


def _cat(xs: list[torch.Tensor]) -> torch.Tensor:
    kept = [x for x in xs if x.shape[2]]
    if not kept:
        return xs[0]
    return kept[0] if len(kept) == 1 else torch.cat(kept, dim=2)


def _check_step(host_attention) -> None:
    if not isinstance(host_attention, HostAttention):
        raise TypeError(
            f"host_attention: expected a HostAttention (e.g. DenseHost(), or "
            f"HostSparsity.for_layer(i)), got {type(host_attention).__name__}"
        )


def _query_partial(q_qr, k_keys, v_keys, k_qr, v_qr, *, with_query: bool, scale, impl):
    """One host's share of the query attention (alignment: module docstring)."""
    if with_query:
        return attention(
            q_qr, _cat([k_keys, k_qr]), _cat([v_keys, v_qr]), causal=True, scale=scale, impl=impl
        )
    return attention(q_qr, k_keys, v_keys, causal=False, scale=scale, impl=impl)


def spava_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: SpavaLayout,
    config: SpavaConfig,
    group=None,
    *,
    scale: float | None = None,
    impl: str = "auto",
    host_attention: HostAttention = DENSE,
    timer: SectionTimer | None = None,
) -> AttentionOutput:
    """Spava attention of this rank's local rows over a process group (one rank = one host).

    Args:
        q: ``[B, H, S_local, D]``; k, v: ``[B, H_KV, S_local, D]`` with RoPE applied, rows in the
            local order of :class:`SpavaLayout` (anchor, this host's virtual blocks, query).
        layout: from :func:`build_layout`; ``layout.num_hosts`` must equal the group size.
        config: the switches (``overlap_comm``: async all-gathers waited only where needed).
        group: the process group (default: the world); rank ``h`` is host ``h``.
        scale: softmax scale, default ``D ** -0.5``. impl: passed to ``sparse_kernels.attention``.
        host_attention: the step of the anchor rows and of each local block's rows.
        timer: if given, the time of the essential-KV selection (``"estimation"``), of the
            collectives (``"communication"``) and of the rest (``"attention"``) is counted there.

    Returns:
        ``AttentionOutput`` of the local rows, local order. Anchor and query rows are identical
        on every host.
    """
    rank, size = world(group)
    if size != layout.num_hosts:
        raise ValueError(
            f"layout is for {layout.num_hosts} hosts, the process group has {size} ranks"
        )
    if layout.query_len < 1:
        raise ValueError("spava_attention needs a query block (query_len >= 1), got 0")
    _check_local(q, k, v, layout, rank)
    _check_step(host_attention)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    async_op = config.overlap_comm
    Q, K, V = (_local_parts(t, layout, rank) for t in (q, k, v))
    mine = layout.virtual_of_host(rank)
    l_p = layout.passing_len

    # 1. essential KVs of each local block -> all-gather (padded to l_p, trimmed by the receiver)
    pend = []
    if l_p > 0:
        for j, vb in enumerate(mine):
            with section(timer, "estimation"):
                kc, vc, _ = select_essential(
                    Q["query"],
                    K["blocks"][j],
                    V["blocks"][j],
                    layout.passing_count(vb),
                    scale=scale,
                )
                buf = k.new_zeros(2, *kc.shape[:2], l_p, kc.shape[-1])
                buf[0, :, :, : kc.shape[2]] = kc
                buf[1, :, :, : kc.shape[2]] = vc
            with section(timer, "communication"):
                pend.append(all_gather(buf, group, async_op=async_op))

    # 2. this host's share of the query attention, gathered for the LSE merge
    a0, a1 = layout.anchor_slice(rank)
    ka = K.get("anchor", k[:, :, :0])
    va = V.get("anchor", v[:, :, :0])
    qp = _query_partial(
        Q["query"],
        _cat([ka[:, :, a0:a1], *K["blocks"]]),
        _cat([va[:, :, a0:a1], *V["blocks"]]),
        K["query"],
        V["query"],
        with_query=rank == 0,
        scale=scale,
        impl=impl,
    )
    with section(timer, "communication"):
        pend_out = all_gather(qp.out, group, async_op=async_op)
        pend_lse = all_gather(qp.lse, group, async_op=async_op)

    # 3. anchor rows, then each local block with its passing block
    outs, lses = [], []
    none_k, none_v = k[:, :, :0], v[:, :, :0]
    if layout.anchor_len:
        r = host_attention(
            Q["anchor"], ka, va, none_k, none_v, start=0, scale=scale, impl=impl, timer=timer
        )
        outs.append(r.out)
        lses.append(r.lse)
    for j, vb in enumerate(mine):
        kp, vp = [], []
        if l_p > 0:
            with section(timer, "communication"):
                gathered = pend[j].wait()
            for g in range(vb):
                src = layout.host_of_virtual(g)
                slot = layout.virtual_of_host(src).index(g)
                c = layout.passing_count(g)
                if slot == j:
                    other = gathered[src]
                else:
                    with section(timer, "communication"):
                        other = pend[slot].wait()[src]
                kp.append(other[0, :, :, :c])
                vp.append(other[1, :, :, :c])
        r = host_attention(
            Q["blocks"][j],
            K["blocks"][j],
            V["blocks"][j],
            _cat([ka, *kp]),
            _cat([va, *vp]),
            start=layout.block(vb)[0],
            scale=scale,
            impl=impl,
            timer=timer,
        )
        outs.append(r.out)
        lses.append(r.lse)

    with section(timer, "communication"):
        for p in pend:  # a selection no local block needed (e.g. host 0) is still completed
            p.wait()
        parts_out, parts_lse = pend_out.wait(), pend_lse.wait()
    # 4. merge the query partials of every host (rank order)
    m = merge_attention(parts_out, parts_lse, impl=impl)
    outs.append(m.out)
    lses.append(m.lse)
    return AttentionOutput(torch.cat(outs, dim=2), torch.cat(lses, dim=2))


def simulate_spava_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: SpavaLayout,
    config: SpavaConfig,
    *,
    scale: float | None = None,
    impl: str = "auto",
    host_attention: HostAttention = DENSE,
) -> AttentionOutput:
    """Exactly :func:`spava_attention`'s approximation in one process, on the full sequence.

    q: ``[B, H, n, D]``, k/v: ``[B, H_KV, n, D]`` in global order; returns global order. The same
    selection, the same key sets and the same per-host query partials merged in host order.
    ``config`` is accepted for symmetry (the switches change timing, not the result).
    """
    del config
    _check_step(host_attention)
    if layout.query_len < 1:
        raise ValueError("simulate_spava_attention needs a query block (query_len >= 1), got 0")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim != 4 or t.shape[2] != layout.seq_len:
            raise ValueError(
                f"{name}: expected [B, H, {layout.seq_len}, D] (the full sequence), "
                f"got {tuple(t.shape)}"
            )
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    la, qs = layout.anchor_len, layout.context_end
    q_qr, k_qr, v_qr = q[:, :, qs:], k[:, :, qs:], v[:, :, qs:]
    ka, va = k[:, :, :la], v[:, :, :la]
    out = q.new_zeros(q.shape)
    lse = torch.zeros(q.shape[:3], dtype=torch.float32, device=q.device)
    none_k, none_v = k[:, :, :0], v[:, :, :0]
    if la:
        r = host_attention(q[:, :, :la], ka, va, none_k, none_v, start=0, scale=scale, impl=impl)
        out[:, :, :la], lse[:, :, :la] = r.out, r.lse
    sel_k, sel_v = [], []
    for vb in range(layout.num_virtual):
        s, e = layout.block(vb)
        kb, vb_ = k[:, :, s:e], v[:, :, s:e]
        r = host_attention(
            q[:, :, s:e],
            kb,
            vb_,
            _cat([ka, *sel_k]),
            _cat([va, *sel_v]),
            start=s,
            scale=scale,
            impl=impl,
        )
        out[:, :, s:e], lse[:, :, s:e] = r.out, r.lse
        if layout.passing_len > 0:
            kc, vc, _ = select_essential(q_qr, kb, vb_, layout.passing_count(vb), scale=scale)
            sel_k.append(kc)
            sel_v.append(vc)
    parts_o, parts_l = [], []
    for h in range(layout.num_hosts):
        a0, a1 = layout.anchor_slice(h)
        blocks = [layout.block(vb) for vb in layout.virtual_of_host(h)]
        r = _query_partial(
            q_qr,
            _cat([ka[:, :, a0:a1], *(k[:, :, s:e] for s, e in blocks)]),
            _cat([va[:, :, a0:a1], *(v[:, :, s:e] for s, e in blocks)]),
            k_qr,
            v_qr,
            with_query=h == 0,
            scale=scale,
            impl=impl,
        )
        parts_o.append(r.out)
        parts_l.append(r.lse)
    m = merge_attention(parts_o, parts_l, impl=impl)
    out[:, :, qs:], lse[:, :, qs:] = m.out, m.lse
    return AttentionOutput(out, lse)
