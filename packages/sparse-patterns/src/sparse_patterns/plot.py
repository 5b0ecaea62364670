"""Pictures of a head (as Figs. 3, 8, 9 of the paper): its attention before and after the
plan's permutation, and the blocks the plan computes. matplotlib is imported lazily."""

from __future__ import annotations

from pathlib import Path

import torch

from .plan import BlockPlan


def _pool(a: torch.Tensor, size: int) -> torch.Tensor:
    S = a.shape[-1]
    f = max(1, -(-S // size))
    n = -(-S // f)
    a = torch.nn.functional.pad(a, (0, n * f - S, 0, n * f - S))
    return a.reshape(n, f, n, f).amax(dim=(1, 3))


def head_images(
    q: torch.Tensor,
    k: torch.Tensor,
    plan: BlockPlan,
    *,
    batch: int = 0,
    head: int = 0,
    size: int = 256,
) -> dict[str, torch.Tensor]:
    """``{"attention", "permuted", "blocks"}``: the head's causal attention (max-pooled to
    ``size``), the same with rows/cols in the plan's permuted order, and the plan's computed
    blocks (permuted space, 1 = computed). For S up to a few thousand tokens."""
    S, D = q.shape[2], q.shape[3]
    G = q.shape[1] // k.shape[1]
    s = (q[batch, head].float() @ k[batch, head // G].float().T) * D**-0.5
    s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    a = torch.softmax(s, -1)
    qp = plan.q_perm[batch, head].long() if plan.q_perm is not None else torch.arange(S)
    kp = plan.kv_perm[batch, head].long() if plan.kv_perm is not None else torch.arange(S)
    ap = a[qp][:, kp]
    nb = -(-S // plan.block)
    bm = torch.zeros(nb, nb + 1)
    idx = plan.kv_block_indices[batch, head].long()
    cnt = plan.kv_block_counts[batch, head].long()
    valid = torch.arange(idx.shape[-1]) < cnt[:, None]
    bm.scatter_(1, torch.where(valid, idx, nb).cpu(), 1.0)
    return {
        "attention": _pool(a.cpu(), size),
        "permuted": _pool(ap.cpu(), size),
        "blocks": bm[:, :nb],
    }


def plot_head(
    q: torch.Tensor,
    k: torch.Tensor,
    plan: BlockPlan,
    path: str | Path,
    *,
    batch: int = 0,
    head: int = 0,
    title: str | None = None,
    size: int = 256,
) -> Path:
    """Write a 3-panel PNG: attention, permuted attention, computed blocks. Returns the path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover
        raise ImportError("plot_head needs matplotlib: pip install matplotlib") from e
    imgs = head_images(q, k, plan, batch=batch, head=head, size=size)
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.2))
    for ax, (name, img) in zip(axes, imgs.items()):
        data = img.clamp_min(1e-6).log10() if name != "blocks" else img
        ax.imshow(
            data.numpy(), cmap="viridis" if name != "blocks" else "Greys", interpolation="nearest"
        )
        ax.set_title(
            {
                "attention": "attention (log10)",
                "permuted": "after permutation",
                "blocks": f"computed blocks ({plan.block})",
            }[name]
        )
        ax.set_xlabel("key")
        ax.set_ylabel("query")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
