"""Quality metrics against dense attention, chunked over query rows (never an S x S matrix).

Per head: attention-mass recall (mean over rows of the dense softmax mass inside the executed
mask) and output recall ``1 - ||o_sparse - o_dense|| / ||o_dense||`` (Frobenius over rows), the
search objective of App. A.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

# Elements of one [B, H, R, S] float32 chunk.
_CHUNK_ELEMS = 1 << 25


def eval_rows(S: int, n: int | None, device) -> torch.Tensor:
    """All rows (``n=None``) or ``n`` evenly spaced rows always including the last one."""
    if n is None or n >= S:
        return torch.arange(S, device=device)
    return torch.unique(torch.linspace(0, S - 1, n, device=device).round().long())


def recall_many(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask_fns: Sequence[Callable[[torch.Tensor], torch.Tensor]],
    *,
    scale: float,
    rows: torch.Tensor | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For each ``mask_fn(rows) -> bool [B, H, R, S]`` (original order, e.g.
    ``BlockPlan.row_mask``): ``(mass_recall [B, H], output_recall [B, H])``.

    The dense row distribution is computed once per chunk and shared by every mask.
    """
    B, H, S, D = q.shape
    G = H // k.shape[1]
    rows = torch.arange(S, device=q.device) if rows is None else rows
    step = max(1, _CHUNK_ELEMS // max(1, B * H * S))
    H_KV = k.shape[1]
    # GQA by grouping query heads (K/V are never repeated: at 1M tokens a repeat is 14 GB).
    kt = k.float()[:, :, None].transpose(-1, -2)  # [B, H_KV, 1, D, S]
    vv = v.float()[:, :, None]  # [B, H_KV, 1, S, D]

    def grouped(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        R = x.shape[-2]
        out = torch.matmul(x.reshape(B, H_KV, G, R, x.shape[-1]), y)
        return out.reshape(B, H, R, out.shape[-1])

    mass = [torch.zeros(B, H, device=q.device, dtype=torch.float64) for _ in mask_fns]
    err = [torch.zeros(B, H, device=q.device, dtype=torch.float64) for _ in mask_fns]
    ref = torch.zeros(B, H, device=q.device, dtype=torch.float64)
    j = torch.arange(S, device=q.device)
    for r0 in range(0, rows.numel(), step):
        r = rows[r0 : r0 + step]
        s = grouped(q[:, :, r].float(), kt) * scale
        s = s.masked_fill(j[None, :] > r[:, None], float("-inf"))
        p = torch.softmax(s, dim=-1)
        od = grouped(p, vv)
        ref += od.double().pow(2).sum((-1, -2))
        for t, fn in enumerate(mask_fns):
            m = fn(r)
            mass[t] += (p * m).sum(-1).double().sum(-1)
            ps = torch.softmax(s.masked_fill(~m, float("-inf")), dim=-1).nan_to_num(0.0)
            os_ = grouped(ps, vv)
            err[t] += (os_ - od).double().pow(2).sum((-1, -2))
    n = rows.numel()
    out = []
    for t in range(len(mask_fns)):
        out.append(((mass[t] / n).float(), (1.0 - (err[t] / ref.clamp_min(1e-30)).sqrt()).float()))
    return out
