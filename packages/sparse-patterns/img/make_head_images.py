"""Draws the head pictures of this folder with ``sparse_patterns.plot.plot_head`` from planted
heads (``sparse_patterns.testing``), on the CPU:

    python packages/sparse-patterns/img/make_head_images.py
"""

from pathlib import Path

import torch
from sparse_patterns import (
    Grid,
    HeadConfig,
    QBoundary,
    TokenLayout,
    TwoDBoundary,
    VerticalSlash,
    plan_layer,
)
from sparse_patterns.plot import plot_head
from sparse_patterns.testing import planted_boundary_qkv, planted_grid_qkv

HERE = Path(__file__).parent
S = 2048
BLOCK = 32


def main() -> None:
    q, k, _ = planted_grid_qkv(1, 1, 1, S, 128, stride=64, phase=21, seed=0)
    grid = HeadConfig(Grid())
    plan = plan_layer(
        q, k, grid, TokenLayout(torch.full((S,), 2), tokens_per_frame=64), block=BLOCK
    )
    plot_head(
        q, k, plan, HERE / "grid-head.png", head_config=grid,
        title="planted grid head (stride 64, phase 21): the permutation makes its lines dense tiles",
    )  # fmt: skip

    # Text and video rows attend different columns; the last rows are text.
    q, k, _, lay = planted_boundary_qkv([(0, 200), (2, 768), (0, 160), (2, 640), (0, 280)])
    vs = VerticalSlash(n_vertical=8, n_slash=8, last_q=32, sink=1, local=4)
    for name, boundary in (("q-boundary", QBoundary()), ("2d-boundary", TwoDBoundary(4))):
        hc = HeadConfig(vs, boundary)
        plan = plan_layer(q, k, hc, lay, block=BLOCK)
        plot_head(
            q, k, plan, HERE / f"{name}-head.png", head=0, head_config=hc,
            title=f"planted boundary head (text / video / text / video / text), {name} plan",
        )  # fmt: skip


if __name__ == "__main__":
    main()
