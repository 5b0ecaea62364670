"""Pictures of a head (as Figs. 3, 8, 9 of the paper): its attention before and after the
plan's permutation, and the tiles the plan computes. matplotlib is imported lazily."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import torch

from .patterns import PATTERN_TYPES, Grid, HeadConfig, NoBoundary
from .plan import BlockPlan

# Element budget of one chunk of executed-mask rows (bools), as the plan builders bound theirs.
_ROW_CHUNK_ELEMS = 1 << 26
# Colours of the tile states SKIPPED, PARTIAL, FULL (sparse_kernels.viz order).
_TILE_COLORS = ("#f2f2f2", "#8fbce6", "#1f4e79")
_TILE_LABELS = ("no entry computed", "some entries computed", "every entry computed")


def _pool(a: torch.Tensor, size: int) -> tuple[torch.Tensor, int]:
    """Max-pool a square ``[S, S]`` map to at most ``size`` pixels a side; returns the map and
    the pooling factor (tokens per pixel along each axis)."""
    S = a.shape[-1]
    f = max(1, -(-S // size))
    n = -(-S // f)
    a = torch.nn.functional.pad(a, (0, n * f - S, 0, n * f - S))
    return a.reshape(n, f, n, f).amax(dim=(1, 3)), f


def _check(q: torch.Tensor, k: torch.Tensor, plan: BlockPlan, batch: int, head: int, size: int):
    if not isinstance(plan, BlockPlan):
        raise TypeError(f"plan: expected a BlockPlan, got {type(plan).__name__}")
    if q.ndim != 4 or k.ndim != 4:
        raise ValueError(
            f"q, k: expected [B, H, S, D] and [B, H_KV, S, D], got {tuple(q.shape)} and "
            f"{tuple(k.shape)}"
        )
    B, H, S, _ = q.shape
    if k.shape[0] != B or k.shape[2] != S or H % k.shape[1] != 0:
        raise ValueError(f"k: expected [{B}, H_KV dividing {H}, {S}, D], got {tuple(k.shape)}")
    if plan.S != S or tuple(plan.kv_block_counts.shape[:2]) != (B, H):
        raise ValueError(
            f"plan: expected a plan for [B, H] = [{B}, {H}] and S = {S}, got "
            f"{list(plan.kv_block_counts.shape[:2])} and S = {plan.S}"
        )
    if not plan.exact_lists:
        raise ValueError(
            "plan: expected a plan from plan_layer(..., exact_vertical_lists=True) (the picture "
            "reads its executed mask), got an execution-only plan"
        )
    if not (0 <= batch < B and 0 <= head < H):
        raise ValueError(f"batch, head: expected in [0, {B}) x [0, {H}], got ({batch}, {head})")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size: expected an int >= 1, got {size!r}")


def _executed(plan: BlockPlan, batch: int, head: int) -> torch.Tensor:
    """The head's exact executed mask ``[S, S]`` (original order), from ``plan.row_mask``."""
    B, H = plan.kv_block_counts.shape[:2]
    S = plan.S
    dev = plan.kv_block_counts.device
    step = max(1, _ROW_CHUNK_ELEMS // (B * H * S))
    parts = [
        plan.row_mask(torch.arange(r, min(r + step, S), device=dev))[batch, head].cpu()
        for r in range(0, S, step)
    ]
    return torch.cat(parts)


def head_images(
    q: torch.Tensor,
    k: torch.Tensor,
    plan: BlockPlan,
    *,
    batch: int = 0,
    head: int = 0,
    size: int = 256,
) -> dict[str, torch.Tensor]:
    """One head's pictures and numbers, for S up to a few thousand tokens:

    * ``"attention"``: causal attention probabilities, max-pooled to at most ``size`` pixels a
      side (``"pool"`` tokens per pixel);
    * ``"permuted"``: the same with rows / columns in the plan's permuted order;
    * ``"blocks"``: int8 ``[NB, NB]`` state of each ``plan.block`` x ``plan.block`` tile of the
      permuted order, ``sparse_kernels.viz`` codes (0 no entry computed, 1 some, 2 all), from the
      exact executed mask (``BlockPlan.row_mask``: block lists, exact columns and windows);
    * ``"pool"``: the pooling factor; ``"density"``: computed / causal entries; ``"recall"``:
      attention mass on the computed entries, mean over rows (0-d float tensors).
    """
    from sparse_kernels.viz import block_states

    _check(q, k, plan, batch, head, size)
    S, D = q.shape[2], q.shape[3]
    G = q.shape[1] // k.shape[1]
    s = (q[batch, head].float() @ k[batch, head // G].float().T) * D**-0.5
    causal = torch.ones(S, S, dtype=torch.bool, device=s.device).tril()
    a = torch.softmax(s.masked_fill(~causal, float("-inf")), -1).cpu()
    causal = causal.cpu()
    ex = _executed(plan, batch, head)
    qp = plan.q_perm[batch, head].long().cpu() if plan.q_perm is not None else torch.arange(S)
    kp = plan.kv_perm[batch, head].long().cpu() if plan.kv_perm is not None else torch.arange(S)
    attention, f = _pool(a, size)
    permuted, _ = _pool(a[qp][:, kp], size)
    return {
        "attention": attention,
        "permuted": permuted,
        "blocks": block_states(ex[qp][:, kp], block=plan.block),
        "pool": torch.tensor(f),
        "density": ex.sum() / causal.sum(),
        "recall": (a * ex).sum() / S,
    }


def _spec_text(spec) -> str:
    args = ", ".join(f"{f.name}={getattr(spec, f.name)}" for f in dataclasses.fields(spec))
    return f"{type(spec).__name__}({args})"


def _pattern_text(head_config, plan: BlockPlan, batch: int, head: int) -> str:
    if head_config is None:
        return "pattern not given (pass head_config=)"
    hc = head_config if isinstance(head_config, HeadConfig) else HeadConfig(head_config)
    text = _spec_text(hc.pattern)
    if not isinstance(hc.boundary, NoBoundary):
        text += f" + {_spec_text(hc.boundary)}"
    found = [
        f"{key} {int(plan.meta[key][batch, head])}"
        for key in ("stride", "phase")
        if isinstance(plan.meta.get(key), torch.Tensor) and plan.meta[key].ndim == 2
    ]
    if found and isinstance(hc.pattern, Grid):
        text += f"; found {', '.join(found)}"
    return text


def head_figure(
    q: torch.Tensor,
    k: torch.Tensor,
    plan: BlockPlan,
    *,
    batch: int = 0,
    head: int = 0,
    title: str | None = None,
    size: int = 256,
    head_config=None,
):
    """A matplotlib ``Figure`` of one head: attention (log colour scale with a colorbar), the
    same after the plan's permutation, and the computed tiles at one cell per block. The
    title names the head's pattern and parameters (``head_config``: a ``HeadConfig`` or a
    pattern spec), the share of causal entries computed and the attention mass they hold."""
    if head_config is not None and not isinstance(head_config, (HeadConfig, *PATTERN_TYPES)):
        raise TypeError(
            f"head_config: expected a HeadConfig or a pattern spec, got "
            f"{type(head_config).__name__}"
        )
    try:
        from matplotlib import colormaps
        from matplotlib.colors import BoundaryNorm, ListedColormap, LogNorm
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
        from matplotlib.ticker import MaxNLocator
    except ImportError as e:  # pragma: no cover - exercised through a monkeypatched import
        raise ImportError("plot_head needs matplotlib: pip install 'sparse-patterns[plot]'") from e
    imgs = head_images(q, k, plan, batch=batch, head=head, size=size)
    S, blk = plan.S, plan.block
    f = int(imgs["pool"])
    n = imgs["attention"].shape[0]
    fig = Figure(figsize=(15, 6.4), dpi=110)
    # Fixed layout: two square maps, their shared colorbar, the tile grid, a legend row below.
    axes = [fig.add_axes(r) for r in ((0.045, 0.2, 0.265, 0.6), (0.35, 0.2, 0.265, 0.6))]
    cax = fig.add_axes((0.62, 0.2, 0.01, 0.6))
    tiles = fig.add_axes((0.745, 0.2, 0.24, 0.6))
    # Uniform attention over S keys is 1/S; two decades below it is noise for a picture.
    norm = LogNorm(vmin=0.01 / S, vmax=1.0)
    cmap = colormaps["viridis"].with_extremes(bad="#e6e6e6")
    scale = f"1 pixel = {f}x{f} tokens (max)" if f > 1 else "1 pixel = 1 token"
    im = None
    # The plan permutes rows, columns, both or neither: each axis says which order it shows.
    qo = " (permuted order)" if plan.q_perm is not None else ""
    ko = " (permuted order)" if plan.kv_perm is not None else ""
    for ax, key, name, q_order, k_order in (
        (axes[0], "attention", "attention", "", ""),
        (axes[1], "permuted", "after the plan's permutation", qo, ko),
    ):
        img = imgs[key].masked_fill(imgs[key] == 0, float("nan"))
        im = ax.imshow(
            img.numpy(), cmap=cmap, norm=norm, interpolation="nearest", extent=(0, n * f, n * f, 0)
        )
        ax.set_title(f"{name}\n{scale}", fontsize=10)
        ax.set_xlabel(f"key token{k_order}")
        ax.set_ylabel(f"query token{q_order}")
    cb = fig.colorbar(im, cax=cax)
    cb.set_label("attention probability (log scale)\ngrey: masked (causal)")
    states = imgs["blocks"]
    nb = states.shape[0]
    tiles.imshow(
        states.numpy(),
        cmap=ListedColormap(list(_TILE_COLORS)),
        norm=BoundaryNorm([-0.5, 0.5, 1.5, 2.5], 3),
        interpolation="nearest",
    )
    tiles.set_title(
        f"computed tiles, in the plan's order\n1 cell = 1 block of {blk}x{blk} tokens ({nb}x{nb})",
        fontsize=10,
    )
    for axis in (tiles.xaxis, tiles.yaxis):
        axis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    tiles.set_xlabel(f"key block ({blk} tokens){ko}")
    tiles.set_ylabel(f"query block ({blk} tokens){qo}")
    share = [float((states == i).float().mean()) for i in range(3)]
    fig.legend(
        handles=[
            Patch(facecolor=c, edgecolor="0.5", label=f"{lab}: {100 * p:.1f}% of tiles")
            for c, lab, p in zip(_TILE_COLORS, _TILE_LABELS, share)
        ],
        loc="lower center",
        bbox_to_anchor=(0.865, 0.0),
        ncols=1,
        fontsize=9,
        frameon=False,
    )
    lines = [title] if title else []
    lines += textwrap.wrap(f"head {head}: {_pattern_text(head_config, plan, batch, head)}", 130)
    lines.append(
        f"S = {S} tokens; computes {100 * float(imgs['density']):.1f}% of the causal entries, "
        f"which hold {100 * float(imgs['recall']):.1f}% of the attention mass"
    )
    fig.suptitle("\n".join(lines), fontsize=11, y=0.98, va="top")
    return fig


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
    head_config=None,
) -> Path:
    """Write :func:`head_figure` as a PNG; returns the path."""
    fig = head_figure(
        q, k, plan, batch=batch, head=head, title=title, size=size, head_config=head_config
    )
    path = Path(path)
    fig.savefig(path)
    return path
