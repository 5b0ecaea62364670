"""Where the attention mass of ``bench_grid.py``'s planted grid sits (CPU, KV head 0 and its
first query head, the last 32 rows): on the exact grid lines, or on slash bands of +-w tokens
around them.

The slash lines are planted through 32 Fourier pairs of ``(i mod 256)`` in ``q`` and ``k``, so
``q_i . k_j`` follows a Dirichlet kernel in ``(i - j) mod 256``: its main lobe also lifts the
neighbouring offsets. A Grid head lists the exact lines only, so its mass recall on these inputs is
bounded by the first row this prints.

    uv run python packages/sparse-patterns/benchmarks/grid_planted_mass.py
"""

from __future__ import annotations

import torch
from bench_grid import planted_video_qkv  # the same inputs as the benchmark (same directory)

D, TPF, ROWS = 128, 256, 32


def main() -> None:
    for S in (32768, 131072):
        q, k, _ = planted_video_qkv(S, heads=1, kv_heads=1, dim=D, tpf=TPF, device="cpu")
        i = torch.arange(S)
        rows = torch.arange(S - ROWS, S)
        s = (q[0, 0, rows] @ k[0, 0].T) * D**-0.5
        p = s.masked_fill(i[None, :] > rows[:, None], float("-inf")).softmax(-1)
        on_line = (i % TPF) == 0  # KV head 0: phase 0
        d = (rows[:, None] - i[None, :]) % TPF
        for w in (0, 1, 2, 4):
            band = (d <= w) | (d >= TPF - w)
            mass = float((p * (on_line[None, :] | band)).sum(-1).mean())
            print(f"S={S}: vertical lines + slash band +-{w}: {mass:.4f} of the mass")


if __name__ == "__main__":
    main()
